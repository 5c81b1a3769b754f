//! Checks every reader runs before executing an artifact: references resolve, shapes agree (full shape
//! inference over the op graphs), tensors are finite, sizes are sane, golden vectors are well-formed. The result
//! ([`ValidatedPlan`]) carries the inferred shape of every value so runtimes never re-derive it.

use std::collections::{BTreeMap, BTreeSet};

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
    // Checked: a hostile artifact's padding near u64::MAX must be a typed refusal, not an overflow (a panic in
    // builds with overflow checks, as the fuzzers run).
    let padded = (n as u64)
        .checked_add(pad_begin as u64)
        .and_then(|p| p.checked_add(pad_end as u64))
        .ok_or("padded size overflows")?;
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

    /// The feature shape of a node's output, by the rule of its op (the shape rules below, one per op family).
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
        match &node.op {
            Op::Dense { weight, bias } => self.dense_shape(user, weight, bias.as_deref(), ins),
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
            | Op::Exp
            | Op::Flatten => elementwise_shape(user, &node.op, ins),
            Op::Clip { min, max } => clip_shape(user, *min, *max, ins),
            Op::Add | Op::Mul => binary_shape(user, ins),
            Op::Affine { scale, shift } => {
                self.affine_shape(user, scale.as_deref(), shift.as_deref(), ins)
            }
            Op::Concat => concat_shape(user, ins),
            Op::Slice { start, len } => slice_shape(user, *start, *len, ins),
            Op::Reshape { shape } => self.reshape_shape(user, shape, ins),
            Op::Transpose { perm } => transpose_shape(user, perm, ins),
            Op::Conv2d {
                weight,
                bias,
                stride,
                padding,
                dilation,
                groups,
            } => self.conv2d_shape(
                user,
                weight,
                bias.as_deref(),
                stride,
                padding,
                dilation,
                *groups,
                ins,
            ),
            Op::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
            } => max_pool2d_shape(user, kernel, stride, padding, dilation, ins),
            Op::LayerNorm {
                scale,
                bias,
                epsilon,
            } => self.layer_norm_shape(user, scale.as_deref(), bias.as_deref(), *epsilon, ins),
        }
    }

    /// The whole pass, section by section (each section's checks run in this order, so the first error a hostile
    /// artifact hits is always the same).
    fn run(&self) -> Result<ValidatedPlan, FormatError> {
        self.check_weights()?;
        let mut cur = self.observation_shape()?;
        self.check_preprocess(&mut cur)?;
        let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        shapes.insert(OBS_VALUE.into(), cur.clone());
        let obs_shape = cur;
        self.declare_states(&mut shapes)?;
        // `visible`: what later modules and the policy may read.
        let mut visible: BTreeSet<String> = shapes.keys().cloned().collect();
        let mem = self.modules(&mut shapes, &mut visible, &obs_shape)?;
        let action_len = self.action_space()?;
        let dist_params_len = self.distribution(&visible, &shapes, action_len)?;
        self.value_and_next_states(&visible, &shapes)?;
        self.golden_cases(&shapes, action_len)?;

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

// The sections of `run` and the shape rules of `node_shape` below are split for readers only: the compiled code
// stays one function. This crate is compiled into the browser bundle, which sits a few hundred bytes under its
// hard 3 MB gzipped limit, and the compiler did not inline called-once methods back on its own (an earlier split
// of `run` into nine methods grew the bundle by 1.5 KB: a prologue and epilogue each, and the values passed
// between them). So every helper here with exactly one caller is `#[inline(always)]`, takes what it needs by
// reference, and is neither generic nor takes a closure; helpers with several callers are left to the compiler.
impl Checker<'_> {
    /// Weights: every tensor within `max_tensor_elems` and finite.
    #[inline(always)]
    fn check_weights(&self) -> Result<(), FormatError> {
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
        Ok(())
    }

    /// The observation space's feature shape before preprocessing: a box's shape, `[1]` (an index) for a discrete
    /// space, and for a dict the total of its parts as one axis (parts with distinct non-empty keys).
    #[inline(always)]
    fn observation_shape(&self) -> Result<Vec<usize>, FormatError> {
        let m = &self.art.manifest;
        Ok(match &m.observation {
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
                let mut keys = BTreeSet::new();
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
        })
    }

    /// Preprocessing, step by step over the observation's shape `cur` (one_hot replaces it with `[n]`): tensors
    /// of the observation's size, finite factors, std > 0, and a discrete observation one-hot encoded before
    /// anything else touches it.
    #[inline(always)]
    fn check_preprocess(&self, cur: &mut Vec<usize>) -> Result<(), FormatError> {
        let m = &self.art.manifest;
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
                    self.tensor_with_numel(mean, &user, cur)?;
                    self.tensor_with_numel(std, &user, cur)?;
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
                        *cur = vec![*n];
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
        Ok(())
    }

    /// Recurrent state: each state is a value `state/<name>` of a sane shape, named once.
    #[inline(always)]
    fn declare_states(&self, shapes: &mut BTreeMap<String, Vec<usize>>) -> Result<(), FormatError> {
        if let Some(rec) = &self.art.manifest.recurrent {
            for s in &rec.states {
                self.check_value_size(&format!("recurrent state '{}'", s.name), &s.shape)?;
                let key = format!("{STATE_PREFIX}{}", s.name);
                if shapes.insert(key.clone(), s.shape.clone()).is_some() {
                    return Err(FormatError::DuplicateValue { name: key });
                }
            }
        }
        Ok(())
    }

    /// Modules, in order, with shape inference (adding every value to `shapes` and each module's outputs to
    /// `visible`), and the memory estimate, refused as soon as it stops fitting the budget and then for the whole
    /// policy at batch 1.
    #[inline(always)]
    fn modules(
        &self,
        shapes: &mut BTreeMap<String, Vec<usize>>,
        visible: &mut BTreeSet<String>,
        obs_shape: &[usize],
    ) -> Result<MemoryEstimate, FormatError> {
        let m = &self.art.manifest;
        let mut total_nodes = 0usize;
        let mut mem = MemoryEstimate {
            // The weights as loaded (the artifact's own copy).
            fixed_bytes: self
                .art
                .tensors
                .values()
                .fold(0u64, |a, t| a.saturating_add(4 * numel(&t.shape))),
            // The observation value itself (every state value too, below).
            bytes_per_env: 4 * numel(obs_shape),
            state_bytes_per_env: 0,
        };
        let mut conv_scratch = 0u64;
        for module in &m.modules {
            self.module_graph(
                module,
                shapes,
                visible,
                &mut total_nodes,
                &mut mem,
                &mut conv_scratch,
            )?;
        }

        // The rest of the per-env memory: raw and preprocessed observation, each state (host row, executor copy,
        // step input and output).
        mem.fixed_bytes = mem.fixed_bytes.saturating_add(conv_scratch);
        mem.bytes_per_env = mem
            .bytes_per_env
            .saturating_add(4 * m.observation.raw_len() as u64)
            .saturating_add(4 * numel(obs_shape));
        if let Some(rec) = &m.recurrent {
            for st in &rec.states {
                mem.state_bytes_per_env = mem
                    .state_bytes_per_env
                    .saturating_add(16 * numel(&st.shape));
            }
        }
        self.check_memory("the policy at batch 1", mem.bytes_for(1, 1))?;
        Ok(mem)
    }

    /// One module's graph: the node count stays within `max_nodes`, its inputs are visible values, each node
    /// reads values defined before it in the module and defines a new one, and its outputs are defined in it
    /// (they become visible to later modules and the policy).
    #[inline(always)]
    fn module_graph(
        &self,
        module: &Module,
        shapes: &mut BTreeMap<String, Vec<usize>>,
        visible: &mut BTreeSet<String>,
        total_nodes: &mut usize,
        mem: &mut MemoryEstimate,
        conv_scratch: &mut u64,
    ) -> Result<(), FormatError> {
        *total_nodes = total_nodes.saturating_add(module.nodes.len());
        if *total_nodes > self.limits.max_nodes {
            return Err(FormatError::TooLarge {
                what: "node count".into(),
                found: *total_nodes as u64,
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
            let out = self.node_output(module, node, &local, mem, conv_scratch)?;
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
        Ok(())
    }

    /// One node: its inputs are defined in the module (`local`), its output's shape follows its op's rule and is
    /// a sane value size, and the memory it adds still fits.
    #[inline(always)]
    fn node_output(
        &self,
        module: &Module,
        node: &Node,
        local: &BTreeMap<&str, Vec<usize>>,
        mem: &mut MemoryEstimate,
        conv_scratch: &mut u64,
    ) -> Result<Vec<usize>, FormatError> {
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
        self.node_memory(node, &out, mem, conv_scratch)?;
        Ok(out)
    }

    /// Memory, node by node, so a huge graph is refused as soon as it stops fitting: the output per env, a packed
    /// copy of each tensor the node reads, a transpose's indices, and the largest convolution scratch.
    #[inline(always)]
    fn node_memory(
        &self,
        node: &Node,
        out: &[usize],
        mem: &mut MemoryEstimate,
        conv_scratch: &mut u64,
    ) -> Result<(), FormatError> {
        mem.bytes_per_env = mem.bytes_per_env.saturating_add(4 * numel(out));
        for t in node.op.tensors() {
            mem.fixed_bytes = mem
                .fixed_bytes
                .saturating_add(4 * numel(&self.art.tensors[t].shape));
        }
        match &node.op {
            Op::Transpose { .. } => {
                mem.fixed_bytes = mem.fixed_bytes.saturating_add(4 * numel(out));
            }
            Op::Conv2d { weight, .. } => {
                // Per env: the patch matrix (output positions x one filter's inputs) and the GEMM result.
                let w = numel(&self.art.tensors[weight].shape);
                let positions = numel(out) / (out[0].max(1) as u64);
                let filter = w / (out[0].max(1) as u64);
                let scratch = positions.saturating_mul(filter).saturating_add(numel(out));
                *conv_scratch = (*conv_scratch).max(4u64.saturating_mul(scratch));
            }
            _ => {}
        }
        self.check_memory(
            &format!("node '{}'", node.name),
            mem.bytes_for(1, 0).saturating_add(*conv_scratch),
        )
    }

    /// The action space: usable sizes (checked before anything multiplies or sums them) and ordered, non-NaN box
    /// bounds, one pair per action element. Returns the numbers per env in an action.
    #[inline(always)]
    fn action_space(&self) -> Result<usize, FormatError> {
        let m = &self.art.manifest;
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
        Ok(action_len)
    }

    /// The distribution against the action space: its kind fits the space, its parameter values are visible and
    /// sized for the action, and its settings are sane; action masks need a discrete space. Returns the numbers
    /// per env in `dist_params`.
    #[inline(always)]
    fn distribution(
        &self,
        visible: &BTreeSet<String>,
        shapes: &BTreeMap<String, Vec<usize>>,
        action_len: usize,
    ) -> Result<usize, FormatError> {
        let m = &self.art.manifest;
        let dist_user = "the distribution";
        let dist_params_len = match (&m.distribution, &m.action) {
            (Distribution::Categorical { logits }, ActionSpace::Discrete { n }) => {
                discrete_params(visible, shapes, "logits", logits, *n)?;
                *n
            }
            (Distribution::MultiCategorical { logits }, ActionSpace::MultiDiscrete { nvec }) => {
                let s = visible_shape(visible, shapes, logits, dist_user)?;
                let total: usize = nvec.iter().sum(); // bounded by max_value_elems above
                if s != vec![total] {
                    return Err(FormatError::shape(
                        dist_user,
                        format!("logits '{logits}' are {s:?}, nvec needs [{total}]"),
                    ));
                }
                total
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
                box_params(visible, shapes, "mean", mean, shape)?;
                self.check_log_std(visible, shapes, log_std, log_std_range, shape)?;
                if matches!(m.distribution, Distribution::SquashedGaussian { .. })
                    && !finite_bounds(low, high)
                {
                    return Err(FormatError::invalid(
                        "action bounds",
                        "a squashed Gaussian needs finite bounds",
                    ));
                }
                2 * action_len // mean, then log-std (after clamping), per row
            }
            (Distribution::QValues { q, epsilon }, ActionSpace::Discrete { n }) => {
                discrete_params(visible, shapes, "q values", q, *n)?;
                if !(0.0..=1.0).contains(epsilon) {
                    return Err(FormatError::invalid(
                        "distribution.epsilon",
                        format!("{epsilon} is not a probability in [0, 1]"),
                    ));
                }
                *n
            }
            (
                Distribution::Deterministic {
                    action,
                    rescale,
                    noise,
                },
                ActionSpace::Box { shape, low, high },
            ) => {
                box_params(visible, shapes, "action", action, shape)?;
                if *rescale && !finite_bounds(low, high) {
                    return Err(FormatError::invalid(
                        "action bounds",
                        "a rescaled deterministic actor needs finite bounds",
                    ));
                }
                if let Some(noise) = noise {
                    check_action_noise(noise, action_len)?;
                }
                action_len // the actor's own output, per row
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
        };

        if m.action_masks && matches!(m.action, ActionSpace::Box { .. }) {
            return Err(FormatError::invalid(
                "action_masks",
                "action masks need a discrete or multi-discrete action space",
            ));
        }
        Ok(dist_params_len)
    }

    /// A Gaussian's log-std: a parameter tensor or a visible value with one number per action element, and a
    /// clamping range (if any) that is ordered and not NaN.
    #[inline(always)]
    fn check_log_std(
        &self,
        visible: &BTreeSet<String>,
        shapes: &BTreeMap<String, Vec<usize>>,
        log_std: &LogStd,
        log_std_range: &Option<(f32, f32)>,
        shape: &[usize],
    ) -> Result<(), FormatError> {
        match log_std {
            LogStd::Parameter { tensor } => {
                self.tensor_with_numel(tensor, "the distribution", shape)?
            }
            LogStd::Value { value } => box_params(visible, shapes, "log_std", value, shape)?,
        }
        if let Some((lo, hi)) = log_std_range {
            if lo.is_nan() || hi.is_nan() || lo > hi {
                return Err(FormatError::invalid(
                    "log_std_range",
                    format!("({lo}, {hi})"),
                ));
            }
        }
        Ok(())
    }

    /// The value estimate (if any) is a visible value of one number, and each recurrent state's next value is
    /// visible and has the state's shape.
    #[inline(always)]
    fn value_and_next_states(
        &self,
        visible: &BTreeSet<String>,
        shapes: &BTreeMap<String, Vec<usize>>,
    ) -> Result<(), FormatError> {
        let m = &self.art.manifest;
        if let Some(v) = &m.value {
            let s = visible_shape(visible, shapes, v, "the value estimate")?;
            if numel(&s) != 1 {
                return Err(FormatError::shape(
                    "the value estimate",
                    format!("'{v}' is {s:?}, must hold 1 number"),
                ));
            }
        }
        if let Some(rec) = &m.recurrent {
            for s in &rec.states {
                let next = visible_shape(
                    visible,
                    shapes,
                    &s.next,
                    &format!("recurrent state '{}'", s.name),
                )?;
                if next != s.shape {
                    return Err(FormatError::shape(
                        format!("recurrent state '{}'", s.name),
                        format!("next '{}' is {next:?}, state is {:?}", s.next, s.shape),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Golden vectors: a batch within `max_golden_batch`, the observation, every checked value and every action
    /// list sized for the batch, something to check, and a tolerance in [0, MAX_GOLDEN_TOLERANCE].
    #[inline(always)]
    fn golden_cases(
        &self,
        shapes: &BTreeMap<String, Vec<usize>>,
        action_len: usize,
    ) -> Result<(), FormatError> {
        let m = &self.art.manifest;
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
        Ok(())
    }
}

/// The shape of value `name` as `user` reads it: defined and visible (a module output, `obs` or a state), or
/// `UndefinedValue`.
fn visible_shape(
    visible: &BTreeSet<String>,
    shapes: &BTreeMap<String, Vec<usize>>,
    name: &str,
    user: &str,
) -> Result<Vec<usize>, FormatError> {
    visible
        .contains(name)
        .then(|| shapes.get(name).cloned())
        .flatten()
        .ok_or_else(|| FormatError::UndefinedValue {
            name: name.into(),
            user: user.into(),
        })
}

/// A discrete distribution's parameter value (`what`: logits or q values) `name`: visible, of shape `[n]`.
fn discrete_params(
    visible: &BTreeSet<String>,
    shapes: &BTreeMap<String, Vec<usize>>,
    what: &str,
    name: &str,
    n: usize,
) -> Result<(), FormatError> {
    let s = visible_shape(visible, shapes, name, "the distribution")?;
    if s != vec![n] {
        return Err(FormatError::shape(
            "the distribution",
            format!("{what} '{name}' are {s:?}, action space needs [{n}]"),
        ));
    }
    Ok(())
}

/// A continuous distribution's value (`what`: mean, log_std or action) `name`: visible, with as many numbers as
/// the box action space `shape`.
fn box_params(
    visible: &BTreeSet<String>,
    shapes: &BTreeMap<String, Vec<usize>>,
    what: &str,
    name: &str,
    shape: &[usize],
) -> Result<(), FormatError> {
    let s = visible_shape(visible, shapes, name, "the distribution")?;
    if numel(&s) != numel(shape) {
        return Err(FormatError::shape(
            "the distribution",
            format!("{what} '{name}' is {s:?}, action space is {shape:?}"),
        ));
    }
    Ok(())
}

/// A deterministic actor's exploration noise: one finite mean and one finite sigma >= 0 per action element.
#[inline(always)]
fn check_action_noise(noise: &ActionNoise, action_len: usize) -> Result<(), FormatError> {
    let ActionNoise { mean, sigma } = noise;
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
    if mean.iter().any(|v| !v.is_finite()) || sigma.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(FormatError::invalid(
            "distribution.noise",
            "means must be finite and sigmas finite and >= 0",
        ));
    }
    Ok(())
}

// Shape rules, one per op family (`Checker::node_shape` dispatches). `user` names the node in errors; values have
// at least one axis, none empty (`check_value_size` holds for every value a node reads).

/// Refuses a node without exactly `n` inputs.
fn arity(user: &str, ins: &[&Vec<usize>], n: usize) -> Result<(), FormatError> {
    if ins.len() != n {
        return Err(FormatError::shape(
            user,
            format!("expects {n} input(s), has {}", ins.len()),
        ));
    }
    Ok(())
}

/// The last axis of a value's shape (never empty: see above).
fn last_axis(s: &[usize]) -> usize {
    *s.last().unwrap()
}

/// Activations and other elementwise maps (relu, tanh, sigmoid, silu, elu, leaky_relu, gelu, erf, softmax,
/// log_softmax, exp) and flatten: one input; elu's and leaky_relu's alpha finite; the output has the input's shape,
/// or for flatten one axis of all its elements.
#[inline(always)]
fn elementwise_shape(
    user: String,
    op: &Op,
    ins: &[&Vec<usize>],
) -> Result<Vec<usize>, FormatError> {
    arity(&user, ins, 1)?;
    if let Op::Elu { alpha } | Op::LeakyRelu { alpha } = op {
        if !alpha.is_finite() {
            return Err(FormatError::invalid(user, "alpha must be finite"));
        }
    }
    Ok(if *op == Op::Flatten {
        vec![numel(ins[0]) as usize]
    } else {
        ins[0].clone()
    })
}

/// Clip: one input, bounds (either optional) ordered and not NaN; the output has the input's shape.
#[inline(always)]
fn clip_shape(
    user: String,
    min: Option<f32>,
    max: Option<f32>,
    ins: &[&Vec<usize>],
) -> Result<Vec<usize>, FormatError> {
    arity(&user, ins, 1)?;
    if min.is_some_and(f32::is_nan)
        || max.is_some_and(f32::is_nan)
        || matches!((min, max), (Some(a), Some(b)) if a > b)
    {
        return Err(FormatError::invalid(
            user,
            format!("bounds {min:?}..{max:?} must be ordered, not NaN"),
        ));
    }
    Ok(ins[0].clone())
}

/// Add and mul: two inputs of one shape, which the output has (no broadcasting).
#[inline(always)]
fn binary_shape(user: String, ins: &[&Vec<usize>]) -> Result<Vec<usize>, FormatError> {
    arity(&user, ins, 2)?;
    if ins[0] != ins[1] {
        return Err(FormatError::shape(
            user,
            format!("input shapes differ: {:?} vs {:?}", ins[0], ins[1]),
        ));
    }
    Ok(ins[0].clone())
}

/// Concat (along the last axis): at least one input, all of one rank and equal but for the last axis; the
/// output's last axis is the sum of theirs.
#[inline(always)]
fn concat_shape(user: String, ins: &[&Vec<usize>]) -> Result<Vec<usize>, FormatError> {
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
        total = total.saturating_add(last_axis(s));
    }
    let mut out = head.to_vec();
    out.push(total);
    Ok(out)
}

/// Slice (of the last axis): one input, `len` >= 1 numbers from `start` inside its last axis; the output's last
/// axis is `len`.
#[inline(always)]
fn slice_shape(
    user: String,
    start: usize,
    len: usize,
    ins: &[&Vec<usize>],
) -> Result<Vec<usize>, FormatError> {
    arity(&user, ins, 1)?;
    if len == 0 || start.checked_add(len).is_none_or(|e| e > last_axis(ins[0])) {
        return Err(FormatError::shape(
            user,
            format!("slice {start}+{len} outside last axis of {:?}", ins[0]),
        ));
    }
    let mut out = ins[0].clone();
    *out.last_mut().unwrap() = len;
    Ok(out)
}

/// Transpose: one input and a permutation `perm` of its axes; output axis `i` is input axis `perm[i]`.
#[inline(always)]
fn transpose_shape(
    user: String,
    perm: &[usize],
    ins: &[&Vec<usize>],
) -> Result<Vec<usize>, FormatError> {
    arity(&user, ins, 1)?;
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
    Ok(perm.iter().map(|&p| ins[0][p]).collect())
}

/// Convolution and pooling read one input of shape `[channels, height, width]`.
fn chw_input<'v>(user: &str, ins: &[&'v Vec<usize>]) -> Result<&'v Vec<usize>, FormatError> {
    arity(user, ins, 1)?;
    let x = ins[0];
    if x.len() != 3 {
        return Err(FormatError::shape(
            user,
            format!("input must be [channels, height, width], is {x:?}"),
        ));
    }
    Ok(x)
}

/// Max pooling: one `[channels, height, width]` input; along height and width the windows fit the padded input
/// ([`window_count`]) and none lies entirely in the padding; the output is `[channels, out_height, out_width]`.
#[inline(always)]
fn max_pool2d_shape(
    user: String,
    kernel: &[usize; 2],
    stride: &[usize; 2],
    padding: &[usize; 4],
    dilation: &[usize; 2],
    ins: &[&Vec<usize>],
) -> Result<Vec<usize>, FormatError> {
    let x = chw_input(&user, ins)?;
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
                    format!("window {o} of axis {} lies entirely in the padding", a + 1),
                ));
            }
        }
        out.push(n);
    }
    Ok(out)
}

// The shape rules that read weight tensors.
impl Checker<'_> {
    /// Dense: one flat input `[n]`, a weight `[out, n]` with `out` >= 1 and a bias (if any) of `out` numbers; the
    /// output is `[out]`.
    #[inline(always)]
    fn dense_shape(
        &self,
        user: String,
        weight: &str,
        bias: Option<&str>,
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        arity(&user, ins, 1)?;
        if ins[0].len() != 1 {
            return Err(FormatError::shape(
                &user,
                format!("input must be flat, is {:?} (add a flatten)", ins[0]),
            ));
        }
        let w = self.tensor(weight, &user)?;
        if w.shape.len() != 2 || w.shape[1] != ins[0][0] || w.shape[0] == 0 {
            return Err(FormatError::TensorShape {
                name: weight.to_owned(),
                user,
                expected: vec![w.shape.first().copied().unwrap_or(0), ins[0][0]],
                found: w.shape.clone(),
            });
        }
        if let Some(b) = bias {
            self.tensor_with_numel(b, &user, &[w.shape[0]])?;
        }
        Ok(vec![w.shape[0]])
    }

    /// Affine (`x * scale + shift`, either optional): one input; each tensor has one number, one per element of
    /// the last axis or one per element of the whole value, and scale and shift agree on which; the output has
    /// the input's shape.
    #[inline(always)]
    fn affine_shape(
        &self,
        user: String,
        scale: Option<&str>,
        shift: Option<&str>,
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        arity(&user, ins, 1)?;
        // Each tensor broadcasts over the last axis or the whole vector (or is one number), and scale
        // and shift must agree on which: runtimes index both by one group (`affine_group`). A scale of
        // the last axis with a shift of the whole vector panicked in the cpu executor and silently used
        // a prefix of the shift elsewhere.
        let whole = numel(ins[0]);
        let mut sizes = Vec::new();
        for t in scale.into_iter().chain(shift) {
            let tn = numel(&self.tensor(t, &user)?.shape);
            if tn != last_axis(ins[0]) as u64 && tn != whole && tn != 1 {
                return Err(FormatError::TensorShape {
                    name: t.to_owned(),
                    user: user.clone(),
                    expected: vec![last_axis(ins[0])],
                    found: self.art.tensors[t].shape.clone(),
                });
            }
            sizes.push(tn);
        }
        let group = if sizes.contains(&whole) {
            whole
        } else {
            last_axis(ins[0]) as u64
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
        Ok(ins[0].clone())
    }

    /// Reshape: one input and a target shape of a sane value size with as many elements, which the output has.
    #[inline(always)]
    fn reshape_shape(
        &self,
        user: String,
        shape: &[usize],
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        arity(&user, ins, 1)?;
        self.check_value_size(&user, shape)?;
        if numel(shape) != numel(ins[0]) {
            return Err(FormatError::shape(
                user,
                format!("cannot reshape {:?} to {shape:?}", ins[0]),
            ));
        }
        Ok(shape.to_vec())
    }

    /// Conv2d: one `[channels, height, width]` input; groups >= 1 dividing the channels and the filters; a
    /// weight `[filters, channels / groups, kernel_h, kernel_w]` with no empty axis and a bias (if any) of
    /// `filters` numbers; the kernel fits the padded input along both axes ([`window_count`]); the output is
    /// `[filters, out_height, out_width]`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn conv2d_shape(
        &self,
        user: String,
        weight: &str,
        bias: Option<&str>,
        stride: &[usize; 2],
        padding: &[usize; 4],
        dilation: &[usize; 2],
        groups: usize,
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        let x = chw_input(&user, ins)?;
        let w = self.tensor(weight, &user)?;
        let g = groups;
        let bad_weight = w.shape.len() != 4
            || g == 0
            || x[0] % g != 0
            || w.shape[0] % g != 0
            || w.shape[1] != x[0] / g
            || w.shape.contains(&0);
        if bad_weight {
            return Err(FormatError::TensorShape {
                name: weight.to_owned(),
                user,
                expected: vec![w.shape.first().copied().unwrap_or(0), x[0] / g.max(1), 0, 0],
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
        Ok(vec![w.shape[0], oh, ow])
    }

    /// Layer norm (over the last axis): one input, epsilon finite and >= 0, scale and bias (if any) one number
    /// per element of the last axis; the output has the input's shape.
    #[inline(always)]
    fn layer_norm_shape(
        &self,
        user: String,
        scale: Option<&str>,
        bias: Option<&str>,
        epsilon: f32,
        ins: &[&Vec<usize>],
    ) -> Result<Vec<usize>, FormatError> {
        arity(&user, ins, 1)?;
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(FormatError::invalid(
                user,
                "epsilon must be finite and >= 0",
            ));
        }
        for t in scale.into_iter().chain(bias) {
            self.tensor_with_numel(t, &user, &[last_axis(ins[0])])?;
        }
        Ok(ins[0].clone())
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

#[cfg(test)]
mod tests {
    use super::window_count;

    /// Found by a refactor's differential harness: padding near u64::MAX overflowed the padded size (a panic
    /// where overflow checks are on, as the fuzzers build) before any check refused it.
    #[test]
    fn window_count_refuses_padding_that_overflows() {
        let e = window_count(8, 3, 1, 1, usize::MAX, usize::MAX).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        assert!(window_count(8, usize::MAX, 1, usize::MAX, 1, 1).is_err());
        // The rule itself: (n + pads - extent) / stride + 1.
        assert_eq!(window_count(84, 8, 4, 1, 0, 0), Ok(20));
        assert_eq!(window_count(16, 3, 1, 1, 1, 1), Ok(16));
        assert_eq!(window_count(16, 4, 2, 1, 1, 1), Ok(8));
        assert_eq!(window_count(7, 3, 1, 2, 0, 0), Ok(3));
    }
}
