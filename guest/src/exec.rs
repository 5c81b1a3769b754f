//! The op graphs of an artifact lowered to a flat program over burn tensors.
//!
//! At load every value gets a slot, every weight is uploaded once in the layout its op wants (Dense weights
//! pre-transposed to `[in, out]`, biases as `[1, out]` rows), and every op becomes an [`Instr`] over slot
//! indices: act() only walks this list. Values are held as `[batch, features]` tensors with the feature shape
//! flattened; ops that work on the last axis of a multi-axis feature shape reshape around it.

use std::collections::HashMap;

use burn::tensor::activation;
use burn::tensor::{Device, Tensor, TensorData};
use policyport_format::{Artifact, Op, ValidatedPlan};

use crate::kernels::Act;
use crate::lower::{act_of, affine_group, expand_affine, lower};

#[derive(Debug, Clone, Copy)]
enum Unary {
    Act(Act),
    Softmax,
    LogSoftmax,
}

#[derive(Debug, Clone)]
enum Instr {
    Dense {
        x: usize,
        w: Tensor<2>,
        b: Option<Tensor<2>>,
        out: usize,
    },
    /// `last`: size of the last feature axis (softmax-like ops work along it).
    Unary {
        x: usize,
        f: Unary,
        last: usize,
        out: usize,
    },
    Add {
        a: usize,
        b: usize,
        out: usize,
    },
    Mul {
        a: usize,
        b: usize,
        out: usize,
    },
    Affine {
        x: usize,
        scale: Option<Tensor<2>>,
        shift: Option<Tensor<2>>,
        last: usize,
        out: usize,
    },
    Concat {
        xs: Vec<(usize, usize)>,
        out: usize,
    },
    Slice {
        x: usize,
        last: usize,
        start: usize,
        len: usize,
        out: usize,
    },
    Alias {
        x: usize,
        out: usize,
    },
}

/// A lowered artifact ready to run on one device.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    device: Device,
    instrs: Vec<Instr>,
    n_slots: usize,
    obs_slot: usize,
    /// (slot, numel) of each recurrent state input.
    pub(crate) state_slots: Vec<(usize, usize)>,
    /// (slot, numel) read back after a step: distribution values, then the value estimate, then next states.
    pub(crate) readback: Vec<(usize, usize)>,
}

fn row_tensor(data: &[f32], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data.to_vec(), [1, data.len()]), device)
}

impl Program {
    /// Translate the lowered graph into burn instructions; `readback_values`: what act() needs on the host.
    pub(crate) fn new(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
    ) -> Self {
        let low = lower(art, plan, readback_values);
        let mut weights: HashMap<String, Tensor<2>> = HashMap::new();
        let mut row = |name: &String| -> Tensor<2> {
            weights
                .entry(name.clone())
                .or_insert_with(|| row_tensor(&art.tensors[name].data, device))
                .clone()
        };
        let mut instrs = Vec::new();
        for n in &low.nodes {
            let (ins, out, x_last) = (&n.ins, n.out, n.in_last[0]);
            let unary = |f| Instr::Unary {
                x: ins[0],
                f,
                last: x_last,
                out,
            };
            instrs.push(match n.op {
                Op::Dense { weight, bias } => {
                    let t = &art.tensors[weight];
                    let (o, i) = (t.shape[0], t.shape[1]);
                    // Pre-transpose to [in, out] once, on the host, so act() is a plain matmul.
                    let w = Tensor::from_data(
                        TensorData::new(transpose(&t.data, o, i), [i, o]),
                        device,
                    );
                    Instr::Dense {
                        x: ins[0],
                        w,
                        b: bias.as_ref().map(&mut row),
                        out,
                    }
                }
                Op::Softmax => unary(Unary::Softmax),
                Op::LogSoftmax => unary(Unary::LogSoftmax),
                Op::Add => Instr::Add {
                    a: ins[0],
                    b: ins[1],
                    out,
                },
                Op::Mul => Instr::Mul {
                    a: ins[0],
                    b: ins[1],
                    out,
                },
                Op::Affine { scale, shift } => {
                    let total = low.slot_numel[ins[0]];
                    let group = affine_group(art, scale, shift, total, x_last);
                    let expand = |name: &String| {
                        row_tensor(&expand_affine(&art.tensors[name].data, group), device)
                    };
                    Instr::Affine {
                        x: ins[0],
                        scale: scale.as_ref().map(expand),
                        shift: shift.as_ref().map(expand),
                        last: group,
                        out,
                    }
                }
                Op::Concat => Instr::Concat {
                    xs: ins.iter().copied().zip(n.in_last.iter().copied()).collect(),
                    out,
                },
                Op::Slice { start, len } => Instr::Slice {
                    x: ins[0],
                    last: x_last,
                    start: *start,
                    len: *len,
                    out,
                },
                Op::Flatten => Instr::Alias { x: ins[0], out },
                other => unary(Unary::Act(
                    act_of(other).expect("remaining ops are activations"),
                )),
            });
        }
        Program {
            device: device.clone(),
            instrs,
            n_slots: low.slot_numel.len(),
            obs_slot: low.obs_slot,
            state_slots: low.state_slots,
            readback: low.readback,
        }
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Run one step. `obs`: preprocessed `[batch, obs_len]`; `states`: per state slot, `[batch, numel]`.
    /// Returns the readback values concatenated per row: `[batch, sum(readback numel)]`, row-major.
    pub(crate) fn run(
        &self,
        batch: usize,
        obs: Vec<f32>,
        obs_len: usize,
        states: Vec<Vec<f32>>,
    ) -> Result<Vec<f32>, String> {
        let mut slots: Vec<Option<Tensor<2>>> = vec![None; self.n_slots];
        slots[self.obs_slot] = Some(Tensor::from_data(
            TensorData::new(obs, [batch, obs_len]),
            &self.device,
        ));
        for ((slot, n), data) in self.state_slots.iter().zip(states) {
            slots[*slot] = Some(Tensor::from_data(
                TensorData::new(data, [batch, *n]),
                &self.device,
            ));
        }
        let get = |slots: &Vec<Option<Tensor<2>>>, i: usize| {
            slots[i].clone().expect("validated: defined before use")
        };
        for instr in &self.instrs {
            let (out, t) = match instr {
                Instr::Dense { x, w, b, out } => {
                    let y = get(&slots, *x).matmul(w.clone());
                    (
                        *out,
                        match b {
                            Some(b) => y + b.clone(),
                            None => y,
                        },
                    )
                }
                Instr::Unary { x, f, last, out } => {
                    let t = get(&slots, *x);
                    let [rows, width] = t.dims();
                    let y = match f {
                        Unary::Act(Act::Identity) => t,
                        Unary::Act(Act::Relu) => activation::relu(t),
                        Unary::Act(Act::Tanh) => activation::tanh(t),
                        Unary::Act(Act::Sigmoid) => activation::sigmoid(t),
                        Unary::Act(Act::Silu) => activation::silu(t),
                        Unary::Act(Act::Elu(a)) => activation::elu(t, *a as f64),
                        Unary::Act(Act::LeakyRelu(a)) => activation::leaky_relu(t, *a as f64),
                        Unary::Act(Act::Gelu) => activation::gelu(t),
                        Unary::Act(Act::GeluTanh) => activation::gelu_approximate(t),
                        Unary::Act(Act::Erf) => t.erf(),
                        Unary::Softmax | Unary::LogSoftmax => {
                            let grouped = t.reshape([rows * width / last, *last]);
                            let y = if matches!(f, Unary::Softmax) {
                                activation::softmax(grouped, 1)
                            } else {
                                activation::log_softmax(grouped, 1)
                            };
                            y.reshape([rows, width])
                        }
                    };
                    (*out, y)
                }
                Instr::Add { a, b, out } => (*out, get(&slots, *a) + get(&slots, *b)),
                Instr::Mul { a, b, out } => (*out, get(&slots, *a) * get(&slots, *b)),
                Instr::Affine {
                    x,
                    scale,
                    shift,
                    last,
                    out,
                } => {
                    let t = get(&slots, *x);
                    let [rows, width] = t.dims();
                    let mut g = t.reshape([rows * width / last, *last]);
                    if let Some(s) = scale {
                        g = g * s.clone();
                    }
                    if let Some(s) = shift {
                        g = g + s.clone();
                    }
                    (*out, g.reshape([rows, width]))
                }
                Instr::Concat { xs, out } => {
                    let parts: Vec<Tensor<2>> = xs
                        .iter()
                        .map(|(s, last)| {
                            let t = get(&slots, *s);
                            let [rows, width] = t.dims();
                            t.reshape([rows * width / last, *last])
                        })
                        .collect();
                    (*out, Tensor::cat(parts, 1).reshape([batch as i64, -1]))
                }
                Instr::Slice {
                    x,
                    last,
                    start,
                    len,
                    out,
                } => {
                    let t = get(&slots, *x);
                    let [rows, width] = t.dims();
                    let g = t
                        .reshape([rows * width / last, *last])
                        .narrow(1, *start, *len);
                    (*out, g.reshape([batch as i64, -1]))
                }
                Instr::Alias { x, out } => (*out, get(&slots, *x)),
            };
            slots[out] = Some(t);
        }
        let parts: Vec<Tensor<2>> = self.readback.iter().map(|(s, _)| get(&slots, *s)).collect();
        let all = if parts.len() == 1 {
            parts.into_iter().next().unwrap()
        } else {
            Tensor::cat(parts, 1)
        };
        let data = all
            .try_into_data()
            .map_err(|e| format!("readback: {e:?}"))?;
        match data.as_slice::<f32>() {
            Ok(s) => Ok(s.to_vec()),
            Err(_) => data
                .convert::<f32>()
                .try_to_vec::<f32>()
                .map_err(|e| format!("readback: {e:?}")),
        }
    }
}

/// `[rows, cols]` row-major → `[cols, rows]` row-major (weights are transposed once, at load).
pub(crate) fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = data[r * cols + c];
        }
    }
    t
}
