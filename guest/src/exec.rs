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
    /// Nothing to do (an activation fused into the dense before it).
    #[cfg(feature = "wgpu")]
    Fused,
}

/// The device-side head and preprocessing of the wgpu path.
#[cfg(feature = "wgpu")]
#[derive(Debug, Clone)]
pub(crate) struct GpuParts {
    pub(crate) preprocess: Option<crate::gpu::PreprocessKernel>,
    pub(crate) sample: crate::gpu::SampleKernel,
    /// Readback slots that form the raw head row (distribution values, value) before the next states.
    pub(crate) head_slots: usize,
    /// Identity of this program for device-resident recurrent state (see gpu::DeviceState).
    pub(crate) owner: u64,
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
    #[cfg(feature = "wgpu")]
    pub(crate) gpu: Option<GpuParts>,
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
        Self::build(art, plan, readback_values, device, false)
    }

    /// `fused_dense`: run Dense (+ a following activation only it reads) as one WGSL kernel (wgpu devices).
    pub(crate) fn build(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
        fused_dense: bool,
    ) -> Self {
        let _ = fused_dense;
        let low = lower(art, plan, readback_values);
        // Activations fused into the dense before them: (dense node index -> activation node index).
        #[cfg(feature = "wgpu")]
        let mut fuse_next: std::collections::HashMap<usize, usize> = Default::default();
        #[cfg(feature = "wgpu")]
        if fused_dense {
            let pinned: Vec<usize> = low.readback.iter().map(|(s, _)| *s).collect();
            for i in 0..low.nodes.len().saturating_sub(1) {
                let (d, a) = (&low.nodes[i], &low.nodes[i + 1]);
                if matches!(d.op, Op::Dense { .. })
                    && act_of(a.op).is_some()
                    && a.ins[0] == d.out
                    && low.readers[d.out] == 1
                    && !pinned.contains(&d.out)
                {
                    fuse_next.insert(i, i + 1);
                }
            }
        }
        #[cfg(feature = "wgpu")]
        let fused_acts: std::collections::HashSet<usize> = fuse_next.values().copied().collect();
        let mut weights: HashMap<String, Tensor<2>> = HashMap::new();
        let mut row = |name: &String| -> Tensor<2> {
            weights
                .entry(name.clone())
                .or_insert_with(|| row_tensor(&art.tensors[name].data, device))
                .clone()
        };
        let mut instrs = Vec::new();
        for (ni, n) in low.nodes.iter().enumerate() {
            let (ins, out, x_last) = (&n.ins, n.out, n.in_last[0]);
            #[cfg(feature = "wgpu")]
            if fused_dense {
                if fused_acts.contains(&ni) {
                    instrs.push(Instr::Fused);
                    continue;
                }
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
                    let (act, out) = match fuse_next.get(&ni) {
                        Some(a) => (
                            act_of(low.nodes[*a].op).expect("fusable"),
                            low.nodes[*a].out,
                        ),
                        None => (policyport_shaders::Activation::Identity, out),
                    };
                    instrs.push(Instr::DenseAct {
                        x: ins[0],
                        w: crate::gpu::cube(w),
                        b,
                        n: o,
                        kernels: crate::gpu::DenseKernels::new(act),
                        out,
                    });
                    continue;
                }
            }
            #[cfg(not(feature = "wgpu"))]
            let _ = ni;
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
            #[cfg(feature = "wgpu")]
            gpu: None,
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
        let states = self.upload_states(batch, states);
        let slots = self.forward(batch, obs, obs_len, states);
        let parts: Vec<Tensor<2>> = self
            .readback
            .iter()
            .map(|(s, _)| slots[*s].clone().expect("validated: computed"))
            .collect();
        read_rows(cat_rows(parts))
    }

    fn upload_states(&self, batch: usize, states: Vec<Vec<f32>>) -> Vec<Tensor<2>> {
        self.state_slots
            .iter()
            .zip(states)
            .map(|((_, n), data)| {
                Tensor::from_data(TensorData::new(data, [batch, *n]), &self.device)
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
            st.host_stale = true;
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
                Instr::Fused => continue,
            };
            #[cfg(feature = "wgpu")]
            if self.gpu.is_some() && !matches!(instr, Instr::DenseAct { .. } | Instr::Alias { .. })
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
            .filter(|i| !matches!(i, Instr::Fused | Instr::Alias { .. }))
            .count();
        let gpu = self.gpu.as_ref();
        let pre = gpu.is_some_and(|g| g.preprocess.is_some()) as usize;
        let head_cat = gpu.is_some_and(|g| g.head_slots > 1) as usize;
        // A gather before and a scatter after the step per recurrent state.
        let state_moves = 2 * self.state_slots.len();
        ops + pre + head_cat + 1 + state_moves
    }
}

fn cat_rows(parts: Vec<Tensor<2>>) -> Tensor<2> {
    if parts.len() == 1 {
        parts.into_iter().next().unwrap()
    } else {
        Tensor::cat(parts, 1)
    }
}

pub(crate) fn read_rows(all: Tensor<2>) -> Result<Vec<f32>, String> {
    // A blocking read on WebGPU would trap the whole wasm instance: refuse it (async callers use read_rows_async).
    if cfg!(target_family = "wasm") && cfg!(feature = "wgpu") {
        return Err("a blocking readback is impossible on WebGPU: use the async API".into());
    }
    let data = all
        .try_into_data()
        .map_err(|e| format!("readback: {e:?}"))?;
    rows_of(data)
}

/// [`read_rows`] without blocking (WebGPU maps buffers asynchronously).
#[cfg(feature = "wgpu")]
pub(crate) async fn read_rows_async(all: Tensor<2>) -> Result<Vec<f32>, String> {
    let data = all
        .into_data_async()
        .await
        .map_err(|e| format!("readback: {e:?}"))?;
    rows_of(data)
}

fn rows_of(data: TensorData) -> Result<Vec<f32>, String> {
    match data.as_slice::<f32>() {
        Ok(s) => Ok(s.to_vec()),
        Err(_) => data
            .convert::<f32>()
            .try_to_vec::<f32>()
            .map_err(|e| format!("readback: {e:?}")),
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
