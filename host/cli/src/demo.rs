//! Run a policy in the demo environments: seeded episodes, returns, per-step act() latency.

use std::time::Instant;

use policyport::{ActMode, EnvIds, Observations, PolicyError, Request, Session};

use crate::envs::{Env, EnvObs, ObsElem};

/// An env's observations as act() takes them (u8 frames stay u8).
pub fn observations(obs: EnvObs<'_>) -> Observations<'_> {
    match obs {
        EnvObs::F32(x) => Observations::F32(x),
        EnvObs::U8(x) => Observations::U8(x),
    }
}

#[derive(Debug, Clone)]
pub struct EpisodeStats {
    pub returns: Vec<f64>,
    pub steps: usize,
    /// Per act() call, in microseconds, sorted.
    pub act_us: Vec<f64>,
}

impl EpisodeStats {
    pub fn mean_return(&self) -> f64 {
        self.returns.iter().sum::<f64>() / self.returns.len().max(1) as f64
    }
    pub fn latency_percentile(&self, p: f64) -> f64 {
        if self.act_us.is_empty() {
            return 0.0;
        }
        self.act_us[((self.act_us.len() - 1) as f64 * p).round() as usize]
    }
}

/// Episode e starts from reset(env_seed, e); step t of episode e samples with (policy_seed, env e, step t) —
/// the same streams the fixture script used to evaluate the PyTorch policy.
pub fn run_episodes<E: Env>(
    session: &mut Session,
    episodes: u32,
    env_seed: u64,
    policy_seed: u64,
    sampled: bool,
) -> Result<EpisodeStats, PolicyError> {
    let mut obs = vec![E::Obs::default(); E::OBS_LEN];
    let mut stats = EpisodeStats {
        returns: vec![],
        steps: 0,
        act_us: vec![],
    };
    for e in 0..episodes {
        let mut env = E::reset(env_seed, e);
        let mut total = 0.0;
        for t in 0..E::MAX_STEPS {
            env.observe(&mut obs);
            let mode = if sampled {
                ActMode::Sample {
                    seed: policy_seed,
                    step: t as u64,
                }
            } else {
                ActMode::Deterministic
            };
            let t0 = Instant::now();
            let out = session.act(
                &Request::new(observations(ObsElem::view(&obs)), 1, mode).envs(EnvIds::Range(e)),
            )?;
            stats.act_us.push(t0.elapsed().as_secs_f64() * 1e6);
            let d = out.discrete.first().copied().unwrap_or(0);
            let (r, term) = env.step(d, &out.continuous);
            total += r;
            stats.steps += 1;
            if term {
                break;
            }
        }
        stats.returns.push(total);
    }
    stats.act_us.sort_by(|a, b| a.total_cmp(b));
    Ok(stats)
}

/// [`run_episodes`] with every episode stepped at once: one act() per time step for all envs still running
/// (env ids = episode numbers, so the sampling streams (policy_seed, env e, step t) and therefore the returns
/// are exactly those of the sequential run). `act_us` holds one entry per batched call. The conformance suite
/// replays the fixtures' evaluations this way: on a device, act() latency, not the batch, dominates (the
/// sequential replay of 2 × 20 CartPole episodes on every backend took 110 s of the suite).
pub fn run_episodes_batched<E: Env>(
    session: &mut Session,
    episodes: u32,
    env_seed: u64,
    policy_seed: u64,
    sampled: bool,
) -> Result<EpisodeStats, PolicyError> {
    let mut envs: Vec<E> = (0..episodes).map(|e| E::reset(env_seed, e)).collect();
    let mut returns = vec![0.0f64; episodes as usize];
    let mut active: Vec<u32> = (0..episodes).collect();
    let mut obs = vec![];
    let mut stats = EpisodeStats {
        returns: vec![],
        steps: 0,
        act_us: vec![],
    };
    for t in 0..E::MAX_STEPS {
        if active.is_empty() {
            break;
        }
        obs.resize(active.len() * E::OBS_LEN, E::Obs::default());
        for (row, &e) in active.iter().enumerate() {
            envs[e as usize].observe(&mut obs[row * E::OBS_LEN..(row + 1) * E::OBS_LEN]);
        }
        let mode = if sampled {
            ActMode::Sample {
                seed: policy_seed,
                step: t as u64,
            }
        } else {
            ActMode::Deterministic
        };
        let t0 = Instant::now();
        let out = session.act(
            &Request::new(observations(ObsElem::view(&obs)), active.len(), mode)
                .envs(EnvIds::List(&active)),
        )?;
        stats.act_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let k = if out.discrete.is_empty() {
            out.continuous.len() / active.len()
        } else {
            out.discrete.len() / active.len()
        };
        let mut still = Vec::with_capacity(active.len());
        for (row, &e) in active.iter().enumerate() {
            let d = out.discrete.get(row * k).copied().unwrap_or(0);
            let cont = out.continuous.get(row * k..(row + 1) * k).unwrap_or(&[]);
            let (r, term) = envs[e as usize].step(d, cont);
            returns[e as usize] += r;
            stats.steps += 1;
            if !term {
                still.push(e);
            }
        }
        active = still;
    }
    stats.returns = returns;
    stats.act_us.sort_by(|a, b| a.total_cmp(b));
    Ok(stats)
}
