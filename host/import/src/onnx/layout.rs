//! The ONNX ops of pixel, normalised and exported-by-dynamo policies: Conv, MaxPool, LayerNormalization,
//! Transpose, Cast, Clip, Exp, Neg, and the shape arithmetic both exporters emit around reshapes
//! (Shape → Gather/Slice → Unsqueeze → Concat → Reshape), which is folded at import: shapes are constants here,
//! except the batch size, which travels through the folding as a marker ([`BATCH`]) and must come out as the
//! leading axis of every reshape.

use policyport_format::Op;
use policyport_format::validate::window_count;

use super::{Const, Importer, NodeIn, Val, attr, node_label};
use crate::ImportError;
use crate::onnx_proto::{self as pb, data_type};

/// Stands for the (run-time) batch size inside folded shape arithmetic. Exactly representable, far from any
/// real dimension; arithmetic on it (other than copying) gives something else, which a reshape then refuses.
pub(super) const BATCH: f64 = -9_007_199_254_740_000.0;

fn ints(node: &pb::NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}

fn int(node: &pb::NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}

/// A non-negative attribute value as usize.
/// An attribute size (kernel, stride, pad, dilation, ...): non-negative and at most 2^24 — the format's limit on
/// a value's elements — so products of two never overflow (a stride of 2^40 times a count did).
fn dim(v: i64, what: &str, label: &str) -> Result<usize, ImportError> {
    usize::try_from(v)
        .ok()
        .filter(|v| *v <= MAX_ATTR_SIZE)
        .ok_or_else(|| ImportError::Malformed(format!("node {label}: {what} {v}")))
}

/// The largest size an attribute may give ([`dim`]).
pub(super) const MAX_ATTR_SIZE: usize = 1 << 24;

fn pair(v: &[i64], what: &str, label: &str) -> Result<[usize; 2], ImportError> {
    match v {
        [a, b] => Ok([dim(*a, what, label)?, dim(*b, what, label)?]),
        _ => Err(ImportError::Malformed(format!(
            "node {label}: {what} {v:?} must have 2 values (2-D spatial ops)"
        ))),
    }
}

impl Importer {
    /// Handles the op if it is one of this module's; `Ok(false)` if not.
    fn op_cast(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let to = int(node, "to", data_type::FLOAT as i64) as i32;
        let v = match self.arg(ins, 0, node, idx)? {
            Val::Stacked { .. } => return Err(self.stacked_input(node, idx)),
            Val::Const(c) => Val::Const(cast_const(c, to)),
            // Run-time values are f32 here (uint8 observations arrive as exact f32 bytes), so a cast
            // to a float type is the identity; to an integer type it would truncate.
            v @ Val::Runtime { .. } => {
                if !matches!(
                    to,
                    data_type::FLOAT | data_type::DOUBLE | data_type::FLOAT16 | data_type::BFLOAT16
                ) {
                    return Err(self.unsupported(
                        node,
                        idx,
                        &format!("cast of a run-time value to ONNX type {to}"),
                        "only casts to float types are supported on values computed per step",
                    ));
                }
                v.clone()
            }
        };
        self.vals.insert(out.to_string(), v);
        Ok(())
    }

    fn op_neg(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        match self.arg(ins, 0, node, idx)? {
            Val::Stacked { .. } => return Err(self.stacked_input(node, idx)),
            Val::Const(c) => {
                let c = Const {
                    dims: c.dims.clone(),
                    data: c.data.iter().map(|v| -v).collect(),
                };
                self.vals.insert(out.to_string(), Val::Const(c));
            }
            Val::Runtime { name, shape } => {
                let (name, shape) = (name.clone(), shape.clone());
                let neg = self.add_tensor(&format!("{label}.neg"), vec![1], vec![-1.0]);
                self.emit(
                    &label,
                    Op::Affine {
                        scale: Some(neg),
                        shift: None,
                    },
                    vec![name],
                    out,
                    shape,
                );
            }
        };
        Ok(())
    }

    fn op_exp(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_arg(ins, 0, node, idx)?;
        self.emit(&label, Op::Exp, vec![x], out, xs);
        Ok(())
    }

    fn op_clip(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_arg(ins, 0, node, idx)?;
        // Opset >= 11: bounds are (optional, constant) inputs; before: attributes.
        let bound = |i: usize, a: &str| -> Result<Option<f32>, ImportError> {
            let named = node.input.get(i).is_some_and(|n| !n.is_empty());
            if named {
                match self.vals.get(&node.input[i]) {
                    Some(Val::Const(c)) if c.numel() == 1 => Ok(Some(c.data[0] as f32)),
                    _ => Err(self.unsupported(
                        node,
                        idx,
                        "bounds computed at run time",
                        "clip to constant bounds",
                    )),
                }
            } else {
                Ok(attr(node, a).map(|a| a.f))
            }
        };
        let (min, max) = (bound(1, "min")?, bound(2, "max")?);
        self.emit(&label, Op::Clip { min, max }, vec![x], out, xs);
        Ok(())
    }

    fn op_transpose_const(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let node = n.node;
        let ins = &n.ins[..];
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        // A constant transposed (a weight the exporter left as `W^T`): folded.
        let Some(Val::Const(c)) = ins.first() else {
            unreachable!()
        };
        let rank = c.dims.len();
        let perm = ints(node, "perm").unwrap_or_else(|| (0..rank as i64).rev().collect());
        let mut seen = vec![false; rank];
        let ok = perm.len() == rank
            && perm.iter().all(|&p| {
                usize::try_from(p)
                    .ok()
                    .filter(|p| *p < rank)
                    .is_some_and(|p| !std::mem::replace(&mut seen[p], true))
            });
        if !ok {
            return Err(ImportError::Malformed(format!(
                "node {label}: perm {perm:?} for rank {rank}"
            )));
        }
        let perm: Vec<usize> = perm.iter().map(|p| *p as usize).collect();
        let odims: Vec<usize> = perm.iter().map(|&p| c.dims[p]).collect();
        let mut strides = vec![1usize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * c.dims[d + 1];
        }
        let mut data = Vec::with_capacity(c.numel());
        let mut at = vec![0usize; rank];
        for _ in 0..c.numel() {
            data.push(
                c.data[at
                    .iter()
                    .zip(&perm)
                    .map(|(i, &p)| i * strides[p])
                    .sum::<usize>()],
            );
            for d in (0..rank).rev() {
                at[d] += 1;
                if at[d] < odims[d] {
                    break;
                }
                at[d] = 0;
            }
        }
        self.vals
            .insert(out.to_string(), Val::Const(Const { dims: odims, data }));
        Ok(())
    }

    fn op_transpose(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let v = self.arg(ins, 0, node, idx)?.clone();
        let Val::Runtime { name, shape } = v else {
            return Err(self.unsupported(node, idx, "constant input", "constant-fold the graph"));
        };
        let rank = shape.len() + 1;
        let perm = ints(node, "perm").unwrap_or_else(|| (0..rank as i64).rev().collect());
        if perm.len() != rank || perm[0] != 0 {
            return Err(self.unsupported(
                node,
                idx,
                &format!("perm {perm:?} on a rank-{rank} value"),
                "the batch axis must stay first",
            ));
        }
        let fperm: Vec<usize> = perm[1..]
            .iter()
            .map(|&p| {
                usize::try_from(p - 1)
                    .ok()
                    .filter(|p| *p < shape.len())
                    .ok_or_else(|| ImportError::Malformed(format!("node {label}: perm {perm:?}")))
            })
            .collect::<Result<_, _>>()?;
        if fperm.iter().enumerate().all(|(i, p)| i == *p) {
            self.vals
                .insert(out.to_string(), Val::Runtime { name, shape });
        } else {
            let oshape = fperm.iter().map(|&p| shape[p]).collect();
            self.emit(
                &label,
                Op::Transpose { perm: fperm },
                vec![name],
                out,
                oshape,
            );
        }
        Ok(())
    }

    pub(super) fn op_shape(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let dims: Vec<f64> = match self.arg(ins, 0, node, idx)? {
            Val::Runtime { shape, .. } => std::iter::once(BATCH)
                .chain(shape.iter().map(|d| *d as f64))
                .collect(),
            Val::Const(c) => c.dims.iter().map(|d| *d as f64).collect(),
            // (Stacked inputs reach recurrent.rs, which reads Shape through this handler: see there.)
            Val::Stacked { parts, shape, dir } => std::iter::once(parts.len() as f64)
                .chain(dir.then_some(1.0))
                .chain(std::iter::once(BATCH))
                .chain(shape.iter().map(|d| *d as f64))
                .collect(),
        };
        let r = dims.len() as i64;
        let norm = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (s, e) = (norm(int(node, "start", 0)), norm(int(node, "end", r)));
        let data = dims[s..e.max(s)].to_vec();
        self.set_vector(out, data);
        Ok(())
    }

    fn op_gather(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let axis = int(node, "axis", 0);
        let (Val::Const(data), Some(Val::Const(index))) =
            (self.arg(ins, 0, node, idx)?, ins.get(1))
        else {
            return Err(self.unsupported(
                node,
                idx,
                "gather from a run-time value or with run-time indices",
                "only shape arithmetic (constants) is folded",
            ));
        };
        let c = gather_const(data, index, axis)
            .map_err(|e| ImportError::Malformed(format!("node {label}: {e}")))?;
        self.vals.insert(out.to_string(), Val::Const(c));
        Ok(())
    }

    fn op_squeeze_unsqueeze(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let axes = match ins.get(1) {
            Some(Val::Const(c)) => Some(c.data.iter().map(|v| *v as i64).collect()),
            Some(Val::Runtime { .. } | Val::Stacked { .. }) => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "axes computed at run time",
                    "use constant axes",
                ));
            }
            None => ints(node, "axes"),
        };
        let squeeze = node.op_type == "Squeeze";
        match self.arg(ins, 0, node, idx)?.clone() {
            Val::Const(c) => {
                let dims = squeeze_dims(&c.dims, axes.as_deref(), squeeze)
                    .map_err(|e| ImportError::Malformed(format!("node {label}: {e}")))?;
                self.vals
                    .insert(out.to_string(), Val::Const(Const { dims, data: c.data }));
            }
            Val::Runtime { name, shape } if !squeeze && axes.as_deref() == Some(&[0]) => {
                // A time axis of one in front (a recurrent op's input): see recurrent.rs.
                self.vals.insert(
                    out.to_string(),
                    Val::Stacked {
                        parts: vec![name],
                        shape,
                        dir: false,
                    },
                );
            }
            Val::Stacked { .. } => return Err(self.stacked_input(node, idx)),
            Val::Runtime { name, shape } => {
                let full: Vec<usize> = std::iter::once(0).chain(shape.clone()).collect();
                let dims = squeeze_dims(&full, axes.as_deref(), squeeze).ok();
                // Only the feature axes may change: the batch axis must stay axis 0.
                let keeps_batch = axes.as_ref().is_some_and(|a| {
                    let r = (full.len() + if squeeze { 0 } else { a.len() }) as i64;
                    a.iter().all(|&x| (if x < 0 { x + r } else { x }) != 0)
                });
                let Some(dims) = dims.filter(|d| keeps_batch && d.len() >= 2) else {
                    return Err(self.unsupported(
                        node,
                        idx,
                        &format!("axes {axes:?} on a value of shape [batch] + {shape:?}"),
                        "squeeze/unsqueeze feature axes only, keeping at least one",
                    ));
                };
                let fshape = dims[1..].to_vec();
                self.emit(
                    &label,
                    Op::Reshape {
                        shape: fshape.clone(),
                    },
                    vec![name],
                    out,
                    fshape,
                );
            }
        }
        Ok(())
    }

    fn op_split(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        self.split(node, idx, ins)?;
        Ok(())
    }

    fn op_conv(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        self.conv(node, idx, ins, out)?;
        Ok(())
    }

    fn op_max_pool(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        self.max_pool(node, idx, ins, out)?;
        Ok(())
    }

    fn op_layer_normalization(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.as_str();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_arg(ins, 0, node, idx)?;
        let axis = int(node, "axis", -1);
        if Self::feature_axis(axis, xs.len()) != Some(xs.len() - 1) {
            return Err(self.unsupported(
                node,
                idx,
                &format!("axis {axis}"),
                "normalise over the last axis only",
            ));
        }
        if node.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Err(self.unsupported(
                node,
                idx,
                "mean / inv-std-dev outputs are used",
                "use only the normalised output",
            ));
        }
        let last = *xs.last().expect("feature rank >= 1");
        let mut param = |i: usize, what: &str| -> Result<Option<String>, ImportError> {
            match ins.get(i) {
                None => Ok(None),
                Some(Val::Const(c)) if c.numel() == last || c.numel() == 1 => {
                    let d: Vec<f32> = (0..last)
                        .map(|k| c.data[if c.numel() == 1 { 0 } else { k }] as f32)
                        .collect();
                    Ok(Some(self.add_tensor(
                        &format!("{label}.{what}"),
                        vec![last],
                        d,
                    )))
                }
                Some(_) => Err(self.unsupported(
                    node,
                    idx,
                    &format!("{what} is not a constant of {last} values"),
                    "use constant per-feature parameters",
                )),
            }
        };
        let scale = param(1, "scale")?;
        let bias = param(2, "bias")?;
        let epsilon = attr(node, "epsilon").map_or(1e-5, |a| a.f);
        self.emit(
            &label,
            Op::LayerNorm {
                scale,
                bias,
                epsilon,
            },
            vec![x],
            out,
            xs,
        );
        Ok(())
    }

    fn arg<'v>(
        &self,
        ins: &'v [Val],
        i: usize,
        node: &pb::NodeProto,
        idx: usize,
    ) -> Result<&'v Val, ImportError> {
        ins.get(i).ok_or_else(|| {
            ImportError::Malformed(format!(
                "node {} ({}) needs input {i}",
                node_label(node, idx),
                node.op_type
            ))
        })
    }

    /// Input `i` as a run-time value: (IR name, feature shape).
    pub(super) fn runtime_arg(
        &self,
        ins: &[Val],
        i: usize,
        node: &pb::NodeProto,
        idx: usize,
    ) -> Result<(String, Vec<usize>), ImportError> {
        match self.arg(ins, i, node, idx)? {
            Val::Runtime { name, shape } => Ok((name.clone(), shape.clone())),
            Val::Stacked { .. } => Err(self.stacked_input(node, idx)),
            Val::Const(_) => Err(self.unsupported(
                node,
                idx,
                "constant input",
                "constant-fold the graph before export",
            )),
        }
    }

    /// `Split` of a run-time value (e.g. `mean, log_std = x.chunk(2, -1)` in a SAC actor): the sizes from the
    /// `split` input (opset ≥ 13) or attribute, else `num_outputs` (opset 18: chunks of ceil(n / k), the last
    /// smaller), else equal parts over the node's outputs. Along the last feature axis each part is a `slice`;
    /// along an earlier axis with only axes of one before it the parts are contiguous runs of each env's values
    /// (flatten, slice, reshape). Other axes would interleave and are refused by name.
    fn split(&mut self, node: &pb::NodeProto, idx: usize, ins: &[Val]) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let (x, xs) = self.runtime_arg(ins, 0, node, idx)?;
        let Some(axis) = Self::feature_axis(int(node, "axis", 0), xs.len()) else {
            return Err(self.unsupported(
                node,
                idx,
                &format!("axis {} of [batch] + {xs:?}", int(node, "axis", 0)),
                "split a feature axis",
            ));
        };
        let n = xs[axis];
        let outs = node.output.len();
        let sizes: Vec<i64> = match (ins.get(1), ints(node, "split")) {
            (Some(Val::Const(c)), _) => c.data.iter().map(|v| *v as i64).collect(),
            (Some(_), _) => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "split sizes computed at run time",
                    "use constant split sizes",
                ));
            }
            (None, Some(s)) => s,
            (None, None) => {
                let k = int(node, "num_outputs", outs as i64);
                if k < 1 || k as usize != outs {
                    return Err(ImportError::Malformed(format!(
                        "node {label}: num_outputs {k} for {outs} outputs"
                    )));
                }
                let chunk = n.div_ceil(k as usize) as i64;
                (0..k)
                    .map(|i| chunk.min(n as i64 - i * chunk).max(0))
                    .collect()
            }
        };
        if sizes.len() != outs
            || sizes.iter().any(|s| *s < 1)
            || sizes.iter().sum::<i64>() != n as i64
        {
            return Err(ImportError::Malformed(format!(
                "node {label}: split sizes {sizes:?} for {outs} outputs of an axis of {n}"
            )));
        }
        let last = axis + 1 == xs.len();
        let inner: usize = xs[axis + 1..].iter().product();
        if !last && xs[..axis].iter().any(|d| *d != 1) {
            return Err(self.unsupported(
                node,
                idx,
                &format!("a split of axis {axis} of {xs:?} (its parts interleave in memory)"),
                "split the last feature axis, or an axis with only axes of one before it",
            ));
        }
        let flat = if last || xs.len() == 1 {
            x
        } else {
            let f = format!("{label}.flat");
            self.emit(&f, Op::Flatten, vec![x], &f, vec![xs.iter().product()]);
            Importer::ir_name(&f)
        };
        let mut start = 0usize;
        for (o, len) in node.output.iter().zip(&sizes) {
            let len = *len as usize;
            let mut shape = xs.clone();
            shape[axis] = len;
            if last || xs.len() == 1 {
                self.emit(o, Op::Slice { start, len }, vec![flat.clone()], o, shape);
            } else {
                let part = format!("{o}.flat");
                self.emit(
                    &part,
                    Op::Slice {
                        start: start * inner,
                        len: len * inner,
                    },
                    vec![flat.clone()],
                    &part,
                    vec![len * inner],
                );
                self.emit(
                    o,
                    Op::Reshape {
                        shape: shape.clone(),
                    },
                    vec![Importer::ir_name(&part)],
                    o,
                    shape,
                );
            }
            start += len;
        }
        Ok(())
    }

    /// Spatial geometry shared by Conv and MaxPool: kernel, strides, dilations and the 4 pads
    /// (`[top, left, bottom, right]`, from `pads` or `auto_pad`).
    fn window_attrs(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        input: &[usize],
        kernel: [usize; 2],
    ) -> Result<([usize; 2], [usize; 4], [usize; 2]), ImportError> {
        let label = node_label(node, idx);
        let stride = pair(
            &ints(node, "strides").unwrap_or(vec![1, 1]),
            "strides",
            &label,
        )?;
        let dilation = pair(
            &ints(node, "dilations").unwrap_or(vec![1, 1]),
            "dilations",
            &label,
        )?;
        // Zero strides divided by zero in the ceil-mode rule and zero kernels underflowed `kernel - 1`, both
        // before window_count's own check: refused here, first.
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(ImportError::Malformed(format!(
                "node {label}: kernel {kernel:?}, strides {stride:?} and dilations {dilation:?} must be >= 1"
            )));
        }
        let auto = attr(node, "auto_pad").map_or(&b"NOTSET"[..], |a| a.s.as_slice());
        let padding = match auto {
            b"NOTSET" => {
                let p = ints(node, "pads").unwrap_or(vec![0; 4]);
                if p.len() != 4 {
                    return Err(ImportError::Malformed(format!("node {label}: pads {p:?}")));
                }
                let mut out = [0usize; 4];
                for (o, v) in out.iter_mut().zip(&p) {
                    *o = dim(*v, "pad", &label)?;
                }
                out
            }
            b"VALID" => [0; 4],
            b"SAME_UPPER" | b"SAME_LOWER" => {
                let mut out = [0usize; 4];
                for a in 0..2 {
                    let n = input[1 + a];
                    let want = n.div_ceil(stride[a].max(1));
                    let extent = dilation[a] * (kernel[a].max(1) - 1) + 1;
                    let total = ((want.saturating_sub(1)) * stride[a] + extent).saturating_sub(n);
                    let (small, big) = (total / 2, total - total / 2);
                    let (begin, end) = if auto == b"SAME_UPPER" {
                        (small, big)
                    } else {
                        (big, small)
                    };
                    out[a] = begin;
                    out[a + 2] = end;
                }
                out
            }
            other => {
                return Err(self.unsupported(
                    node,
                    idx,
                    &format!("auto_pad {}", String::from_utf8_lossy(other)),
                    "use NOTSET, VALID, SAME_UPPER or SAME_LOWER",
                ));
            }
        };
        Ok((stride, padding, dilation))
    }

    fn spatial_input(
        &self,
        ins: &[Val],
        node: &pb::NodeProto,
        idx: usize,
    ) -> Result<(String, Vec<usize>), ImportError> {
        let (x, xs) = self.runtime_arg(ins, 0, node, idx)?;
        if xs.len() != 3 {
            return Err(self.unsupported(
                node,
                idx,
                &format!("input of shape [batch] + {xs:?}"),
                "2-D spatial ops take [batch, channels, height, width] (1-D and 3-D are not supported yet)",
            ));
        }
        Ok((x, xs))
    }

    fn conv(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        out: &str,
    ) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let (x, xs) = self.spatial_input(ins, node, idx)?;
        let Some(Val::Const(w)) = ins.get(1) else {
            return Err(self.unsupported(
                node,
                idx,
                "weights computed at run time",
                "only constant weights are supported",
            ));
        };
        if w.dims.len() != 4 {
            return Err(ImportError::Malformed(format!(
                "node {label}: weight dims {:?} (expected [out, in/groups, kh, kw])",
                w.dims
            )));
        }
        let groups = dim(int(node, "group", 1), "group", &label)?;
        let kernel = [w.dims[2], w.dims[3]];
        if let Some(k) = ints(node, "kernel_shape")
            && pair(&k, "kernel_shape", &label)? != kernel
        {
            return Err(ImportError::Malformed(format!(
                "node {label}: kernel_shape {k:?} disagrees with the weight {:?}",
                w.dims
            )));
        }
        let (stride, padding, dilation) = self.window_attrs(node, idx, &xs, kernel)?;
        let o = w.dims[0];
        let bias = match ins.get(2) {
            None => None,
            Some(Val::Const(b)) if b.numel() == o => {
                Some(b.data.iter().map(|v| *v as f32).collect())
            }
            Some(_) => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "bias is not a constant per output channel",
                    "use a constant bias",
                ));
            }
        };
        if groups == 0
            || xs[0] % groups != 0
            || o % groups != 0
            || w.dims[1].checked_mul(groups) != Some(xs[0])
        {
            return Err(ImportError::Malformed(format!(
                "node {label}: weight {:?} with {groups} group(s) on {} input channels",
                w.dims, xs[0]
            )));
        }
        let mut oshape = vec![o];
        for a in 0..2 {
            oshape.push(
                window_count(
                    xs[1 + a],
                    kernel[a],
                    stride[a],
                    dilation[a],
                    padding[a],
                    padding[a + 2],
                )
                .map_err(|e| self.unsupported(node, idx, &e, "check the geometry"))?,
            );
        }
        let wname = self.add_tensor(
            &format!("{}.weight", node.input[1]),
            w.dims.clone(),
            w.data.iter().map(|v| *v as f32).collect(),
        );
        let bname = bias.map(|b| self.add_tensor(&format!("{}.bias", node.input[2]), vec![o], b));
        self.emit(
            &label,
            Op::Conv2d {
                weight: wname,
                bias: bname,
                stride,
                padding,
                dilation,
                groups,
            },
            vec![x],
            out,
            oshape,
        );
        Ok(())
    }

    fn max_pool(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        out: &str,
    ) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let (x, xs) = self.spatial_input(ins, node, idx)?;
        if node.output.get(1).is_some_and(|o| !o.is_empty()) {
            return Err(self.unsupported(
                node,
                idx,
                "the indices output is used",
                "use only the pooled values",
            ));
        }
        let kernel = pair(
            &ints(node, "kernel_shape").unwrap_or_default(),
            "kernel_shape",
            &label,
        )?;
        let (stride, mut padding, dilation) = self.window_attrs(node, idx, &xs, kernel)?;
        if int(node, "ceil_mode", 0) != 0 {
            // Ceil mode = extra bottom/right padding up to the last window that still starts inside the input or
            // the begin padding (PyTorch's rule).
            for a in 0..2 {
                let n = xs[1 + a] + padding[a] + padding[a + 2];
                let extent = dilation[a] * (kernel[a] - 1) + 1;
                if n < extent {
                    continue;
                }
                let mut count = (n - extent).div_ceil(stride[a]) + 1;
                if (count - 1) * stride[a] >= xs[1 + a] + padding[a] {
                    count -= 1;
                }
                let need = (count - 1) * stride[a] + extent;
                padding[a + 2] += need.saturating_sub(n);
            }
        }
        let mut oshape = vec![xs[0]];
        for a in 0..2 {
            oshape.push(
                window_count(
                    xs[1 + a],
                    kernel[a],
                    stride[a],
                    dilation[a],
                    padding[a],
                    padding[a + 2],
                )
                .map_err(|e| self.unsupported(node, idx, &e, "check the geometry"))?,
            );
        }
        self.emit(
            &label,
            Op::MaxPool2d {
                kernel,
                stride,
                padding,
                dilation,
            },
            vec![x],
            out,
            oshape,
        );
        Ok(())
    }

    /// ONNX Reshape of a run-time value: the target's first entry must be the batch ([`BATCH`], `0` = copy, or
    /// `-1` when the rest accounts for every feature); the rest is the feature shape (`0` copies the input's
    /// axis, one `-1` is inferred).
    pub(super) fn reshape_target(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        xs: &[usize],
        target: &Const,
    ) -> Result<Vec<usize>, ImportError> {
        let allowzero = int(node, "allowzero", 0) != 0;
        let n: usize = xs.iter().product();
        let t = &target.data;
        let refuse = |why: &str| {
            self.unsupported(
                node,
                idx,
                &format!("target {t:?} from [batch] + {xs:?}: {why}"),
                "reshapes must keep the batch axis first and only regroup the features",
            )
        };
        if t.is_empty() {
            return Err(refuse("empty target"));
        }
        let mut feat: Vec<Option<usize>> = vec![];
        for (i, &v) in t[1..].iter().enumerate() {
            feat.push(if v == -1.0 {
                None
            } else if v == 0.0 && !allowzero {
                Some(*xs.get(i).ok_or_else(|| refuse("0 copies a missing axis"))?)
            } else if v >= 1.0 && v.fract() == 0.0 && v < 1e15 {
                Some(v as usize)
            } else {
                return Err(refuse("not a feature size"));
            });
        }
        let known: usize = feat.iter().flatten().product();
        let unknown = feat.iter().filter(|d| d.is_none()).count();
        let first = t[0];
        let batch_first = first == BATCH || (first == 0.0 && !allowzero);
        let feat: Vec<usize> = match (batch_first, first == -1.0, unknown) {
            (true, _, 0) if known == n => feat.into_iter().flatten().collect(),
            (true, _, 1) if known > 0 && n % known == 0 => {
                feat.into_iter().map(|d| d.unwrap_or(n / known)).collect()
            }
            // [-1, f...] with the f's covering every feature: the -1 is the batch.
            (false, true, 0) if known == n => feat.into_iter().flatten().collect(),
            _ => return Err(refuse("the batch axis would change")),
        };
        if feat.is_empty() {
            return Err(refuse("no feature axis left"));
        }
        Ok(feat)
    }
}

/// Constant cast: integer targets truncate toward zero (ONNX's rule), bool is `!= 0`.
fn cast_const(c: &Const, to: i32) -> Const {
    let data = c
        .data
        .iter()
        .map(|&v| {
            if v == BATCH {
                return v;
            }
            match to {
                data_type::FLOAT | data_type::FLOAT16 | data_type::BFLOAT16 => v as f32 as f64,
                data_type::DOUBLE => v,
                9 => (v != 0.0) as u8 as f64,
                _ => v.trunc(),
            }
        })
        .collect();
    Const {
        dims: c.dims.clone(),
        data,
    }
}

fn gather_const(data: &Const, index: &Const, axis: i64) -> Result<Const, String> {
    let rank = data.dims.len() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank.max(1) {
        return Err(format!("axis {axis} of a rank-{rank} constant"));
    }
    let a = a as usize;
    let dims = if data.dims.is_empty() {
        vec![data.data.len()]
    } else {
        data.dims.clone()
    };
    let outer: usize = dims[..a].iter().product();
    let inner: usize = dims[a + 1..].iter().product();
    let n = dims[a];
    let mut out = vec![];
    for o in 0..outer {
        for &i in &index.data {
            let i = if i < 0.0 { i + n as f64 } else { i };
            if !(i >= 0.0 && i < n as f64) {
                return Err(format!("index {i} outside 0..{n}"));
            }
            let base = (o * n + i as usize) * inner;
            out.extend_from_slice(&data.data[base..base + inner]);
        }
    }
    let mut odims = dims[..a].to_vec();
    odims.extend_from_slice(&index.dims);
    odims.extend_from_slice(&dims[a + 1..]);
    Ok(Const {
        dims: odims,
        data: out,
    })
}

/// Dims after an ONNX Squeeze (`squeeze`) or Unsqueeze with `axes` (negative counted from the end; Squeeze
/// without axes drops every 1).
fn squeeze_dims(dims: &[usize], axes: Option<&[i64]>, squeeze: bool) -> Result<Vec<usize>, String> {
    if squeeze {
        let r = dims.len() as i64;
        let Some(axes) = axes else {
            return Ok(dims.iter().copied().filter(|d| *d != 1).collect());
        };
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| {
                let a = if a < 0 { a + r } else { a };
                usize::try_from(a)
                    .ok()
                    .filter(|a| *a < dims.len() && dims[*a] == 1)
                    .ok_or_else(|| format!("cannot squeeze axis {a} of {dims:?}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(dims
            .iter()
            .enumerate()
            .filter(|(i, _)| !norm.contains(i))
            .map(|(_, d)| *d)
            .collect())
    } else {
        let axes = axes.ok_or("unsqueeze without axes")?;
        let r = (dims.len() + axes.len()) as i64;
        let mut norm: Vec<usize> = axes
            .iter()
            .map(|&a| {
                let a = if a < 0 { a + r } else { a };
                usize::try_from(a)
                    .ok()
                    .filter(|a| (*a as i64) < r)
                    .ok_or_else(|| format!("cannot unsqueeze axis {a} into rank {r}"))
            })
            .collect::<Result<_, _>>()?;
        norm.sort_unstable();
        norm.dedup();
        if norm.len() != axes.len() {
            return Err(format!("repeated axes {axes:?}"));
        }
        let mut out = vec![];
        let mut src = dims.iter();
        for i in 0..r as usize {
            if norm.contains(&i) {
                out.push(1);
            } else {
                out.push(*src.next().ok_or("axes out of range")?);
            }
        }
        Ok(out)
    }
}

/// The layout family: casts and elementwise ops the exporters emit around shapes, transposes, shape arithmetic
/// (Shape, Gather, Squeeze / Unsqueeze, Split), convolutions, pooling and layer normalisation.
pub(super) fn register(reg: &mut super::OpRegistry) {
    reg.insert(&["Cast"], 1, |imp, n| imp.op_cast(n));
    reg.insert(&["Neg"], 1, |imp, n| imp.op_neg(n));
    reg.insert(&["Exp"], 1, |imp, n| imp.op_exp(n));
    reg.insert(&["Clip"], 1, |imp, n| imp.op_clip(n));
    reg.insert(&["Transpose"], 1, |imp, n| {
        let ins = &n.ins[..];
        if matches!(ins.first(), Some(Val::Const(_))) {
            return imp.op_transpose_const(n);
        }
        imp.op_transpose(n)
    });
    reg.insert(&["Shape"], 1, |imp, n| imp.op_shape(n));
    reg.insert(&["Gather"], 1, |imp, n| imp.op_gather(n));
    reg.insert(&["Unsqueeze", "Squeeze"], 1, |imp, n| {
        imp.op_squeeze_unsqueeze(n)
    });
    reg.insert(&["Split"], 1, |imp, n| imp.op_split(n));
    reg.insert(&["Conv"], 1, |imp, n| imp.op_conv(n));
    reg.insert(&["MaxPool"], 1, |imp, n| imp.op_max_pool(n));
    reg.insert(&["LayerNormalization"], 1, |imp, n| {
        imp.op_layer_normalization(n)
    });
}
