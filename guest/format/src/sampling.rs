//! Turning distribution parameters into actions, exactly as SPEC.md ("Seeded sampling") defines it. Every
//! backend that samples on the host side calls this; device samplers (WGSL, CUDA) implement the same text and
//! are tested against it.

use crate::container::Artifact;
use crate::manifest::{ActionSpace, Distribution, LogStd};
use crate::philox::{Stream, u01, u01_open_closed};

/// How act() chooses actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActMode {
    /// argmax / mean (squashed and rescaled for a squashed Gaussian).
    Deterministic,
    /// A draw from the stream (seed, env, step) of every env row.
    Sample { seed: u64, step: u64 },
}

#[derive(Debug, Clone)]
enum Kind {
    Categorical { n: usize },
    MultiCategorical { nvec: Vec<usize> },
    Gaussian { squashed: bool, clip: bool },
}

/// Precomputed sampling state for one artifact (built at load, used on every act()).
#[derive(Debug, Clone)]
pub struct Sampler {
    kind: Kind,
    action_len: usize,
    /// State-independent log-std (already clamped), if any.
    log_std_param: Option<Vec<f32>>,
    log_std_range: Option<(f32, f32)>,
    low: Vec<f32>,
    high: Vec<f32>,
}

/// Inverse CDF on unnormalised weights: the first i with e_0 + … + e_i > u · Σe, where e_i = exp(l_i − max l).
/// Accumulated in f32, left to right. Falls back to the last index if rounding leaves no such i.
#[inline]
pub fn categorical(logits: &[f32], u: f32) -> usize {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let t = u * total;
    let mut acc = 0.0f32;
    for (i, l) in logits.iter().enumerate() {
        acc += (l - max).exp();
        if acc > t {
            return i;
        }
    }
    logits.len() - 1
}

/// Index of the first maximum.
#[inline]
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best
}

/// Standard normal for action element d: Box–Muller (cosine branch) on words 2d and 2d+1.
#[inline]
pub fn standard_normal(stream: &mut Stream, d: u32) -> f32 {
    let u1 = u01_open_closed(stream.word(2 * d));
    let u2 = u01(stream.word(2 * d + 1));
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

impl Sampler {
    /// Build from a validated artifact (call [`crate::validate`] first: this indexes without re-checking).
    pub fn new(art: &Artifact) -> Self {
        let m = &art.manifest;
        let action_len = m.action.action_len();
        let (low, high) = match &m.action {
            ActionSpace::Box { low, high, .. } => (
                low.iter().map(|b| b.unwrap_or(f32::NEG_INFINITY)).collect(),
                high.iter().map(|b| b.unwrap_or(f32::INFINITY)).collect(),
            ),
            _ => (vec![], vec![]),
        };
        let (kind, log_std, range) = match &m.distribution {
            Distribution::Categorical { .. } => {
                let ActionSpace::Discrete { n } = m.action else {
                    unreachable!("validated")
                };
                (Kind::Categorical { n }, None, None)
            }
            Distribution::MultiCategorical { .. } => {
                let ActionSpace::MultiDiscrete { nvec } = &m.action else {
                    unreachable!("validated")
                };
                (Kind::MultiCategorical { nvec: nvec.clone() }, None, None)
            }
            Distribution::DiagGaussian {
                log_std,
                log_std_range,
                clip,
                ..
            } => (
                Kind::Gaussian {
                    squashed: false,
                    clip: *clip,
                },
                Some(log_std),
                *log_std_range,
            ),
            Distribution::SquashedGaussian {
                log_std,
                log_std_range,
                ..
            } => (
                Kind::Gaussian {
                    squashed: true,
                    clip: false,
                },
                Some(log_std),
                *log_std_range,
            ),
        };
        let log_std_param = match log_std {
            Some(LogStd::Parameter { tensor }) => Some(
                art.tensors[tensor]
                    .data
                    .iter()
                    .map(|v| clamp_range(*v, range))
                    .collect(),
            ),
            _ => None,
        };
        Sampler {
            kind,
            action_len,
            log_std_param,
            log_std_range: range,
            low,
            high,
        }
    }

    pub fn action_len(&self) -> usize {
        self.action_len
    }

    pub fn is_discrete(&self) -> bool {
        !matches!(self.kind, Kind::Gaussian { .. })
    }

    /// Numbers per row of `dist_params` (logits; or mean then log-std for Gaussians).
    pub fn dist_params_len(&self) -> usize {
        match &self.kind {
            Kind::Categorical { n } => *n,
            Kind::MultiCategorical { nvec } => nvec.iter().sum(),
            Kind::Gaussian { .. } => 2 * self.action_len,
        }
    }

    /// Complete one row of distribution parameters in place: for Gaussians, `row[..k]` holds the mean on entry
    /// and `row[k..]` the state-dependent log-std (ignored when the log-std is a parameter); on return `row[k..]`
    /// holds the clamped log-std actually used.
    pub fn finish_params(&self, row: &mut [f32]) {
        if let Kind::Gaussian { .. } = self.kind {
            let k = self.action_len;
            match &self.log_std_param {
                Some(p) => row[k..].copy_from_slice(p),
                None => row[k..]
                    .iter_mut()
                    .for_each(|v| *v = clamp_range(*v, self.log_std_range)),
            }
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
            Kind::Categorical { .. } => {
                discrete[0] = match &mut stream {
                    Some(s) => categorical(params, u01(s.word(0))),
                    None => argmax(params),
                } as i64;
            }
            Kind::MultiCategorical { nvec } => {
                let mut off = 0;
                for (k, n) in nvec.iter().enumerate() {
                    let logits = &params[off..off + n];
                    discrete[k] = match &mut stream {
                        Some(s) => categorical(logits, u01(s.word(k as u32))),
                        None => argmax(logits),
                    } as i64;
                    off += n;
                }
            }
            Kind::Gaussian { squashed, clip } => {
                let k = self.action_len;
                for d in 0..k {
                    let mean = params[d];
                    let mut a = match &mut stream {
                        Some(s) => mean + params[k + d].exp() * standard_normal(s, d as u32),
                        None => mean,
                    };
                    if *squashed {
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

#[inline]
fn clamp_range(v: f32, range: Option<(f32, f32)>) -> f32 {
    match range {
        Some((lo, hi)) => v.clamp(lo, hi),
        None => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categorical_inverse_cdf_edges() {
        let logits = [0.0f32, 0.0, 0.0, 0.0];
        assert_eq!(categorical(&logits, 0.0), 0);
        assert_eq!(categorical(&logits, 0.24), 0);
        assert_eq!(categorical(&logits, 0.26), 1);
        assert_eq!(categorical(&logits, 0.999), 3);
        // A dominant logit takes (almost) all the mass.
        assert_eq!(categorical(&[-100.0, 100.0, -100.0], 0.5), 1);
    }

    #[test]
    fn categorical_frequencies_match_probabilities() {
        let logits = [0.5f32, -1.0, 2.0];
        let e: Vec<f64> = logits.iter().map(|l| (*l as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut counts = [0usize; 3];
        let n = 200_000u64;
        for step in 0..n {
            let mut s = Stream::new(99, 0, step);
            counts[categorical(&logits, u01(s.word(0)))] += 1;
        }
        for i in 0..3 {
            let freq = counts[i] as f64 / n as f64;
            assert!(
                (freq - e[i] / z).abs() < 0.005,
                "class {i}: {freq} vs {}",
                e[i] / z
            );
        }
    }

    #[test]
    fn normal_moments() {
        let n = 200_000u64;
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for step in 0..n {
            let mut s = Stream::new(3, 1, step);
            let z = standard_normal(&mut s, 0) as f64;
            sum += z;
            sq += z * z;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.01,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn argmax_takes_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }
}
