//! The op graphs of an artifact lowered to a flat program over burn tensors: what the two burn executors share.
//!
//! At load every value gets a slot, every weight is uploaded once in the layout its op wants (Dense weights
//! pre-transposed to `[in, out]`, biases as `[1, out]` rows), and every op becomes an [`Instr`] over slot
//! indices: act() only walks this list. Values are held as `[batch, features]` tensors with the feature shape
//! flattened; ops that work on the last axis of a multi-axis feature shape reshape around it.
//!
//! Two executors run a [`BurnGraph`] (issue 37: each one `impl Executor`, neither a mode of the other):
//! [`crate::burn_exec::BurnExecutor`] with everything around the graph on the host (burn flex; and the golden
//! probes of intermediate values on wgpu), and [`crate::wgpu_exec::WgpuExecutor`], which preprocesses, keeps the
//! recurrent state and samples on the device. A backend that computes some ops its own way (wgpu's fused WGSL
//! dense and convolution kernels) hands the graph a [`Fuse`] at build time; the graph itself knows no backend.

use std::collections::HashMap;
use std::sync::Arc;

use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::tensor::{activation, module};
use policyport_format::{Artifact, Op, ValidatedPlan};

use crate::error::{BackendError, PolicyError};
use crate::executor::{DeferredRows, Readback, RowsFuture};
use crate::kernels::Act;
use crate::lower::{LoweredNode, act_of, affine_group, expand_affine, lower, transpose_index};

thread_local! {
    /// Device dispatches issued from this thread by graphs that count them (tests and the benchmark read it
    /// around an act(): see [`crate::wgpu_dispatches_issued`]).
    static DISPATCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One more device dispatch issued on this thread.
pub(crate) fn count_dispatch() {
    DISPATCHES.with(|d| d.set(d.get() + 1));
}

/// Dispatches counted on this thread so far.
pub(crate) fn dispatches_issued() -> usize {
    DISPATCHES.with(|d| d.get())
}

/// An op a backend computes its own way (one fused kernel for a dense layer or a convolution with its bias and
/// activation): the graph runs it on the value of its one input.
pub(crate) trait FusedOp: std::fmt::Debug + Send + Sync {
    /// The op on `x` (`[batch, features]`); counts its own dispatches.
    fn run(&self, x: Tensor<2>) -> Tensor<2>;

    /// Whether a batch of `rows` envs fits this op (a kernel's 32-bit indexing); checked before every step.
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))] // only wgpu fuses ops today
    fn fits(&self, rows: usize) -> bool {
        let _ = rows;
        true
    }
}

/// How a backend takes over ops at build time: for each lowered node, `Some` op to run instead of the graph's
/// own burn ops, or `None`.
pub(crate) type Fuse<'f> =
    &'f dyn Fn(&Artifact, &LoweredNode<'_>, &Device) -> Option<Arc<dyn FusedOp>>;

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
        act: Act,
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
    /// `input`: the `[C, H, W]` feature shape; `act`: the activation the lowering fused in.
    Conv {
        x: usize,
        w: Tensor<4>,
        b: Option<Tensor<1>>,
        options: ConvOptions<2>,
        input: [usize; 3],
        act: Act,
        out: usize,
    },
    MaxPool {
        x: usize,
        options: MaxPoolOptions<2>,
        input: [usize; 3],
        out: usize,
    },
    LayerNorm {
        x: usize,
        last: usize,
        scale: Tensor<1>,
        bias: Option<Tensor<1>>,
        epsilon: f64,
        out: usize,
    },
    /// Per-env gather of features (Transpose): `y[:, i] = x[:, index[i]]`.
    Gather {
        x: usize,
        index: Tensor<1, Int>,
        out: usize,
    },
    /// An op the backend computes itself ([`FusedOp`]).
    Fused {
        x: usize,
        op: Arc<dyn FusedOp>,
        out: usize,
    },
}
/// A lowered artifact's graph on one burn device: immutable (weights uploaded once), shared by every session of
/// the executor that holds it.
#[derive(Debug, Clone)]
pub(crate) struct BurnGraph {
    pub(crate) device: Device,
    instrs: Vec<Instr>,
    n_slots: usize,
    obs_slot: usize,
    /// (slot, numel) of each recurrent state input.
    pub(crate) state_slots: Vec<(usize, usize)>,
    pub(crate) state_sizes: Vec<usize>,
    /// (slot, numel) read back after a step: distribution values, then the value estimate, then next states.
    pub(crate) readback: Vec<(usize, usize)>,
    /// Whether each burn op counts as a device dispatch ([`count_dispatch`]): on a GPU, where
    /// [`crate::PolicyInfo::dispatches_per_act`] reports them.
    counts_dispatches: bool,
}

/// A validated `[C, H, W]` feature shape.
pub(crate) fn chw(shape: &[usize]) -> [usize; 3] {
    shape.try_into().expect("validated: [C, H, W]")
}

pub(crate) fn row_tensor(data: &[f32], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data.to_vec(), [1, data.len()]), device)
}

impl BurnGraph {
    /// Translate the lowered graph into burn instructions; `readback_values`: what a step reads back; `fuse`:
    /// the ops the backend computes itself (see [`Fuse`]); `counts_dispatches`: see the field.
    pub(crate) fn build(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
        fuse: Option<Fuse<'_>>,
        counts_dispatches: bool,
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
            if let Some(op) = fuse.and_then(|f| f(art, n, device)) {
                instrs.push(Instr::Fused { x: ins[0], op, out });
                continue;
            }
            let unary = |f| Instr::Unary {
                x: ins[0],
                f,
                last: x_last,
                out,
            };
            instrs.push(match n.op {
                Op::Dense { weight, bias } => {
                    let w = dense_weight(art, weight, device);
                    Instr::Dense {
                        x: ins[0],
                        w,
                        b: bias.as_ref().map(&mut row),
                        act: n.act,
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
                Op::Flatten | Op::Reshape { .. } => Instr::Alias { x: ins[0], out },
                Op::Transpose { perm } => {
                    let index: Vec<i32> = transpose_index(&n.in_shapes[0], perm)
                        .into_iter()
                        .map(|i| i as i32)
                        .collect();
                    let len = index.len();
                    Instr::Gather {
                        x: ins[0],
                        index: Tensor::from_data(TensorData::new(index, [len]), device),
                        out,
                    }
                }
                Op::Conv2d {
                    weight,
                    bias,
                    stride,
                    padding,
                    dilation,
                    groups,
                } => {
                    let t = &art.tensors[weight];
                    let shape: [usize; 4] = t.shape[..].try_into().expect("validated: rank 4");
                    Instr::Conv {
                        x: ins[0],
                        w: Tensor::from_data(TensorData::new(t.data.clone(), shape), device),
                        b: bias.as_ref().map(|b| {
                            let d = &art.tensors[b].data;
                            Tensor::from_data(TensorData::new(d.clone(), [d.len()]), device)
                        }),
                        options: ConvOptions::new_with_padding(
                            *stride,
                            [(padding[0], padding[2]), (padding[1], padding[3])],
                            *dilation,
                            *groups,
                        ),
                        input: chw(&n.in_shapes[0]),
                        act: n.act,
                        out,
                    }
                }
                Op::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                    dilation,
                } => Instr::MaxPool {
                    x: ins[0],
                    options: MaxPoolOptions {
                        kernel_size: *kernel,
                        stride: *stride,
                        padding: [(padding[0], padding[2]), (padding[1], padding[3])],
                        dilation: *dilation,
                        ceil_mode: false,
                    },
                    input: chw(&n.in_shapes[0]),
                    out,
                },
                Op::LayerNorm {
                    scale,
                    bias,
                    epsilon,
                } => {
                    let vec1 = |d: Vec<f32>| {
                        let len = d.len();
                        Tensor::<1>::from_data(TensorData::new(d, [len]), device)
                    };
                    Instr::LayerNorm {
                        x: ins[0],
                        last: x_last,
                        scale: vec1(
                            scale
                                .as_ref()
                                .map_or_else(|| vec![1.0; x_last], |t| art.tensors[t].data.clone()),
                        ),
                        bias: bias.as_ref().map(|t| vec1(art.tensors[t].data.clone())),
                        epsilon: *epsilon as f64,
                        out,
                    }
                }
                other => unary(Unary::Act(
                    act_of(other).expect("remaining ops are activations"),
                )),
            });
        }
        BurnGraph {
            device: device.clone(),
            instrs,
            n_slots: low.slot_numel.len(),
            obs_slot: low.obs_slot,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            state_slots: low.state_slots,
            readback: low.readback,
            counts_dispatches,
        }
    }

    /// Whether a step of `rows` envs fits every fused op (see [`FusedOp::fits`]).
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn fits(&self, rows: usize) -> bool {
        self.instrs.iter().all(|i| match i {
            Instr::Fused { op, .. } => op.fits(rows),
            _ => true,
        })
    }

    /// `[rows, width]` f32 values as a tensor on this graph's device.
    pub(crate) fn upload(&self, data: &[f32], rows: usize, width: usize) -> Tensor<2> {
        Tensor::from_data(TensorData::new(data.to_vec(), [rows, width]), &self.device)
    }

    /// Burn ops a step issues (fused ops included, aliases not).
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn ops(&self) -> usize {
        self.instrs
            .iter()
            .filter(|i| !matches!(i, Instr::Alias { .. }))
            .count()
    }

    /// Every slot's value after one step of `batch` envs: `x` the (preprocessed) observations on the device,
    /// `states` one `[batch, numel]` tensor per recurrent state input.
    pub(crate) fn forward(
        &self,
        batch: usize,
        x: Tensor<2>,
        states: Vec<Tensor<2>>,
    ) -> Vec<Option<Tensor<2>>> {
        let mut slots: Vec<Option<Tensor<2>>> = vec![None; self.n_slots];
        slots[self.obs_slot] = Some(x);
        for ((slot, _), t) in self.state_slots.iter().zip(states) {
            slots[*slot] = Some(t);
        }
        let get = |slots: &Vec<Option<Tensor<2>>>, i: usize| {
            slots[i].clone().expect("validated: defined before use")
        };
        for instr in &self.instrs {
            let (out, t) = match instr {
                Instr::Dense { x, w, b, act, out } => {
                    let y = get(&slots, *x).matmul(w.clone());
                    let y = match b {
                        Some(b) => y + b.clone(),
                        None => y,
                    };
                    (*out, activate(*act, y))
                }
                Instr::Unary { x, f, last, out } => {
                    let t = get(&slots, *x);
                    let [rows, width] = t.dims();
                    let y = match f {
                        Unary::Act(a) => activate(*a, t),
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
                Instr::Conv {
                    x,
                    w,
                    b,
                    options,
                    input,
                    act,
                    out,
                } => {
                    let t = get(&slots, *x).reshape([batch, input[0], input[1], input[2]]);
                    let y = module::conv2d(t, w.clone(), b.clone(), options.clone());
                    (*out, activate(*act, y.reshape([batch as i64, -1])))
                }
                Instr::MaxPool {
                    x,
                    options,
                    input,
                    out,
                } => {
                    let t = get(&slots, *x).reshape([batch, input[0], input[1], input[2]]);
                    let y = module::max_pool2d(t, options.clone());
                    (*out, y.reshape([batch as i64, -1]))
                }
                Instr::LayerNorm {
                    x,
                    last,
                    scale,
                    bias,
                    epsilon,
                    out,
                } => {
                    let t = get(&slots, *x);
                    let [rows, width] = t.dims();
                    let g = t.reshape([rows * width / last, *last]);
                    let y = module::layer_norm(g, scale.clone(), bias.clone(), *epsilon);
                    (*out, y.reshape([rows, width]))
                }
                Instr::Gather { x, index, out } => (*out, get(&slots, *x).select(1, index.clone())),
                Instr::Fused { x, op, out } => (*out, op.run(get(&slots, *x))),
            };
            // Fused ops count their own dispatches; an alias is no dispatch.
            if self.counts_dispatches && !matches!(instr, Instr::Fused { .. } | Instr::Alias { .. })
            {
                count_dispatch();
            }
            slots[out] = Some(t);
        }
        slots
    }
}

fn activate(f: Act, t: Tensor<2>) -> Tensor<2> {
    match f {
        Act::Identity => t,
        Act::Relu => activation::relu(t),
        Act::Tanh => activation::tanh(t),
        Act::Sigmoid => activation::sigmoid(t),
        Act::Silu => activation::silu(t),
        Act::Elu(a) => activation::elu(t, a as f64),
        Act::LeakyRelu(a) => activation::leaky_relu(t, a as f64),
        Act::Gelu => activation::gelu(t),
        Act::GeluTanh => activation::gelu_approximate(t),
        Act::Erf => t.erf(),
        // The same clamp as the CPU kernel and the WGSL one (exp overflows f32 above 88.72).
        Act::Exp => t.clamp(-104.0, 88.7).exp(),
        Act::Clip(lo, hi) => {
            let t = if lo.is_finite() { t.clamp_min(lo) } else { t };
            if hi.is_finite() { t.clamp_max(hi) } else { t }
        }
    }
}

/// The readback rows of one step concatenated per row.
pub(crate) fn cat_rows(parts: Vec<Tensor<2>>) -> Tensor<2> {
    if parts.len() == 1 {
        parts.into_iter().next().unwrap()
    } else {
        Tensor::cat(parts, 1)
    }
}

/// A step's rows still on a burn device, read back once ([`crate::executor::Pending::Deferred`]). `readback`:
/// whether this device can block for them (WebGPU in a browser cannot).
pub(crate) struct DeviceRows {
    pub(crate) rows: Tensor<2>,
    pub(crate) readback: Readback,
}

impl DeferredRows for DeviceRows {
    fn readback(&self) -> Readback {
        self.readback
    }

    fn wait(self: Box<Self>) -> Result<Vec<f32>, PolicyError> {
        let data = self.rows.try_into_data().map_err(readback_error)?;
        rows_of(data)
    }

    fn wait_async(self: Box<Self>) -> RowsFuture {
        Box::pin(async move {
            let data = self.rows.into_data_async().await.map_err(readback_error)?;
            rows_of(data)
        })
    }
}

pub(crate) fn readback_error(e: impl std::fmt::Debug) -> PolicyError {
    BackendError::Readback(format!("{e:?}")).into()
}

fn rows_of(data: TensorData) -> Result<Vec<f32>, PolicyError> {
    match data.as_slice::<f32>() {
        Ok(s) => Ok(s.to_vec()),
        Err(_) => data
            .convert::<f32>()
            .try_to_vec::<f32>()
            .map_err(readback_error),
    }
}

/// A dense layer's `[out, in]` weight on `device` as `[in, out]`: transposed once, on the host, at load, so a
/// step is a plain matmul (the graph's dense op and wgpu's fused kernel read it so).
pub(crate) fn dense_weight(art: &Artifact, weight: &str, device: &Device) -> Tensor<2> {
    let t = &art.tensors[weight];
    let (o, i) = (t.shape[0], t.shape[1]);
    Tensor::from_data(TensorData::new(transpose(&t.data, o, i), [i, o]), device)
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
