//! Building the wgpu program of an artifact: the burn program with fused dense kernels, plus device
//! preprocessing and the sampling kernel (see gpu.rs), all compiled at load. The sampling kernel's parameters
//! come from the artifact's [`HeadPlan`](policyport_format::HeadPlan), the one decoder of the distribution.

use burn::tensor::Device;
use policyport_format::{Artifact, HeadKind, PreprocessStep, ValidatedPlan};
use policyport_shaders::PreStep;

use crate::exec::{GpuParts, Program};
use crate::gpu::{PreprocessKernel, SampleFamily, SampleKernel, SampleSpec};

pub(crate) fn program(
    art: &Artifact,
    plan: &ValidatedPlan,
    readback: &[&str],
    device: &Device,
) -> Program {
    let mut p = Program::build(art, plan, readback, device, crate::Backend::Wgpu, true);
    // Preprocessing on the device unless a step needs the host (one-hot of discrete observations).
    let preprocess = if !plan.preprocess.runs_on_device() {
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
                // Never here: runs_on_device() is false with a one-hot.
                PreprocessStep::OneHot(_) => None,
            })
            .collect();
        Some(PreprocessKernel::new(&steps, &stats, device))
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
    p.gpu = Some(GpuParts {
        preprocess,
        sample: SampleKernel::new(spec, device),
        head_slots: head.param_values.len() + head.has_value() as usize,
        row_width: k + head.dist_params_len + head.has_value() as usize,
    });
    p
}
