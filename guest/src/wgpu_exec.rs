//! The wgpu executor: a [`BurnGraph`] whose dense layers and convolutions run as fused WGSL kernels (see
//! gpu.rs), with the observations preprocessed, the recurrent state kept and the actions sampled on the device,
//! all compiled at load. One step is one upload of the observations and env ids, the graph, the sampling kernel
//! writing `[actions | finished params | value]` per row, the next state scattered into the session's device
//! copy, and one readback of the packed rows. The sampling kernel's parameters come from the artifact's
//! [`HeadPlan`](policyport_format::HeadPlan), the one decoder of the distribution.

use std::sync::Arc;

use burn::tensor::{Device, Tensor};
use policyport_format::sampling::ActMode;
use policyport_format::{Artifact, HeadKind, ObsDType, Op, PreprocessStep, ValidatedPlan};
use policyport_shaders::{PreInput, PreStep};

use crate::backend::Backend;
use crate::burn_graph::{
    BurnGraph, DeviceRows, Fuse, FusedOp, cat_rows, chw, count_dispatch, dense_weight, row_tensor,
};
use crate::error::{BackendError, PolicyError};
use crate::executor::{ExecScratch, Executor, Pending, Placement, Readback, StepInput, scratch_of};
use crate::gpu::{
    Conv2dKernel, DenseKernels, DeviceState, PreprocessKernel, SampleFamily, SampleKernel,
    SampleSpec,
};
use crate::lower::LoweredNode;
use crate::observations::Observations;

/// A lowered artifact on a wgpu device with its device-side preprocessing and head: immutable, shared by every
/// session (each keeps its recurrent state on the device in its [`WgpuScratch`]).
#[derive(Debug, Clone)]
pub(crate) struct WgpuExecutor {
    graph: BurnGraph,
    /// Observation preprocessing on the device; `None` when a step needs the host (one-hot of discrete
    /// observations: the session preprocesses then).
    preprocess: Option<DeviceObservations>,
    sample: SampleKernel,
    /// Readback slots that form the raw head row (distribution values, value) before the next states.
    head_slots: usize,
    /// `action_len + dist_params_len + has_value`: the sampling kernel's packed row.
    row_width: usize,
}

/// The request's observations to the graph's input on the device: uploaded as the caller gave them, uint8
/// frames as bytes (a quarter of an f32 copy's upload), widened and preprocessed by one kernel.
#[derive(Debug, Clone)]
struct DeviceObservations {
    /// The preprocessing steps on f32 observations; `None` when there are none (the upload is the input).
    f32: Option<PreprocessKernel>,
    /// The steps on uint8 frames, widened first (a kernel even without steps): only for a uint8 observation
    /// space, the only one a caller may pass frames as bytes to (`check_observations` refuses them elsewhere).
    u8: Option<PreprocessKernel>,
}

/// One session's data: the device copy of its recurrent state (made on its first step).
#[derive(Default)]
pub(crate) struct WgpuScratch {
    state: Option<DeviceState>,
}

/// A dense layer with its bias and the activation the lowering fused into it: one WGSL dispatch.
#[derive(Debug)]
struct DenseAct {
    w: burn::backend::wgpu::CubeTensor,
    b: Option<burn::backend::wgpu::CubeTensor>,
    n: usize,
    kernels: DenseKernels,
}

impl FusedOp for DenseAct {
    fn run(&self, x: Tensor<2>) -> Tensor<2> {
        self.kernels.run(x, &self.w, self.b.as_ref(), self.n)
    }
}

/// A convolution with its bias and activation: one WGSL dispatch (`shaders/conv2d.wgsl`).
impl FusedOp for Conv2dKernel {
    fn run(&self, x: Tensor<2>) -> Tensor<2> {
        Conv2dKernel::run(self, x)
    }

    fn fits(&self, rows: usize) -> bool {
        Conv2dKernel::fits(self, rows)
    }
}

/// The ops wgpu computes with its own kernels: every dense layer and every convolution.
fn fused(art: &Artifact, n: &LoweredNode<'_>, device: &Device) -> Option<Arc<dyn FusedOp>> {
    match n.op {
        Op::Dense { weight, bias } => Some(Arc::new(DenseAct {
            w: crate::gpu::cube(dense_weight(art, weight, device)),
            b: bias
                .as_ref()
                .map(|b| crate::gpu::cube(row_tensor(&art.tensors[b].data, device))),
            n: art.tensors[weight].shape[0],
            kernels: DenseKernels::new(n.act),
        })),
        Op::Conv2d {
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
        } => {
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
            Some(Arc::new(Conv2dKernel::new(
                shape,
                &t.data,
                bias.as_ref().map(|b| &art.tensors[b].data[..]),
                n.act,
                device,
            )))
        }
        _ => None,
    }
}

impl WgpuExecutor {
    /// The step executor of `art` on `device`: `readback` is the step's (head values, then next states).
    pub(crate) fn new(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: &[&str],
        device: &Device,
    ) -> Self {
        let fuse: Fuse<'_> = &fused;
        let graph = BurnGraph::build(art, plan, readback, device, Some(fuse), true);
        // The observations go to the device as the caller gave them unless a step needs the host (a one-hot of
        // discrete observations: the host expands the indices, checking each against the space first).
        let preprocess = if plan.preprocess.one_hot_width().is_some() {
            None
        } else {
            let mut stats = vec![];
            let steps: Vec<PreStep> = plan
                .preprocess
                .steps
                .iter()
                .filter_map(|s| match s {
                    PreprocessStep::Scale(factor) => Some(PreStep::Scale(*factor)),
                    PreprocessStep::Normalize { mean, std, clip } => {
                        let mean_offset = stats.len();
                        stats.extend_from_slice(mean);
                        let std_offset = stats.len();
                        stats.extend_from_slice(std);
                        Some(PreStep::Normalize {
                            mean_offset,
                            std_offset,
                            clip: *clip,
                        })
                    }
                    // Never here: a one-hot keeps the observations on the host (above).
                    PreprocessStep::OneHot(_) => None,
                })
                .collect();
            Some(DeviceObservations {
                f32: (!steps.is_empty())
                    .then(|| PreprocessKernel::new(PreInput::F32, &steps, &stats, device)),
                u8: (art.manifest.observation.raw_dtype() == ObsDType::U8)
                    .then(|| PreprocessKernel::new(PreInput::U8, &steps, &stats, device)),
            })
        };
        let head = &plan.head;
        let k = head.action_len;
        let (low, high) = head.bounds_for_device();
        let family = match &head.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                SampleFamily::Categorical
            }
            HeadKind::Gaussian { .. } => SampleFamily::Gaussian,
            HeadKind::Deterministic { .. } => SampleFamily::Deterministic,
            HeadKind::QValues { .. } => SampleFamily::QValues,
        };
        let (rescale, noise) = match &head.kind {
            HeadKind::Deterministic { rescale, noise } => (
                *rescale,
                noise.as_ref().map(|n| (n.mean.clone(), n.sigma.clone())),
            ),
            _ => (false, None),
        };
        let spec = SampleSpec {
            hw: head.raw_params_len + head.has_value() as usize,
            k,
            p: if family == SampleFamily::Gaussian {
                head.dist_params_len
            } else {
                head.raw_params_len
            },
            has_value: head.has_value(),
            family,
            rescale,
            noise,
            epsilon: match head.kind {
                HeadKind::QValues { epsilon, .. } => epsilon,
                _ => 0.0,
            },
            squashed: matches!(head.kind, HeadKind::Gaussian { squashed: true, .. }),
            clip: matches!(head.kind, HeadKind::Gaussian { clip: true, .. }),
            linear_deterministic: matches!(
                head.kind,
                HeadKind::Gaussian {
                    linear_deterministic: true,
                    ..
                }
            ),
            log_std_param: head.log_std_parameter().map(<[f32]>::to_vec),
            log_std_range: head.log_std_range,
            low,
            high,
            segments: head.segments.clone(),
        };
        WgpuExecutor {
            graph,
            preprocess,
            sample: SampleKernel::new(spec, device),
            head_slots: head.param_values.len() + head.has_value() as usize,
            row_width: k + head.dist_params_len + head.has_value() as usize,
        }
    }
}

impl WgpuExecutor {
    /// Dispatches one step issues (fused kernels + burn ops + the sampling kernel), for reports; with the
    /// observations a policy of this observation space is given (uint8 frames as bytes: always one
    /// preprocessing dispatch that widens them; f32: one where there are steps).
    fn dispatches(&self) -> usize {
        let pre = match &self.preprocess {
            Some(d) => (d.u8.is_some() || d.f32.is_some()) as usize,
            None => 0,
        };
        let head_cat = (self.head_slots > 1) as usize;
        // A gather before and a scatter after the step per recurrent state.
        let state_moves = 2 * self.graph.state_slots.len();
        self.graph.ops() + pre + head_cat + 1 + state_moves
    }

    /// The step's observations on the device, preprocessed there where this executor does it.
    fn observations(&self, step: &StepInput<'_>) -> Tensor<2> {
        let batch = step.batch;
        let like = &self.sample.fparams;
        let upload = |x: &[f32]| crate::gpu::upload_f32(like, x, [batch, x.len() / batch]);
        match (&self.preprocess, step.raw) {
            (Some(d), Some(Observations::U8(frames))) => {
                d.u8.as_ref()
                    .expect("check_observations refuses uint8 frames for an f32 observation space")
                    .run_u8(like, frames, batch)
            }
            (Some(d), Some(Observations::F32(x))) => match &d.f32 {
                Some(k) => k.run(upload(x)),
                None => upload(x),
            },
            // Preprocessed by the session (a one-hot).
            _ => upload(step.obs),
        }
    }
}

impl Executor for WgpuExecutor {
    fn backend(&self) -> Backend {
        Backend::Wgpu
    }

    /// The small-batch and tiled kernels' pipelines are built on first use: warm both.
    fn warm_up_batches(&self) -> &'static [usize] {
        &[1, 64]
    }

    /// Preprocessing (unless a one-hot needs the host), state and sampling on the device.
    fn placement(&self) -> Placement {
        Placement {
            preprocess: self.preprocess.is_some(),
            state: true,
            sampling: true,
            raw_observations: self.preprocess.is_some(),
            outputs: false,
        }
    }

    fn state_sizes(&self) -> &[usize] {
        &self.graph.state_sizes
    }

    fn row_width(&self) -> usize {
        self.row_width
    }

    fn dispatches_per_act(&self) -> Option<usize> {
        Some(self.dispatches())
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(WgpuScratch::default())
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        _rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let batch = step.batch;
        if !self.graph.fits(batch) {
            return Err(BackendError::Unsupported(
                "a batch this large: a convolution's values pass the wgpu kernel's 32-bit indexing",
            )
            .into());
        }
        let state = if self.graph.state_sizes.is_empty() {
            None
        } else {
            let st = &mut scratch_of::<WgpuScratch>(scratch).state;
            let d = st.get_or_insert_with(|| {
                DeviceState::zeros(&self.graph.state_sizes, step.num_envs, &self.graph.device)
            });
            d.grow(step.num_envs);
            Some(d)
        };
        let sample = match step.mode {
            ActMode::Sample { seed, step } => Some((seed, step)),
            ActMode::Deterministic => None,
        };
        let ids = crate::gpu::upload_ids(&self.sample.fparams, step.env_ids);
        let gathered = match &state {
            Some(st) => st
                .tensors
                .iter()
                .zip(&st.sizes)
                .map(|(t, n)| st.kernel().gather(t, &ids, batch, *n))
                .collect(),
            None => vec![],
        };
        let x = self.observations(step);
        let slots = self.graph.forward(batch, x, gathered);
        let readback = &self.graph.readback;
        let take = |i: &(usize, usize)| slots[i.0].clone().expect("validated: computed");
        let head = cat_rows(readback[..self.head_slots].iter().map(take).collect());
        if self.head_slots > 1 {
            count_dispatch();
        }
        let packed = self.sample.run(head, &ids, sample);
        if let Some(st) = state {
            for ((t, n), next) in st
                .tensors
                .iter()
                .zip(&st.sizes)
                .zip(&readback[self.head_slots..])
            {
                st.kernel().scatter(t, take(next), &ids, batch, *n);
            }
        }
        Ok(Pending::Deferred(Box::new(DeviceRows {
            rows: packed,
            readback: READBACK,
        })))
    }

    fn reset_state(&self, scratch: &mut ExecScratch, envs: &[u32]) -> Result<(), PolicyError> {
        if let Some(d) = &mut scratch_of::<WgpuScratch>(scratch).state {
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
        if !self.graph.state_sizes.is_empty() {
            scratch_of::<WgpuScratch>(scratch)
                .state
                .get_or_insert_with(|| {
                    DeviceState::zeros(&self.graph.state_sizes, num_envs, &self.graph.device)
                })
                .write_rows(envs, values, num_envs);
        }
        Ok(())
    }

    fn read_state(&self, scratch: &mut ExecScratch) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        match &scratch_of::<WgpuScratch>(scratch).state {
            Some(d) => d.read().map(Some),
            None => Ok(None),
        }
    }
}

/// How a wgpu device reads its rows back: WebGPU in a browser maps buffers only asynchronously (a blocking
/// read would trap the whole wasm instance); native wgpu can block.
pub(crate) const READBACK: Readback = if cfg!(target_family = "wasm") {
    Readback::AsyncOnly
} else {
    Readback::Blocking
};
