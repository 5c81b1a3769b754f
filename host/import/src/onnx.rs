//! ONNX → policy artifact. Reads graphs from `torch.onnx.export` (the TorchScript-based and the dynamo
//! exporters) for MLP actor-critic policies, folds constants and MatMul+Add into dense layers, splits the graph
//! into encoder / policy head / value head by what each node feeds, and writes the manifest + weights.

use std::collections::{BTreeMap, HashMap, HashSet};

use policyport_format::container::Tensor;
use policyport_format::{
    ActionSpace, Distribution, LogStd, Manifest, Module, ModuleRole, Node, OBS_VALUE, ObsDType,
    ObservationSpace, Op, Preprocess, Producer, STATE_PREFIX,
};
use prost::Message;

use crate::ImportError;
use crate::onnx_proto::{self as pb, data_type};
use crate::spec::{DistSpec, ImportSpec, LogStdSpec};

mod layout;
mod ops;
mod recurrent;

use ops::{NodeIn, OpRegistry};

/// A value during import: known at compile time, or computed per step with this feature shape.
#[derive(Debug, Clone)]
enum Val {
    Const(Const),
    Runtime {
        name: String,
        shape: Vec<usize>,
    },
    /// A tensor with leading axes before the batch, `[K, (1,) batch, shape...]` (a recurrent op's time or layer
    /// axis; `dir`: its num-directions axis of one too): one per-env value per leading index ([`recurrent`]).
    Stacked {
        parts: Vec<String>,
        shape: Vec<usize>,
        dir: bool,
    },
}

#[derive(Debug, Clone)]
struct Const {
    dims: Vec<usize>,
    data: Vec<f64>,
}

impl Const {
    fn numel(&self) -> usize {
        self.data.len()
    }
}

/// Elements in one constant: the format's limit on a weight tensor (2^28).
const MAX_CONST_ELEMS: usize = 1 << 28;
/// Elements per env in one run-time value: the format's limit (2^24). Checked where values are made (graph
/// inputs, `emit`), so every product over a run-time shape stays far from overflowing.
const MAX_VALUE_ELEMS: usize = 1 << 24;
/// Layers of one stacked recurrent state input.
const MAX_RNN_LAYERS: usize = 1024;

fn tensor_to_const(t: &pb::TensorProto) -> Result<Const, ImportError> {
    if t.data_location == 1 {
        return Err(ImportError::Unsupported {
            what: format!("initializer '{}' stores its data externally", t.name),
            hint: "export with external_data=False (models under 2 GB fit inline)".into(),
        });
    }
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| ImportError::Malformed(format!("tensor '{}' has dim {d}", t.name)))
        })
        .collect::<Result<_, _>>()?;
    // Checked and capped: a wrapping product let dims disagree with the data (every later shape computation
    // trusts `dims`).
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| *n <= MAX_CONST_ELEMS)
        .ok_or_else(|| {
            ImportError::Malformed(format!("tensor '{}': dims {dims:?} are too large", t.name))
        })?;
    let raw = &t.raw_data;
    let data: Vec<f64> = match t.data_type {
        data_type::FLOAT if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        data_type::FLOAT => t.float_data.iter().map(|v| *v as f64).collect(),
        data_type::DOUBLE if !raw.is_empty() => raw
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        data_type::DOUBLE => t.double_data.clone(),
        data_type::FLOAT16 if !raw.is_empty() => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        data_type::BFLOAT16 if !raw.is_empty() => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        data_type::INT64 if !raw.is_empty() => raw
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        data_type::INT64 => t.int64_data.iter().map(|v| *v as f64).collect(),
        data_type::INT32 if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        data_type::INT32 => t.int32_data.iter().map(|v| *v as f64).collect(),
        other => {
            return Err(ImportError::Unsupported {
                what: format!("initializer '{}' has ONNX data type {other}", t.name),
                hint: "use float32 weights".into(),
            });
        }
    };
    if data.len() != n {
        return Err(ImportError::Malformed(format!(
            "tensor '{}': {} values for dims {:?}",
            t.name,
            data.len(),
            dims
        )));
    }
    Ok(Const { dims, data })
}

struct Importer {
    vals: HashMap<String, Val>,
    nodes: Vec<Node>,
    tensors: BTreeMap<String, Tensor>,
    /// How many nodes read each ONNX value (for folding MatMul + Add only when nothing else reads the product).
    uses: HashMap<String, usize>,
    /// IR node index that defines each runtime value.
    producer: HashMap<String, usize>,
    /// The first value `emit` made over the size limit (checked after each node).
    oversize: Option<String>,
}

fn attr<'n>(node: &'n pb::NodeProto, name: &str) -> Option<&'n pb::AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

fn node_label(node: &pb::NodeProto, index: usize) -> String {
    if node.name.is_empty() {
        format!("#{index} ({})", node.op_type)
    } else {
        node.name.clone()
    }
}

impl Importer {
    fn unsupported(
        &self,
        node: &pb::NodeProto,
        idx: usize,
        detail: &str,
        hint: &str,
    ) -> ImportError {
        ImportError::UnsupportedOp {
            op: node.op_type.clone(),
            node: node_label(node, idx),
            detail: detail.into(),
            hint: hint.into(),
        }
    }

    fn get(&self, name: &str, node: &pb::NodeProto, idx: usize) -> Result<Val, ImportError> {
        self.vals.get(name).cloned().ok_or_else(|| {
            ImportError::Malformed(format!(
                "node {} reads '{name}', which nothing defines before it",
                node_label(node, idx)
            ))
        })
    }

    fn add_tensor(&mut self, base: &str, shape: Vec<usize>, data: Vec<f32>) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while self.tensors.contains_key(&name) {
            name = format!("{base}.{k}");
            k += 1;
        }
        self.tensors.insert(name.clone(), Tensor::new(shape, data));
        name
    }

    /// IR name of an ONNX value: the same, unless it would shadow a reserved name (`obs`, `state/..`).
    fn ir_name(onnx: &str) -> String {
        if onnx == OBS_VALUE || onnx.starts_with(STATE_PREFIX) {
            format!("onnx:{onnx}")
        } else {
            onnx.to_string()
        }
    }

    fn emit(&mut self, name: &str, op: Op, inputs: Vec<String>, output: &str, shape: Vec<usize>) {
        if shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .is_none_or(|n| n > MAX_VALUE_ELEMS)
        {
            self.oversize.get_or_insert(format!(
                "node {name}: a value of shape {shape:?} (over 2^24 elements per env)"
            ));
        }
        let ir = Self::ir_name(output);
        self.producer.insert(ir.clone(), self.nodes.len());
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs,
            output: ir.clone(),
        });
        self.vals
            .insert(output.to_string(), Val::Runtime { name: ir, shape });
    }

    /// Resolve an ONNX axis on a batch-leading tensor of rank 1 + feature rank to a feature axis.
    fn feature_axis(axis: i64, feat_rank: usize) -> Option<usize> {
        let rank = feat_rank as i64 + 1;
        let a = if axis < 0 { axis + rank } else { axis };
        (a >= 1 && a < rank).then(|| (a - 1) as usize)
    }

    fn node(&mut self, node: &pb::NodeProto, idx: usize) -> Result<(), ImportError> {
        let label = node_label(node, idx);
        let out = node.output.first().cloned().unwrap_or_default();
        if !node.domain.is_empty() && node.domain != "ai.onnx" {
            return Err(self.unsupported(
                node,
                idx,
                &format!("custom domain '{}'", node.domain),
                "export with standard ONNX ops (inline functions, no custom ops)",
            ));
        }
        // An omitted optional input ("") before a given one would shift the positions every handler reads
        // (Slice(x, s, e, "", steps) read steps as axes; LayerNorm with scale "" read the bias as the scale):
        // refused. Trailing omitted inputs are simply absent.
        // (LSTM and GRU read their inputs by position themselves: `rnn` below.)
        let given = node
            .input
            .iter()
            .rposition(|n| !n.is_empty())
            .map_or(0, |i| i + 1);
        if node.input[..given].iter().any(|n| n.is_empty())
            && !matches!(node.op_type.as_str(), "LSTM" | "GRU")
        {
            return Err(self.unsupported(
                node,
                idx,
                "an omitted optional input before a given one",
                "give every input up to the last one used",
            ));
        }
        let mut ins: Vec<Val> = node.input[..given]
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| self.get(n, node, idx))
            .collect::<Result<_, _>>()?;
        // Slice before opset 10 takes its bounds as attributes: the same values as inputs (starts, ends, axes).
        if node.op_type == "Slice" && ins.len() == 1 {
            if let (Some(s), Some(e)) = (attr(node, "starts"), attr(node, "ends")) {
                let c = |v: &[i64]| {
                    Val::Const(Const {
                        dims: vec![v.len()],
                        data: v.iter().map(|x| *x as f64).collect(),
                    })
                };
                ins.push(c(&s.ints));
                ins.push(c(&e.ints));
                if let Some(a) = attr(node, "axes") {
                    ins.push(c(&a.ints));
                }
            }
        }
        let op = node.op_type.as_str();
        if op == "LSTM" || op == "GRU" {
            return self.rnn(node, idx);
        }
        if ins
            .first()
            .is_some_and(|v| matches!(v, Val::Stacked { .. }))
            || (op == "Concat" && ins.iter().any(|v| matches!(v, Val::Stacked { .. })))
        {
            return self.stacked_op(node, idx, &ins, &out);
        }
        if ins.iter().any(|v| matches!(v, Val::Stacked { .. })) {
            return Err(self.unsupported(
                node,
                idx,
                "a time- or layer-major tensor (a recurrent op's) as a later input",
                "index the recurrent op's outputs back to [batch, features] first",
            ));
        }
        // The op's registered handler (ops/, one registration per family): the inputs it reads unconditionally
        // are checked here first, so no handler indexes past them.
        let Some(def) = ops::registry().get(op) else {
            return Err(self.unsupported(
                node,
                idx,
                "not supported by the ONNX importer",
                &format!(
                    "supported: {}; re-export without it or open an issue",
                    ops::registry().names().join(" ")
                ),
            ));
        };
        if ins.len() < def.min_inputs {
            return Err(ImportError::Malformed(format!(
                "node {label} ({op}) has {} input(s), needs {}",
                ins.len(),
                def.min_inputs
            )));
        }
        (def.handler)(
            self,
            &NodeIn {
                node,
                idx,
                ins,
                out,
            },
        )
    }

    fn op_constant(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, _) = n.parts();
        let out = n.out.clone();
        let t = attr(node, "value")
            .and_then(|a| a.t.as_ref())
            .map(tensor_to_const)
            .transpose()?
            .or_else(|| {
                attr(node, "value_float").map(|a| Const {
                    dims: vec![],
                    data: vec![a.f as f64],
                })
            })
            .or_else(|| {
                attr(node, "value_floats").map(|a| Const {
                    dims: vec![a.floats.len()],
                    data: a.floats.iter().map(|v| *v as f64).collect(),
                })
            })
            .or_else(|| {
                attr(node, "value_int").map(|a| Const {
                    dims: vec![],
                    data: vec![a.i as f64],
                })
            })
            .or_else(|| {
                attr(node, "value_ints").map(|a| Const {
                    dims: vec![a.ints.len()],
                    data: a.ints.iter().map(|v| *v as f64).collect(),
                })
            })
            .ok_or_else(|| {
                self.unsupported(
                    node,
                    idx,
                    "no supported value attribute",
                    "use a tensor, float(s) or int(s) constant",
                )
            })?;
        self.vals.insert(out, Val::Const(t));
        Ok(())
    }

    fn op_identity(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let ins = &n.ins[..];
        let out = n.out.clone();
        self.vals.insert(out, ins[0].clone());
        Ok(())
    }

    fn op_gemm(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        let op = n.node.op_type.as_str();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_input(n)?;
        let Val::Const(w) = &ins[1] else {
            return Err(self.unsupported(
                node,
                idx,
                "weight input is computed at run time",
                "only constant weights are supported",
            ));
        };
        if xs.len() != 1 || w.dims.len() != 2 {
            return Err(self.unsupported(
                node,
                idx,
                &format!("input {xs:?} x weight {:?}", w.dims),
                "flatten the input first; weights must be 2-D",
            ));
        }
        let geti = |n: &str, d: i64| attr(node, n).map(|a| a.i).unwrap_or(d);
        let getf = |n: &str| attr(node, n).map(|a| a.f as f64).unwrap_or(1.0);
        let (trans_a, trans_b) = if op == "Gemm" {
            (geti("transA", 0), geti("transB", 0))
        } else {
            (0, 0)
        };
        if trans_a != 0 {
            return Err(self.unsupported(
                node,
                idx,
                "transA=1",
                "export without transposing the activations",
            ));
        }
        let (alpha, beta) = if op == "Gemm" {
            (getf("alpha"), getf("beta"))
        } else {
            (1.0, 1.0)
        };
        // PyTorch layout [out, in].
        let (o, i) = if trans_b != 0 {
            (w.dims[0], w.dims[1])
        } else {
            (w.dims[1], w.dims[0])
        };
        if i != xs[0] {
            return Err(ImportError::Malformed(format!(
                "node {label}: input has {} features, weight expects {i}",
                xs[0]
            )));
        }
        let mut wd = vec![0.0f32; o * i];
        for r in 0..o {
            for c in 0..i {
                let v = if trans_b != 0 {
                    w.data[r * i + c]
                } else {
                    w.data[c * o + r]
                };
                wd[r * i + c] = (alpha * v) as f32;
            }
        }
        let wname = self.add_tensor(&format!("{}.weight", node.input[1]), vec![o, i], wd);
        let bias = match ins.get(2) {
            Some(Val::Stacked { .. }) => return Err(self.stacked_input(node, idx)),
            Some(Val::Const(c)) => {
                if c.numel() != o && c.numel() != 1 {
                    return Err(self.unsupported(
                        node,
                        idx,
                        &format!("bias of {} values for {o} outputs", c.numel()),
                        "use a per-output bias",
                    ));
                }
                let b: Vec<f32> = (0..o)
                    .map(|k| (beta * c.data[if c.numel() == 1 { 0 } else { k }]) as f32)
                    .collect();
                Some(self.add_tensor(&format!("{}.bias", node.input[2]), vec![o], b))
            }
            Some(Val::Runtime { .. }) => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "bias computed at run time",
                    "only constant biases are supported",
                ));
            }
            None => None,
        };
        self.emit(
            &label,
            Op::Dense {
                weight: wname,
                bias,
            },
            vec![x],
            &out,
            vec![o],
        );
        Ok(())
    }

    fn op_binary(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        self.binary(node, idx, &ins, &out)?;
        Ok(())
    }

    fn op_activation(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, _) = n.parts();
        let out = n.out.clone();
        let op = n.node.op_type.as_str();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_input(n)?;
        let ir = match op {
            "Relu" => Op::Relu,
            "Tanh" => Op::Tanh,
            "Sigmoid" => Op::Sigmoid,
            "Erf" => Op::Erf,
            "Elu" => Op::Elu {
                alpha: attr(node, "alpha").map(|a| a.f).unwrap_or(1.0),
            },
            "LeakyRelu" => Op::LeakyRelu {
                alpha: attr(node, "alpha").map(|a| a.f).unwrap_or(0.01),
            },
            "Gelu" => {
                let approx = attr(node, "approximate")
                    .map(|a| a.s.as_slice())
                    .unwrap_or(b"none");
                Op::Gelu {
                    approximate: approx == b"tanh",
                }
            }
            "Softmax" | "LogSoftmax" => {
                let axis = attr(node, "axis").map(|a| a.i).unwrap_or(-1);
                if Self::feature_axis(axis, xs.len()) != Some(xs.len() - 1) {
                    return Err(self.unsupported(
                        node,
                        idx,
                        &format!("axis {axis}"),
                        "softmax over the last axis only",
                    ));
                }
                if op == "Softmax" {
                    Op::Softmax
                } else {
                    Op::LogSoftmax
                }
            }
            _ => {
                if attr(node, "axis").map(|a| a.i).unwrap_or(1) != 1 {
                    return Err(self.unsupported(
                        node,
                        idx,
                        "axis != 1",
                        "flatten everything but the batch axis",
                    ));
                }
                Op::Flatten
            }
        };
        let shape = if ir == Op::Flatten {
            vec![xs.iter().product()]
        } else {
            xs
        };
        self.emit(&label, ir, vec![x], &out, shape);
        Ok(())
    }

    fn op_reshape(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        let label = node_label(n.node, n.idx);
        let Some((x, xs)) = runtime(&ins[0]) else {
            let Val::Const(c) = &ins[0] else {
                unreachable!()
            };
            // Constant reshape (shape arithmetic): same data, the target's dims.
            let Some(Val::Const(t)) = ins.get(1) else {
                return Err(self.unsupported(
                    node,
                    idx,
                    "shape computed at run time",
                    "use a static target shape",
                ));
            };
            let mut dims: Vec<i64> = t.data.iter().map(|v| *v as i64).collect();
            // Checked: a product of hostile target dims wrapped (then `-1` was inferred from it).
            let Some(known) = dims
                .iter()
                .filter(|d| **d > 0)
                .try_fold(1i64, |a, &d| a.checked_mul(d))
            else {
                return Err(ImportError::Malformed(format!(
                    "node {label}: reshape target {dims:?}"
                )));
            };
            for (i, d) in dims.iter_mut().enumerate() {
                if *d == 0 {
                    *d = c.dims.get(i).copied().unwrap_or(1) as i64;
                }
            }
            if let Some(d) = dims.iter_mut().find(|d| **d == -1) {
                *d = c.numel() as i64 / known.max(1);
            }
            let dims: Vec<usize> = dims.iter().map(|d| (*d).max(0) as usize).collect();
            if dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(c.numel()) {
                return Err(ImportError::Malformed(format!(
                    "node {label}: reshape of {:?} to {dims:?}",
                    c.dims
                )));
            }
            self.vals.insert(
                out,
                Val::Const(Const {
                    dims,
                    data: c.data.clone(),
                }),
            );
            return Ok(());
        };
        let Some(Val::Const(target)) = ins.get(1) else {
            return Err(self.unsupported(
                node,
                idx,
                "shape computed at run time",
                "use a static target shape",
            ));
        };
        let shape = self.reshape_target(node, idx, &xs, target)?;
        if shape == xs {
            self.vals.insert(out, Val::Runtime { name: x, shape });
        } else if shape.len() == 1 {
            self.emit(&label, Op::Flatten, vec![x], &out, shape);
        } else {
            self.emit(
                &label,
                Op::Reshape {
                    shape: shape.clone(),
                },
                vec![x],
                &out,
                shape,
            );
        }
        Ok(())
    }

    fn op_concat_const(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        // Shape arithmetic: 1-D constants concatenated (axis 0).
        let mut data = vec![];
        for v in ins {
            let Val::Const(c) = v else { unreachable!() };
            if c.dims.len() > 1 {
                return Err(self.unsupported(
                    node,
                    idx,
                    "concatenation of multi-axis constants",
                    "fold constants before export",
                ));
            }
            data.extend_from_slice(&c.data);
        }
        self.set_vector(&out, data);
        Ok(())
    }

    fn op_concat(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        let label = node_label(n.node, n.idx);
        let mut xs = vec![];
        let mut shapes = vec![];
        for v in ins {
            let Some((x, s)) = runtime(v) else {
                return Err(self.unsupported(
                    node,
                    idx,
                    "constant input",
                    "concatenate run-time values only",
                ));
            };
            xs.push(x);
            shapes.push(s);
        }
        let axis = attr(node, "axis").map(|a| a.i).unwrap_or(1);
        let r = shapes[0].len();
        // Same rank and the same leading dims, or [2,3] ++ [4,3] became [2,7] silently (and a lower-rank
        // input was indexed past its end).
        if r == 0
            || shapes
                .iter()
                .any(|s| s.len() != r || s[..r - 1] != shapes[0][..r - 1])
        {
            return Err(ImportError::Malformed(format!(
                "node {label}: Concat of shapes {shapes:?} (they must differ in the last axis only)"
            )));
        }
        if Self::feature_axis(axis, r) != Some(r - 1) {
            return Err(self.unsupported(
                node,
                idx,
                &format!("axis {axis}"),
                "concatenate along the last axis",
            ));
        }
        let mut shape = shapes[0].clone();
        shape[r - 1] = shapes.iter().map(|s| s[r - 1]).sum();
        self.emit(&label, Op::Concat, xs, &out, shape);
        Ok(())
    }

    fn op_slice_const(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        let Val::Const(c) = &ins[0] else {
            unreachable!()
        };
        let arg = |i: usize| match ins.get(i) {
            Some(Val::Const(c)) if c.numel() == 1 => Some(c.data[0] as i64),
            _ => None,
        };
        let (Some(s0), Some(e0)) = (arg(1), arg(2)) else {
            return Err(self.unsupported(node, idx, "dynamic bounds", "use constant slice bounds"));
        };
        let step = arg(4).unwrap_or(1);
        let n = c.numel() as i64;
        if step != 1 {
            return Err(self.unsupported(
                node,
                idx,
                "step != 1 on a constant",
                "fold constants before export",
            ));
        }
        let clampi = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
        let (a, b) = (clampi(s0) as usize, clampi(e0) as usize);
        let data = c.data[a..b.max(a)].to_vec();
        self.set_vector(&out, data);
        Ok(())
    }

    fn op_slice(&mut self, n: &NodeIn<'_>) -> Result<(), ImportError> {
        let (node, idx, ins) = n.parts();
        let out = n.out.clone();
        let label = node_label(n.node, n.idx);
        let (x, xs) = self.runtime_input(n)?;
        let c = |i: usize| match ins.get(i) {
            Some(Val::Const(c)) => Some(c.data.iter().map(|v| *v as i64).collect::<Vec<_>>()),
            _ => None,
        };
        let (Some(starts), Some(ends)) = (c(1), c(2)) else {
            return Err(self.unsupported(node, idx, "dynamic bounds", "use constant slice bounds"));
        };
        let axes = c(3).unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = c(4).unwrap_or_else(|| vec![1; starts.len()]);
        let last = *xs.last().unwrap() as i64;
        if starts.len() != 1
            || ends.len() != 1
            || axes.len() != 1
            || steps.len() != 1
            || steps[0] != 1
            || Self::feature_axis(axes[0], xs.len()) != Some(xs.len() - 1)
        {
            return Err(self.unsupported(
                node,
                idx,
                "not a unit-step slice of the last axis",
                "slice the last axis only",
            ));
        }
        let clampi = |v: i64| {
            if v < 0 {
                (v + last).max(0)
            } else {
                v.min(last)
            }
        };
        let (s, e) = (clampi(starts[0]), clampi(ends[0]));
        if e <= s {
            return Err(self.unsupported(
                node,
                idx,
                "empty slice",
                "slices must keep at least one element",
            ));
        }
        let mut shape = xs.clone();
        *shape.last_mut().unwrap() = (e - s) as usize;
        self.emit(
            &label,
            Op::Slice {
                start: s as usize,
                len: (e - s) as usize,
            },
            vec![x],
            &out,
            shape,
        );
        Ok(())
    }

    /// The node's first input, which must be computed per step (a constant one is left for export-time folding).
    fn runtime_input(&self, n: &NodeIn<'_>) -> Result<(String, Vec<usize>), ImportError> {
        n.ins.first().and_then(runtime).ok_or_else(|| {
            self.unsupported(
                n.node,
                n.idx,
                "a constant first input",
                "constant-fold the graph before export",
            )
        })
    }

    /// `out` is the 1-D constant `data` (the results of folded shape arithmetic).
    fn set_vector(&mut self, out: &str, data: Vec<f64>) {
        self.vals.insert(
            out.to_string(),
            Val::Const(Const {
                dims: vec![data.len()],
                data,
            }),
        );
    }

    /// Add / Sub / Mul / Div: folded when both operands are constants, an elementwise op on two run-time values,
    /// or an affine map (folded into a bias-less Dense before it where possible) with a constant operand.
    fn binary(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        ins: &[Val],
        out: &str,
    ) -> Result<(), ImportError> {
        match (&ins[0], &ins[1]) {
            (Val::Const(a), Val::Const(b)) => self.fold_binary(node, idx, a, b, out),
            (Val::Runtime { name: a, shape: sa }, Val::Runtime { name: b, shape: sb }) => {
                self.binary_of_runtimes(node, idx, (a, sa), (b, sb), out)
            }
            (Val::Runtime { name, shape }, Val::Const(c)) => {
                self.binary_with_const(node, idx, (name, shape), c, false, out)
            }
            (Val::Const(c), Val::Runtime { name, shape }) => {
                self.binary_with_const(node, idx, (name, shape), c, true, out)
            }
            // `Importer::node` sends a recurrent op's stacked outputs elsewhere before this.
            (Val::Stacked { .. }, _) | (_, Val::Stacked { .. }) => {
                Err(self.stacked_input(node, idx))
            }
        }
    }

    /// Both operands constant: the result is a constant (scalar broadcast or equal shapes).
    fn fold_binary(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        a: &Const,
        b: &Const,
        out: &str,
    ) -> Result<(), ImportError> {
        if a.numel() != b.numel() && a.numel() != 1 && b.numel() != 1 {
            return Err(self.unsupported(
                node,
                idx,
                "constant broadcast",
                "fold constants before export",
            ));
        }
        let op = node.op_type.as_str();
        let n = a.numel().max(b.numel());
        let dims = if a.numel() >= b.numel() {
            a.dims.clone()
        } else {
            b.dims.clone()
        };
        let data = (0..n)
            .map(|i| {
                let (x, y) = (
                    a.data[if a.numel() == 1 { 0 } else { i }],
                    b.data[if b.numel() == 1 { 0 } else { i }],
                );
                match op {
                    "Add" => x + y,
                    "Sub" => x - y,
                    "Mul" => x * y,
                    _ => x / y,
                }
            })
            .collect();
        self.vals
            .insert(out.to_string(), Val::Const(Const { dims, data }));
        Ok(())
    }

    /// Two run-time operands of equal shapes: Add, Mul, or Sub as `a + (-1 * b)`.
    fn binary_of_runtimes(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        (a, sa): (&String, &Vec<usize>),
        (b, sb): (&String, &Vec<usize>),
        out: &str,
    ) -> Result<(), ImportError> {
        if sa != sb {
            return Err(self.unsupported(
                node,
                idx,
                &format!("shapes {sa:?} and {sb:?}"),
                "operands must have equal shapes",
            ));
        }
        let label = node_label(node, idx);
        match node.op_type.as_str() {
            "Add" => self.emit(&label, Op::Add, vec![a.clone(), b.clone()], out, sa.clone()),
            "Mul" => self.emit(&label, Op::Mul, vec![a.clone(), b.clone()], out, sa.clone()),
            "Sub" => {
                let neg = self.add_tensor(&format!("{label}.neg"), vec![1], vec![-1.0]);
                let tmp = format!("{out}/neg");
                let tmp_ir = Self::ir_name(&tmp);
                self.emit(
                    &format!("{label}/neg"),
                    Op::Affine {
                        scale: Some(neg),
                        shift: None,
                    },
                    vec![b.clone()],
                    &tmp,
                    sa.clone(),
                );
                self.emit(&label, Op::Add, vec![a.clone(), tmp_ir], out, sa.clone());
            }
            _ => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "division of two run-time values",
                    "not supported yet",
                ));
            }
        }
        Ok(())
    }

    /// A run-time operand `r` and a constant `c` (`const_first`: `c op r`) that broadcasts over the last axis:
    /// an affine map, or the bias of the bias-less Dense that produced `r` when `r + c` is its only use.
    fn binary_with_const(
        &mut self,
        node: &pb::NodeProto,
        idx: usize,
        (r, shape): (&String, &Vec<usize>),
        c: &Const,
        const_first: bool,
        out: &str,
    ) -> Result<(), ImportError> {
        let last = *shape.last().unwrap();
        let total: usize = shape.iter().product();
        // A leading batch axis of 1 in the constant broadcasts over the batch.
        let n = c.numel();
        if n != 1 && n != last && n != total {
            return Err(self.unsupported(
                node,
                idx,
                &format!("constant of dims {:?} against {shape:?}", c.dims),
                "constants must broadcast over the last axis",
            ));
        }
        let label = node_label(node, idx);
        let op = node.op_type.as_str();
        let v: Vec<f32> = c.data.iter().map(|v| *v as f32).collect();
        let len = v.len();
        if op == "Add" && len == last && shape.len() == 1 {
            let onnx_in = &node.input[const_first as usize];
            if self.fold_into_dense_bias(r, onnx_in, &label, &v, shape, out) {
                return Ok(());
            }
        }
        let (scale, shift) = match (op, const_first) {
            ("Add", _) => (None, Some(v)),
            ("Sub", false) => (None, Some(v.iter().map(|x| -x).collect())),
            ("Sub", true) => (Some(vec![-1.0; len]), Some(v)),
            ("Mul", _) => (Some(v), None),
            ("Div", false) => (Some(v.iter().map(|x| 1.0 / x).collect()), None),
            _ => {
                return Err(self.unsupported(
                    node,
                    idx,
                    "constant divided by a run-time value",
                    "not supported",
                ));
            }
        };
        let scale = scale.map(|s| self.add_tensor(&format!("{label}.scale"), vec![len], s));
        let shift = shift.map(|s| self.add_tensor(&format!("{label}.shift"), vec![len], s));
        self.emit(
            &label,
            Op::Affine { scale, shift },
            vec![r.clone()],
            out,
            shape.clone(),
        );
        Ok(())
    }

    /// `Dense (no bias) + bias` as one Dense when nothing else reads the product (`onnx_in`, the ONNX name of
    /// the Add's run-time input `r`): true if folded (`out` is then that Dense's output).
    fn fold_into_dense_bias(
        &mut self,
        r: &str,
        onnx_in: &str,
        label: &str,
        bias: &[f32],
        shape: &[usize],
        out: &str,
    ) -> bool {
        let Some(&pi) = self.producer.get(r) else {
            return false;
        };
        let only_use = self.uses.get(onnx_in).copied().unwrap_or(0) == 1;
        if !only_use || !matches!(self.nodes[pi].op, Op::Dense { bias: None, .. }) {
            return false;
        }
        let b = self.add_tensor(&format!("{label}.bias"), vec![bias.len()], bias.to_vec());
        if let Op::Dense { bias, .. } = &mut self.nodes[pi].op {
            *bias = Some(b);
        }
        let ir = Self::ir_name(out);
        self.nodes[pi].output = ir.clone();
        self.producer.insert(ir.clone(), pi);
        self.vals.insert(
            out.to_string(),
            Val::Runtime {
                name: ir,
                shape: shape.to_vec(),
            },
        );
        true
    }
}

/// The names of a model's graph outputs, in order.
pub fn graph_output_names(bytes: &[u8]) -> Result<Vec<String>, ImportError> {
    let model = pb::ModelProto::decode(bytes)
        .map_err(|e| ImportError::Malformed(format!("not an ONNX model: {e}")))?;
    Ok(model
        .graph
        .map(|g| g.output.into_iter().map(|o| o.name).collect())
        .unwrap_or_default())
}

/// A serialized ONNX `TensorProto` (e.g. a backend test's `input_0.pb`): its dims and values as f64.
pub fn read_tensor(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f64>), ImportError> {
    let t = pb::TensorProto::decode(bytes)
        .map_err(|e| ImportError::Malformed(format!("not an ONNX TensorProto: {e}")))?;
    let c = tensor_to_const(&t)?;
    Ok((c.dims, c.data))
}

/// The result of an import: a manifest (without golden vectors) and its weights.
#[derive(Debug, Clone)]
pub struct Imported {
    pub manifest: Manifest,
    pub tensors: BTreeMap<String, Tensor>,
}

/// Import an ONNX model according to `spec`: the graph's inputs (recurrent state, then the observation) become
/// run-time values, every node is lowered through the op registry, the spec's outputs become the distribution's
/// and the value's inputs, the IR is split into modules by what each output needs, and the observation's space
/// and preprocessing are recorded.
pub fn import_onnx(bytes: &[u8], spec: &ImportSpec, source: &str) -> Result<Imported, ImportError> {
    let model = pb::ModelProto::decode(bytes)
        .map_err(|e| ImportError::Malformed(format!("not an ONNX model: {e}")))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Malformed("ONNX model has no graph".into()))?;
    let mut imp = Importer::for_graph(graph)?;
    let state_inputs = recurrent_inputs(&mut imp, graph, spec)?;
    let (feat, input_u8) = observation_input(&mut imp, graph, spec)?;
    for (i, n) in graph.node.iter().enumerate() {
        imp.node(n, i)?;
        if let Some(what) = imp.oversize.take() {
            return Err(ImportError::Malformed(what));
        }
    }
    let states = recurrent_outputs(&imp, spec, &state_inputs)?;
    let heads = heads(&mut imp, graph, spec)?;
    let value = spec
        .value
        .as_ref()
        .map(|v| runtime_out(&imp, graph, v, "value").map(|(n, _)| n))
        .transpose()?;
    let action = spec.action.clone().or(heads.default_action).ok_or_else(|| {
        ImportError::Spec("a Gaussian policy needs \"action\": {\"kind\": \"box\", \"shape\": [..], \"low\": [..], \"high\": [..]}".into())
    })?;
    let modules = split_modules(&imp.nodes, &heads.policy_values, value.as_ref(), &states);
    let mut tensors = BTreeMap::new();
    for m in &modules {
        for n in &m.nodes {
            for t in n.op.tensors() {
                tensors.insert(t.to_string(), imp.tensors[t].clone());
            }
        }
    }
    tensors.extend(heads.tensors);
    let (observation, preprocess) = observation_preprocess(spec, &feat, input_u8, &mut tensors)?;
    let manifest = Manifest {
        name: spec.name.clone().unwrap_or_else(|| graph.name.clone()),
        producer: Producer {
            tool: "policyport".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source: format!("onnx:{source}"),
            notes: format!(
                "{} {}, ir {}{}",
                model.producer_name,
                model.producer_version,
                model.ir_version,
                spec.source
                    .as_ref()
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default()
            ),
        },
        observation,
        action,
        preprocess,
        modules,
        distribution: heads.distribution,
        value,
        recurrent: (!states.is_empty()).then_some(policyport_format::RecurrentSpec { states }),
        golden: vec![],
        action_masks: false,
    };
    Ok(Imported { manifest, tensors })
}

impl Importer {
    /// An importer for `graph`: each value's readers counted, the initializers as constants.
    fn for_graph(graph: &pb::GraphProto) -> Result<Self, ImportError> {
        let mut imp = Importer {
            vals: HashMap::new(),
            nodes: vec![],
            tensors: BTreeMap::new(),
            uses: HashMap::new(),
            producer: HashMap::new(),
            oversize: None,
        };
        for n in &graph.node {
            for i in &n.input {
                *imp.uses.entry(i.clone()).or_default() += 1;
            }
        }
        for o in &graph.output {
            *imp.uses.entry(o.name.clone()).or_default() += 1;
        }
        for init in &graph.initializer {
            imp.vals
                .insert(init.name.clone(), Val::Const(tensor_to_const(init)?));
        }
        Ok(imp)
    }
}

/// One recurrent state input of the graph as the artifact holds it: a state per layer (`names`), each of
/// per-env `shape`; `stacked` when the graph input is `[layers, batch, ...]` rather than `[batch, ...]`.
struct StateInput {
    names: Vec<String>,
    shape: Vec<usize>,
    stacked: bool,
}

/// The recurrent state inputs the spec names (`[layers, batch, features...]`: one state per layer, or `[batch,
/// features...]`), registered as run-time values of `imp`.
fn recurrent_inputs(
    imp: &mut Importer,
    graph: &pb::GraphProto,
    spec: &ImportSpec,
) -> Result<Vec<StateInput>, ImportError> {
    let dims_of = |i: &pb::ValueInfoProto| -> Vec<Option<i64>> {
        i.r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .and_then(|t| t.shape.as_ref())
            .map(|s| s.dim.iter().map(|d| d.dim_value).collect())
            .unwrap_or_default()
    };
    let static_dims = |d: &[Option<i64>], what: &str| -> Result<Vec<usize>, ImportError> {
        d.iter()
            .map(|v| {
                v.filter(|v| *v > 0 && *v <= MAX_VALUE_ELEMS as i64)
                    .map(|v| v as usize)
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ImportError::Spec(format!(
                    "{what} needs static dims (1 ..= 2^24) besides the batch, has {d:?}"
                ))
            })
    };
    let mut state_inputs = vec![];
    for pair in &spec.recurrent {
        let gi = graph
            .input
            .iter()
            .find(|i| i.name == pair.input)
            .ok_or_else(|| {
                ImportError::Spec(format!(
                    "recurrent input '{}' is not a graph input",
                    pair.input
                ))
            })?;
        if imp.vals.contains_key(&pair.input) {
            return Err(ImportError::Spec(format!(
                "recurrent input '{}' is an initializer",
                pair.input
            )));
        }
        let d = dims_of(gi);
        let what = format!("recurrent input '{}'", pair.input);
        let (names, shape, stacked) = if d.len() >= 3 {
            let layers = static_dims(&d[..1], &what)?[0];
            if layers > MAX_RNN_LAYERS {
                return Err(ImportError::Spec(format!(
                    "{what} has {layers} layers (at most {MAX_RNN_LAYERS})"
                )));
            }
            let feat = static_dims(&d[2..], &what)?;
            (
                (0..layers)
                    .map(|k| format!("{}.{k}", pair.input))
                    .collect::<Vec<_>>(),
                feat,
                true,
            )
        } else if d.len() == 2 {
            (
                vec![pair.input.clone()],
                static_dims(&d[1..], &what)?,
                false,
            )
        } else {
            return Err(ImportError::Spec(format!(
                "{what} has rank {}: [layers, batch, ...] or [batch, ...]",
                d.len()
            )));
        };
        let parts: Vec<String> = names.iter().map(|n| format!("{STATE_PREFIX}{n}")).collect();
        imp.vals.insert(
            pair.input.clone(),
            if stacked {
                Val::Stacked {
                    parts,
                    shape: shape.clone(),
                    dir: false,
                }
            } else {
                Val::Runtime {
                    name: parts[0].clone(),
                    shape: shape.clone(),
                }
            },
        );
        state_inputs.push(StateInput {
            names,
            shape,
            stacked,
        });
    }
    Ok(state_inputs)
}

/// The observation input (the one the spec names, the only run-time input, or a dict observation's inputs),
/// registered as `imp`'s observation value: its feature shape, and whether it is uint8.
fn observation_input(
    imp: &mut Importer,
    graph: &pb::GraphProto,
    spec: &ImportSpec,
) -> Result<(Vec<usize>, bool), ImportError> {
    let runtime_inputs: Vec<&pb::ValueInfoProto> = graph
        .input
        .iter()
        .filter(|i| !imp.vals.contains_key(&i.name))
        .collect();
    Ok(match &spec.observation {
        Some(ObservationSpace::Dict { spaces }) => {
            (dict_inputs(imp, spaces, &runtime_inputs, spec)?, false)
        }
        _ => {
            let input = match &spec.input {
                Some(name) => runtime_inputs
                    .iter()
                    .find(|i| &i.name == name)
                    .copied()
                    .ok_or_else(|| {
                        ImportError::Spec(format!(
                            "graph has no input '{name}' (inputs: {:?})",
                            runtime_inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
                        ))
                    })?,
                None if runtime_inputs.len() == 1 => runtime_inputs[0],
                None => {
                    return Err(ImportError::Spec(format!(
                        "graph has {} run-time inputs {:?}: name the observation with \"input\", or describe \
                         a dict observation whose keys are these inputs",
                        runtime_inputs.len(),
                        runtime_inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
                    )));
                }
            };
            let (feat, elem) = input_feature_shape(input)?;
            imp.vals.insert(
                input.name.clone(),
                Val::Runtime {
                    name: OBS_VALUE.into(),
                    shape: feat.clone(),
                },
            );
            (feat, elem == data_type::UINT8)
        }
    })
}

/// The recurrent states of the artifact: each input's next value is the spec's output of the same shape.
fn recurrent_outputs(
    imp: &Importer,
    spec: &ImportSpec,
    state_inputs: &[StateInput],
) -> Result<Vec<policyport_format::StateSpec>, ImportError> {
    let mut states = vec![];
    for (pair, input) in spec.recurrent.iter().zip(state_inputs) {
        let (names, shape, stacked) = (&input.names, &input.shape, &input.stacked);
        let next: Vec<String> = match (imp.vals.get(&pair.output), stacked) {
            (
                Some(Val::Stacked {
                    parts,
                    shape: s,
                    dir: false,
                }),
                true,
            ) if s == shape && parts.len() == names.len() => parts.clone(),
            (Some(Val::Runtime { name, shape: s }), false) if s == shape => vec![name.clone()],
            (None, _) => {
                return Err(ImportError::Spec(format!(
                    "recurrent output '{}' is not a value of the graph",
                    pair.output
                )));
            }
            _ => {
                return Err(ImportError::Spec(format!(
                    "recurrent output '{}' does not have the shape of input '{}' ({} x {shape:?})",
                    pair.output,
                    pair.input,
                    names.len()
                )));
            }
        };
        for (n, nx) in names.iter().zip(next) {
            states.push(policyport_format::StateSpec {
                name: n.clone(),
                shape: shape.clone(),
                next: nx,
            });
        }
    }
    Ok(states)
}

/// `name`'s run-time value (its IR name and per-env shape), or why it cannot be an output (`what`: its role).
fn runtime_out(
    imp: &Importer,
    graph: &pb::GraphProto,
    name: &str,
    what: &str,
) -> Result<(String, Vec<usize>), ImportError> {
    match imp.vals.get(name) {
        Some(Val::Runtime { name, shape }) => Ok((name.clone(), shape.clone())),
        Some(Val::Const(_)) => Err(ImportError::Spec(format!(
            "{what} '{name}' is a constant, not a function of the observation"
        ))),
        Some(Val::Stacked { .. }) => Err(ImportError::Spec(format!(
            "{what} '{name}' still has the time or layer axis of a recurrent op in front of the batch"
        ))),
        None => Err(ImportError::Spec(format!(
            "{what} '{name}' is not a value of the graph (outputs: {:?})",
            graph.output.iter().map(|o| &o.name).collect::<Vec<_>>()
        ))),
    }
}

/// What the spec's distribution reads: the distribution, the action space it implies (discrete ones), the
/// values the policy head must compute, and tensors it adds (a constant log-std).
struct Heads {
    distribution: Distribution,
    default_action: Option<ActionSpace>,
    policy_values: Vec<String>,
    tensors: Vec<(String, Tensor)>,
}

fn heads(
    imp: &mut Importer,
    graph: &pb::GraphProto,
    spec: &ImportSpec,
) -> Result<Heads, ImportError> {
    let mut tensors_extra: Vec<(String, Tensor)> = vec![];
    let (distribution, default_action, policy_values) = match &spec.distribution {
        DistSpec::Categorical { logits } => {
            let (v, s) = runtime_out(imp, graph, logits, "logits")?;
            let n = s.iter().product();
            // Logits of several axes (a spatial action map, a conv layer's output): one categorical over all of
            // them, row-major.
            let v = if s.len() > 1 {
                let flat = format!("{logits}.flat");
                imp.emit(&flat, Op::Flatten, vec![v], &flat, vec![n]);
                Importer::ir_name(&flat)
            } else {
                v
            };
            (
                Distribution::Categorical { logits: v.clone() },
                Some(ActionSpace::Discrete { n }),
                vec![v],
            )
        }
        DistSpec::MultiCategorical { logits, nvec } => {
            let (v, _) = runtime_out(imp, graph, logits, "logits")?;
            (
                Distribution::MultiCategorical { logits: v.clone() },
                Some(ActionSpace::MultiDiscrete { nvec: nvec.clone() }),
                vec![v],
            )
        }
        DistSpec::DiagGaussian {
            mean,
            log_std,
            log_std_range,
            ..
        }
        | DistSpec::SquashedGaussian {
            mean,
            log_std,
            log_std_range,
            ..
        } => {
            let (m, ms) = runtime_out(imp, graph, mean, "mean")?;
            let k: usize = ms.iter().product();
            let mut values = vec![m.clone()];
            let (ls, log_std_value, log_std_tensor) = log_std_of(imp, graph, log_std, k)?;
            values.extend(log_std_value);
            tensors_extra.extend(log_std_tensor.map(|t| ("log_std".to_string(), t)));
            let dist = match &spec.distribution {
                DistSpec::DiagGaussian { clip, .. } => Distribution::DiagGaussian {
                    mean: m,
                    log_std: ls,
                    log_std_range: *log_std_range,
                    clip: *clip,
                },
                // The other arm of this match: a squashed Gaussian.
                other => Distribution::SquashedGaussian {
                    mean: m,
                    log_std: ls,
                    log_std_range: *log_std_range,
                    deterministic: match other {
                        DistSpec::SquashedGaussian { deterministic, .. } => *deterministic,
                        _ => Default::default(),
                    },
                },
            };
            (dist, None, values)
        }
    };
    Ok(Heads {
        distribution,
        default_action,
        policy_values,
        tensors: tensors_extra,
    })
}

/// A Gaussian's log-std as the spec gives it, for a mean of `k` numbers: a graph output that is a run-time value
/// (then also a value the policy head computes), or a constant — a constant output, an initializer, numbers in
/// the spec — stored as the artifact's `log_std` tensor.
fn log_std_of(
    imp: &Importer,
    graph: &pb::GraphProto,
    log_std: &LogStdSpec,
    k: usize,
) -> Result<(LogStd, Option<String>, Option<Tensor>), ImportError> {
    let parameter = |t: Tensor| {
        let ls = LogStd::Parameter {
            tensor: "log_std".into(),
        };
        Ok((ls, None, Some(t)))
    };
    let f32s = |c: &Const| c.data.iter().map(|v| *v as f32).collect::<Vec<f32>>();
    match log_std {
        LogStdSpec::Output(o) => match imp.vals.get(o) {
            Some(Val::Const(c)) if c.numel() != k => Err(ImportError::Spec(format!(
                "log_std output '{o}' is a constant of {} numbers, the mean has {k}",
                c.numel()
            ))),
            Some(Val::Const(c)) => parameter(Tensor::new(vec![k], f32s(c))),
            _ => {
                let (v, _) = runtime_out(imp, graph, o, "log_std")?;
                Ok((LogStd::Value { value: v.clone() }, Some(v), None))
            }
        },
        LogStdSpec::Initializer(name) => match imp.vals.get(name) {
            Some(Val::Const(c)) => parameter(Tensor::new(vec![c.numel()], f32s(c))),
            _ => Err(ImportError::Spec(format!(
                "'{name}' is not an initializer of the graph"
            ))),
        },
        LogStdSpec::Values(v) => parameter(Tensor::new(vec![v.len()], v.clone())),
    }
}

/// The IR nodes split into modules by what reaches them: encoder (both heads), policy head, value head, and what
/// only the next recurrent state needs, each with the values it reads and those later modules or the artifact
/// read from it (nodes nothing reads are dropped).
fn split_modules(
    nodes: &[Node],
    policy_values: &[String],
    value: Option<&String>,
    states: &[policyport_format::StateSpec],
) -> Vec<Module> {
    let n_nodes = nodes.len();
    let reach = |targets: &[String]| -> Vec<bool> {
        let mut need: HashSet<&str> = targets.iter().map(|s| s.as_str()).collect();
        let mut keep = vec![false; n_nodes];
        for i in (0..n_nodes).rev() {
            if need.contains(nodes[i].output.as_str()) {
                keep[i] = true;
                for x in &nodes[i].inputs {
                    need.insert(x);
                }
            }
        }
        keep
    };
    let pi = reach(policy_values);
    let vf = reach(&value.into_iter().cloned().collect::<Vec<_>>());
    let next_states: Vec<String> = states.iter().map(|s| s.next.clone()).collect();
    let st = reach(&next_states);
    let mut groups: Vec<(&str, ModuleRole, Vec<Node>)> = vec![
        ("encoder", ModuleRole::Encoder, vec![]),
        ("pi", ModuleRole::PolicyHead, vec![]),
        ("vf", ModuleRole::ValueHead, vec![]),
        // What only the next recurrent state needs (e.g. the last layer's cell state), after the heads.
        ("recurrent_state", ModuleRole::RecurrentCore, vec![]),
    ];
    for (i, node) in nodes.iter().enumerate() {
        let g = match (pi[i], vf[i], st[i]) {
            (true, true, _) => 0,
            (true, false, _) => 1,
            (false, true, _) => 2,
            (false, false, true) => 3,
            (false, false, false) => continue,
        };
        groups[g].2.push(node.clone());
    }
    let final_reads: Vec<String> = policy_values
        .iter()
        .chain(value)
        .chain(next_states.iter())
        .cloned()
        .collect();
    let mut modules = vec![];
    for (gi, (name, role, group)) in groups.iter().enumerate() {
        if group.is_empty() {
            continue;
        }
        let defined: HashSet<&str> = group.iter().map(|n| n.output.as_str()).collect();
        let mut inputs: Vec<String> = vec![];
        for n in group {
            for x in &n.inputs {
                if !defined.contains(x.as_str()) && !inputs.contains(x) {
                    inputs.push(x.clone());
                }
            }
        }
        let later: HashSet<&str> = groups[gi + 1..]
            .iter()
            .flat_map(|g| g.2.iter())
            .flat_map(|n| n.inputs.iter().map(|s| s.as_str()))
            .collect();
        let outputs: Vec<String> = group
            .iter()
            .map(|n| n.output.clone())
            .filter(|o| later.contains(o.as_str()) || final_reads.contains(o))
            .collect();
        modules.push(Module {
            name: name.to_string(),
            role: *role,
            inputs,
            outputs,
            nodes: group.clone(),
        });
    }
    modules
}

/// The observation space (the spec's, else a box of the input's shape and type) and its preprocessing (one-hot,
/// scale, normalization, whose tensors go into `tensors`).
fn observation_preprocess(
    spec: &ImportSpec,
    feat: &[usize],
    input_u8: bool,
    tensors: &mut BTreeMap<String, Tensor>,
) -> Result<(ObservationSpace, Vec<Preprocess>), ImportError> {
    let observation = spec.observation.clone().unwrap_or(ObservationSpace::Box {
        shape: feat.to_vec(),
        dtype: if input_u8 {
            ObsDType::U8
        } else {
            ObsDType::F32
        },
    });
    let mut preprocess = vec![];
    if let ObservationSpace::Discrete { n } = observation {
        preprocess.push(Preprocess::OneHot { n });
    }
    if let Some(f) = spec.scale {
        preprocess.push(Preprocess::Scale { factor: f });
    }
    if let Some(norm) = &spec.normalize {
        let need = feat.iter().product::<usize>();
        if norm.mean.len() != need || norm.std.len() != need {
            return Err(ImportError::Spec(format!(
                "normalize: mean/std need {need} values each, have {} and {}",
                norm.mean.len(),
                norm.std.len()
            )));
        }
        tensors.insert(
            "obs_norm.mean".into(),
            Tensor::new(feat.to_vec(), norm.mean.clone()),
        );
        tensors.insert(
            "obs_norm.std".into(),
            Tensor::new(feat.to_vec(), norm.std.clone()),
        );
        preprocess.push(Preprocess::Normalize {
            mean: "obs_norm.mean".into(),
            std: "obs_norm.std".into(),
            clip: norm.clip,
        });
    }
    if tensors
        .get("obs_norm.mean")
        .is_some_and(|t| t.data.len() != feat.iter().product::<usize>())
    {
        return Err(ImportError::Spec(format!(
            "normalize: mean/std need {} values",
            feat.iter().product::<usize>()
        )));
    }
    Ok((observation, preprocess))
}

/// A graph input's feature shape (`[batch, features...]` with static features within the value limit) and
/// element type (float32 or uint8).
fn input_feature_shape(input: &pb::ValueInfoProto) -> Result<(Vec<usize>, i32), ImportError> {
    let tt = input.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
    let dims: Vec<Option<i64>> = tt
        .and_then(|t| t.shape.as_ref())
        .map(|s| s.dim.iter().map(|d| d.dim_value).collect())
        .unwrap_or_default();
    let elem = tt.map(|t| t.elem_type).unwrap_or(0);
    if dims.len() < 2 {
        return Err(ImportError::Spec(format!(
            "input '{}' must be [batch, features...], has rank {}",
            input.name,
            dims.len()
        )));
    }
    let feat: Vec<usize> = dims[1..]
        .iter()
        .map(|d| {
            d.filter(|v| *v > 0 && *v <= MAX_VALUE_ELEMS as i64)
                .map(|v| v as usize)
        })
        .collect::<Option<Vec<usize>>>()
        .filter(|f| {
            f.iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some_and(|n| n <= MAX_VALUE_ELEMS)
        })
        .ok_or_else(|| {
            ImportError::Spec(format!(
                "input '{}' needs static feature dims, has {dims:?}",
                input.name
            ))
        })?;
    if elem != data_type::FLOAT && elem != data_type::UINT8 {
        return Err(ImportError::Spec(format!(
            "input '{}' has element type {elem}; float32 (or uint8) expected",
            input.name
        )));
    }
    Ok((feat, elem))
}

/// A dict observation (format 1.2) over a graph with one input per part, the way `torch.onnx.export` writes a
/// policy taking a dict (SB3's `MultiInputPolicy`: one named input per key): the runtime's observation is each
/// env's parts flattened and concatenated in the spec's order, so each graph input becomes a slice of it,
/// reshaped to the part's shape. Every run-time input must be a part (or a recurrent state, handled before);
/// a part's shape must be the input's feature shape, and a uint8 input needs a `u8` part (a float part could
/// carry fractions the graph's uint8 input never sees). Returns the observation's feature shape, `[total]`.
fn dict_inputs(
    imp: &mut Importer,
    spaces: &[policyport_format::DictEntry],
    runtime_inputs: &[&pb::ValueInfoProto],
    spec: &ImportSpec,
) -> Result<Vec<usize>, ImportError> {
    if let Some(name) = &spec.input {
        return Err(ImportError::Spec(format!(
            "\"input\": \"{name}\" with a dict observation: each dict key names its graph input; drop \"input\""
        )));
    }
    let names = || runtime_inputs.iter().map(|i| &i.name).collect::<Vec<_>>();
    if let Some(extra) = runtime_inputs
        .iter()
        .find(|i| !spaces.iter().any(|e| e.key == i.name))
    {
        return Err(ImportError::Spec(format!(
            "graph input '{}' is not a part of the dict observation (keys: {:?}) nor a recurrent state",
            extra.name,
            spaces.iter().map(|e| &e.key).collect::<Vec<_>>()
        )));
    }
    let mut off = 0usize;
    for e in spaces {
        let input = runtime_inputs
            .iter()
            .find(|i| i.name == e.key)
            .ok_or_else(|| {
                ImportError::Spec(format!(
                    "dict observation key '{}' is not a run-time graph input (inputs: {:?})",
                    e.key,
                    names()
                ))
            })?;
        let (feat, elem) = input_feature_shape(input)?;
        if feat != e.shape {
            return Err(ImportError::Spec(format!(
                "dict part '{}' has shape {:?}, its graph input {feat:?}",
                e.key, e.shape
            )));
        }
        if elem == data_type::UINT8 && e.dtype != ObsDType::U8 {
            return Err(ImportError::Spec(format!(
                "graph input '{}' is uint8: its dict part needs \"dtype\": \"u8\"",
                e.key
            )));
        }
        let n: usize = feat.iter().product();
        let flat = if feat.len() > 1 {
            format!("{}.flat", e.key)
        } else {
            e.key.clone()
        };
        imp.emit(
            &format!("{}.slice", e.key),
            Op::Slice { start: off, len: n },
            vec![OBS_VALUE.into()],
            &flat,
            vec![n],
        );
        if feat.len() > 1 {
            let src = Importer::ir_name(&flat);
            imp.emit(
                &format!("{}.reshape", e.key),
                Op::Reshape {
                    shape: feat.clone(),
                },
                vec![src],
                &e.key,
                feat.clone(),
            );
        }
        off += n;
    }
    Ok(vec![off])
}

/// A value computed per step: its IR name and feature shape (None for constants and stacked values).
fn runtime(v: &Val) -> Option<(String, Vec<usize>)> {
    match v {
        Val::Runtime { name, shape } => Some((name.clone(), shape.clone())),
        Val::Const(_) | Val::Stacked { .. } => None,
    }
}

/// The core family: constants, identities, dense layers, elementwise arithmetic, activations, and the reshapes,
/// concatenations and slices of run-time values.
fn register_core(reg: &mut OpRegistry) {
    reg.insert(&["Constant"], 0, |imp, n| imp.op_constant(n));
    reg.insert(&["Identity", "Dropout"], 1, |imp, n| imp.op_identity(n));
    reg.insert(&["Gemm", "MatMul"], 2, |imp, n| imp.op_gemm(n));
    reg.insert(&["Add", "Sub", "Mul", "Div"], 2, |imp, n| imp.op_binary(n));
    reg.insert(
        &[
            "Relu",
            "Tanh",
            "Sigmoid",
            "Erf",
            "Elu",
            "LeakyRelu",
            "Gelu",
            "Softmax",
            "LogSoftmax",
            "Flatten",
        ],
        1,
        |imp, n| imp.op_activation(n),
    );
    reg.insert(&["Reshape"], 2, |imp, n| imp.op_reshape(n));
    reg.insert(&["Concat"], 1, |imp, n| {
        let ins = &n.ins[..];
        if ins.iter().all(|v| matches!(v, Val::Const(_))) {
            return imp.op_concat_const(n);
        }
        imp.op_concat(n)
    });
    reg.insert(&["Slice"], 3, |imp, n| {
        let ins = &n.ins[..];
        if matches!(&ins[0], Val::Const(c) if c.dims.len() <= 1) {
            return imp.op_slice_const(n);
        }
        imp.op_slice(n)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `log_std_of`'s three sources on the pendulum fixture (a diagonal Gaussian): literal values and a run-time
    /// output become the artifact's parameter / the head's value; a name that is no initializer is a typed
    /// refusal.
    #[test]
    fn log_std_from_values_an_output_or_a_missing_initializer() {
        // The manifest dir at run time (cargo test sets it): the compile-time one names the checkout that built
        // this binary, which a shared target dir reuses from another checkout (CONTRIBUTING: "Freshness is by
        // mtime, across checkouts"; this test failed so once that checkout was deleted).
        let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
        let dir = format!("{root}/../../tests/fixtures/pendulum");
        let bytes = std::fs::read(format!("{dir}/policy.onnx")).unwrap();
        let json = std::fs::read_to_string(format!("{dir}/import.json")).unwrap();
        let with = |log_std: serde_json::Value| {
            let mut spec: serde_json::Value = serde_json::from_str(&json).unwrap();
            spec["distribution"]["log_std"] = log_std;
            serde_json::from_value::<ImportSpec>(spec).unwrap()
        };
        let imported =
            import_onnx(&bytes, &with(serde_json::json!({"values": [-0.5]})), "t").unwrap();
        assert_eq!(imported.tensors["log_std"].data, vec![-0.5]);
        assert!(matches!(
            imported.manifest.distribution,
            Distribution::DiagGaussian {
                log_std: LogStd::Parameter { .. },
                ..
            }
        ));
        // The mean itself as a (run-time) log-std output: a value the policy head computes, no tensor.
        let imported =
            import_onnx(&bytes, &with(serde_json::json!({"output": "mean"})), "t").unwrap();
        assert!(!imported.tensors.contains_key("log_std"));
        assert!(matches!(
            imported.manifest.distribution,
            Distribution::DiagGaussian {
                log_std: LogStd::Value { .. },
                ..
            }
        ));
        let err = import_onnx(
            &bytes,
            &with(serde_json::json!({"initializer": "nope"})),
            "t",
        );
        assert!(
            matches!(&err, Err(ImportError::Spec(m)) if m.contains("'nope' is not an initializer")),
            "{err:?}"
        );
    }

    fn model(nodes: Vec<pb::NodeProto>) -> Vec<u8> {
        let dim = |v: Option<i64>| pb::Dimension {
            dim_value: v,
            dim_param: None,
        };
        let input = pb::ValueInfoProto {
            name: "obs".into(),
            r#type: Some(pb::TypeProto {
                tensor_type: Some(pb::TypeProtoTensor {
                    elem_type: data_type::FLOAT,
                    shape: Some(pb::TensorShapeProto {
                        dim: vec![dim(None), dim(Some(4))],
                    }),
                }),
            }),
        };
        pb::ModelProto {
            graph: Some(pb::GraphProto {
                node: nodes,
                input: vec![input],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn node(op: &str, inputs: &[&str], output: &str) -> pb::NodeProto {
        pb::NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            ..Default::default()
        }
    }

    /// Regression (issue 15's corpus): a node without the inputs its op reads indexed past them and panicked.
    #[test]
    fn nodes_missing_inputs_are_malformed_not_a_panic() {
        let spec = ImportSpec::new(DistSpec::Categorical {
            logits: "logits".into(),
        });
        for (op, inputs) in [
            ("Relu", vec![]),
            ("Add", vec!["obs"]),
            ("Gemm", vec!["obs"]),
            ("Reshape", vec!["obs"]),
            ("Slice", vec!["obs", "obs"]),
            ("Concat", vec![]),
            ("Conv", vec![]),
            ("Transpose", vec![]),
            ("LayerNormalization", vec![]),
            ("Gather", vec!["obs"]),
        ] {
            let bytes = model(vec![node(op, &inputs, "logits")]);
            match import_onnx(&bytes, &spec, "t") {
                Err(ImportError::Malformed(_) | ImportError::UnsupportedOp { .. }) => {}
                other => panic!("{op} with {inputs:?}: {other:?}"),
            }
        }
    }

    /// `Split` (added for SAC actors' `x.chunk(2, -1)`): sizes from the `split` input, equal parts, and opset 18's
    /// `num_outputs` (ceil-sized chunks), each part the right numbers (run through the float64 reference); sizes
    /// that do not cover the axis, or the batch axis, are typed errors.
    #[test]
    fn split_parts_are_slices_of_the_axis() {
        let spec = ImportSpec::new(DistSpec::Categorical {
            logits: "logits".into(),
        });
        let split =
            |inputs: &[&str], outs: &[&str], attrs: Vec<pb::AttributeProto>| pb::NodeProto {
                op_type: "Split".into(),
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: outs.iter().map(|s| s.to_string()).collect(),
                attribute: attrs,
                ..Default::default()
            };
        let int_attr = |name: &str, i: i64| pb::AttributeProto {
            name: name.into(),
            i,
            r#type: 2,
            ..Default::default()
        };
        let ints_attr = |name: &str, v: Vec<i64>| pb::AttributeProto {
            name: name.into(),
            ints: v,
            r#type: 7,
            ..Default::default()
        };
        let obs = [1.0f32, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
        // logits = concat(b, a): the parts swapped, so a wrong slice shows.
        let cases: Vec<(Vec<pb::NodeProto>, Vec<f64>)> = vec![
            (
                vec![
                    split(
                        &["obs"],
                        &["a", "b"],
                        vec![int_attr("axis", 1), ints_attr("split", vec![1, 3])],
                    ),
                    node("Concat", &["b", "a"], "logits"),
                ],
                vec![2.0, 3.0, 4.0, 1.0, 20.0, 30.0, 40.0, 10.0],
            ),
            (
                vec![
                    split(&["obs"], &["a", "b"], vec![int_attr("axis", -1)]),
                    node("Concat", &["b", "a"], "logits"),
                ],
                vec![3.0, 4.0, 1.0, 2.0, 30.0, 40.0, 10.0, 20.0],
            ),
            (
                vec![
                    split(
                        &["obs"],
                        &["a", "b"],
                        vec![int_attr("axis", 1), int_attr("num_outputs", 2)],
                    ),
                    node("Concat", &["b", "a"], "logits"),
                ],
                vec![3.0, 4.0, 1.0, 2.0, 30.0, 40.0, 10.0, 20.0],
            ),
        ];
        for (i, (nodes, want)) in cases.into_iter().enumerate() {
            let mut nodes = nodes;
            if let Some(c) = nodes.last_mut() {
                c.attribute.push(int_attr("axis", 1));
            }
            let imported =
                import_onnx(&model(nodes), &spec, "t").unwrap_or_else(|e| panic!("case {i}: {e}"));
            let vals =
                crate::reference::eval(&imported.manifest, &imported.tensors, &obs, 2).unwrap();
            let logits = imported.manifest.distribution.param_values()[0].to_string();
            assert_eq!(vals[&logits], want, "case {i}");
        }
        for (what, node) in [
            (
                "sizes short of the axis",
                split(
                    &["obs"],
                    &["a", "b"],
                    vec![int_attr("axis", 1), ints_attr("split", vec![1, 2])],
                ),
            ),
            (
                "the batch axis",
                split(&["obs"], &["a", "b"], vec![int_attr("axis", 0)]),
            ),
            (
                "an empty part",
                split(
                    &["obs"],
                    &["a", "b"],
                    vec![int_attr("axis", 1), ints_attr("split", vec![0, 4])],
                ),
            ),
            // ceil(4 / 3) = 2: chunks 2, 2, 0 — an empty last part.
            (
                "num_outputs leaving an empty chunk",
                split(
                    &["obs"],
                    &["a", "b"],
                    vec![int_attr("axis", 1), int_attr("num_outputs", 3)],
                ),
            ),
        ] {
            let bytes = model(vec![
                node,
                pb::NodeProto {
                    op_type: "Concat".into(),
                    input: vec!["a".into(), "b".into()],
                    output: vec!["logits".into()],
                    attribute: vec![int_attr("axis", 1)],
                    ..Default::default()
                },
            ]);
            match import_onnx(&bytes, &spec, "t") {
                Err(ImportError::Malformed(_) | ImportError::UnsupportedOp { .. }) => {}
                other => panic!("{what}: {:?}", other.map(|_| ())),
            }
        }
    }
}
