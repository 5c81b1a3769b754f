//! The action head of an artifact, decoded once: what the distribution is, where its parameters come from,
//! how wide every per-row output is, and the action bounds. [`crate::validate`] builds it (it is part of the
//! [`ValidatedPlan`](crate::ValidatedPlan)), and it is the only decoder of [`Distribution`]: the host-side sampler
//! ([`HeadPlan::act_row`]), the WGSL sampler's parameters (guest `wgpu` backend) and the libtorch sampler are all
//! built from it, so a new distribution is one new [`HeadKind`] and one arm in each sampler.
//!
//! Why it lives in the format crate: the libtorch host and the reference interpreter need it without the runtime,
//! and it is a pure function of the validated artifact.

use std::collections::BTreeMap;

use crate::container::Artifact;
use crate::manifest::{ActionSpace, Distribution, LogStd, SquashedDeterministic};
use crate::philox::{Stream, u01};
use crate::sampling::{ActMode, argmax, categorical, clamp_range, standard_normal};

/// The family of the action distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadKind {
    /// One categorical over `n` logits.
    Categorical { n: usize },
    /// One categorical per component, logits concatenated.
    MultiCategorical { nvec: Vec<usize> },
    /// Normal(mean, exp(log_std)) per element. `squashed`: tanh, then rescaled to the action bounds (SAC);
    /// `clip`: clipped to the bounds (SB3's PPO with `clip_actions`); `linear_deterministic` (squashed only):
    /// the deterministic action is the mean rescaled without tanh and clipped to the bounds (format 1.3's
    /// `clipped_mean`, RLlib's SAC).
    Gaussian {
        squashed: bool,
        clip: bool,
        linear_deterministic: bool,
    },
}

/// Where a Gaussian's log-std comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum LogStdSource {
    /// A state-independent parameter (already clamped to `log_std_range`).
    Parameter(Vec<f32>),
    /// A value of the graph (the second distribution value), clamped per row.
    Value,
}

/// The decoded head. Every per-row width an executor needs is here.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadPlan {
    pub kind: HeadKind,
    /// Numbers per env in an action (1 for discrete, `len(nvec)` for multi-discrete, the Box size otherwise).
    pub action_len: usize,
    /// Numbers per env in the finished `dist_params` output (logits; or mean then log-std).
    pub dist_params_len: usize,
    /// Numbers per env the graph produces for the distribution (its values concatenated), before the log-std
    /// is completed: equals `dist_params_len` except for a parameter log-std (then only the mean).
    pub raw_params_len: usize,
    /// The graph values the distribution reads, in `dist_params` order.
    pub param_values: Vec<String>,
    /// The value estimate, if the policy has a critic.
    pub value: Option<String>,
    /// Gaussians only.
    pub log_std: Option<LogStdSource>,
    pub log_std_range: Option<(f32, f32)>,
    /// Per-element action bounds of a Box space (±inf where unbounded); empty for discrete spaces.
    pub low: Vec<f32>,
    pub high: Vec<f32>,
    /// Categorical segment sizes (`[n]` or `nvec`); empty for Gaussians.
    pub segments: Vec<usize>,
}

impl HeadPlan {
    /// Decode the head of an artifact whose references and shapes were checked (by [`crate::validate`], which
    /// calls this with its inferred `shapes`). Indexes without re-checking.
    pub(crate) fn new(art: &Artifact, shapes: &BTreeMap<String, Vec<usize>>) -> Self {
        let m = &art.manifest;
        let action_len = m.action.action_len();
        let (low, high) = match &m.action {
            ActionSpace::Box { low, high, .. } => (
                low.iter().map(|b| b.unwrap_or(f32::NEG_INFINITY)).collect(),
                high.iter().map(|b| b.unwrap_or(f32::INFINITY)).collect(),
            ),
            _ => (vec![], vec![]),
        };
        let segments = match &m.action {
            ActionSpace::Discrete { n } => vec![*n],
            ActionSpace::MultiDiscrete { nvec } => nvec.clone(),
            ActionSpace::Box { .. } => vec![],
        };
        let (kind, log_std, range) = match &m.distribution {
            Distribution::Categorical { .. } => (
                HeadKind::Categorical {
                    n: segments.first().copied().unwrap_or(0),
                },
                None,
                None,
            ),
            Distribution::MultiCategorical { .. } => (
                HeadKind::MultiCategorical {
                    nvec: segments.clone(),
                },
                None,
                None,
            ),
            Distribution::DiagGaussian {
                log_std,
                log_std_range,
                clip,
                ..
            } => (
                HeadKind::Gaussian {
                    squashed: false,
                    clip: *clip,
                    linear_deterministic: false,
                },
                Some(log_std),
                *log_std_range,
            ),
            Distribution::SquashedGaussian {
                log_std,
                log_std_range,
                deterministic,
                ..
            } => (
                HeadKind::Gaussian {
                    squashed: true,
                    clip: false,
                    linear_deterministic: *deterministic == SquashedDeterministic::ClippedMean,
                },
                Some(log_std),
                *log_std_range,
            ),
        };
        let log_std = log_std.map(|l| match l {
            LogStd::Parameter { tensor } => LogStdSource::Parameter(
                art.tensors[tensor]
                    .data
                    .iter()
                    .map(|v| clamp_range(*v, range))
                    .collect(),
            ),
            LogStd::Value { .. } => LogStdSource::Value,
        });
        let param_values: Vec<String> = m
            .distribution
            .param_values()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let raw_params_len = param_values
            .iter()
            .map(|v| shapes.get(v).map_or(0, |s| s.iter().product::<usize>()))
            .sum();
        let dist_params_len = match &kind {
            HeadKind::Categorical { n } => *n,
            HeadKind::MultiCategorical { nvec } => nvec.iter().sum(),
            HeadKind::Gaussian { .. } => 2 * action_len,
        };
        HeadPlan {
            kind,
            action_len,
            dist_params_len,
            raw_params_len,
            param_values,
            value: m.value.clone(),
            log_std,
            log_std_range: range,
            low,
            high,
            segments,
        }
    }

    pub fn action_len(&self) -> usize {
        self.action_len
    }

    pub fn dist_params_len(&self) -> usize {
        self.dist_params_len
    }

    pub fn has_value(&self) -> bool {
        self.value.is_some()
    }

    /// Discrete or multi-discrete actions (integers); otherwise continuous.
    pub fn is_discrete(&self) -> bool {
        !matches!(self.kind, HeadKind::Gaussian { .. })
    }

    /// `(low, high)` with one entry per action element, for device samplers that bind both buffers whatever the
    /// space: the Box bounds, or zeros for discrete spaces (never read there).
    pub fn bounds_for_device(&self) -> (Vec<f32>, Vec<f32>) {
        let or_zeros = |b: &[f32]| {
            if b.is_empty() {
                vec![0.0; self.action_len]
            } else {
                b.to_vec()
            }
        };
        (or_zeros(&self.low), or_zeros(&self.high))
    }

    /// The state-independent log-std, if the head has one.
    pub fn log_std_parameter(&self) -> Option<&[f32]> {
        match &self.log_std {
            Some(LogStdSource::Parameter(p)) => Some(p),
            _ => None,
        }
    }

    /// The graph values a step reads back for the head, in row order: distribution values, then the value
    /// estimate (`raw_params_len + has_value` numbers per row).
    pub fn readback_values(&self) -> Vec<&str> {
        self.param_values
            .iter()
            .map(String::as_str)
            .chain(self.value.as_deref())
            .collect()
    }

    /// Complete one row of distribution parameters in place: for Gaussians, `row[..k]` holds the mean on entry
    /// and `row[k..]` the state-dependent log-std (ignored when the log-std is a parameter); on return `row[k..]`
    /// holds the clamped log-std actually used.
    pub fn finish_params(&self, row: &mut [f32]) {
        if let HeadKind::Gaussian { .. } = self.kind {
            let k = self.action_len;
            match &self.log_std {
                Some(LogStdSource::Parameter(p)) => row[k..].copy_from_slice(p),
                _ => row[k..]
                    .iter_mut()
                    .for_each(|v| *v = clamp_range(*v, self.log_std_range)),
            }
        }
    }

    /// The log-density (log-probability for discrete heads) of one row's actions under its (finished)
    /// parameters, as trainers report it with a sampled action (RLlib's `action_logp`, SB3's `log_prob`):
    /// the sum over action elements. `None` where the returned action is not the distribution's draw itself:
    /// a clipped Gaussian (the clip moved it), a squashed one (rescaled through tanh; trainers compute it from
    /// the pre-squash draw), and a discrete action out of range.
    pub fn log_prob(&self, params: &[f32], discrete: &[i64], continuous: &[f32]) -> Option<f32> {
        match &self.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                let mut off = 0;
                let mut total = 0.0f64;
                for (k, n) in self.segments.iter().enumerate() {
                    let logits = &params[off..off + n];
                    let a = usize::try_from(*discrete.get(k)?).ok().filter(|a| a < n)?;
                    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let lse = max
                        + logits
                            .iter()
                            .map(|l| (*l as f64 - max).exp())
                            .sum::<f64>()
                            .ln();
                    total += logits[a] as f64 - lse;
                    off += n;
                }
                Some(total as f32)
            }
            HeadKind::Gaussian {
                squashed: false,
                clip: false,
                ..
            } => {
                let k = self.action_len;
                let half_ln_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
                let mut total = 0.0f64;
                for d in 0..k {
                    let (mean, log_std) = (params[d] as f64, params[k + d] as f64);
                    let z = (*continuous.get(d)? as f64 - mean) / log_std.exp();
                    total += -0.5 * z * z - log_std - half_ln_2pi;
                }
                Some(total as f32)
            }
            HeadKind::Gaussian { .. } => None,
        }
    }

    /// Choose the actions of one env row from its (finished) parameters. Discrete actions go to `discrete`,
    /// continuous ones to `continuous`; each slice has `action_len` elements (the other may be empty).
    pub fn act_row(
        &self,
        params: &[f32],
        mode: ActMode,
        env: u32,
        discrete: &mut [i64],
        continuous: &mut [f32],
    ) {
        let mut stream = match mode {
            ActMode::Sample { seed, step } => Some(Stream::new(seed, env, step)),
            ActMode::Deterministic => None,
        };
        match &self.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                let mut off = 0;
                for (k, n) in self.segments.iter().enumerate() {
                    let logits = &params[off..off + n];
                    discrete[k] = match &mut stream {
                        Some(s) => categorical(logits, u01(s.word(k as u32))),
                        None => argmax(logits),
                    } as i64;
                    off += n;
                }
            }
            HeadKind::Gaussian {
                squashed,
                clip,
                linear_deterministic,
            } => {
                let k = self.action_len;
                for d in 0..k {
                    let mean = params[d];
                    let mut a = match &mut stream {
                        Some(s) => mean + params[k + d].exp() * standard_normal(s, d as u32),
                        None => mean,
                    };
                    if *squashed && *linear_deterministic && stream.is_none() {
                        a = (self.low[d] + (a + 1.0) * 0.5 * (self.high[d] - self.low[d]))
                            .clamp(self.low[d], self.high[d]);
                    } else if *squashed {
                        a = self.low[d] + (a.tanh() + 1.0) * 0.5 * (self.high[d] - self.low[d]);
                    } else if *clip {
                        a = a.clamp(self.low[d], self.high[d]);
                    }
                    continuous[d] = a;
                }
            }
        }
    }
}
