//! Building the wgpu program of an artifact: the burn program with fused dense kernels, plus device
//! preprocessing and the sampling kernel (see gpu.rs), all compiled at load.

use burn::tensor::Device;
use policyport_format::{ActionSpace, Artifact, Distribution, LogStd, Preprocess, ValidatedPlan};
use policyport_shaders::PreStep;

use crate::exec::{GpuParts, Program};
use crate::gpu::{PreprocessKernel, SampleKernel, SampleSpec};

pub(crate) fn program(
    art: &Artifact,
    plan: &ValidatedPlan,
    readback: &[&str],
    device: &Device,
) -> Program {
    let mut p = Program::build(art, plan, readback, device, true);
    let m = &art.manifest;
    // Preprocessing on the device unless a step needs the host (one-hot of discrete observations).
    let preprocess = if m.preprocess.is_empty()
        || m.preprocess
            .iter()
            .any(|s| matches!(s, Preprocess::OneHot { .. }))
    {
        None
    } else {
        let mut stats = vec![];
        let steps: Vec<PreStep> = m
            .preprocess
            .iter()
            .map(|s| match s {
                Preprocess::Scale { factor } => PreStep::Scale(*factor),
                Preprocess::Normalize { mean, std, clip } => {
                    let mean_offset = stats.len();
                    stats.extend_from_slice(&art.tensors[mean].data);
                    let std_offset = stats.len();
                    stats.extend_from_slice(&art.tensors[std].data);
                    PreStep::Normalize {
                        mean_offset,
                        std_offset,
                        clip: *clip,
                    }
                }
                Preprocess::OneHot { .. } => unreachable!("handled on the host"),
            })
            .collect();
        Some(PreprocessKernel::new(&steps, &stats, device))
    };
    let k = m.action.action_len();
    let numel = |v: &str| plan.shapes[v].iter().product::<usize>();
    let dist_values = m.distribution.param_values();
    let raw: usize = dist_values.iter().map(|v| numel(v)).sum();
    let has_value = m.value.is_some();
    let (low, high) = match &m.action {
        ActionSpace::Box { low, high, .. } => (
            low.iter().map(|b| b.unwrap_or(f32::NEG_INFINITY)).collect(),
            high.iter().map(|b| b.unwrap_or(f32::INFINITY)).collect(),
        ),
        _ => (vec![0.0; k], vec![0.0; k]),
    };
    let segments = match &m.action {
        ActionSpace::Discrete { n } => vec![*n],
        ActionSpace::MultiDiscrete { nvec } => nvec.clone(),
        ActionSpace::Box { .. } => vec![],
    };
    let clamp = |v: f32, r: Option<(f32, f32)>| r.map_or(v, |(lo, hi)| v.clamp(lo, hi));
    let spec = match &m.distribution {
        Distribution::Categorical { .. } | Distribution::MultiCategorical { .. } => SampleSpec {
            hw: raw + has_value as usize,
            k,
            p: raw,
            has_value,
            gaussian: false,
            squashed: false,
            clip: false,
            log_std_param: None,
            log_std_range: None,
            low,
            high,
            segments,
        },
        Distribution::DiagGaussian {
            log_std,
            log_std_range,
            ..
        }
        | Distribution::SquashedGaussian {
            log_std,
            log_std_range,
            ..
        } => SampleSpec {
            hw: raw + has_value as usize,
            k,
            p: 2 * k,
            has_value,
            gaussian: true,
            squashed: matches!(m.distribution, Distribution::SquashedGaussian { .. }),
            clip: matches!(
                m.distribution,
                Distribution::DiagGaussian { clip: true, .. }
            ),
            log_std_param: match log_std {
                LogStd::Parameter { tensor } => Some(
                    art.tensors[tensor]
                        .data
                        .iter()
                        .map(|v| clamp(*v, *log_std_range))
                        .collect(),
                ),
                LogStd::Value { .. } => None,
            },
            log_std_range: *log_std_range,
            low,
            high,
            segments,
        },
    };
    p.gpu = Some(GpuParts {
        preprocess,
        sample: SampleKernel::new(spec, device),
        head_slots: dist_values.len() + has_value as usize,
        owner: crate::gpu::new_owner(),
    });
    p
}
