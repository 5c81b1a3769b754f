//! ONNX LSTM and GRU, as both PyTorch exporters write a policy's single step: the features unsqueezed to a
//! time axis of one (`[1, batch, F]`), each layer's initial state sliced out of a graph input `[layers, batch,
//! H]`, the op's outputs `Y [1, 1, batch, H]`, `Y_h`/`Y_c [1, batch, H]` squeezed or reshaped back and the final
//! states concatenated into the graph outputs. Tensors with such leading axes before the batch are
//! [`Val::Stacked`]: one per-env value per leading index. Only the handful of ops the exporters put around the
//! recurrent ops accept them (Squeeze, Unsqueeze, Slice, Gather and Concat on the leading axis; the
//! num-directions Transpose and the regrouping Reshape); anything else refuses them with a typed error.
//!
//! Each recurrent op becomes one cell in the format's existing ops ([`GraphBuilder::lstm_cell`],
//! [`GraphBuilder::gru_cell`]): ONNX's gate orders (LSTM i, o, f, c; GRU z, r, h) are permuted to PyTorch's first.

use std::collections::BTreeMap;

use policyport_format::Op;

use super::layout::BATCH;
use super::{Const, Importer, Val, attr, node_label};
use crate::ImportError;
use crate::builder::{CellWeights, GraphBuilder};
use crate::onnx_proto as pb;

/// Names the reshapes that turn a recurrent op's num-directions axis into a feature axis.
const DIRECTION_AXIS: &str = "direction_axis";

/// The constant weights of one LSTM / GRU layer (ONNX's gate order), checked against its hidden size.
struct RnnWeights {
    lstm: bool,
    hidden: usize,
    /// `[1, gates * hidden, features]`
    w: Const,
    /// `[1, gates * hidden, hidden]`
    r: Const,
    /// `[1, 2 * gates * hidden]`: input and recurrent biases.
    b: Option<Const>,
}

/// Input `i` as integers when it is a constant (axes, bounds, steps).
fn const_ints(ins: &[Val], i: usize) -> Option<Vec<i64>> {
    match ins.get(i) {
        Some(Val::Const(c)) => Some(c.data.iter().map(|v| *v as i64).collect()),
        _ => None,
    }
}

impl Importer {
    /// The error for a handler that met a [`Val::Stacked`] input (the dispatch routes those here first, so this
    /// is the typed answer should one slip through, never a panic).
    pub(super) fn stacked_input(&self, node: &pb::NodeProto, idx: usize) -> ImportError {
        self.unsupported(
            node,
            idx,
            "a time- or layer-major tensor (a recurrent op's)",
            "index the recurrent op's outputs back to [batch, features] first",
        )
    }

    /// The refusal of an op this module does not read on a [`Val::Stacked`] tensor.
    fn stacked_refusal(&self, node: &pb::NodeProto, idx: usize, detail: &str) -> ImportError {
        self.unsupported(
            node,
            idx,
            detail,
            "around a recurrent op, only the exporters' own Squeeze/Unsqueeze/Slice/Gather/Concat on the \
             time or layer axis, and Reshape/Transpose that keep it, are read",
        )
    }

    /// An op reading a [`Val::Stacked`] input.
    pub(super) fn stacked_op(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        out: &str,
    ) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let refuse = |detail: &str| self.stacked_refusal(node, idx, detail);
        let Val::Stacked { parts, shape, dir } = ins[0].clone() else {
            return Err(refuse("a time- or layer-major tensor as a later input"));
        };
        let axes = const_ints(ins, 1).or_else(|| attr(node, "axes").map(|a| a.ints.clone()));
        let stacked =
            |parts: Vec<String>, shape: Vec<usize>, dir: bool| Val::Stacked { parts, shape, dir };
        let v = match node.op_type.as_str() {
            "Identity" => ins[0].clone(),
            "Shape" => {
                return self.op_shape(&super::NodeIn {
                    node,
                    idx,
                    ins: ins.to_vec(),
                    out: out.to_string(),
                });
            }
            "Squeeze" => match (axes.as_deref(), dir, parts.len()) {
                (Some([1]), true, _) => stacked(parts, shape, false),
                (Some([0]), false, 1) => Val::Runtime {
                    name: parts[0].clone(),
                    shape,
                },
                _ => return Err(refuse(&format!("Squeeze axes {axes:?}"))),
            },
            "Slice" if !dir => self.stacked_slice(node, idx, ins, parts, shape)?,
            "Gather" if !dir => self.stacked_gather(node, idx, ins, parts, shape)?,
            "Concat" if !dir => {
                let axis = attr(node, "axis").map_or(0, |a| a.i);
                let rank = 2 + shape.len() as i64;
                if axis != 0 && axis != -rank {
                    return Err(refuse(&format!("Concat on axis {axis}")));
                }
                let mut all = vec![];
                for v in ins {
                    match v {
                        Val::Stacked {
                            parts,
                            shape: s,
                            dir: false,
                        } if *s == shape => all.extend(parts.iter().cloned()),
                        _ => return Err(refuse("Concat of a stacked tensor with something else")),
                    }
                }
                stacked(all, shape, false)
            }
            // [K, 1 (directions), batch, F] → [K, batch, 1, F]: the unit axis becomes a feature axis.
            "Transpose" if dir && shape.len() == 1 => {
                let perm = attr(node, "perm")
                    .map(|a| a.ints.clone())
                    .unwrap_or_default();
                if perm != [0, 2, 1, 3] {
                    return Err(refuse(&format!("Transpose perm {perm:?}")));
                }
                let fshape = vec![1, shape[0]];
                let parts =
                    self.reshape_parts(&format!("{label}.{DIRECTION_AXIS}"), parts, &fshape);
                stacked(parts, fshape, false)
            }
            "Reshape" if !dir => self.stacked_reshape(node, idx, ins, parts, shape)?,
            other => return Err(refuse(&format!("{other} on a time- or layer-major tensor"))),
        };
        self.vals.insert(out.to_string(), v);
        Ok(())
    }

    /// Slice of the leading (time or layer) axis: constant bounds, step 1, a non-empty range.
    fn stacked_slice(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        parts: Vec<String>,
        shape: Vec<usize>,
    ) -> Result<Val, ImportError> {
        let refuse = |detail: &str| self.stacked_refusal(node, idx, detail);
        let (Some(s), Some(e)) = (const_ints(ins, 1), const_ints(ins, 2)) else {
            return Err(refuse("Slice with run-time bounds"));
        };
        let ax = const_ints(ins, 3).unwrap_or(vec![0]);
        let step = const_ints(ins, 4).unwrap_or(vec![1]);
        let k = parts.len() as i64;
        let clampi = |v: i64| if v < 0 { (v + k).max(0) } else { v.min(k) } as usize;
        if s.len() != 1 || e.len() != 1 || ax != [0] || step != [1] || clampi(e[0]) <= clampi(s[0])
        {
            return Err(refuse(&format!("Slice {s:?}..{e:?} on axes {ax:?}")));
        }
        Ok(Val::Stacked {
            parts: parts[clampi(s[0])..clampi(e[0])].to_vec(),
            shape,
            dir: false,
        })
    }

    /// Gather on the leading axis with a constant index: a scalar index drops the axis, a one-element list keeps
    /// it.
    fn stacked_gather(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        parts: Vec<String>,
        shape: Vec<usize>,
    ) -> Result<Val, ImportError> {
        let refuse = |detail: &str| self.stacked_refusal(node, idx, detail);
        let axis = attr(node, "axis").map_or(0, |a| a.i);
        let Some(Val::Const(i)) = ins.get(1) else {
            return Err(refuse("Gather with run-time indices"));
        };
        let k = parts.len() as i64;
        let at = |v: f64| -> Option<usize> {
            let v = v as i64;
            let v = if v < 0 { v + k } else { v };
            (0..k).contains(&v).then_some(v as usize)
        };
        match (axis, i.dims.as_slice(), i.data.as_slice()) {
            (0, [], [x]) => {
                let p = at(*x).ok_or_else(|| refuse("Gather index out of range"))?;
                Ok(Val::Runtime {
                    name: parts[p].clone(),
                    shape,
                })
            }
            (0, [1], [x]) => {
                let p = at(*x).ok_or_else(|| refuse("Gather index out of range"))?;
                Ok(Val::Stacked {
                    parts: vec![parts[p].clone()],
                    shape,
                    dir: false,
                })
            }
            _ => Err(refuse(&format!(
                "Gather on axis {axis} with indices {:?}",
                i.dims
            ))),
        }
    }

    /// Reshape that keeps the leading axis and the batch (`[K, batch, features...]`), regrouping each part's
    /// features.
    fn stacked_reshape(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        parts: Vec<String>,
        shape: Vec<usize>,
    ) -> Result<Val, ImportError> {
        let Some(Val::Const(t)) = ins.get(1) else {
            return Err(self.stacked_refusal(node, idx, "Reshape to a run-time shape"));
        };
        let allowzero = attr(node, "allowzero").is_some_and(|a| a.i != 0);
        let d = &t.data;
        let k = parts.len() as f64;
        // [K, batch, features...]: the batch as the marker, -1 (inferred), or 0 (copied).
        let batch_ok = d
            .get(1)
            .is_some_and(|b| *b == BATCH || *b == -1.0 || (*b == 0.0 && !allowzero));
        if d.len() < 2 || d[0] != k || !batch_ok || (d[1] == -1.0 && d[2..].contains(&-1.0)) {
            return Err(self.stacked_refusal(node, idx, &format!("Reshape to {d:?}")));
        }
        let target = Const {
            dims: vec![d.len() - 1],
            data: std::iter::once(BATCH)
                .chain(d[2..].iter().copied())
                .collect(),
        };
        let fshape = self.reshape_target(node, idx, &shape, &target)?;
        let parts = if fshape == shape {
            parts
        } else if let Some(orig) = self.undo_direction_axis(&parts, &fshape) {
            // The dynamo exporter's [K, 1, batch, H] → [K, batch, 1, H] → [K, batch, H]: back to the
            // recurrent op's own values (the unit-axis reshapes are left dead, and dropped).
            orig
        } else {
            self.reshape_parts(&node_label(node, idx), parts, &fshape)
        };
        Ok(Val::Stacked {
            parts,
            shape: fshape,
            dir: false,
        })
    }

    /// If every part is one of [`Self::reshape_parts`]'s `[H] → [1, H]` regroupings and `shape` is `[H]`: the
    /// values they regrouped.
    fn undo_direction_axis(&self, parts: &[String], shape: &[usize]) -> Option<Vec<String>> {
        parts
            .iter()
            .map(|p| {
                let n = &self.nodes[*self.producer.get(p)?];
                let regroup = matches!(&n.op, Op::Reshape { shape: s } if s.len() == 2 && s[0] == 1 && s[1..] == *shape);
                (regroup && n.name.ends_with(&format!(".{DIRECTION_AXIS}"))).then(|| n.inputs[0].clone())
            })
            .collect()
    }

    fn reshape_parts(&mut self, label: &str, parts: Vec<String>, shape: &[usize]) -> Vec<String> {
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let o = format!("{label}.{i}");
                let o = if label.ends_with(DIRECTION_AXIS) {
                    format!("{label}.{i}.{DIRECTION_AXIS}")
                } else {
                    o
                };
                self.emit(
                    &o,
                    Op::Reshape {
                        shape: shape.to_vec(),
                    },
                    vec![p],
                    &o,
                    shape.to_vec(),
                );
                Self::ir_name(&o)
            })
            .collect()
    }

    /// An ONNX `LSTM` or `GRU` node stepping once.
    pub(super) fn rnn(&mut self, node: &pb::NodeProto, idx: usize) -> Result<(), ImportError> {
        let lstm = node.op_type == "LSTM";
        self.check_rnn_attributes(node, idx, lstm)?;
        let lbr = attr(node, "linear_before_reset").is_some_and(|a| a.i != 0);
        let (x, f) = self.rnn_step_input(node, idx)?;
        let weights = self.rnn_weights(node, idx, lstm, f)?;
        let h = weights.hidden;
        let h_in = self.rnn_state(node, idx, 5, "initial_h", h)?;
        let c_in = if lstm {
            Some(self.rnn_state(node, idx, 6, "initial_c", h)?)
        } else {
            None
        };
        self.emit_rnn_cell(node, idx, &weights, (&x, f), lbr, (&h_in, c_in.as_deref()))
    }

    /// Input `i` of a recurrent node, absent when the name is empty or missing.
    fn rnn_input(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        i: usize,
    ) -> Result<Option<Val>, ImportError> {
        node.input
            .get(i)
            .filter(|n| !n.is_empty())
            .map(|n| self.get(n, node, idx))
            .transpose()
    }

    /// PyTorch's nn.LSTM / nn.GRU semantics only: forward, time-major, no clip, the default gate activations.
    fn check_rnn_attributes(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        lstm: bool,
    ) -> Result<(), ImportError> {
        let refuse = |detail: &str, hint: &str| self.unsupported(node, idx, detail, hint);
        let direction = attr(node, "direction").map(|a| String::from_utf8_lossy(&a.s).into_owned());
        if direction.as_deref().is_some_and(|d| d != "forward") {
            return Err(refuse(
                &format!("direction {direction:?}"),
                "a policy steps forward: export a unidirectional layer",
            ));
        }
        if attr(node, "layout").is_some_and(|a| a.i != 0) {
            return Err(refuse(
                "layout=1 (batch-first tensors)",
                "export with batch_first=False",
            ));
        }
        if attr(node, "clip").is_some() || attr(node, "input_forget").is_some_and(|a| a.i != 0) {
            return Err(refuse(
                "clip / input_forget",
                "PyTorch's nn.LSTM / nn.GRU semantics only",
            ));
        }
        if let Some(a) = attr(node, "activations") {
            let want: &[&[u8]] = if lstm {
                &[b"Sigmoid", b"Tanh", b"Tanh"]
            } else {
                &[b"Sigmoid", b"Tanh"]
            };
            if a.strings.len() != want.len()
                || a.strings.iter().zip(want).any(|(s, w)| s.as_slice() != *w)
            {
                return Err(refuse(
                    "non-default activations",
                    "the default sigmoid / tanh gates",
                ));
            }
        }
        Ok(())
    }

    /// Input X: one time step of flat run-time features, `[1, batch, F]`. Returns the step's value and F.
    fn rnn_step_input(
        &self,
        node: &pb::NodeProto,
        idx: usize,
    ) -> Result<(String, usize), ImportError> {
        let refuse = |detail: &str, hint: &str| self.unsupported(node, idx, detail, hint);
        let Some(Val::Stacked {
            parts: xp,
            shape: xs,
            dir: false,
        }) = self.rnn_input(node, idx, 0)?
        else {
            return Err(refuse(
                "input X is not one time step of run-time features",
                "export one step: x.unsqueeze(0) into the layer (time-major, sequence length 1)",
            ));
        };
        if xp.len() != 1 || xs.len() != 1 {
            return Err(refuse(
                &format!("X of {} time steps with features {xs:?}", xp.len()),
                "export one step (sequence length 1) of flat features",
            ));
        }
        Ok((xp[0].clone(), xs[0]))
    }

    /// The constant weights W, R (and bias B) of a layer with `f` input features, checked against its hidden
    /// size; no sequence lengths (one step) and no peepholes (PyTorch has none).
    fn rnn_weights(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        lstm: bool,
        f: usize,
    ) -> Result<RnnWeights, ImportError> {
        let label = node_label(node, idx);
        let refuse = |detail: &str, hint: &str| self.unsupported(node, idx, detail, hint);
        let gates = if lstm { 4 } else { 3 };
        let konst = |v: Option<Val>, what: &str| -> Result<Const, ImportError> {
            match v {
                Some(Val::Const(c)) => Ok(c),
                _ => Err(refuse(
                    &format!("{what} is not a constant"),
                    "constant weights",
                )),
            }
        };
        let w = konst(self.rnn_input(node, idx, 1)?, "W")?;
        let r = konst(self.rnn_input(node, idx, 2)?, "R")?;
        // Bounded like every attribute size, so `gates * h` products below cannot overflow.
        let h = attr(node, "hidden_size").map_or(0, |a| {
            a.i.clamp(0, super::layout::MAX_ATTR_SIZE as i64) as usize
        });
        if h == 0 || w.dims != [1, gates * h, f] || r.dims != [1, gates * h, h] {
            return Err(ImportError::Malformed(format!(
                "node {label}: W {:?}, R {:?} for hidden size {h} and {f} input features",
                w.dims, r.dims
            )));
        }
        let b = self
            .rnn_input(node, idx, 3)?
            .map(|v| konst(Some(v), "B"))
            .transpose()?;
        if let Some(b) = b.as_ref().filter(|b| b.dims != [1, 2 * gates * h]) {
            return Err(ImportError::Malformed(format!(
                "node {label}: B is {:?}",
                b.dims
            )));
        }
        if let Some(v) = self.rnn_input(node, idx, 4)? {
            if !matches!(&v, Val::Const(c) if c.data.iter().all(|x| *x == 1.0)) {
                return Err(refuse("sequence_lens", "one step: no sequence lengths"));
            }
        }
        if self.rnn_input(node, idx, 7)?.is_some() {
            return Err(refuse("peephole weights P", "PyTorch's LSTM has none"));
        }
        Ok(RnnWeights {
            lstm,
            hidden: h,
            w,
            r,
            b,
        })
    }

    /// State input `i` (`what`: initial_h or initial_c): one layer's `[1, batch, hidden]` state, fed from a graph
    /// input so it carries between steps.
    fn rnn_state(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        i: usize,
        what: &str,
        hidden: usize,
    ) -> Result<String, ImportError> {
        let refuse = |detail: &str, hint: &str| self.unsupported(node, idx, detail, hint);
        match self.rnn_input(node, idx, i)? {
            Some(Val::Stacked {
                parts,
                shape,
                dir: false,
            }) if parts.len() == 1 && shape == [hidden] => Ok(parts[0].clone()),
            Some(_) => Err(refuse(
                &format!("{what} is not one layer's [1, batch, {hidden}] state"),
                "slice the state input per layer",
            )),
            None => Err(refuse(
                &format!("no {what}"),
                "feed the state from a graph input (and return the next state) so it carries between steps; \
                 name the pair in the import spec's \"recurrent\"",
            )),
        }
    }

    /// The layer as one cell of the format's ops (gate blocks permuted to PyTorch's order), its nodes and weights
    /// added to the graph, and the node's outputs `Y`, `Y_h` (and `Y_c`) bound to the next state.
    fn emit_rnn_cell(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        weights: &RnnWeights,
        (x, f): (&str, usize),
        linear_before_reset: bool,
        (h_in, c_in): (&str, Option<&str>),
    ) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let RnnWeights {
            lstm,
            hidden: h,
            w,
            r,
            b,
        } = weights;
        let (lstm, h) = (*lstm, *h);
        let gates = if lstm { 4 } else { 3 };
        // ONNX gate blocks → PyTorch's order: LSTM (i, o, f, c) → (i, f, g, o); GRU (z, r, h) → (r, z, n).
        let order: &[usize] = if lstm { &[0, 2, 3, 1] } else { &[1, 0, 2] };
        let permute = |m: &[f64], cols: usize| -> Vec<f32> {
            order
                .iter()
                .flat_map(|&blk| {
                    m[blk * h * cols..(blk + 1) * h * cols]
                        .iter()
                        .map(|v| *v as f32)
                })
                .collect()
        };
        let w_ih = permute(&w.data, f);
        let w_hh = permute(&r.data, h);
        let (b_ih, b_hh) = match b {
            Some(b) => (
                Some(permute(&b.data[..gates * h], 1)),
                Some(permute(&b.data[gates * h..], 1)),
            ),
            None => (None, None),
        };
        let empty = BTreeMap::new();
        let mut g = GraphBuilder::new(&empty, "ONNX model");
        let cw = CellWeights {
            hidden: h,
            w_ih: &w_ih,
            w_hh: &w_hh,
            b_ih: b_ih.as_deref(),
            b_hh: b_hh.as_deref(),
        };
        let prefix = format!("{label}.cell");
        let (h_next, c_next) = match c_in {
            Some(c_in) => {
                let (hn, cn) = g.lstm_cell(&prefix, x, f, cw, h_in, c_in);
                (hn, Some(cn))
            }
            None => (
                g.gru_cell(&prefix, x, f, cw, linear_before_reset, h_in),
                None,
            ),
        };
        for n in g.take_nodes() {
            self.producer.insert(n.output.clone(), self.nodes.len());
            self.nodes.push(n);
        }
        for (k, t) in std::mem::take(&mut g.tensors) {
            if self.tensors.insert(k.clone(), t).is_some() {
                return Err(ImportError::Malformed(format!(
                    "node {label}: weight name '{k}' used twice"
                )));
            }
        }
        let one = |p: &str, dir: bool| Val::Stacked {
            parts: vec![p.to_string()],
            shape: vec![h],
            dir,
        };
        let outs: Vec<Option<Val>> = vec![
            Some(one(&h_next, true)),
            Some(one(&h_next, false)),
            c_next.as_deref().map(|c| one(c, false)),
        ];
        for (name, v) in node.output.iter().zip(outs) {
            if let (false, Some(v)) = (name.is_empty(), v) {
                self.vals.insert(name.clone(), v);
            }
        }
        Ok(())
    }
}
