//! The op graphs of an artifact lowered to a flat program over burn tensors.
//!
//! At load every value gets a slot, every weight is uploaded once in the layout its op wants (Dense weights
//! pre-transposed to `[in, out]`, biases as `[1, out]` rows), and every op becomes an [`Instr`] over slot
//! indices: act() only walks this list. Values are held as `[batch, features]` tensors with the feature shape
//! flattened; ops that work on the last axis of a multi-axis feature shape reshape around it.

use std::collections::HashMap;

use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::tensor::{activation, module};
#[cfg(feature = "wgpu")]
use policyport_format::sampling::ActMode;
use policyport_format::{Artifact, Op, ValidatedPlan};

use crate::backend::Backend;
use crate::error::{BackendError, PolicyError};
use crate::executor::{ExecScratch, Executor, Pending, Placement, StepInput};
use crate::kernels::Act;
use crate::lower::{act_of, affine_group, expand_affine, lower, transpose_index};

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
    /// Dense + bias + activation as one WGSL dispatch (wgpu devices).
    #[cfg(feature = "wgpu")]
    DenseAct {
        x: usize,
        w: burn::backend::wgpu::CubeTensor,
        b: Option<burn::backend::wgpu::CubeTensor>,
        n: usize,
        kernels: crate::gpu::DenseKernels,
        out: usize,
    },
    /// Conv2d + bias + activation as one WGSL dispatch (wgpu devices; `shaders/conv2d.wgsl`).
    #[cfg(feature = "wgpu")]
    ConvAct {
        x: usize,
        kernel: crate::gpu::Conv2dKernel,
        out: usize,
    },
}

/// The device-side head and preprocessing of the wgpu path.
#[cfg(feature = "wgpu")]
#[derive(Debug, Clone)]
pub(crate) struct GpuParts {
    pub(crate) preprocess: Option<crate::gpu::PreprocessKernel>,
    pub(crate) sample: crate::gpu::SampleKernel,
    /// Readback slots that form the raw head row (distribution values, value) before the next states.
    pub(crate) head_slots: usize,
    /// `action_len + dist_params_len + has_value`: the sampling kernel's packed row.
    pub(crate) row_width: usize,
}

/// A lowered artifact ready to run on one device: immutable (weights uploaded once), shared by every session.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    device: Device,
    backend: Backend,
    instrs: Vec<Instr>,
    n_slots: usize,
    obs_slot: usize,
    /// (slot, numel) of each recurrent state input.
    pub(crate) state_slots: Vec<(usize, usize)>,
    state_sizes: Vec<usize>,
    /// (slot, numel) read back after a step: distribution values, then the value estimate, then next states.
    pub(crate) readback: Vec<(usize, usize)>,
    #[cfg(feature = "wgpu")]
    pub(crate) gpu: Option<GpuParts>,
}

/// One session's data: on wgpu, the device copy of its recurrent state.
#[derive(Default)]
pub(crate) struct BurnScratch {
    #[cfg(feature = "wgpu")]
    state: Option<crate::gpu::DeviceState>,
}

/// A validated `[C, H, W]` feature shape.
fn chw(shape: &[usize]) -> [usize; 3] {
    shape.try_into().expect("validated: [C, H, W]")
}

fn row_tensor(data: &[f32], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data.to_vec(), [1, data.len()]), device)
}

impl Program {
    /// Translate the lowered graph into burn instructions; `readback_values`: what a step reads back.
    pub(crate) fn new(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
        backend: Backend,
    ) -> Self {
        Self::build(art, plan, readback_values, device, backend, false)
    }

    /// `fused_dense`: run each Dense (with the activation the lowering fused into it) as one WGSL kernel (wgpu
    /// devices).
    pub(crate) fn build(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
        backend: Backend,
        fused_dense: bool,
    ) -> Self {
        let _ = fused_dense;
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
            #[cfg(feature = "wgpu")]
            if fused_dense {
                if let Op::Dense { weight, bias } = n.op {
                    let t = &art.tensors[weight];
                    let (o, i) = (t.shape[0], t.shape[1]);
                    let w = Tensor::<2>::from_data(
                        TensorData::new(transpose(&t.data, o, i), [i, o]),
                        device,
                    );
                    let b = bias
                        .as_ref()
                        .map(|b| crate::gpu::cube(row_tensor(&art.tensors[b].data, device)));
                    instrs.push(Instr::DenseAct {
                        x: ins[0],
                        w: crate::gpu::cube(w),
                        b,
                        n: o,
                        kernels: crate::gpu::DenseKernels::new(n.act),
                        out,
                    });
                    continue;
                }
                if let Op::Conv2d {
                    weight,
                    bias,
                    stride,
                    padding,
                    dilation,
                    groups,
                } = n.op
                {
                    let t = &art.tensors[weight];
                    let shape = policyport_shaders::Conv2dShape {
                        rows: 1,
                        input: chw(&n.in_shapes[0]),
                        out_channels: t.shape[0],
                        kernel: [t.shape[2], t.shape[3]],
                        stride: *stride,
                        padding: *padding,
                        dilation: *dilation,
                        groups: *groups,
                    };
                    instrs.push(Instr::ConvAct {
                        x: ins[0],
                        kernel: crate::gpu::Conv2dKernel::new(
                            shape,
                            &t.data,
                            bias.as_ref().map(|b| &art.tensors[b].data[..]),
                            n.act,
                            device,
                        ),
                        out,
                    });
                    continue;
                }
            }
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
        Program {
            device: device.clone(),
            backend,
            instrs,
            n_slots: low.slot_numel.len(),
            obs_slot: low.obs_slot,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            state_slots: low.state_slots,
            readback: low.readback,
            #[cfg(feature = "wgpu")]
            gpu: None,
        }
    }

    /// Run one step on the host-placement path. `obs`: preprocessed `[batch, obs_len]`; `states`: per state slot,
    /// `[batch, numel]`. Returns the readback values concatenated per row, `[batch, sum(readback numel)]`, still
    /// on the device.
    fn run(&self, batch: usize, obs: Vec<f32>, obs_len: usize, states: &[Vec<f32>]) -> Tensor<2> {
        let states = self.upload_states(batch, states);
        let slots = self.forward(batch, obs, obs_len, states);
        let parts: Vec<Tensor<2>> = self
            .readback
            .iter()
            .map(|(s, _)| slots[*s].clone().expect("validated: computed"))
            .collect();
        cat_rows(parts)
    }

    fn upload_states(&self, batch: usize, states: &[Vec<f32>]) -> Vec<Tensor<2>> {
        self.state_slots
            .iter()
            .zip(states)
            .map(|((_, n), data)| {
                Tensor::from_data(TensorData::new(data.clone(), [batch, *n]), &self.device)
            })
            .collect()
    }

    /// The wgpu path: observations preprocessed on the device, state rows gathered from the device copy, the
    /// program, the sampling kernel writing `[actions | finished params | value]` per row, next state scattered
    /// back into the device copy. Returns the packed rows, still on the device: the caller reads them back once
    /// ([`read_rows`], or [`read_rows_async`] where blocking is impossible).
    #[cfg(feature = "wgpu")]
    pub(crate) fn launch_gpu(
        &self,
        batch: usize,
        obs: Vec<f32>,
        obs_len: usize,
        state: Option<&mut crate::gpu::DeviceState>,
        envs: &[u32],
        sample: Option<(u64, u64)>,
    ) -> Tensor<2> {
        // Only wgpu programs (built by wgpu_setup::program) take this path.
        let gpu = self.gpu.as_ref().expect("launch_gpu on a gpu program");
        let ids = crate::gpu::upload_ids(&gpu.sample.fparams, envs);
        let gathered = match &state {
            Some(st) => st
                .tensors
                .iter()
                .zip(&st.sizes)
                .map(|(t, n)| st.kernel().gather(t, &ids, batch, *n))
                .collect(),
            None => vec![],
        };
        let slots = self.forward(batch, obs, obs_len, gathered);
        let take = |i: &(usize, usize)| slots[i.0].clone().expect("validated: computed");
        let head = cat_rows(self.readback[..gpu.head_slots].iter().map(take).collect());
        if gpu.head_slots > 1 {
            crate::gpu::count_dispatch();
        }
        let packed = gpu.sample.run(head, &ids, sample);
        if let Some(st) = state {
            for ((t, n), next) in st
                .tensors
                .iter()
                .zip(&st.sizes)
                .zip(&self.readback[gpu.head_slots..])
            {
                st.kernel().scatter(t, take(next), &ids, batch, *n);
            }
        }
        packed
    }

    fn forward(
        &self,
        batch: usize,
        obs: Vec<f32>,
        obs_len: usize,
        states: Vec<Tensor<2>>,
    ) -> Vec<Option<Tensor<2>>> {
        let mut slots: Vec<Option<Tensor<2>>> = vec![None; self.n_slots];
        let x = Tensor::from_data(TensorData::new(obs, [batch, obs_len]), &self.device);
        #[cfg(feature = "wgpu")]
        let x = match self.gpu.as_ref().and_then(|g| g.preprocess.as_ref()) {
            Some(k) => k.run(x),
            None => x,
        };
        slots[self.obs_slot] = Some(x);
        let _ = batch;
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
                #[cfg(feature = "wgpu")]
                Instr::DenseAct {
                    x,
                    w,
                    b,
                    n,
                    kernels,
                    out,
                } => (*out, kernels.run(get(&slots, *x), w, b.as_ref(), *n)),
                #[cfg(feature = "wgpu")]
                Instr::ConvAct { x, kernel, out } => (*out, kernel.run(get(&slots, *x))),
            };
            #[cfg(feature = "wgpu")]
            if self.gpu.is_some()
                && !matches!(
                    instr,
                    Instr::DenseAct { .. } | Instr::ConvAct { .. } | Instr::Alias { .. }
                )
            {
                crate::gpu::count_dispatch();
            }
            slots[out] = Some(t);
        }
        slots
    }

    /// Dispatches one act() issues (fused kernels + burn ops + the sampling kernel), for reports.
    #[cfg(feature = "wgpu")]
    pub(crate) fn dispatches_per_act(&self) -> usize {
        let ops = self
            .instrs
            .iter()
            .filter(|i| !matches!(i, Instr::Alias { .. }))
            .count();
        let gpu = self.gpu.as_ref();
        let pre = gpu.is_some_and(|g| g.preprocess.is_some()) as usize;
        let head_cat = gpu.is_some_and(|g| g.head_slots > 1) as usize;
        // A gather before and a scatter after the step per recurrent state.
        let state_moves = 2 * self.state_slots.len();
        ops + pre + head_cat + 1 + state_moves
    }
}

/// An elementwise activation as burn ops.
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

impl Executor for Program {
    fn backend(&self) -> Backend {
        self.backend
    }

    /// A wgpu program builds its small-batch and tiled kernels' pipelines on first use: warm both.
    fn warm_up_batches(&self) -> &'static [usize] {
        #[cfg(feature = "wgpu")]
        if self.gpu.is_some() {
            return &[1, 64];
        }
        &[1]
    }

    /// wgpu programs preprocess (unless a one-hot needs the host), keep state and sample on the device.
    fn placement(&self) -> Placement {
        #[cfg(feature = "wgpu")]
        if let Some(g) = &self.gpu {
            return Placement {
                preprocess: g.preprocess.is_some(),
                state: true,
                sampling: true,
            };
        }
        Placement::default()
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        #[cfg(feature = "wgpu")]
        if let Some(g) = &self.gpu {
            return g.row_width;
        }
        self.readback.iter().map(|(_, n)| n).sum()
    }

    fn dispatches_per_act(&self) -> Option<usize> {
        #[cfg(feature = "wgpu")]
        if self.gpu.is_some() {
            return Some(Program::dispatches_per_act(self));
        }
        None
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(BurnScratch::default())
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let _ = (&scratch, &rows);
        let obs_len = step.obs.len() / step.batch;
        #[cfg(feature = "wgpu")]
        if self.instrs.iter().any(|i| match i {
            Instr::ConvAct { kernel, .. } => !kernel.fits(step.batch),
            _ => false,
        }) {
            return Err(BackendError::Unsupported(
                "a batch this large: a convolution's values pass the wgpu kernel's 32-bit indexing",
            )
            .into());
        }
        #[cfg(feature = "wgpu")]
        if self.gpu.is_some() {
            let st = &mut crate::executor::scratch_of::<BurnScratch>(scratch).state;
            let state = if self.state_sizes.is_empty() {
                None
            } else {
                let d = st.get_or_insert_with(|| {
                    crate::gpu::DeviceState::zeros(&self.state_sizes, step.num_envs, &self.device)
                });
                d.grow(step.num_envs);
                Some(d)
            };
            let sample = match step.mode {
                ActMode::Sample { seed, step } => Some((seed, step)),
                ActMode::Deterministic => None,
            };
            return Ok(Pending::Device(self.launch_gpu(
                step.batch,
                step.obs.to_vec(),
                obs_len,
                state,
                step.env_ids,
                sample,
            )));
        }
        Ok(Pending::Device(self.run(
            step.batch,
            step.obs.to_vec(),
            obs_len,
            step.states,
        )))
    }

    fn reset_state(&self, scratch: &mut ExecScratch, envs: &[u32]) -> Result<(), PolicyError> {
        let _ = (&scratch, envs);
        #[cfg(feature = "wgpu")]
        if let Some(d) = &mut crate::executor::scratch_of::<BurnScratch>(scratch).state {
            d.zero_rows(envs);
        }
        Ok(())
    }

    fn write_state(
        &self,
        scratch: &mut ExecScratch,
        envs: &[u32],
        values: &[&[f32]],
        num_envs: usize,
    ) -> Result<(), PolicyError> {
        let _ = (&scratch, envs, values, num_envs);
        #[cfg(feature = "wgpu")]
        if self.gpu.is_some() && !self.state_sizes.is_empty() {
            let st = &mut crate::executor::scratch_of::<BurnScratch>(scratch).state;
            st.get_or_insert_with(|| {
                crate::gpu::DeviceState::zeros(&self.state_sizes, num_envs, &self.device)
            })
            .write_rows(envs, values, num_envs);
        }
        Ok(())
    }

    fn read_state(&self, scratch: &mut ExecScratch) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        let _ = &scratch;
        #[cfg(feature = "wgpu")]
        if let Some(d) = &crate::executor::scratch_of::<BurnScratch>(scratch).state {
            return d.read().map(Some);
        }
        Ok(None)
    }
}

fn cat_rows(parts: Vec<Tensor<2>>) -> Tensor<2> {
    if parts.len() == 1 {
        parts.into_iter().next().unwrap()
    } else {
        Tensor::cat(parts, 1)
    }
}

pub(crate) fn read_rows(all: Tensor<2>) -> Result<Vec<f32>, PolicyError> {
    // A blocking read on WebGPU would trap the whole wasm instance: refuse it (async callers use read_rows_async).
    if cfg!(target_family = "wasm") && cfg!(feature = "wgpu") {
        return Err(BackendError::NeedsAsync {
            use_instead: "Session::act_async",
        }
        .into());
    }
    let data = all.try_into_data().map_err(readback_error)?;
    rows_of(data)
}

/// [`read_rows`] without blocking (WebGPU maps buffers asynchronously).
pub(crate) async fn read_rows_async(all: Tensor<2>) -> Result<Vec<f32>, PolicyError> {
    let data = all.into_data_async().await.map_err(readback_error)?;
    rows_of(data)
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
