//! Checks every reader runs before executing an artifact: references resolve, shapes agree (full shape
//! inference over the op graphs), tensors are finite, sizes are sane, golden vectors are well-formed. The result
//! ([`ValidatedPlan`]) carries the inferred shape of every value so runtimes never re-derive it.

use std::collections::BTreeMap;

use crate::container::Artifact;
use crate::error::FormatError;
use crate::manifest::*;

/// Size limits that keep a hostile artifact from making a reader allocate absurd amounts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Elements in one weight tensor.
    pub max_tensor_elems: u64,
    /// Elements per env in one value (activation).
    pub max_value_elems: u64,
    /// Nodes across all modules.
    pub max_nodes: usize,
    /// Rows in one golden case.
    pub max_golden_batch: usize,
    /// Bytes a loaded policy may use: the weights and their packed copies, plus every value, the state rows and
    /// the convolution scratch for the rows of one act() ([`MemoryEstimate`]). Validation refuses a policy that
    /// does not fit at batch 1, and runtimes refuse a batch (or a number of recurrent envs) that does not fit,
    /// before allocating anything — a 200 KB file used to ask for 100+ GiB.
    pub max_memory_bytes: u64,
}

/// The default [`Limits::max_memory_bytes`]: 8 GiB where addresses are 64-bit, 1 GiB on 32-bit targets (wasm32,
/// whose whole linear memory is at most 4 GiB). A budget against hostile artifacts, the same on every machine,
/// not a reading of the machine's memory: an act() inside it that the machine cannot hold is refused when its
/// allocation fails (`PolicyError::Allocation`), on every backend; set it to what one process may spend.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = if usize::BITS >= 64 { 8 << 30 } else { 1 << 30 };

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tensor_elems: 1 << 28,
            max_value_elems: 1 << 24,
            max_nodes: 100_000,
            max_golden_batch: 1 << 16,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
        }
    }
}

/// The largest relative tolerance a golden case may declare. Relative errors above 1 mean "any answer of the
/// right order of magnitude", which is no check at all.
pub const MAX_GOLDEN_TOLERANCE: f64 = 1.0;

/// What validation learned about an artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedPlan {
    /// Feature shape of every value in the namespace (`obs`, `state/..`, module outputs and node outputs).
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// Feature shape of the preprocessed observation.
    pub obs_shape: Vec<usize>,
    /// Numbers per env in an action.
    pub action_len: usize,
    /// Numbers per env in `dist_params` (the distribution's parameter values concatenated).
    pub dist_params_len: usize,
    /// The action head, decoded once (the only decoder of the distribution: every sampler is built from it).
    pub head: crate::head::HeadPlan,
    /// The observation's preprocessing, resolved once (every executor builds its own from it).
    pub preprocess: crate::preprocess::PreprocessPlan,
    /// What a runtime allocates to run it (an upper estimate, the same for every executor).
    pub memory: MemoryEstimate,
}

/// An upper estimate of a loaded policy's memory, computed from the validated shapes before anything is
/// allocated: `fixed_bytes` is paid once (the weights, one packed copy per node that reads a tensor, transpose
/// indices, the largest convolution scratch), `bytes_per_env` per row of an act() (every value of the graph, the
/// raw and preprocessed observation) and `state_bytes_per_env` per env a recurrent session holds (host rows, the
/// executor's copy, the step's input and output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    pub fixed_bytes: u64,
    pub bytes_per_env: u64,
    pub state_bytes_per_env: u64,
}

impl MemoryEstimate {
    /// Bytes for one act() of `batch` rows in a session holding state for `envs` envs (saturating).
    pub fn bytes_for(&self, batch: usize, envs: usize) -> u64 {
        self.fixed_bytes
            .saturating_add(self.bytes_per_env.saturating_mul(batch as u64))
            .saturating_add(self.state_bytes_per_env.saturating_mul(envs as u64))
    }
}

/// Output positions of a sliding window along one axis (convolution and pooling share the rule), checked:
/// `(n + pad_begin + pad_end - dilation * (k - 1) - 1) / stride + 1`, at least one.
pub fn window_count(
    n: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    pad_end: usize,
) -> Result<usize, String> {
    if k == 0 || stride == 0 || dilation == 0 {
        return Err(format!(
            "kernel {k}, stride {stride} and dilation {dilation} must be >= 1"
        ));
    }
    let padded = (n as u64) + (pad_begin as u64) + (pad_end as u64);
    let extent = (dilation as u64)
        .checked_mul(k as u64 - 1)
        .and_then(|e| e.checked_add(1))
        .ok_or("kernel extent overflows")?;
    if extent > padded {
        return Err(format!(
            "kernel extent {extent} is larger than the padded size {padded}"
        ));
    }
    if pad_begin as u64 >= extent || pad_end as u64 >= extent {
        return Err(format!(
            "padding {pad_begin}/{pad_end} must be smaller than the kernel extent {extent}"
        ));
    }
    Ok(((padded - extent) / stride as u64 + 1) as usize)
}

fn numel(shape: &[usize]) -> u64 {
    shape
        .iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

struct Checker<'a> {
    art: &'a Artifact,
    limits: &'a Limits,
}

impl Checker<'_> {
    fn tensor(&self, name: &str, user: &str) -> Result<&crate::container::Tensor, FormatError> {
        self.art
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor {
                name: name.into(),
                user: user.into(),
            })
    }

    fn tensor_with_numel(&self, name: &str, user: &str, want: &[usize]) -> Result<(), FormatError> {
        let t = self.tensor(name, user)?;
        if numel(&t.shape) != numel(want) {
            return Err(FormatError::TensorShape {
                name: name.into(),
                user: user.into(),
                expected: want.to_vec(),
                found: t.shape.clone(),
            });
        }
        Ok(())
    }

    fn check_memory(&self, what: &str, bytes: u64) -> Result<(), FormatError> {
        if bytes > self.limits.max_memory_bytes {
            return Err(FormatError::MemoryBudget {
                what: what.into(),
                bytes,
                limit: self.limits.max_memory_bytes,
            });
        }
        Ok(())
    }

    fn check_value_size(&self, what: &str, shape: &[usize]) -> Result<(), FormatError> {
        if shape.is_empty() || shape.contains(&0) {
            return Err(FormatError::shape(
                what,
                format!("shape {shape:?} must have at least one axis, none empty"),
            ));
        }
        let n = numel(shape);
        if n > self.limits.max_value_elems {
            return Err(FormatError::TooLarge {
                what: what.into(),
                found: n,
                limit: self.limits.max_value_elems,
            });
        }
        Ok(())
    }

    fn node_shape(
        &self,
        module: &str,
        node: &Node,
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        let user = format!(
            "node '{}' ({:?}) of module '{}'",
            node.name, node.op, module
        );
        let arity = |n: usize| -> Result<(), FormatError> {
            if ins.len() != n {
                return Err(FormatError::shape(
                    &user,
                    format!("expects {n} input(s), has {}", ins.len()),
                ));
            }
            Ok(())
        };
        let last = |s: &Vec<usize>| *s.last().unwrap();
        Ok(match &node.op {
            Op::Dense { weight, bias } => {
                arity(1)?;
                if ins[0].len() != 1 {
                    return Err(FormatError::shape(
                        &user,
                        format!("input must be flat, is {:?} (add a flatten)", ins[0]),
                    ));
                }
                let w = self.tensor(weight, &user)?;
                if w.shape.len() != 2 || w.shape[1] != ins[0][0] || w.shape[0] == 0 {
                    return Err(FormatError::TensorShape {
                        name: weight.clone(),
                        user,
                        expected: vec![w.shape.first().copied().unwrap_or(0), ins[0][0]],
                        found: w.shape.clone(),
                    });
                }
                if let Some(b) = bias {
                    self.tensor_with_numel(b, &user, &[w.shape[0]])?;
                }
                vec![w.shape[0]]
            }
            Op::Relu
            | Op::Tanh
            | Op::Sigmoid
            | Op::Silu
            | Op::Elu { .. }
            | Op::LeakyRelu { .. }
            | Op::Gelu { .. }
            | Op::Erf
            | Op::Softmax
            | Op::LogSoftmax
            | Op::Flatten => {
                arity(1)?;
                if let Op::Elu { alpha } | Op::LeakyRelu { alpha } = &node.op {
                    if !alpha.is_finite() {
                        return Err(FormatError::invalid(user, "alpha must be finite"));
                    }
                }
                if node.op == Op::Flatten {
                    vec![numel(ins[0]) as usize]
                } else {
                    ins[0].clone()
                }
            }
            Op::Add | Op::Mul => {
                arity(2)?;
                if ins[0] != ins[1] {
                    return Err(FormatError::shape(
                        user,
                        format!("input shapes differ: {:?} vs {:?}", ins[0], ins[1]),
                    ));
                }
                ins[0].clone()
            }
            Op::Concat => {
                if ins.is_empty() {
                    return Err(FormatError::shape(user, "needs at least one input"));
                }
                let head = &ins[0][..ins[0].len() - 1];
                let mut total = 0usize;
                for s in ins {
                    if s.len() != ins[0].len() || &s[..s.len() - 1] != head {
                        return Err(FormatError::shape(
                            &user,
                            format!("inputs {ins:?} differ beyond the last axis"),
                        ));
                    }
                    total = total.saturating_add(last(s));
                }
                let mut out = head.to_vec();
                out.push(total);
                out
            }
            Op::Affine { scale, shift } => {
                arity(1)?;
                // Each tensor broadcasts over the last axis or the whole vector (or is one number), and scale
                // and shift must agree on which: runtimes index both by one group (`affine_group`). A scale of
                // the last axis with a shift of the whole vector panicked in the cpu executor and silently used
                // a prefix of the shift elsewhere.
                let whole = numel(ins[0]);
                let mut sizes = Vec::new();
                for t in scale.iter().chain(shift.iter()) {
                    let tn = numel(&self.tensor(t, &user)?.shape);
                    if tn != last(ins[0]) as u64 && tn != whole && tn != 1 {
                        return Err(FormatError::TensorShape {
                            name: t.clone(),
                            user: user.clone(),
                            expected: vec![last(ins[0])],
                            found: self.art.tensors[t].shape.clone(),
                        });
                    }
                    sizes.push(tn);
                }
                let group = if sizes.contains(&whole) {
                    whole
                } else {
                    last(ins[0]) as u64
                };
                if sizes.iter().any(|&n| n != 1 && n != group) {
                    return Err(FormatError::shape(
                        user,
                        format!(
                            "scale and shift broadcast differently ({sizes:?} numbers over a {:?} value): both must \
                             span the last axis or both the whole value (or be one number)",
                            ins[0]
                        ),
                    ));
                }
                ins[0].clone()
            }
            Op::Exp => {
                arity(1)?;
                ins[0].clone()
            }
            Op::Clip { min, max } => {
                arity(1)?;
                if min.is_some_and(f32::is_nan)
                    || max.is_some_and(f32::is_nan)
                    || matches!((min, max), (Some(a), Some(b)) if a > b)
                {
                    return Err(FormatError::invalid(
                        user,
                        format!("bounds {min:?}..{max:?} must be ordered, not NaN"),
                    ));
                }
                ins[0].clone()
            }
            Op::Reshape { shape } => {
                arity(1)?;
                self.check_value_size(&user, shape)?;
                if numel(shape) != numel(ins[0]) {
                    return Err(FormatError::shape(
                        user,
                        format!("cannot reshape {:?} to {shape:?}", ins[0]),
                    ));
                }
                shape.clone()
            }
            Op::Transpose { perm } => {
                arity(1)?;
                let mut seen = vec![false; ins[0].len()];
                if perm.len() != ins[0].len()
                    || perm
                        .iter()
                        .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
                {
                    return Err(FormatError::shape(
                        user,
                        format!("{perm:?} is not a permutation of the axes of {:?}", ins[0]),
                    ));
                }
                perm.iter().map(|&p| ins[0][p]).collect()
            }
            Op::Conv2d {
                weight,
                bias,
                stride,
                padding,
                dilation,
                groups,
            } => {
                arity(1)?;
                let x = ins[0];
                if x.len() != 3 {
                    return Err(FormatError::shape(
                        &user,
                        format!("input must be [channels, height, width], is {x:?}"),
                    ));
                }
                let w = self.tensor(weight, &user)?;
                let g = *groups;
                let bad_weight = w.shape.len() != 4
                    || g == 0
                    || x[0] % g != 0
                    || w.shape[0] % g != 0
                    || w.shape[1] != x[0] / g
                    || w.shape.contains(&0);
                if bad_weight {
                    return Err(FormatError::TensorShape {
                        name: weight.clone(),
                        user,
                        expected: vec![
                            w.shape.first().copied().unwrap_or(0),
                            x[0] / g.max(1),
                            0,
                            0,
                        ],
                        found: w.shape.clone(),
                    });
                }
                if let Some(b) = bias {
                    self.tensor_with_numel(b, &user, &[w.shape[0]])?;
                }
                let oh = window_count(
                    x[1],
                    w.shape[2],
                    stride[0],
                    dilation[0],
                    padding[0],
                    padding[2],
                )
                .map_err(|e| FormatError::shape(&user, format!("height: {e}")))?;
                let ow = window_count(
                    x[2],
                    w.shape[3],
                    stride[1],
                    dilation[1],
                    padding[1],
                    padding[3],
                )
                .map_err(|e| FormatError::shape(&user, format!("width: {e}")))?;
                vec![w.shape[0], oh, ow]
            }
            Op::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
            } => {
                arity(1)?;
                let x = ins[0];
                if x.len() != 3 {
                    return Err(FormatError::shape(
                        &user,
                        format!("input must be [channels, height, width], is {x:?}"),
                    ));
                }
                let mut out = vec![x[0]];
                for a in 0..2 {
                    let n = window_count(
                        x[1 + a],
                        kernel[a],
                        stride[a],
                        dilation[a],
                        padding[a],
                        padding[a + 2],
                    )
                    .map_err(|e| FormatError::shape(&user, format!("axis {}: {e}", a + 1)))?;
                    // Every window must see the input: a window entirely in the padding has no maximum.
                    for o in 0..n {
                        let start = (o * stride[a]) as i64 - padding[a] as i64;
                        let d = dilation[a] as i64;
                        let first = if start >= 0 { 0 } else { (-start + d - 1) / d };
                        if first >= kernel[a] as i64 || start + first * d >= x[1 + a] as i64 {
                            return Err(FormatError::shape(
                                &user,
                                format!(
                                    "window {o} of axis {} lies entirely in the padding",
                                    a + 1
                                ),
                            ));
                        }
                    }
                    out.push(n);
                }
                out
            }
            Op::LayerNorm {
                scale,
                bias,
                epsilon,
            } => {
                arity(1)?;
                if !(epsilon.is_finite() && *epsilon >= 0.0) {
                    return Err(FormatError::invalid(
                        user,
                        "epsilon must be finite and >= 0",
                    ));
                }
                for t in scale.iter().chain(bias.iter()) {
                    self.tensor_with_numel(t, &user, &[last(ins[0])])?;
                }
                ins[0].clone()
            }
            Op::Slice { start, len } => {
                arity(1)?;
                if *len == 0 || start.checked_add(*len).is_none_or(|e| e > last(ins[0])) {
                    return Err(FormatError::shape(
                        user,
                        format!("slice {start}+{len} outside last axis of {:?}", ins[0]),
                    ));
                }
                let mut out = ins[0].clone();
                *out.last_mut().unwrap() = *len;
                out
            }
        })
    }

    fn run(&self) -> Result<ValidatedPlan, FormatError> {
        let m = &self.art.manifest;
        let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();

        // Weights: finite and bounded.
        for (name, t) in &self.art.tensors {
            let n = numel(&t.shape);
            if n > self.limits.max_tensor_elems {
                return Err(FormatError::TooLarge {
                    what: format!("tensor '{name}'"),
                    found: n,
                    limit: self.limits.max_tensor_elems,
                });
            }
            if let Some(index) = t.data.iter().position(|x| !x.is_finite()) {
                return Err(FormatError::NonFiniteWeight {
                    name: name.clone(),
                    index,
                });
            }
        }

        // Observation and preprocessing.
        let mut cur: Vec<usize> = match &m.observation {
            ObservationSpace::Box { shape, .. } => {
                self.check_value_size("observation space", shape)?;
                shape.clone()
            }
            ObservationSpace::Discrete { n } => {
                if *n == 0 || *n as u64 > self.limits.max_value_elems {
                    return Err(FormatError::invalid(
                        "observation.n",
                        format!("{n} is not a usable number of states"),
                    ));
                }
                vec![1]
            }
            ObservationSpace::Dict { spaces } => {
                if spaces.is_empty() {
                    return Err(FormatError::invalid(
                        "observation.spaces",
                        "a dict needs at least one part",
                    ));
                }
                let mut total = 0u64;
                // A set, not a scan of the earlier keys: up to 2^24 one-element parts pass the size check.
                let mut keys = std::collections::BTreeSet::new();
                for (i, e) in spaces.iter().enumerate() {
                    if e.key.is_empty() || !keys.insert(e.key.as_str()) {
                        return Err(FormatError::invalid(
                            "observation.spaces",
                            format!("part {i}: key '{}' is empty or repeated", e.key),
                        ));
                    }
                    self.check_value_size(&format!("observation part '{}'", e.key), &e.shape)?;
                    total =
                        total.saturating_add(e.shape.iter().map(|d| *d as u64).product::<u64>());
                }
                let flat = vec![usize::try_from(total).unwrap_or(usize::MAX)];
                self.check_value_size("observation space", &flat)?;
                flat
            }
        };
        let mut one_hot_done = false;
        for (i, p) in m.preprocess.iter().enumerate() {
            let user = format!("preprocess step {i}");
            match p {
                // A discrete observation is an index until one_hot expands it: a step before one_hot would
                // turn it into a non-index (a scale of 1000 made the one-hot write out of bounds; a fraction
                // silently picked another state). Regression test `preprocessing_before_one_hot_is_refused`.
                Preprocess::Scale { .. } | Preprocess::Normalize { .. }
                    if matches!(m.observation, ObservationSpace::Discrete { .. })
                        && !one_hot_done =>
                {
                    return Err(FormatError::invalid(
                        user,
                        "a discrete observation is an index: no step may come before one_hot",
                    ));
                }
                Preprocess::Scale { factor } => {
                    if !factor.is_finite() {
                        return Err(FormatError::invalid(user, "scale factor must be finite"));
                    }
                }
                Preprocess::Normalize { mean, std, clip } => {
                    self.tensor_with_numel(mean, &user, &cur)?;
                    self.tensor_with_numel(std, &user, &cur)?;
                    if self.art.tensors[std].data.iter().any(|s| *s <= 0.0) {
                        return Err(FormatError::invalid(
                            user,
                            format!("std tensor '{std}' must be > 0"),
                        ));
                    }
                    if clip.is_some_and(|c| c.is_nan() || c <= 0.0) {
                        return Err(FormatError::invalid(user, "clip must be > 0"));
                    }
                }
                Preprocess::OneHot { n } => match &m.observation {
                    ObservationSpace::Discrete { n: space_n } if space_n == n && !one_hot_done => {
                        cur = vec![*n];
                        one_hot_done = true;
                    }
                    _ => {
                        return Err(FormatError::invalid(
                            user,
                            "one_hot needs a Discrete observation space of the same n",
                        ));
                    }
                },
            }
        }
        if matches!(m.observation, ObservationSpace::Discrete { .. }) && !one_hot_done {
            return Err(FormatError::invalid(
                "preprocess",
                "a Discrete observation space needs a one_hot step",
            ));
        }
        shapes.insert(OBS_VALUE.into(), cur.clone());
        let obs_shape = cur;

        if let Some(rec) = &m.recurrent {
            for s in &rec.states {
                self.check_value_size(&format!("recurrent state '{}'", s.name), &s.shape)?;
                let key = format!("{STATE_PREFIX}{}", s.name);
                if shapes.insert(key.clone(), s.shape.clone()).is_some() {
                    return Err(FormatError::DuplicateValue { name: key });
                }
            }
        }

        // Modules, in order, with shape inference. `visible`: what later modules and the policy may read.
        let mut visible: std::collections::BTreeSet<String> = shapes.keys().cloned().collect();
        let mut total_nodes = 0usize;
        let mut mem = MemoryEstimate {
            // The weights as loaded (the artifact's own copy).
            fixed_bytes: self
                .art
                .tensors
                .values()
                .fold(0u64, |a, t| a.saturating_add(4 * numel(&t.shape))),
            // The observation value itself (every state value too, below).
            bytes_per_env: 4 * numel(&obs_shape),
            state_bytes_per_env: 0,
        };
        let mut conv_scratch = 0u64;
        for module in &m.modules {
            total_nodes = total_nodes.saturating_add(module.nodes.len());
            if total_nodes > self.limits.max_nodes {
                return Err(FormatError::TooLarge {
                    what: "node count".into(),
                    found: total_nodes as u64,
                    limit: self.limits.max_nodes as u64,
                });
            }
            let mut local: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
            for input in &module.inputs {
                let s = visible
                    .contains(input.as_str())
                    .then(|| shapes.get(input))
                    .flatten()
                    .ok_or_else(|| FormatError::UndefinedValue {
                        name: input.clone(),
                        user: format!("module '{}'", module.name),
                    })?;
                local.insert(input, s.clone());
            }
            for node in &module.nodes {
                let mut ins = Vec::with_capacity(node.inputs.len());
                for i in &node.inputs {
                    ins.push(
                        local
                            .get(i.as_str())
                            .ok_or_else(|| FormatError::UndefinedValue {
                                name: i.clone(),
                                user: format!("node '{}' of module '{}'", node.name, module.name),
                            })?,
                    );
                }
                let out = self.node_shape(&module.name, node, &ins)?;
                self.check_value_size(&format!("output of node '{}'", node.name), &out)?;
                // Memory, node by node, so a huge graph is refused as soon as it stops fitting.
                mem.bytes_per_env = mem.bytes_per_env.saturating_add(4 * numel(&out));
                for t in node.op.tensors() {
                    mem.fixed_bytes = mem
                        .fixed_bytes
                        .saturating_add(4 * numel(&self.art.tensors[t].shape));
                }
                match &node.op {
                    Op::Transpose { .. } => {
                        mem.fixed_bytes = mem.fixed_bytes.saturating_add(4 * numel(&out));
                    }
                    Op::Conv2d { weight, .. } => {
                        // Per env: the patch matrix (output positions x one filter's inputs) and the GEMM result.
                        let w = numel(&self.art.tensors[weight].shape);
                        let positions = numel(&out) / (out[0].max(1) as u64);
                        let filter = w / (out[0].max(1) as u64);
                        let scratch = positions.saturating_mul(filter).saturating_add(numel(&out));
                        conv_scratch = conv_scratch.max(4u64.saturating_mul(scratch));
                    }
                    _ => {}
                }
                self.check_memory(
                    &format!("node '{}'", node.name),
                    mem.bytes_for(1, 0).saturating_add(conv_scratch),
                )?;
                if local.contains_key(node.output.as_str()) || shapes.contains_key(&node.output) {
                    return Err(FormatError::DuplicateValue {
                        name: node.output.clone(),
                    });
                }
                shapes.insert(node.output.clone(), out.clone());
                local.insert(&node.output, out);
            }
            for o in &module.outputs {
                if !local.contains_key(o.as_str()) {
                    return Err(FormatError::UndefinedValue {
                        name: o.clone(),
                        user: format!("outputs of module '{}'", module.name),
                    });
                }
                visible.insert(o.clone());
            }
        }

        // The rest of the per-env memory: raw and preprocessed observation, each state (host row, executor copy,
        // step input and output).
        mem.fixed_bytes = mem.fixed_bytes.saturating_add(conv_scratch);
        mem.bytes_per_env = mem
            .bytes_per_env
            .saturating_add(4 * m.observation.raw_len() as u64)
            .saturating_add(4 * numel(&obs_shape));
        if let Some(rec) = &m.recurrent {
            for st in &rec.states {
                mem.state_bytes_per_env = mem
                    .state_bytes_per_env
                    .saturating_add(16 * numel(&st.shape));
            }
        }
        self.check_memory("the policy at batch 1", mem.bytes_for(1, 1))?;

        let value_shape = |name: &str, user: &str| -> Result<Vec<usize>, FormatError> {
            visible
                .contains(name)
                .then(|| shapes.get(name).cloned())
                .flatten()
                .ok_or_else(|| FormatError::UndefinedValue {
                    name: name.into(),
                    user: user.into(),
                })
        };

        // Distribution against the action space.
        // Sizes from the action space are checked before anything multiplies or sums them: an nvec summing past
        // usize::MAX wrapped to a small logits width that passed, and the sampler then sliced past the logits
        // (regression test `multi_discrete_nvec_that_wraps_is_refused`).
        match &m.action {
            ActionSpace::Discrete { n } if *n == 0 || *n as u64 > self.limits.max_value_elems => {
                return Err(FormatError::invalid(
                    "action.n",
                    format!("{n} is not a usable number of actions"),
                ));
            }
            ActionSpace::MultiDiscrete { nvec } => {
                if nvec.is_empty() || nvec.contains(&0) {
                    return Err(FormatError::invalid(
                        "action.nvec",
                        "needs >= 1 component, each >= 1",
                    ));
                }
                let total = nvec
                    .iter()
                    .try_fold(0u64, |acc, &n| acc.checked_add(n as u64));
                if total.is_none_or(|t| t > self.limits.max_value_elems) {
                    return Err(FormatError::TooLarge {
                        what: "action.nvec (sum of the choices)".into(),
                        found: total.unwrap_or(u64::MAX),
                        limit: self.limits.max_value_elems,
                    });
                }
            }
            ActionSpace::Box { shape, .. } => self.check_value_size("action space", shape)?,
            _ => {}
        }
        let action_len = m.action.action_len();
        match &m.action {
            ActionSpace::Box { low, high, .. } => {
                if low.len() != action_len || high.len() != action_len {
                    return Err(FormatError::invalid(
                        "action bounds",
                        format!("need {action_len} low and high values"),
                    ));
                }
                for (l, h) in low.iter().zip(high) {
                    if let (Some(l), Some(h)) = (l, h) {
                        if l.is_nan() || h.is_nan() || l > h {
                            return Err(FormatError::invalid(
                                "action bounds",
                                format!("low {l} > high {h}"),
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
        let dist_params_len: usize;
        let dist_user = "the distribution";
        match (&m.distribution, &m.action) {
            (Distribution::Categorical { logits }, ActionSpace::Discrete { n }) => {
                let s = value_shape(logits, dist_user)?;
                if s != vec![*n] {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("logits '{logits}' are {s:?}, action space needs [{n}]"),
                    ));
                }
                dist_params_len = *n;
            }
            (Distribution::MultiCategorical { logits }, ActionSpace::MultiDiscrete { nvec }) => {
                let s = value_shape(logits, dist_user)?;
                let total: usize = nvec.iter().sum(); // bounded by max_value_elems above
                if s != vec![total] {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("logits '{logits}' are {s:?}, nvec needs [{total}]"),
                    ));
                }
                dist_params_len = total;
            }
            (
                Distribution::DiagGaussian {
                    mean,
                    log_std,
                    log_std_range,
                    ..
                }
                | Distribution::SquashedGaussian {
                    mean,
                    log_std,
                    log_std_range,
                    ..
                },
                ActionSpace::Box { shape, low, high },
            ) => {
                let s = value_shape(mean, dist_user)?;
                if numel(&s) != numel(shape) {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("mean '{mean}' is {s:?}, action space is {shape:?}"),
                    ));
                }
                match log_std {
                    LogStd::Parameter { tensor } => {
                        self.tensor_with_numel(tensor, dist_user, shape)?
                    }
                    LogStd::Value { value } => {
                        let ls = value_shape(value, dist_user)?;
                        if numel(&ls) != numel(shape) {
                            return Err(FormatError::shape(
                                dist_user,
                                format!("log_std '{value}' is {ls:?}, action space is {shape:?}"),
                            ));
                        }
                    }
                }
                if let Some((lo, hi)) = log_std_range {
                    if lo.is_nan() || hi.is_nan() || lo > hi {
                        return Err(FormatError::invalid(
                            "log_std_range",
                            format!("({lo}, {hi})"),
                        ));
                    }
                }
                if matches!(m.distribution, Distribution::SquashedGaussian { .. })
                    && !finite_bounds(low, high)
                {
                    return Err(FormatError::invalid(
                        "action bounds",
                        "a squashed Gaussian needs finite bounds",
                    ));
                }
                dist_params_len = 2 * action_len; // mean, then log-std (after clamping), per row
            }
            (Distribution::QValues { q, epsilon }, ActionSpace::Discrete { n }) => {
                let s = value_shape(q, dist_user)?;
                if s != vec![*n] {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("q values '{q}' are {s:?}, action space needs [{n}]"),
                    ));
                }
                if !(0.0..=1.0).contains(epsilon) {
                    return Err(FormatError::invalid(
                        "distribution.epsilon",
                        format!("{epsilon} is not a probability in [0, 1]"),
                    ));
                }
                dist_params_len = *n;
            }
            (
                Distribution::Deterministic {
                    action,
                    rescale,
                    noise,
                },
                ActionSpace::Box { shape, low, high },
            ) => {
                let s = value_shape(action, dist_user)?;
                if numel(&s) != numel(shape) {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("action '{action}' is {s:?}, action space is {shape:?}"),
                    ));
                }
                if *rescale && !finite_bounds(low, high) {
                    return Err(FormatError::invalid(
                        "action bounds",
                        "a rescaled deterministic actor needs finite bounds",
                    ));
                }
                if let Some(crate::manifest::ActionNoise { mean, sigma }) = noise {
                    if mean.len() != action_len || sigma.len() != action_len {
                        return Err(FormatError::invalid(
                            "distribution.noise",
                            format!(
                                "{} means and {} sigmas for {action_len} action elements",
                                mean.len(),
                                sigma.len()
                            ),
                        ));
                    }
                    if mean.iter().any(|v| !v.is_finite())
                        || sigma.iter().any(|v| !(v.is_finite() && *v >= 0.0))
                    {
                        return Err(FormatError::invalid(
                            "distribution.noise",
                            "means must be finite and sigmas finite and >= 0",
                        ));
                    }
                }
                dist_params_len = action_len; // the actor's own output, per row
            }
            (d, a) => {
                return Err(FormatError::invalid(
                    "distribution",
                    format!(
                        "{} does not fit the action space {}",
                        variant_name(d),
                        action_name(a)
                    ),
                ));
            }
        }

        if m.action_masks && matches!(m.action, ActionSpace::Box { .. }) {
            return Err(FormatError::invalid(
                "action_masks",
                "action masks need a discrete or multi-discrete action space",
            ));
        }
        if let Some(v) = &m.value {
            let s = value_shape(v, "the value estimate")?;
            if numel(&s) != 1 {
                return Err(FormatError::shape(
                    "the value estimate",
                    format!("'{v}' is {s:?}, must hold 1 number"),
                ));
            }
        }
        if let Some(rec) = &m.recurrent {
            for s in &rec.states {
                let next = value_shape(&s.next, &format!("recurrent state '{}'", s.name))?;
                if next != s.shape {
                    return Err(FormatError::shape(
                        format!("recurrent state '{}'", s.name),
                        format!("next '{}' is {next:?}, state is {:?}", s.next, s.shape),
                    ));
                }
            }
        }

        // Golden vectors.
        let raw_len = m.observation.raw_len();
        for g in &m.golden {
            let user = format!("golden case '{}'", g.name);
            if g.batch == 0 || g.batch > self.limits.max_golden_batch {
                return Err(FormatError::invalid(
                    user,
                    format!("batch {} out of range", g.batch),
                ));
            }
            // u64 products: on wasm32 batch (<= 2^16) times a per-env length (<= 2^24) wraps usize.
            let need_obs = g.batch as u64 * raw_len as u64;
            if g.obs.len() as u64 != need_obs {
                return Err(FormatError::invalid(
                    user,
                    format!("{} obs numbers, need {need_obs}", g.obs.len()),
                ));
            }
            for (name, vals) in &g.values {
                let s = shapes
                    .get(name)
                    .cloned()
                    .ok_or_else(|| FormatError::UndefinedValue {
                        name: name.clone(),
                        user: user.clone(),
                    })?;
                if vals.len() as u64 != numel(&s) * g.batch as u64 {
                    return Err(FormatError::invalid(
                        user,
                        format!("value '{name}' has {} numbers", vals.len()),
                    ));
                }
            }
            for (what, acts) in [
                ("sampled", &g.sampled_actions),
                ("deterministic", &g.deterministic_actions),
            ] {
                let need = g.batch as u64 * action_len as u64;
                if !acts.is_empty() && acts.len() as u64 != need {
                    return Err(FormatError::invalid(
                        user,
                        format!("{what} actions: {} numbers, need {need}", acts.len()),
                    ));
                }
            }
            // A case must be able to fail: one that checks no value and no action, or whose tolerance admits
            // anything (+inf, 1e300: a NaN output's relative error, infinity, still passed), verified nothing
            // while `verify` said "ok" (regression test `golden_cases_that_check_nothing_are_refused`).
            if g.values.is_empty()
                && g.sampled_actions.is_empty()
                && g.deterministic_actions.is_empty()
            {
                return Err(FormatError::invalid(
                    user,
                    "checks nothing: no values and no actions",
                ));
            }
            if !(0.0..=MAX_GOLDEN_TOLERANCE).contains(&g.tolerance) {
                return Err(FormatError::invalid(
                    user,
                    format!(
                        "tolerance {} is not in [0, {MAX_GOLDEN_TOLERANCE}]",
                        g.tolerance
                    ),
                ));
            }
        }

        let head = crate::head::HeadPlan::new(self.art, &shapes);
        Ok(ValidatedPlan {
            head,
            preprocess: crate::preprocess::PreprocessPlan::new(self.art),
            memory: mem,
            shapes,
            obs_shape,
            action_len,
            dist_params_len,
        })
    }
}

/// Every bound of a Box present and finite (what mapping actions into the bounds needs).
fn finite_bounds(low: &[Option<f32>], high: &[Option<f32>]) -> bool {
    low.iter()
        .chain(high)
        .all(|b| b.is_some_and(|v| v.is_finite()))
}

fn variant_name(d: &Distribution) -> &'static str {
    match d {
        Distribution::Categorical { .. } => "categorical",
        Distribution::MultiCategorical { .. } => "multi_categorical",
        Distribution::DiagGaussian { .. } => "diag_gaussian",
        Distribution::SquashedGaussian { .. } => "squashed_gaussian",
        Distribution::QValues { .. } => "q_values",
        Distribution::Deterministic { .. } => "deterministic",
    }
}

fn action_name(a: &ActionSpace) -> &'static str {
    match a {
        ActionSpace::Discrete { .. } => "discrete",
        ActionSpace::MultiDiscrete { .. } => "multi_discrete",
        ActionSpace::Box { .. } => "box",
    }
}

/// Check an artifact completely. Runtimes call this in `load`; the writer calls it before writing.
pub fn validate(art: &Artifact, limits: &Limits) -> Result<ValidatedPlan, FormatError> {
    Checker { art, limits }.run()
}
