//! A float64 interpreter of the artifact's op graphs: the toolchain's oracle when the user brings no golden
//! vectors (e.g. an ONNX file alone), and an independent second implementation for the runtimes' tests.
//! Straight loops, no tricks: it is meant to be obviously right, not fast.

use std::collections::{BTreeMap, HashMap};

use policyport_format::container::Tensor;
use policyport_format::sampling::ActMode;
use policyport_format::{
    Artifact, GoldenCase, Limits, Manifest, Node, OBS_VALUE, ObservationSpace, Op, Preprocess,
    STATE_PREFIX, validate,
};

/// Every value of the namespace for a batch, row-major `batch x numel`, in float64.
pub fn eval(
    manifest: &Manifest,
    tensors: &BTreeMap<String, Tensor>,
    obs: &[f32],
    batch: usize,
) -> Result<HashMap<String, Vec<f64>>, String> {
    eval_step(manifest, tensors, obs, batch, &[])
}

/// [`eval`] from given recurrent states (per state, in manifest order, `batch x numel`; missing ones are zeros):
/// one step of a recurrent policy. The next states are the values the manifest's `next` fields name.
pub fn eval_step(
    manifest: &Manifest,
    tensors: &BTreeMap<String, Tensor>,
    obs: &[f32],
    batch: usize,
    states: &[Vec<f64>],
) -> Result<HashMap<String, Vec<f64>>, String> {
    let art = Artifact {
        manifest: manifest.clone(),
        tensors: tensors.clone(),
        version: (
            policyport_format::FORMAT_MAJOR,
            policyport_format::FORMAT_MINOR,
        ),
    };
    let plan = validate(&art, &Limits::default()).map_err(|e| e.to_string())?;
    let raw = manifest.observation.raw_len();
    if obs.len() != batch * raw {
        return Err(format!(
            "{} obs numbers for batch {batch} x {raw}",
            obs.len()
        ));
    }
    let x = preprocess(manifest, tensors, obs);
    let mut vals = initial_values(manifest, &x, batch, states)?;
    for module in &manifest.modules {
        for node in &module.nodes {
            let y = NodeEval::new(node, tensors, &plan.shapes, &vals, batch).eval();
            vals.insert(node.output.clone(), y);
        }
    }
    Ok(vals)
}

/// The observation after the manifest's preprocessing steps.
fn preprocess(manifest: &Manifest, tensors: &BTreeMap<String, Tensor>, obs: &[f32]) -> Vec<f32> {
    // Preprocessing in f32, exactly as the runtimes do it (it is part of the input contract, not the model).
    let mut x: Vec<f32> = obs.to_vec();
    for p in &manifest.preprocess {
        match p {
            Preprocess::Scale { factor } => x.iter_mut().for_each(|v| *v *= factor),
            Preprocess::Normalize { mean, std, clip } => {
                let (m, s) = (&tensors[mean].data, &tensors[std].data);
                for (i, v) in x.iter_mut().enumerate() {
                    let z = (*v - m[i % m.len()]) / s[i % s.len()];
                    *v = clip.map_or(z, |c| z.clamp(-c, c));
                }
            }
            Preprocess::OneHot { n } => {
                let ObservationSpace::Discrete { .. } = manifest.observation else {
                    unreachable!()
                };
                x = x
                    .iter()
                    .flat_map(|k| (0..*n).map(move |j| if j as f32 == *k { 1.0 } else { 0.0 }))
                    .collect();
            }
        }
    }
    x
}

/// The namespace before the first node: the preprocessed observation and the recurrent states (given or zeros).
fn initial_values(
    manifest: &Manifest,
    x: &[f32],
    batch: usize,
    states: &[Vec<f64>],
) -> Result<HashMap<String, Vec<f64>>, String> {
    let mut vals: HashMap<String, Vec<f64>> = HashMap::new();
    vals.insert(OBS_VALUE.into(), x.iter().map(|v| *v as f64).collect());
    for (k, s) in manifest
        .recurrent
        .iter()
        .flat_map(|r| &r.states)
        .enumerate()
    {
        let n: usize = s.shape.iter().product();
        let v = match states.get(k) {
            Some(v) if v.len() == n * batch => v.clone(),
            Some(v) => {
                return Err(format!(
                    "state '{}' has {} numbers for batch {batch} x {n}",
                    s.name,
                    v.len()
                ));
            }
            None => vec![0.0; n * batch],
        };
        vals.insert(format!("{STATE_PREFIX}{}", s.name), v);
    }
    Ok(vals)
}

/// One node's evaluation: the node, what it reads, and the sizes of its first input that every op uses.
struct NodeEval<'a> {
    node: &'a Node,
    tensors: &'a BTreeMap<String, Tensor>,
    /// Feature shape of every value (the validated plan's).
    shapes: &'a BTreeMap<String, Vec<usize>>,
    vals: &'a HashMap<String, Vec<f64>>,
    batch: usize,
    /// The first input, row-major `batch x w_in`.
    a: &'a [f64],
    /// Numbers per row of the first input.
    w_in: usize,
    /// Length of the first input's last axis.
    last: usize,
}

impl<'a> NodeEval<'a> {
    /// The evaluation of `node` over the values computed so far.
    fn new(
        node: &'a Node,
        tensors: &'a BTreeMap<String, Tensor>,
        shapes: &'a BTreeMap<String, Vec<usize>>,
        vals: &'a HashMap<String, Vec<f64>>,
        batch: usize,
    ) -> Self {
        let a = &vals[&node.inputs[0]];
        let w_in = shapes[&node.inputs[0]].iter().product();
        let last = *shapes[&node.inputs[0]].last().unwrap();
        NodeEval {
            node,
            tensors,
            shapes,
            vals,
            batch,
            a,
            w_in,
            last,
        }
    }

    /// A tensor of the artifact, in float64.
    fn tensor(&self, name: &str) -> Vec<f64> {
        self.tensors[name]
            .data
            .iter()
            .map(|v| *v as f64)
            .collect::<Vec<f64>>()
    }

    /// `f` applied to every number of the first input.
    fn map(&self, f: &dyn Fn(f64) -> f64) -> Vec<f64> {
        self.a.iter().map(|v| f(*v)).collect::<Vec<f64>>()
    }

    /// `f` applied to the first and second inputs, number by number.
    fn zip_second(&self, f: &dyn Fn(f64, f64) -> f64) -> Vec<f64> {
        self.a
            .iter()
            .zip(&self.vals[&self.node.inputs[1]])
            .map(|(x, y)| f(*x, *y))
            .collect()
    }

    /// The node's output, row-major `batch x numel`.
    fn eval(&self) -> Vec<f64> {
        match &self.node.op {
            Op::Dense { weight, bias } => self.dense(weight, bias.as_deref()),
            Op::Relu => self.map(&|v| v.max(0.0)),
            Op::Tanh => self.map(&|v| v.tanh()),
            Op::Sigmoid => self.map(&|v| 1.0 / (1.0 + (-v).exp())),
            Op::Silu => self.map(&|v| v / (1.0 + (-v).exp())),
            Op::Elu { alpha } => self.map(&|v| {
                if v > 0.0 {
                    v
                } else {
                    *alpha as f64 * (v.exp() - 1.0)
                }
            }),
            Op::LeakyRelu { alpha } => self.map(&|v| if v > 0.0 { v } else { *alpha as f64 * v }),
            Op::Erf => self.map(&erf),
            Op::Gelu { approximate: false } => {
                self.map(&|v| 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)))
            }
            Op::Gelu { approximate: true } => self.map(&|v| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            }),
            Op::Softmax => self.softmax(false),
            Op::LogSoftmax => self.softmax(true),
            Op::Add => self.zip_second(&|x, y| x + y),
            Op::Mul => self.zip_second(&|x, y| x * y),
            Op::Affine { scale, shift } => self.affine(scale.as_deref(), shift.as_deref()),
            Op::Concat => self.concat(),
            Op::Slice { start, len } => self
                .a
                .chunks_exact(self.last)
                .flat_map(|g| g[*start..start + len].to_vec())
                .collect(),
            Op::Flatten | Op::Reshape { .. } => self.a.to_vec(),
            Op::Exp => self.map(&f64::exp),
            Op::Clip { min, max } => self.map(&|v| {
                let v = min.map_or(v, |m| v.max(m as f64));
                max.map_or(v, |m| v.min(m as f64))
            }),
            Op::Transpose { perm } => self.transpose(perm),
            Op::Conv2d {
                weight,
                bias,
                stride,
                padding,
                dilation,
                groups,
            } => self.conv2d(weight, bias.as_deref(), stride, padding, dilation, *groups),
            Op::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
            } => self.max_pool2d(kernel, stride, padding, dilation),
            Op::LayerNorm {
                scale,
                bias,
                epsilon,
            } => self.layer_norm(scale.as_deref(), bias.as_deref(), *epsilon),
        }
    }

    /// `y = x W^T + b`.
    fn dense(&self, weight: &str, bias: Option<&str>) -> Vec<f64> {
        let (a, batch, w_in) = (self.a, self.batch, self.w_in);
        let w = self.tensor(weight);
        let o = self.tensors[weight].shape[0];
        let b = bias.map(|b| self.tensor(b));
        let mut y = vec![0.0; batch * o];
        for r in 0..batch {
            for j in 0..o {
                let mut acc = b.as_ref().map_or(0.0, |b| b[j]);
                for k in 0..w_in {
                    acc += a[r * w_in + k] * w[j * w_in + k];
                }
                y[r * o + j] = acc;
            }
        }
        y
    }

    /// Softmax (or, with `log`, log-softmax) over the last axis.
    fn softmax(&self, log: bool) -> Vec<f64> {
        let mut y = self.a.to_vec();
        for g in y.chunks_exact_mut(self.last) {
            let m = g.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = g.iter().map(|v| (v - m).exp()).sum();
            for v in g.iter_mut() {
                *v = if !log {
                    (*v - m).exp() / z
                } else {
                    *v - m - z.ln()
                };
            }
        }
        y
    }

    /// `x * scale + shift`, each a scalar, a full row or a last-axis vector.
    fn affine(&self, scale: Option<&str>, shift: Option<&str>) -> Vec<f64> {
        let (w_in, last) = (self.w_in, self.last);
        let (sc, sh) = (scale.map(|s| self.tensor(s)), shift.map(|s| self.tensor(s)));
        self.a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let col = i % w_in;
                let pick = |p: &Vec<f64>| {
                    p[if p.len() == 1 {
                        0
                    } else if p.len() == w_in {
                        col
                    } else {
                        col % last
                    }]
                };
                v * sc.as_ref().map_or(1.0, pick) + sh.as_ref().map_or(0.0, pick)
            })
            .collect()
    }

    /// The inputs joined along the last axis.
    fn concat(&self) -> Vec<f64> {
        let parts: Vec<(&Vec<f64>, usize)> = self
            .node
            .inputs
            .iter()
            .map(|n| (&self.vals[n], *self.shapes[n].last().unwrap()))
            .collect();
        let groups = self.a.len() / self.last;
        let mut y = vec![];
        for g in 0..groups {
            for (p, l) in &parts {
                y.extend_from_slice(&p[g * l..(g + 1) * l]);
            }
        }
        y
    }

    /// The feature axes permuted by `perm`.
    fn transpose(&self, perm: &[usize]) -> Vec<f64> {
        let (a, w_in) = (self.a, self.w_in);
        let shape = &self.shapes[&self.node.inputs[0]];
        let rank = shape.len();
        let mut strides = vec![1usize; rank];
        for d in (0..rank - 1).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let mut y = Vec::with_capacity(a.len());
        for r in 0..self.batch {
            for i in 0..w_in {
                // Unravel i over the output shape, then read the input at the permuted position.
                let (mut rest, mut src) = (i, 0);
                for d in (0..rank).rev() {
                    src += (rest % out_shape[d]) * strides[perm[d]];
                    rest /= out_shape[d];
                }
                y.push(a[r * w_in + src]);
            }
        }
        y
    }

    /// A grouped 2-D convolution over `[channels, height, width]`.
    fn conv2d(
        &self,
        weight: &str,
        bias: Option<&str>,
        stride: &[usize; 2],
        padding: &[usize; 4],
        dilation: &[usize; 2],
        groups: usize,
    ) -> Vec<f64> {
        let (a, batch, w_in) = (self.a, self.batch, self.w_in);
        let (xs, ys) = (
            &self.shapes[&self.node.inputs[0]],
            &self.shapes[&self.node.output],
        );
        let ws = &self.tensors[weight].shape;
        let (w, b) = (self.tensor(weight), bias.map(|b| self.tensor(b)));
        let (c, h, wd) = (xs[0], xs[1] as i64, xs[2] as i64);
        let (o, oh, ow) = (ys[0], ys[1], ys[2]);
        let (cg, kh, kw) = (ws[1], ws[2], ws[3]);
        let og = o / groups;
        let mut y = vec![0.0; batch * o * oh * ow];
        for r in 0..batch {
            let x = &a[r * w_in..(r + 1) * w_in];
            for oc in 0..o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = b.as_ref().map_or(0.0, |b| b[oc]);
                        for ci in 0..cg {
                            let ch = g * cg + ci;
                            for ky in 0..kh {
                                let iy =
                                    (oy * stride[0] + ky * dilation[0]) as i64 - padding[0] as i64;
                                for kx in 0..kw {
                                    let ix = (ox * stride[1] + kx * dilation[1]) as i64
                                        - padding[1] as i64;
                                    if iy >= 0 && iy < h && ix >= 0 && ix < wd {
                                        acc += x[(ch * h as usize + iy as usize) * wd as usize
                                            + ix as usize]
                                            * w[((oc * cg + ci) * kh + ky) * kw + kx];
                                    }
                                }
                            }
                        }
                        y[((r * o + oc) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
            let _ = c;
        }
        y
    }

    /// 2-D max pooling over `[channels, height, width]` (padding never wins).
    fn max_pool2d(
        &self,
        kernel: &[usize; 2],
        stride: &[usize; 2],
        padding: &[usize; 4],
        dilation: &[usize; 2],
    ) -> Vec<f64> {
        let (a, batch) = (self.a, self.batch);
        let (xs, ys) = (
            &self.shapes[&self.node.inputs[0]],
            &self.shapes[&self.node.output],
        );
        let (c, h, wd) = (xs[0], xs[1] as i64, xs[2] as i64);
        let (oh, ow) = (ys[1], ys[2]);
        let mut y = vec![f64::NEG_INFINITY; batch * c * oh * ow];
        for rc in 0..batch * c {
            let x = &a[rc * (h * wd) as usize..][..(h * wd) as usize];
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut m = f64::NEG_INFINITY;
                    for ky in 0..kernel[0] {
                        let iy = (oy * stride[0] + ky * dilation[0]) as i64 - padding[0] as i64;
                        for kx in 0..kernel[1] {
                            let ix = (ox * stride[1] + kx * dilation[1]) as i64 - padding[1] as i64;
                            if iy >= 0 && iy < h && ix >= 0 && ix < wd {
                                m = m.max(x[(iy * wd + ix) as usize]);
                            }
                        }
                    }
                    y[(rc * oh + oy) * ow + ox] = m;
                }
            }
        }
        y
    }

    /// Layer normalisation over the last axis, with optional per-feature scale and bias.
    fn layer_norm(&self, scale: Option<&str>, bias: Option<&str>, epsilon: f32) -> Vec<f64> {
        let last = self.last;
        let (sc, bi) = (scale.map(|s| self.tensor(s)), bias.map(|b| self.tensor(b)));
        let mut y = self.a.to_vec();
        for g in y.chunks_exact_mut(last) {
            let mean = g.iter().sum::<f64>() / last as f64;
            let var = g.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / last as f64;
            let r = 1.0 / (var + epsilon as f64).sqrt();
            for (i, v) in g.iter_mut().enumerate() {
                *v = (*v - mean) * r * sc.as_ref().map_or(1.0, |s| s[i])
                    + bi.as_ref().map_or(0.0, |b| b[i]);
            }
        }
        y
    }
}

/// erf in float64: Maclaurin series below |x| = 3 (≈1e-15 absolute), continued fraction for erfc above.
fn erf(x: f64) -> f64 {
    let ax = x.abs();
    if ax < 3.0 {
        let (mut term, mut sum, mut n) = (ax, ax, 0.0f64);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -ax * ax / n;
            sum += term / (2.0 * n + 1.0);
        }
        return x.signum() * sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    let mut f = ax;
    for k in (1..=80).rev() {
        f = ax + (k as f64 / 2.0) / f;
    }
    let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f;
    x.signum() * (1.0 - erfc)
}

/// Golden vectors from the reference interpreter, for artifacts compiled without oracle outputs.
pub fn make_golden(
    manifest: &Manifest,
    tensors: &BTreeMap<String, Tensor>,
    cases: &[(String, Vec<f32>, usize, u64, u64, u32)],
) -> Result<Vec<GoldenCase>, String> {
    let art = Artifact {
        manifest: manifest.clone(),
        tensors: tensors.clone(),
        version: (
            policyport_format::FORMAT_MAJOR,
            policyport_format::FORMAT_MINOR,
        ),
    };
    let plan = validate(&art, &Limits::default()).map_err(|e| e.to_string())?;
    let sampler = plan.head;
    let dist_values: Vec<&str> = manifest.distribution.param_values();
    let mut out = vec![];
    for (name, obs, batch, seed, step, env_offset) in cases {
        let vals = eval(manifest, tensors, obs, *batch)?;
        let mut values = BTreeMap::new();
        for v in dist_values.iter().copied().chain(manifest.value.as_deref()) {
            values.insert(v.to_string(), vals[v].clone());
        }
        let k = sampler.action_len();
        let p = sampler.dist_params_len();
        let raw: usize = dist_values.iter().map(|v| vals[*v].len() / batch).sum();
        let (mut sampled, mut det) = (vec![], vec![]);
        for r in 0..*batch {
            let mut params = vec![0.0f32; p];
            let mut off = 0;
            for v in &dist_values {
                let w = vals[*v].len() / batch;
                for j in 0..w {
                    params[off + j] = vals[*v][r * w + j] as f32;
                }
                off += w;
            }
            debug_assert_eq!(off, raw);
            sampler.finish_params(&mut params);
            for (mode, dst) in [
                (
                    ActMode::Sample {
                        seed: *seed,
                        step: *step,
                    },
                    &mut sampled,
                ),
                (ActMode::Deterministic, &mut det),
            ] {
                let (mut d, mut c) = (vec![0i64; k], vec![0.0f32; k]);
                sampler.act_row(&params, mode, env_offset + r as u32, &mut d, &mut c);
                if sampler.is_discrete() {
                    dst.extend(d.iter().map(|v| *v as f64));
                } else {
                    dst.extend(c.iter().map(|v| *v as f64));
                }
            }
        }
        out.push(GoldenCase {
            name: name.clone(),
            batch: *batch,
            obs: obs.clone(),
            seed: *seed,
            step: *step,
            env_offset: *env_offset,
            tolerance: 1e-5,
            values,
            sampled_actions: sampled,
            deterministic_actions: det,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-3.0, -0.999_977_909_503_001_4),
            (5.0, 0.999_999_999_998_462_5),
        ] {
            assert!(
                (super::erf(x) - want).abs() < 1e-13,
                "erf({x}) = {} want {want}",
                super::erf(x)
            );
        }
    }
}
