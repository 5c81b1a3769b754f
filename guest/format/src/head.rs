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
use crate::manifest::{ActionNoise, ActionSpace, Distribution, LogStd, SquashedDeterministic};
use crate::philox::{Stream, u01};
use crate::sampling::{
    ActMode, argmax_masked, categorical_masked, clamp_range, standard_normal, uniform_index,
};

/// What a masked entry of `dist_params` reads (sb3-contrib's `MaskableCategorical` puts a huge negative logit
/// there; the dtype's minimum is the largest such number that is still finite, so exp(it − max) is exactly 0).
pub const MASKED_LOGIT: f32 = f32::MIN;

/// Per-row controls a request adds to the head, beside the [`ActMode`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowControls<'a> {
    /// One flag per logit (per Q value) of the row, segments concatenated as in `dist_params`; `false` forbids
    /// the action. Checked beforehand ([`HeadPlan::check_controls`]): every segment allows at least one action.
    pub mask: Option<&'a [bool]>,
    /// A Q-value head's exploration rate for this request instead of the artifact's.
    pub epsilon: Option<f32>,
}

impl RowControls<'_> {
    /// Nothing beyond the mode: the artifact's own head.
    pub const NONE: RowControls<'static> = RowControls {
        mask: None,
        epsilon: None,
    };
}

/// A request's controls of the action head (its action mask, its epsilon) that the policy cannot take: the
/// request check of [`HeadPlan::check_controls`], and the runtime's `PolicyError::HeadControl`.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum HeadControlError {
    #[error(
        "action mask given for a policy with continuous actions (masks are for discrete heads)"
    )]
    MaskOnContinuous,
    #[error(
        "action mask has {found} flags; {batch} rows need {per_row} each (one per logit or Q value)"
    )]
    MaskLength {
        found: usize,
        batch: usize,
        per_row: usize,
    },
    #[error("action mask of row {row} allows no action in component {segment}")]
    NoAllowedAction { row: usize, segment: usize },
    #[error("epsilon {epsilon} is not a probability in [0, 1]")]
    Epsilon { epsilon: f32 },
    #[error("epsilon given for a policy without Q values (epsilon-greedy is a DQN-family head)")]
    EpsilonWithoutQValues,
}

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
    /// (1.4) Q values, one per action: greedy when deterministic, epsilon-greedy when sampled.
    QValues { n: usize, epsilon: f32 },
    /// (1.4) A deterministic actor's action: rescaled from [-1, 1] to the bounds, or clipped to them; sampled
    /// actions add `noise` (`(mean, sigma)` per element) first, or equal the deterministic ones without it.
    Deterministic {
        rescale: bool,
        noise: Option<ActionNoise>,
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
            Distribution::QValues { epsilon, .. } => (
                HeadKind::QValues {
                    n: segments.first().copied().unwrap_or(0),
                    epsilon: *epsilon,
                },
                None,
                None,
            ),
            Distribution::Deterministic { rescale, noise, .. } => (
                HeadKind::Deterministic {
                    rescale: *rescale,
                    noise: noise.clone(),
                },
                None,
                None,
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
            HeadKind::QValues { n, .. } => *n,
            HeadKind::Deterministic { .. } => action_len,
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
        !matches!(
            self.kind,
            HeadKind::Gaussian { .. } | HeadKind::Deterministic { .. }
        )
    }

    /// Flags per row an action mask has (the logits or Q values of every component); 0 for continuous heads.
    pub fn mask_len(&self) -> usize {
        if self.is_discrete() {
            self.segments.iter().sum()
        } else {
            0
        }
    }

    /// The request check of a request's head controls for `batch` rows. A mask (`batch x mask_len` flags):
    /// the head is discrete, the length fits, and every component of every row allows at least one action (a
    /// row with none has no answer: sb3-contrib would sample from an all-masked distribution, uniformly among
    /// forbidden actions). An epsilon: the head has Q values and it is a probability (NaN is not).
    pub fn check_controls(
        &self,
        mask: Option<&[bool]>,
        epsilon: Option<f32>,
        batch: usize,
    ) -> Result<(), HeadControlError> {
        if let Some(mask) = mask {
            let per_row = self.mask_len();
            if per_row == 0 {
                return Err(HeadControlError::MaskOnContinuous);
            }
            if batch.checked_mul(per_row) != Some(mask.len()) {
                return Err(HeadControlError::MaskLength {
                    found: mask.len(),
                    batch,
                    per_row,
                });
            }
            for (row, flags) in mask.chunks_exact(per_row).enumerate() {
                let mut off = 0;
                for (segment, n) in self.segments.iter().enumerate() {
                    if !flags[off..off + n].iter().any(|f| *f) {
                        return Err(HeadControlError::NoAllowedAction { row, segment });
                    }
                    off += n;
                }
            }
        }
        if let Some(epsilon) = epsilon {
            if !matches!(self.kind, HeadKind::QValues { .. }) {
                return Err(HeadControlError::EpsilonWithoutQValues);
            }
            if !(0.0..=1.0).contains(&epsilon) {
                return Err(HeadControlError::Epsilon { epsilon });
            }
        }
        Ok(())
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

    /// Write [`MASKED_LOGIT`] over the forbidden entries of one row of (finished) discrete parameters: what the
    /// masked distribution sees, and what `dist_params` reports.
    pub fn mask_params(&self, row: &mut [f32], mask: &[bool]) {
        for (p, allowed) in row.iter_mut().zip(mask) {
            if !allowed {
                *p = MASKED_LOGIT;
            }
        }
    }

    /// The log-density (log-probability for discrete heads) of one row's actions under its (finished)
    /// parameters, as trainers report it with a sampled action (RLlib's `action_logp`, SB3's `log_prob`):
    /// the sum over action elements. `None` where the returned action is not the distribution's draw itself:
    /// a clipped Gaussian (the clip moved it), a squashed one (rescaled through tanh; trainers compute it from
    /// the pre-squash draw), and a discrete action out of range.
    ///
    /// `params` of a masked row must be the masked ones ([`HeadPlan::mask_params`]): a forbidden action then
    /// has log-probability `-inf` relative terms cancel as sb3-contrib's (its masked logits are a huge negative
    /// number, so every allowed action's log-probability is the log-softmax over the allowed ones). A Q-value
    /// head's is epsilon-greedy's: `ln(epsilon / allowed + (1 − epsilon) · [a is greedy])`.
    pub fn log_prob(&self, params: &[f32], discrete: &[i64], continuous: &[f32]) -> Option<f32> {
        self.log_prob_with(params, discrete, continuous, &RowControls::NONE)
    }

    /// [`HeadPlan::log_prob`] under a request's controls (the mask of the row, an epsilon override).
    pub fn log_prob_with(
        &self,
        params: &[f32],
        discrete: &[i64],
        continuous: &[f32],
        controls: &RowControls<'_>,
    ) -> Option<f32> {
        match &self.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                let mut off = 0;
                let mut total = 0.0f64;
                for (k, n) in self.segments.iter().enumerate() {
                    let logits = &params[off..off + n];
                    let allowed = |i: usize| controls.mask.is_none_or(|m| m[off + i]);
                    let a = usize::try_from(*discrete.get(k)?).ok().filter(|a| a < n)?;
                    if !allowed(a) {
                        return Some(f32::NEG_INFINITY);
                    }
                    let max = (0..*n)
                        .filter(|i| allowed(*i))
                        .map(|i| logits[i])
                        .fold(f32::NEG_INFINITY, f32::max) as f64;
                    let lse = max
                        + (0..*n)
                            .filter(|i| allowed(*i))
                            .map(|i| (logits[i] as f64 - max).exp())
                            .sum::<f64>()
                            .ln();
                    total += logits[a] as f64 - lse;
                    off += n;
                }
                Some(total as f32)
            }
            HeadKind::QValues { n, epsilon } => {
                let a = usize::try_from(*discrete.first()?).ok().filter(|a| a < n)?;
                let mask = controls.mask;
                if mask.is_some_and(|m| !m[a]) {
                    return Some(f32::NEG_INFINITY);
                }
                let eps = controls.epsilon.unwrap_or(*epsilon) as f64;
                let allowed = mask.map_or(*n, |m| m[..*n].iter().filter(|f| **f).count());
                let greedy = argmax_masked(&params[..*n], mask.map(|m| &m[..*n]));
                let p = eps / allowed as f64 + if a == greedy { 1.0 - eps } else { 0.0 };
                Some(p.ln() as f32)
            }
            HeadKind::Deterministic { .. } => None,
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
        self.act_row_with(params, mode, env, &RowControls::NONE, discrete, continuous)
    }

    /// [`HeadPlan::act_row`] under a request's controls: `controls.mask` is this row's mask (checked by
    /// [`HeadPlan::check_controls`]; the masked entries of `params` need not be overwritten first), applied before
    /// argmax and sampling; `controls.epsilon` overrides a Q-value head's exploration rate. Never inlined: one
    /// call per row costs nothing beside the draw, and its copies cost the browser bundle (3 MB goal).
    #[inline(never)]
    pub fn act_row_with(
        &self,
        params: &[f32],
        mode: ActMode,
        env: u32,
        controls: &RowControls<'_>,
        discrete: &mut [i64],
        continuous: &mut [f32],
    ) {
        let stream = match mode {
            ActMode::Sample { seed, step } => Some(Stream::new(seed, env, step)),
            ActMode::Deterministic => None,
        };
        self.act_row_from(params, stream, controls, discrete, continuous)
    }

    /// [`HeadPlan::act_row_with`] drawing from `stream` (the row's (seed, env, step) stream; `None`: the
    /// deterministic action), for a caller that built the streams of many rows at once
    /// ([`crate::philox::first_blocks`], [`Stream::with_first_block`]).
    pub fn act_row_from(
        &self,
        params: &[f32],
        mut stream: Option<Stream>,
        controls: &RowControls<'_>,
        discrete: &mut [i64],
        continuous: &mut [f32],
    ) {
        match &self.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                let mut off = 0;
                for (k, n) in self.segments.iter().enumerate() {
                    let logits = &params[off..off + n];
                    let mask = controls.mask.map(|m| &m[off..off + n]);
                    discrete[k] = match &mut stream {
                        Some(s) => categorical_masked(logits, mask, u01(s.word(k as u32))),
                        None => argmax_masked(logits, mask),
                    } as i64;
                    off += n;
                }
            }
            HeadKind::QValues { n, epsilon } => {
                let q = &params[..*n];
                let mask = controls.mask.map(|m| &m[..*n]);
                let eps = controls.epsilon.unwrap_or(*epsilon);
                let explore = stream.as_mut().and_then(|s| {
                    (u01(s.word(0)) < eps).then(|| uniform_index(s.word(1), mask, *n))
                });
                discrete[0] = explore.unwrap_or_else(|| argmax_masked(q, mask)) as i64;
            }
            HeadKind::Deterministic { rescale, noise } => {
                for d in 0..self.action_len {
                    let mut a = params[d];
                    if let (Some(s), Some(n)) = (&mut stream, noise) {
                        a += n.mean[d] + n.sigma[d] * standard_normal(s, d as u32);
                        if *rescale {
                            a = a.clamp(-1.0, 1.0);
                        }
                    }
                    continuous[d] = if *rescale {
                        self.low[d] + 0.5 * (a + 1.0) * (self.high[d] - self.low[d])
                    } else {
                        a.clamp(self.low[d], self.high[d])
                    };
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
