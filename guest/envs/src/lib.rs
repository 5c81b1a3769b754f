//! CartPole-v1 and Pendulum-v1 (Gymnasium's dynamics) for the demos, twins of tests/fixtures/envs.py: float64
//! state, float32 observations, resets drawn from the Philox stream (env seed, episode, step 0), so an episode
//! here replays the PyTorch policy's episode in the fixture script step for step.
//!
//! One implementation serves the native demo (`policyport demo`), the browser demo (compiled into the wasm
//! bundle by `guest/web`) and the browser tests' native traces. Transcendentals go through the `libm` crate,
//! not the platform's libm, so native and wasm builds produce bit-identical trajectories.

use policyport_format::philox::Stream;

fn u01(w: u32) -> f64 {
    (w >> 8) as f64 * (1.0 / 16_777_216.0)
}

/// A single-env environment with a Gymnasium-like interface.
pub trait Env {
    const OBS_LEN: usize;
    const MAX_STEPS: usize;
    fn reset(env_seed: u64, episode: u32) -> Self;
    fn observe(&self, out: &mut [f32]);
    /// Apply an action (discrete index, or continuous values); returns (reward, terminated).
    fn step(&mut self, discrete: i64, continuous: &[f32]) -> (f64, bool);
}

#[derive(Debug, Clone, PartialEq)]
pub struct CartPole {
    pub state: [f64; 4],
}

impl CartPole {
    const GRAVITY: f64 = 9.8;
    const MASSCART: f64 = 1.0;
    const MASSPOLE: f64 = 0.1;
    const TOTAL_MASS: f64 = Self::MASSPOLE + Self::MASSCART;
    const LENGTH: f64 = 0.5;
    const POLEMASS_LENGTH: f64 = Self::MASSPOLE * Self::LENGTH;
    const FORCE_MAG: f64 = 10.0;
    const TAU: f64 = 0.02;
    const X_THRESHOLD: f64 = 2.4;
    const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
}

impl Env for CartPole {
    const OBS_LEN: usize = 4;
    const MAX_STEPS: usize = 500;

    fn reset(env_seed: u64, episode: u32) -> Self {
        let mut s = Stream::new(env_seed, episode, 0);
        let mut state = [0.0; 4];
        for (i, v) in state.iter_mut().enumerate() {
            *v = -0.05 + 0.1 * u01(s.word(i as u32));
        }
        CartPole { state }
    }

    fn observe(&self, out: &mut [f32]) {
        for (o, s) in out.iter_mut().zip(self.state) {
            *o = s as f32;
        }
    }

    fn step(&mut self, action: i64, _: &[f32]) -> (f64, bool) {
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if action == 1 {
            Self::FORCE_MAG
        } else {
            -Self::FORCE_MAG
        };
        let (costheta, sintheta) = (libm::cos(theta), libm::sin(theta));
        let temp =
            (force + Self::POLEMASS_LENGTH * theta_dot * theta_dot * sintheta) / Self::TOTAL_MASS;
        let thetaacc = (Self::GRAVITY * sintheta - costheta * temp)
            / (Self::LENGTH
                * (4.0 / 3.0 - Self::MASSPOLE * costheta * costheta / Self::TOTAL_MASS));
        let xacc = temp - Self::POLEMASS_LENGTH * thetaacc * costheta / Self::TOTAL_MASS;
        let x = x + Self::TAU * x_dot;
        let x_dot = x_dot + Self::TAU * xacc;
        let theta = theta + Self::TAU * theta_dot;
        let theta_dot = theta_dot + Self::TAU * thetaacc;
        self.state = [x, x_dot, theta, theta_dot];
        let term = x < -Self::X_THRESHOLD
            || x > Self::X_THRESHOLD
            || theta < -Self::THETA_THRESHOLD
            || theta > Self::THETA_THRESHOLD;
        (1.0, term)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Pendulum {
    pub th: f64,
    pub thdot: f64,
}

impl Pendulum {
    const MAX_SPEED: f64 = 8.0;
    const MAX_TORQUE: f64 = 2.0;
    const DT: f64 = 0.05;
    const G: f64 = 10.0;
    const M: f64 = 1.0;
    const L: f64 = 1.0;
}

impl Env for Pendulum {
    const OBS_LEN: usize = 3;
    const MAX_STEPS: usize = 200;

    fn reset(env_seed: u64, episode: u32) -> Self {
        let mut s = Stream::new(env_seed, episode, 0);
        let th = -std::f64::consts::PI + 2.0 * std::f64::consts::PI * u01(s.word(0));
        let thdot = -1.0 + 2.0 * u01(s.word(1));
        Pendulum { th, thdot }
    }

    fn observe(&self, out: &mut [f32]) {
        out[0] = libm::cos(self.th) as f32;
        out[1] = libm::sin(self.th) as f32;
        out[2] = self.thdot as f32;
    }

    fn step(&mut self, _: i64, action: &[f32]) -> (f64, bool) {
        use std::f64::consts::PI;
        let (th, thdot) = (self.th, self.thdot);
        let u = (action[0] as f64).clamp(-Self::MAX_TORQUE, Self::MAX_TORQUE);
        let ang = (th + PI).rem_euclid(2.0 * PI) - PI;
        let cost = ang * ang + 0.1 * thdot * thdot + 0.001 * u * u;
        let newthdot = thdot
            + (3.0 * Self::G / (2.0 * Self::L) * libm::sin(th)
                + 3.0 / (Self::M * Self::L * Self::L) * u)
                * Self::DT;
        let newthdot = newthdot.clamp(-Self::MAX_SPEED, Self::MAX_SPEED);
        self.th = th + newthdot * Self::DT;
        self.thdot = newthdot;
        (-cost, false)
    }
}

/// Which environment a [`VecEnv`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvKind {
    CartPole,
    Pendulum,
}

impl EnvKind {
    pub fn obs_len(self) -> usize {
        match self {
            EnvKind::CartPole => CartPole::OBS_LEN,
            EnvKind::Pendulum => Pendulum::OBS_LEN,
        }
    }

    pub fn max_steps(self) -> usize {
        match self {
            EnvKind::CartPole => CartPole::MAX_STEPS,
            EnvKind::Pendulum => Pendulum::MAX_STEPS,
        }
    }

    /// Actions per env: CartPole takes one discrete action, Pendulum one continuous torque.
    pub fn discrete(self) -> bool {
        matches!(self, EnvKind::CartPole)
    }
}

impl std::str::FromStr for EnvKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cartpole" | "cartpole-v1" => Ok(EnvKind::CartPole),
            "pendulum" | "pendulum-v1" => Ok(EnvKind::Pendulum),
            _ => Err(format!("unknown env '{s}' (cartpole, pendulum)")),
        }
    }
}

enum Envs {
    CartPole(Vec<CartPole>),
    Pendulum(Vec<Pendulum>),
}

/// `n` envs stepped together by one batched act() per tick, with automatic resets. Env `i` plays episodes
/// `i, i + n, i + 2n, …` (reset stream (seed, episode)), so every episode is distinct and reproducible; the
/// policy's sampling stream for env `i` at tick `t` is (policy seed, env `i`, step `t`).
pub struct VecEnv {
    kind: EnvKind,
    seed: u64,
    envs: Envs,
    episode: Vec<u32>,
    t: Vec<u32>,
    ret: Vec<f64>,
    obs: Vec<f32>,
    ticks: u64,
    finished: Vec<f64>,
}

/// What one [`VecEnv::step`] finished.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReport {
    /// (env index, episode return) of every episode that ended this tick (terminated or truncated).
    pub finished: Vec<(u32, f64)>,
}

impl VecEnv {
    pub fn new(kind: EnvKind, n: usize, seed: u64) -> Self {
        let episode: Vec<u32> = (0..n as u32).collect();
        let envs = match kind {
            EnvKind::CartPole => {
                Envs::CartPole(episode.iter().map(|&e| CartPole::reset(seed, e)).collect())
            }
            EnvKind::Pendulum => {
                Envs::Pendulum(episode.iter().map(|&e| Pendulum::reset(seed, e)).collect())
            }
        };
        let mut v = VecEnv {
            kind,
            seed,
            envs,
            episode,
            t: vec![0; n],
            ret: vec![0.0; n],
            obs: vec![0.0; n * kind.obs_len()],
            ticks: 0,
            finished: vec![],
        };
        for i in 0..n {
            v.observe(i);
        }
        v
    }

    pub fn kind(&self) -> EnvKind {
        self.kind
    }

    pub fn len(&self) -> usize {
        self.t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.t.is_empty()
    }

    /// Observations of every env, `len x obs_len`, row-major (what act() takes).
    pub fn observations(&self) -> &[f32] {
        &self.obs
    }

    /// Ticks so far (the `step` of the next act()'s sampling streams).
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// Per env: steps into the current episode.
    pub fn episode_steps(&self) -> &[u32] {
        &self.t
    }

    /// Per env: return so far in the current episode.
    pub fn running_returns(&self) -> &[f64] {
        &self.ret
    }

    /// Returns of every finished episode, in the order they finished.
    pub fn finished_returns(&self) -> &[f64] {
        &self.finished
    }

    fn observe(&mut self, i: usize) {
        let n = self.kind.obs_len();
        let out = &mut self.obs[i * n..(i + 1) * n];
        match &self.envs {
            Envs::CartPole(e) => e[i].observe(out),
            Envs::Pendulum(e) => e[i].observe(out),
        }
    }

    /// Apply one action per env (`discrete` for CartPole, `continuous` for Pendulum, `len` values each), reset
    /// the envs whose episode ended, and refresh the observations.
    pub fn step(&mut self, discrete: &[i64], continuous: &[f32]) -> Result<StepReport, String> {
        let n = self.len();
        let need = if self.kind.discrete() {
            discrete.len()
        } else {
            continuous.len()
        };
        if need != n {
            return Err(format!("{n} envs need {n} actions, got {need}"));
        }
        let mut report = StepReport::default();
        let max = self.kind.max_steps() as u32;
        for i in 0..n {
            let (r, term) = match &mut self.envs {
                Envs::CartPole(e) => e[i].step(discrete[i], &[]),
                Envs::Pendulum(e) => e[i].step(0, &continuous[i..i + 1]),
            };
            self.ret[i] += r;
            self.t[i] += 1;
            if term || self.t[i] >= max {
                report.finished.push((i as u32, self.ret[i]));
                self.finished.push(self.ret[i]);
                self.episode[i] += n as u32;
                let (seed, ep) = (self.seed, self.episode[i]);
                match &mut self.envs {
                    Envs::CartPole(e) => e[i] = CartPole::reset(seed, ep),
                    Envs::Pendulum(e) => e[i] = Pendulum::reset(seed, ep),
                }
                self.t[i] = 0;
                self.ret[i] = 0.0;
            }
            self.observe(i);
        }
        self.ticks += 1;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_env_resets_and_reports_returns() {
        let mut v = VecEnv::new(EnvKind::CartPole, 3, 5);
        assert_eq!(v.observations().len(), 12);
        // Always pushing right ends every CartPole episode within a few dozen steps.
        for _ in 0..200 {
            v.step(&[1, 1, 1], &[]).unwrap();
        }
        assert!(v.finished_returns().len() >= 3);
        assert!(v.finished_returns().iter().all(|r| *r >= 1.0 && *r < 200.0));
        assert!(v.step(&[1], &[]).is_err());
        let mut p = VecEnv::new(EnvKind::Pendulum, 2, 5);
        for _ in 0..200 {
            p.step(&[], &[0.0, 0.0]).unwrap();
        }
        assert_eq!(
            p.finished_returns().len(),
            2,
            "pendulum truncates at 200 steps"
        );
    }

    #[test]
    fn episodes_are_reproducible() {
        let mut a = VecEnv::new(EnvKind::Pendulum, 4, 9);
        let mut b = VecEnv::new(EnvKind::Pendulum, 4, 9);
        for t in 0..300 {
            let u = [(t % 5) as f32 - 2.0; 4];
            a.step(&[], &u).unwrap();
            b.step(&[], &u).unwrap();
        }
        assert_eq!(a.observations(), b.observations());
        assert_eq!(a.finished_returns(), b.finished_returns());
    }
}
