//! CartPole-v1 and Pendulum-v1 (Gymnasium's dynamics) for the demos, twins of tests/fixtures/envs.py: float64
//! state, float32 observations, resets drawn from the Philox stream (env seed, episode, step 0), so an episode
//! here replays the PyTorch policy's episode in the fixture script step for step. And [`Catch`], a small pixel
//! game (uint8 RGB frames, integers only) for the demos' pixel policy.
//!
//! One implementation serves the native demo (`policyport demo`), the browser demo (compiled into the wasm
//! bundle by `guest/web`) and the browser tests' native traces. Transcendentals go through the `libm` crate,
//! not the platform's libm, so native and wasm builds produce bit-identical trajectories.

use policyport_format::philox::Stream;

fn u01(w: u32) -> f64 {
    (w >> 8) as f64 * (1.0 / 16_777_216.0)
}

/// A batch of observations as an env hands them out: f32 numbers, or u8 pixels for image envs (what a policy
/// with a uint8 observation space takes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EnvObs<'a> {
    F32(&'a [f32]),
    U8(&'a [u8]),
}

impl EnvObs<'_> {
    pub fn len(&self) -> usize {
        match self {
            EnvObs::F32(x) => x.len(),
            EnvObs::U8(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The element type of an env's observations: `f32` or `u8`.
pub trait ObsElem: Copy + Default + 'static {
    fn view(x: &[Self]) -> EnvObs<'_>;
}

impl ObsElem for f32 {
    fn view(x: &[f32]) -> EnvObs<'_> {
        EnvObs::F32(x)
    }
}

impl ObsElem for u8 {
    fn view(x: &[u8]) -> EnvObs<'_> {
        EnvObs::U8(x)
    }
}

/// A single-env environment with a Gymnasium-like interface.
pub trait Env {
    /// `f32` numbers, or `u8` for pixel envs.
    type Obs: ObsElem;
    const OBS_LEN: usize;
    const MAX_STEPS: usize;
    fn reset(env_seed: u64, episode: u32) -> Self;
    fn observe(&self, out: &mut [Self::Obs]);
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
    type Obs = f32;
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
    type Obs = f32;
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

/// Catch, a pixel game (twin of `Catch` in tests/fixtures/envs.py): balls fall one row per step down a 16 x 16
/// board, a new one every 5 steps, each in a column at most 5 from the previous ball's (so a perfect player catches
/// every ball); a 3-wide paddle on the bottom row moves left / stays / moves right (actions 0 / 1 / 2; other values
/// are clamped into that range). A ball reaching the bottom row scores +1 if the paddle is under it, else -1;
/// episodes are cut at 200 steps (38 balls land: returns in [-38, 38]). Observations are the board as uint8 RGB,
/// `[16, 16, 3]` (rows, columns, channels), the frame a person sees too.
///
/// Ball `k` spawns at step `5k` in row 0, is in row `t - 5k` at step `t` and lands at `5k + 15`, so at most three
/// are in flight; their columns are kept by `k mod 3`. Randomness: the reset from words 0 (paddle) and 1 (first
/// column) of stream (env seed, episode, 0), ball `k >= 1`'s drift from word 0 of (env seed, episode, k); an
/// integer in `[0, n)` is `((w >> 8) * n) >> 24`. Integers only, so every platform plays the same frames.
#[derive(Debug, Clone, PartialEq)]
pub struct Catch {
    pub env_seed: u64,
    pub episode: u32,
    /// Steps into the episode.
    pub t: u32,
    /// The paddle's leftmost column.
    pub paddle: u32,
    /// Columns of the balls in flight, by spawn index mod 3.
    pub columns: [u32; 3],
}

impl Catch {
    pub const SIZE: u32 = 16;
    pub const PADDLE_WIDTH: u32 = 3;
    pub const PERIOD: u32 = 5;
    pub const DRIFT: u32 = 5;
    pub const BACKGROUND: [u8; 3] = [14, 18, 28];
    pub const BALL: [u8; 3] = [255, 176, 64];
    pub const PADDLE: [u8; 3] = [88, 196, 255];

    fn below(w: u32, n: u32) -> u32 {
        (((w >> 8) as u64 * n as u64) >> 24) as u32
    }
}

impl Env for Catch {
    type Obs = u8;
    const OBS_LEN: usize = (Self::SIZE * Self::SIZE * 3) as usize;
    const MAX_STEPS: usize = 200;

    fn reset(env_seed: u64, episode: u32) -> Self {
        let mut s = Stream::new(env_seed, episode, 0);
        let paddle = Self::below(s.word(0), Self::SIZE - Self::PADDLE_WIDTH + 1);
        let first = Self::below(s.word(1), Self::SIZE);
        Catch {
            env_seed,
            episode,
            t: 0,
            paddle,
            columns: [first, 0, 0],
        }
    }

    fn observe(&self, out: &mut [u8]) {
        let n = Self::SIZE as usize;
        for px in out.chunks_exact_mut(3) {
            px.copy_from_slice(&Self::BACKGROUND);
        }
        for j in 0..3 {
            let Some(k) = (self.t / Self::PERIOD).checked_sub(j) else {
                continue;
            };
            let row = self.t - Self::PERIOD * k;
            if row < Self::SIZE - 1 {
                let at = (row as usize * n + self.columns[(k % 3) as usize] as usize) * 3;
                out[at..at + 3].copy_from_slice(&Self::BALL);
            }
        }
        let at = ((n - 1) * n + self.paddle as usize) * 3;
        for px in out[at..at + Self::PADDLE_WIDTH as usize * 3].chunks_exact_mut(3) {
            px.copy_from_slice(&Self::PADDLE);
        }
    }

    fn step(&mut self, action: i64, _: &[f32]) -> (f64, bool) {
        let moved = self.paddle as i64 + action.clamp(0, 2) - 1;
        self.paddle = moved.clamp(0, (Self::SIZE - Self::PADDLE_WIDTH) as i64) as u32;
        self.t += 1;
        let mut reward = 0.0;
        // The ball landing now (spawned 15 steps ago) is scored before its slot is reused by the new one.
        if let Some(land) = self.t.checked_sub(Self::SIZE - 1)
            && land % Self::PERIOD == 0
        {
            let col = self.columns[(land / Self::PERIOD % 3) as usize];
            let caught = (self.paddle..self.paddle + Self::PADDLE_WIDTH).contains(&col);
            reward = if caught { 1.0 } else { -1.0 };
        }
        if self.t % Self::PERIOD == 0 {
            let k = self.t / Self::PERIOD;
            let prev = self.columns[((k - 1) % 3) as usize] as i64;
            let w = Stream::new(self.env_seed, self.episode, k as u64).word(0);
            let drift = Self::below(w, 2 * Self::DRIFT + 1) as i64 - Self::DRIFT as i64;
            self.columns[(k % 3) as usize] = (prev + drift).clamp(0, Self::SIZE as i64 - 1) as u32;
        }
        (reward, false)
    }
}

/// Which environment a [`VecEnv`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvKind {
    CartPole,
    Pendulum,
    Catch,
}

impl EnvKind {
    pub fn obs_len(self) -> usize {
        match self {
            EnvKind::CartPole => CartPole::OBS_LEN,
            EnvKind::Pendulum => Pendulum::OBS_LEN,
            EnvKind::Catch => Catch::OBS_LEN,
        }
    }

    pub fn max_steps(self) -> usize {
        match self {
            EnvKind::CartPole => CartPole::MAX_STEPS,
            EnvKind::Pendulum => Pendulum::MAX_STEPS,
            EnvKind::Catch => Catch::MAX_STEPS,
        }
    }

    /// Actions per env: CartPole and Catch take one discrete action, Pendulum one continuous torque.
    pub fn discrete(self) -> bool {
        !matches!(self, EnvKind::Pendulum)
    }

    /// Observations are uint8 pixels (Catch) rather than f32 numbers.
    pub fn pixels(self) -> bool {
        matches!(self, EnvKind::Catch)
    }
}

impl std::str::FromStr for EnvKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cartpole" | "cartpole-v1" => Ok(EnvKind::CartPole),
            "pendulum" | "pendulum-v1" => Ok(EnvKind::Pendulum),
            "catch" => Ok(EnvKind::Catch),
            _ => Err(format!("unknown env '{s}' (cartpole, pendulum, catch)")),
        }
    }
}

/// `n` envs of one type and their observations, row-major: what [`VecEnv`] steps without knowing the type.
trait EnvBatch {
    fn step(&mut self, i: usize, discrete: i64, continuous: &[f32]) -> (f64, bool);
    fn reset(&mut self, i: usize, env_seed: u64, episode: u32);
    fn observe(&mut self, i: usize);
    fn observations(&self) -> EnvObs<'_>;
}

struct Batch<E: Env> {
    envs: Vec<E>,
    obs: Vec<E::Obs>,
}

impl<E: Env> Batch<E> {
    fn new(episodes: &[u32], env_seed: u64) -> Self {
        let mut b = Batch {
            envs: episodes.iter().map(|&e| E::reset(env_seed, e)).collect(),
            obs: vec![E::Obs::default(); episodes.len() * E::OBS_LEN],
        };
        for i in 0..episodes.len() {
            b.observe(i);
        }
        b
    }
}

impl<E: Env> EnvBatch for Batch<E> {
    fn step(&mut self, i: usize, discrete: i64, continuous: &[f32]) -> (f64, bool) {
        self.envs[i].step(discrete, continuous)
    }

    fn reset(&mut self, i: usize, env_seed: u64, episode: u32) {
        self.envs[i] = E::reset(env_seed, episode);
    }

    fn observe(&mut self, i: usize) {
        self.envs[i].observe(&mut self.obs[i * E::OBS_LEN..(i + 1) * E::OBS_LEN]);
    }

    fn observations(&self) -> EnvObs<'_> {
        E::Obs::view(&self.obs)
    }
}

/// `n` envs stepped together by one batched act() per tick, with automatic resets. Env `i` plays episodes
/// `i, i + n, i + 2n, …` (reset stream (seed, episode)), so every episode is distinct and reproducible; the
/// policy's sampling stream for env `i` at tick `t` is (policy seed, env `i`, step `t`).
pub struct VecEnv {
    kind: EnvKind,
    seed: u64,
    envs: Box<dyn EnvBatch>,
    episode: Vec<u32>,
    t: Vec<u32>,
    ret: Vec<f64>,
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
        let envs: Box<dyn EnvBatch> = match kind {
            EnvKind::CartPole => Box::new(Batch::<CartPole>::new(&episode, seed)),
            EnvKind::Pendulum => Box::new(Batch::<Pendulum>::new(&episode, seed)),
            EnvKind::Catch => Box::new(Batch::<Catch>::new(&episode, seed)),
        };
        VecEnv {
            kind,
            seed,
            envs,
            episode,
            t: vec![0; n],
            ret: vec![0.0; n],
            ticks: 0,
            finished: vec![],
        }
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

    /// Observations of every env, `len x obs_len`, row-major (what act() takes): f32, or u8 frames for Catch.
    pub fn observations(&self) -> EnvObs<'_> {
        self.envs.observations()
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

    /// Apply one action per env (`discrete` for CartPole and Catch, `continuous` for Pendulum, `len` values
    /// each), reset the envs whose episode ended, and refresh the observations.
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
            let (r, term) = if self.kind.discrete() {
                self.envs.step(i, discrete[i], &[])
            } else {
                self.envs.step(i, 0, &continuous[i..i + 1])
            };
            self.ret[i] += r;
            self.t[i] += 1;
            if term || self.t[i] >= max {
                report.finished.push((i as u32, self.ret[i]));
                self.finished.push(self.ret[i]);
                self.episode[i] += n as u32;
                self.envs.reset(i, self.seed, self.episode[i]);
                self.t[i] = 0;
                self.ret[i] = 0.0;
            }
            self.envs.observe(i);
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

    /// The column of the lowest ball in flight (the next to land).
    fn lowest_ball(c: &Catch) -> Option<u32> {
        (0..3).rev().find_map(|j| {
            let k = (c.t / Catch::PERIOD).checked_sub(j)?;
            (c.t - Catch::PERIOD * k < Catch::SIZE - 1).then(|| c.columns[(k % 3) as usize])
        })
    }

    #[test]
    fn catch_is_winnable_every_episode_and_lost_by_standing_still() {
        for episode in 0..20 {
            let (mut chase, mut stay) = (Catch::reset(7, episode), Catch::reset(7, episode));
            let (mut won, mut lost) = (0.0, 0.0);
            for _ in 0..Catch::MAX_STEPS {
                let target = lowest_ball(&chase).unwrap_or(chase.paddle + 1);
                let action = 1 + (target as i64 - (chase.paddle as i64 + 1)).signum();
                won += chase.step(action, &[]).0;
                lost += stay.step(1, &[]).0;
            }
            assert_eq!(won, 38.0, "episode {episode}: every ball is reachable");
            assert!(lost < 0.0, "episode {episode}: {lost}");
        }
    }

    #[test]
    fn catch_frames_show_the_balls_in_flight_and_the_paddle() {
        let mut c = Catch::reset(1, 0);
        for _ in 0..12 {
            c.step(2, &[]);
        }
        let mut frame = vec![0u8; Catch::OBS_LEN];
        c.observe(&mut frame);
        let px = |row: u32, col: u32| {
            let at = ((row * Catch::SIZE + col) * 3) as usize;
            [frame[at], frame[at + 1], frame[at + 2]]
        };
        // t = 12: balls 0, 1, 2 at rows 12, 7, 2; the paddle pushed right 12 times from its reset column.
        for (k, row) in [(0, 12), (1, 7), (2, 2)] {
            assert_eq!(px(row, c.columns[k]), Catch::BALL, "ball {k}");
        }
        assert_eq!(c.paddle, Catch::SIZE - Catch::PADDLE_WIDTH);
        for col in 0..Catch::SIZE {
            let want = if col >= c.paddle {
                Catch::PADDLE
            } else {
                Catch::BACKGROUND
            };
            assert_eq!(px(Catch::SIZE - 1, col), want, "bottom row, column {col}");
        }
        let balls = frame.chunks_exact(3).filter(|p| *p == Catch::BALL).count();
        assert_eq!(balls, 3);
        // Out-of-range actions move one cell at most.
        let mut d = Catch::reset(1, 0);
        let p = d.paddle;
        d.step(-7, &[]);
        assert_eq!(d.paddle, p.saturating_sub(1));
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
        let mut c = VecEnv::new(EnvKind::Catch, 3, 9);
        assert!(matches!(c.observations(), EnvObs::U8(x) if x.len() == 3 * Catch::OBS_LEN));
        for _ in 0..Catch::MAX_STEPS {
            c.step(&[1, 0, 2], &[]).unwrap();
        }
        assert_eq!(
            c.finished_returns().len(),
            3,
            "catch truncates at 200 steps"
        );
        assert_eq!(a.finished_returns(), b.finished_returns());
    }
}
