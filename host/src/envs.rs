//! CartPole-v1 and Pendulum-v1 (Gymnasium's dynamics) for the demo, twins of tests/fixtures/envs.py: float64
//! state, float32 observations, resets drawn from the Philox stream (env seed, episode, step 0), so an episode
//! here replays the PyTorch policy's episode in the fixture script step for step.

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
        let (costheta, sintheta) = (theta.cos(), theta.sin());
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
        out[0] = self.th.cos() as f32;
        out[1] = self.th.sin() as f32;
        out[2] = self.thdot as f32;
    }

    fn step(&mut self, _: i64, action: &[f32]) -> (f64, bool) {
        use std::f64::consts::PI;
        let (th, thdot) = (self.th, self.thdot);
        let u = (action[0] as f64).clamp(-Self::MAX_TORQUE, Self::MAX_TORQUE);
        let ang = (th + PI).rem_euclid(2.0 * PI) - PI;
        let cost = ang * ang + 0.1 * thdot * thdot + 0.001 * u * u;
        let newthdot = thdot
            + (3.0 * Self::G / (2.0 * Self::L) * th.sin()
                + 3.0 / (Self::M * Self::L * Self::L) * u)
                * Self::DT;
        let newthdot = newthdot.clamp(-Self::MAX_SPEED, Self::MAX_SPEED);
        self.th = th + newthdot * Self::DT;
        self.thdot = newthdot;
        (-cost, false)
    }
}
