//! Many game agents, one batched act() per policy per tick (issue 35's engine-neutral layer).
//!
//! Game engines keep agents as entities that spawn, die and respawn, visited in whatever order the engine's
//! query gives; the runtime keys sampling streams and recurrent state by an *env id* per batch row. This crate is
//! the bridge every engine binding shares (the C ABI, the Bevy plugin, Godot, C#):
//!
//! - an [`AgentId`] is stable for the agent's life and names one env id from a free list. Ids are never confused:
//!   the id carries a generation, so a despawned agent's id is a typed error ([`AgentsError::UnknownAgent`]),
//!   never the row of the agent that reuses its env id;
//! - a reused env id always starts a new episode: [`Agents::spawn`] (and [`Agents::respawn`]) mark the agent so
//!   its first act() zeroes its recurrent state *before* the step (the runtime's `episode_starts`), which is how
//!   ML-Agents and Cervo reset memory per agent;
//! - per tick, [`Agents::observe`] stages one observation row (and optionally an action mask) per agent, in any
//!   order; [`Agents::act`] runs one `act()` over the staged rows with the env-id list and the episode starts, the
//!   tick as the sampling step, and returns a [`Tick`] whose views are indexed by agent id, so nothing depends on
//!   the order agents were observed in;
//! - the backend is whatever the [`CompiledPolicy`] runs on ([`Agents::new`]: one [`Session`]): native kernels,
//!   a GPU, or the wasm sandbox (`policyport_wasmtime::load`: each session its own plugin instance under
//!   wasmtime's deadline and memory cap). One type and one code path for every backend.
//!
//! Errors are typed ([`AgentsError`]); a refused call changes nothing (no agent, id, staged row or state moves).

use std::fmt;
use std::sync::Arc;

use policyport::{
    ActMode, ActOutputs, CompiledPolicy, EnvIds, Observations, PolicyError, Request, Session,
};

pub mod script;
pub use script::{ScriptError, ScriptRunner};

/// The act inside [`Agents::tick_rows`] timed, for issue 35's engine benchmark (tests/scripts/engine-bench.sh): with
/// the `bench-timing` feature each call reads the clock twice around its act and adds the span to a process-wide
/// total, [`bench_timing::act_seconds`]; without it (the default) no clock is read and that is None. Why: an
/// engine's per-tick cost over an act timed in another process (tick_bench's) carries whatever differs between the
/// two processes' acts (the same 100-agent CartPole act measured 8.1 µs in tick_bench and 8.5 µs inside Godot 3,
/// 2026-12-07, also back to back inside one call); over the act timed in the same calls it is what the binding adds.
/// Bevy's act system has the same split (policyport-bevy's `bench_timing`).
pub mod bench_timing {
    #[cfg(feature = "bench-timing")]
    static ACT_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// A clock reading (nothing without the `bench-timing` feature). The engine bindings' own timings use it too
    /// (policyport-bevy's `bench_timing`, whose feature turns this one on).
    #[derive(Clone, Copy)]
    pub struct Mark(#[cfg(feature = "bench-timing")] std::time::Instant);

    impl Mark {
        #[inline(always)]
        pub fn now() -> Self {
            Mark(
                #[cfg(feature = "bench-timing")]
                std::time::Instant::now(),
            )
        }

        /// Seconds from `earlier` to this mark (0 without the feature).
        #[inline(always)]
        #[cfg_attr(not(feature = "bench-timing"), allow(unused_variables))]
        pub fn secs_since(self, earlier: Mark) -> f64 {
            #[cfg(feature = "bench-timing")]
            return (self.0 - earlier.0).as_secs_f64();
            #[cfg(not(feature = "bench-timing"))]
            0.0
        }

        /// The time since this mark, added to the acts' total.
        #[inline(always)]
        pub(crate) fn add_to_act(self) {
            #[cfg(feature = "bench-timing")]
            ACT_NS.fetch_add(
                u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    /// Seconds spent in the acts of `Agents::tick_rows` by every `Agents` of this process so far (None without the
    /// `bench-timing` feature): a benchmark reads it before and after the calls it times.
    pub fn act_seconds() -> Option<f64> {
        #[cfg(feature = "bench-timing")]
        return Some(ACT_NS.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9);
        #[cfg(not(feature = "bench-timing"))]
        None
    }
}

/// The most agents one [`Agents`] holds alive at once unless configured otherwise (the runtime's default
/// limit of envs with recurrent state).
pub const DEFAULT_MAX_AGENTS: usize = policyport::DEFAULT_MAX_ENVS;

/// An agent's stable identity: its env id (`slot`) and which occupant of that env id it is (`generation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId {
    slot: u32,
    generation: u32,
}

impl AgentId {
    /// The env id this agent's rows carry (its sampling stream and recurrent state).
    pub fn env_id(self) -> u32 {
        self.slot
    }

    /// The id as one integer (for C, C# and GDScript callers): `generation << 32 | env id`.
    pub fn to_bits(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.slot)
    }

    /// The id [`AgentId::to_bits`] gave. Any integer makes an id; one that names no live agent is refused by
    /// every call that takes it.
    pub fn from_bits(bits: u64) -> Self {
        AgentId {
            slot: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent {}#{}", self.slot, self.generation)
    }
}

/// How agents act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentsConfig {
    /// The sampling seed: each agent draws from the Philox stream (seed, env id, tick).
    pub seed: u64,
    /// Greedy / mean actions instead of sampled ones.
    pub deterministic: bool,
    /// The most agents alive at once ([`AgentsError::TooManyAgents`] past it).
    pub max_agents: usize,
    /// Compute each agent's value estimate ([`Tick::value`]). Off by default: a game acts, and the critic's
    /// estimate is for training, debugging or a HUD; without it the native backends skip the layers only the
    /// value needs (a PPO policy with a separate critic, SB3's default MLP, does about half its work for it),
    /// as the engines' own exports do (Godot RL Agents and ML-Agents export the actor alone).
    pub values: bool,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            seed: 0,
            deterministic: false,
            max_agents: DEFAULT_MAX_AGENTS,
            values: false,
        }
    }
}

/// `dst.extend_from_slice(obs)` for one agent's observation, as the staging copies it (and an engine gathering
/// rows for [`Agents::observe_rows`] can): observations are often a handful of numbers, copied as a fixed-size
/// array (a few register moves), not by a `memcpy` call (a slice's length known only at run time) or an element
/// loop (which stores the length at every push).
#[inline(always)]
pub fn append_observation(dst: &mut Vec<f32>, obs: &[f32]) {
    match obs.len() {
        1 => dst.push(obs[0]),
        2 => extend_fixed::<2>(dst, obs),
        3 => extend_fixed::<3>(dst, obs),
        4 => extend_fixed::<4>(dst, obs),
        6 => extend_fixed::<6>(dst, obs),
        8 => extend_fixed::<8>(dst, obs),
        _ => dst.extend_from_slice(obs),
    }
}

/// `dst.extend_from_slice(src)` for `src` of N numbers, the length known at compile time.
#[inline(always)]
fn extend_fixed<const N: usize>(dst: &mut Vec<f32>, src: &[f32]) {
    match <&[f32; N]>::try_from(src) {
        Ok(a) => dst.extend_from_slice(a),
        Err(_) => dst.extend_from_slice(src),
    }
}

/// Why an agents call was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error("{0} is not alive (despawned, or not spawned by these agents)")]
    UnknownAgent(AgentId),
    #[error("{0} was already observed this tick (one row per agent per act)")]
    AlreadyObserved(AgentId),
    #[error("{agent}: {found} observation numbers, the policy takes {expected}")]
    ObservationLength {
        agent: AgentId,
        expected: usize,
        found: usize,
    },
    #[error("{agent}: {found} action-mask flags, the policy takes {expected} (one per logit)")]
    MaskLength {
        agent: AgentId,
        expected: usize,
        found: usize,
    },
    #[error("{agent}: an action mask for a policy with continuous actions")]
    MaskOnContinuous { agent: AgentId },
    #[error("{max} agents are alive: the limit (AgentsConfig::max_agents)")]
    TooManyAgents { max: usize },
    /// The policy refused the tick or failed (the sandbox's own failures too: `PolicyError::Sandbox`).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A candidate of [`Agents::auto`] could not be built or timed (its error, as text).
    #[error("candidate unavailable: {0}")]
    Unavailable(String),
}

/// What the staged rows must look like (read once from the policy).
#[derive(Debug, Clone, Copy)]
struct Shape {
    obs_len: usize,
    action_len: usize,
    /// Flags per agent of an action mask (the logits / Q values), 0 for continuous policies.
    mask_len: usize,
    discrete: bool,
    has_value: bool,
}

/// One env id's occupant.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    generation: u32,
    alive: bool,
    /// The next act() starts a new episode for it (spawned or respawned since its last step).
    start: bool,
    /// Its row + 1 in the staging of tick `t` at `rows[t % 2]`, valid while `until[t % 2]` is `t + 1` (0: not
    /// staged then). The act() that ends tick `t` makes `t + 1` the current tick, so the same entry then says the
    /// agent's row in the last act's outputs while the next tick stages into the other one: an act() writes
    /// nothing per agent (the per-row bookkeeping loop was ~1 % of a 1 000-agent Bevy tick).
    rows: [u32; 2],
    until: [u64; 2],
}

impl Slot {
    /// Whether `id` may stage a row in tick `t`: the slot is alive, of `id`'s generation, not staged yet.
    #[inline(always)]
    fn takes(&self, id: AgentId, t: u64) -> bool {
        self.alive && self.generation == id.generation && self.staged(t) == 0
    }

    /// Its row + 1 in the staging of tick `t` (0: not staged).
    #[inline(always)]
    fn staged(&self, t: u64) -> u32 {
        let p = (t & 1) as usize;
        if self.until[p] == t + 1 {
            self.rows[p]
        } else {
            0
        }
    }

    /// Stage it at row `row_plus_1 - 1` of tick `t` (0: withdrawn).
    #[inline(always)]
    fn set_staged(&mut self, t: u64, row_plus_1: u32) {
        let p = (t & 1) as usize;
        self.rows[p] = row_plus_1;
        self.until[p] = t + 1;
    }
}

/// Agents acting through one policy: ids, this tick's staged rows, the last tick's outputs.
pub struct Agents {
    session: Box<Session>,
    shape: Shape,
    config: AgentsConfig,
    slots: Vec<Slot>,
    /// Env ids of despawned agents, reused last-in first-out.
    free: Vec<u32>,
    alive: usize,
    /// Ticks acted so far: the sampling step of the next act().
    tick: u64,
    // This tick's staging, one entry (row) per observed agent.
    ids: Vec<AgentId>,
    /// The request's env-id list: the staged ids' env ids, written once at act() (not pushed per row).
    env_ids: Vec<u32>,
    obs: Vec<f32>,
    /// One flag per staged row once `any_start`; empty before (most ticks start no episode: an unstarted tick
    /// writes no flag per agent, as with masks).
    starts: Vec<bool>,
    /// Some staged row starts a new episode.
    any_start: bool,
    /// `mask_len` flags per staged row once `masked`; empty before.
    masks: Vec<bool>,
    /// Some staged row carries a mask (rows without one are staged all-allowed from then on).
    masked: bool,
    /// The agents of the last act(), by row.
    acted: Vec<AgentId>,
}

impl fmt::Debug for Agents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agents")
            .field("backend", &self.backend())
            .field("alive", &self.alive)
            .field("staged", &self.ids.len())
            .field("tick", &self.tick)
            .finish()
    }
}

impl Agents {
    /// Agents acting through a session on `policy`, whatever it runs on: the native kernels, a GPU, libtorch
    /// (`policyport_torch::load`) or the wasm sandbox (`policyport_wasmtime::load`: the session gets its own
    /// plugin instance, under the policy's deadline and memory cap for every tick).
    pub fn new(policy: Arc<CompiledPolicy>, config: AgentsConfig) -> Self {
        Self::from_session(Session::new(policy), config)
    }

    /// [`Agents::new`] on a session the caller set up (its intra-op threads: `Session::set_threads`, kept).
    /// Its recurrent state rows are not: every agent starts a new episode at its first act().
    pub fn from_session(mut session: Session, config: AgentsConfig) -> Self {
        let policy = session.policy().clone();
        let info = policy.info();
        let discrete = policy.head().is_discrete();
        let shape = Shape {
            obs_len: info.obs_len,
            action_len: info.action_len,
            mask_len: if discrete {
                policy.head().mask_len()
            } else {
                0
            },
            discrete,
            has_value: info.has_value,
        };
        session.set_max_envs(config.max_agents);
        Self::with(Box::new(session), shape, config)
    }

    /// The fastest of several ways to run the same policy (native backends, the sandbox) at `agents` agents:
    /// each candidate is built twice by its builder, once to be timed (a few ticks of `agents` agents on zero
    /// observations, median) and once to be returned fresh (no tick acted, no agent alive). Returns the chosen
    /// agents and what was measured: `(candidate index, backend, median µs per tick or the candidate's error)`.
    /// Candidates that fail to build or to act are skipped; if all fail, the first error is returned.
    #[allow(clippy::type_complexity)]
    pub fn auto(
        builders: &[&dyn Fn() -> Result<Agents, AgentsError>],
        agents: usize,
    ) -> Result<(Agents, Vec<(usize, String, Result<f64, AgentsError>)>), AgentsError> {
        let agents = agents.max(1);
        let mut measured = vec![];
        let mut best: Option<(usize, f64)> = None;
        let mut first_err = None;
        for (i, build) in builders.iter().enumerate() {
            let timed = build().and_then(|mut a| {
                let backend = a.backend();
                let ids = (0..agents)
                    .map(|_| a.spawn())
                    .collect::<Result<Vec<_>, _>>()?;
                let zeros = vec![0f32; a.obs_len()];
                let mut times = vec![];
                for _ in 0..5 {
                    let t0 = std::time::Instant::now();
                    for id in &ids {
                        a.observe(*id, &zeros)?;
                    }
                    a.act()?;
                    times.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                times.sort_by(f64::total_cmp);
                Ok((backend, times[times.len() / 2]))
            });
            match timed {
                Ok((backend, us)) => {
                    if best.is_none_or(|(_, b)| us < b) {
                        best = Some((i, us));
                    }
                    measured.push((i, backend, Ok(us)));
                }
                Err(e) => {
                    let text = e.to_string();
                    first_err.get_or_insert(e);
                    measured.push((i, "?".into(), Err(AgentsError::Unavailable(text))));
                }
            }
        }
        match best {
            Some((i, _)) => Ok((builders[i]()?, measured)),
            None => Err(first_err.unwrap_or(AgentsError::Unavailable("no candidate".into()))),
        }
    }

    fn with(session: Box<Session>, shape: Shape, config: AgentsConfig) -> Self {
        Agents {
            session,
            shape,
            config,
            slots: vec![],
            free: vec![],
            alive: 0,
            tick: 0,
            ids: vec![],
            env_ids: vec![],
            obs: vec![],
            starts: vec![],
            any_start: false,
            masks: vec![],
            masked: false,
            acted: vec![],
        }
    }

    /// The policy's backend's name: "cpu", "flex", "wgpu", "torch", "wasmtime" (the sandbox), ...
    pub fn backend(&self) -> String {
        self.session.policy().backend().name().to_string()
    }

    /// Observation numbers per agent.
    pub fn obs_len(&self) -> usize {
        self.shape.obs_len
    }

    /// Action numbers per agent.
    pub fn action_len(&self) -> usize {
        self.shape.action_len
    }

    /// Action-mask flags per agent (0: the policy's actions are continuous).
    pub fn mask_len(&self) -> usize {
        self.shape.mask_len
    }

    pub fn is_discrete(&self) -> bool {
        self.shape.discrete
    }

    /// Agents alive now.
    pub fn len(&self) -> usize {
        self.alive
    }

    pub fn is_empty(&self) -> bool {
        self.alive == 0
    }

    /// Ticks acted so far (the sampling step of the next act()).
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// Compute the agents' value estimates from the next act() on, or not ([`AgentsConfig::values`]).
    pub fn set_values(&mut self, values: bool) {
        self.config.values = values;
    }

    /// Whether act() asks for the agents' value estimates ([`AgentsConfig::values`]; a policy without a value has
    /// none either way: [`Agents::has_value`]).
    pub fn values(&self) -> bool {
        self.config.values
    }

    /// Whether the policy has a value estimate (a critic) at all.
    pub fn has_value(&self) -> bool {
        self.shape.has_value
    }

    /// Sampled (false, the default) or greedy / mean (true) actions from the next act() on.
    pub fn set_deterministic(&mut self, deterministic: bool) {
        self.config.deterministic = deterministic;
    }

    /// The threads each act() uses (1 in the sandbox).
    pub fn threads(&mut self) -> usize {
        self.session.threads()
    }

    /// Split each act() over `threads` threads by rows (the calling thread and `threads - 1` workers the policy's
    /// session owns; 0: one per core): [`policyport::Session::set_threads`], with its rules (the cpu backend only,
    /// small batches stay on the calling thread, the same actions whatever the count). A game's frame then waits
    /// for its share instead of the whole batch. The sandboxed plugin runs on the calling thread only:
    /// more than one is refused there ([`BackendError::Unsupported`](policyport::BackendError::Unsupported)).
    pub fn set_threads(&mut self, threads: usize) -> Result<(), AgentsError> {
        Ok(self.session.set_threads(threads)?)
    }

    /// How act() uses those threads ([`policyport::Session::set_thread_split`]): by default a tick's batch is
    /// split only while that measures faster than the calling thread alone (the game's own threads may take the
    /// cores); [`ThreadSplit::Always`](policyport::ThreadSplit::Always) splits every batch big enough.
    pub fn set_thread_split(&mut self, split: policyport::ThreadSplit) {
        self.session.set_thread_split(split);
    }

    /// A new agent: a free env id (a despawned agent's, else the next unused one); its first act() starts a new
    /// episode.
    pub fn spawn(&mut self) -> Result<AgentId, AgentsError> {
        if self.alive >= self.config.max_agents {
            return Err(AgentsError::TooManyAgents {
                max: self.config.max_agents,
            });
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s =
                    u32::try_from(self.slots.len()).map_err(|_| AgentsError::TooManyAgents {
                        max: self.config.max_agents,
                    })?;
                self.slots.push(Slot::default());
                s
            }
        };
        // A reused env id: a new occupant (despawn moved the generation on, so old ids stay dead), a new episode.
        let s = &mut self.slots[slot as usize];
        s.alive = true;
        s.start = true;
        s.rows = [0; 2];
        s.until = [0; 2];
        self.alive += 1;
        Ok(AgentId {
            slot,
            generation: s.generation,
        })
    }

    fn slot(&self, id: AgentId) -> Result<&Slot, AgentsError> {
        match self.slots.get(id.slot as usize) {
            Some(s) if s.alive && s.generation == id.generation => Ok(s),
            _ => Err(AgentsError::UnknownAgent(id)),
        }
    }

    /// Is `id` a live agent of these agents?
    pub fn contains(&self, id: AgentId) -> bool {
        self.slot(id).is_ok()
    }

    /// The agent is gone: its env id goes back to the free list (the next agent to get it starts a new episode).
    /// A row it had staged this tick is withdrawn.
    pub fn despawn(&mut self, id: AgentId) -> Result<(), AgentsError> {
        let staged = self.slot(id)?.staged(self.tick);
        if staged != 0 {
            self.unstage(staged as usize - 1);
        }
        let s = &mut self.slots[id.slot as usize];
        s.alive = false;
        s.start = false;
        s.rows = [0; 2];
        s.until = [0; 2];
        s.generation = s.generation.wrapping_add(1);
        self.free.push(id.slot);
        self.alive -= 1;
        Ok(())
    }

    /// The same agent starts a new episode at its next act() (its recurrent state is zeroed before that step).
    pub fn respawn(&mut self, id: AgentId) -> Result<(), AgentsError> {
        let staged = self.slot(id)?.staged(self.tick);
        self.slots[id.slot as usize].start = true;
        if staged != 0 {
            self.start_row(staged as usize - 1);
        }
        Ok(())
    }

    /// Stage `obs` (the policy's observation for this agent, [`Agents::obs_len`] numbers) for the next act().
    ///
    /// Inlined into the caller (an engine's per-agent loop): the checks and four pushes are a few dozen
    /// instructions; anything else (a refusal, a tick that already has masks) takes the general path.
    /// (`#[inline]` alone left it a call in the Bevy plugin's loop.)
    #[inline(always)]
    pub fn observe(&mut self, id: AgentId, obs: &[f32]) -> Result<(), AgentsError> {
        let (slot, o) = (id.slot as usize, self.shape.obs_len);
        match self.slots.get(slot) {
            Some(s) if s.takes(id, self.tick) && obs.len() == o && !self.masked => {
                let start = s.start;
                self.push_row(id, start, obs);
                let tick = self.tick;
                self.slots[slot].set_staged(tick, self.ids.len() as u32);
                Ok(())
            }
            _ => self.stage_general(id, obs),
        }
    }

    /// Stage one checked row (id, episode start, observation): both staging paths' common part.
    #[inline(always)]
    fn push_row(&mut self, id: AgentId, start: bool, obs: &[f32]) {
        if self.ids.is_empty() {
            self.tick_starts();
        }
        self.ids.push(id);
        if start || self.any_start {
            self.push_start(start);
        }
        append_observation(&mut self.obs, obs);
    }

    /// The just-staged last row's episode-start flag (the flags are written only once some row starts one).
    #[cold]
    #[inline(never)]
    fn push_start(&mut self, start: bool) {
        self.starts.resize(self.ids.len() - 1, false);
        self.starts.push(start);
        self.any_start = true;
    }

    /// Staged row `row` starts a new episode (a respawn after its observation).
    fn start_row(&mut self, row: usize) {
        if !self.any_start {
            self.starts.clear();
            self.starts.resize(self.ids.len(), false);
            self.any_start = true;
        }
        self.starts[row] = true;
    }

    /// The first observation of a tick: the policy's worker threads (if it has any) are woken now, so their
    /// wake-up overlaps with the rest of the tick's observations instead of delaying its act().
    #[cold]
    #[inline(never)]
    fn tick_starts(&mut self) {
        self.session.wake_threads();
    }

    /// `observe`'s general path, out of line so `observe` stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn stage_general(&mut self, id: AgentId, obs: &[f32]) -> Result<(), AgentsError> {
        self.stage(id, obs, None)
    }

    /// [`Agents::observe`] with an action mask: one flag per logit (per Q value), `false` forbidding the action.
    pub fn observe_masked(
        &mut self,
        id: AgentId,
        obs: &[f32],
        mask: &[bool],
    ) -> Result<(), AgentsError> {
        self.stage(id, obs, Some(mask))
    }

    fn stage(
        &mut self,
        id: AgentId,
        obs: &[f32],
        mask: Option<&[bool]>,
    ) -> Result<(), AgentsError> {
        let slot = *self.slot(id)?;
        if slot.staged(self.tick) != 0 {
            return Err(AgentsError::AlreadyObserved(id));
        }
        if obs.len() != self.shape.obs_len {
            return Err(AgentsError::ObservationLength {
                agent: id,
                expected: self.shape.obs_len,
                found: obs.len(),
            });
        }
        if let Some(m) = mask {
            if !self.shape.discrete {
                return Err(AgentsError::MaskOnContinuous { agent: id });
            }
            if m.len() != self.shape.mask_len {
                return Err(AgentsError::MaskLength {
                    agent: id,
                    expected: self.shape.mask_len,
                    found: m.len(),
                });
            }
        }
        self.push_row(id, slot.start, obs);
        // Mask flags are staged only once some row of the tick has a mask (the rows before it are then filled
        // all-allowed): an unmasked tick, the common case, writes no flag per agent.
        match mask {
            Some(m) => {
                if !self.masked {
                    self.masks.clear();
                    self.masks
                        .resize((self.ids.len() - 1) * self.shape.mask_len, true);
                    self.masked = true;
                }
                self.masks.extend_from_slice(m);
            }
            None if self.masked => self
                .masks
                .extend(std::iter::repeat_n(true, self.shape.mask_len)),
            None => {}
        }
        let tick = self.tick;
        self.slots[id.slot as usize].set_staged(tick, self.ids.len() as u32);
        Ok(())
    }

    /// Withdraw staged row `row` (the last row moves into its place).
    fn unstage(&mut self, row: usize) {
        let last = self.ids.len() - 1;
        let (o, m) = (self.shape.obs_len, self.shape.mask_len);
        self.ids.swap_remove(row);
        if self.any_start {
            self.starts.swap_remove(row);
        }
        if row != last {
            self.obs.copy_within(last * o..(last + 1) * o, row * o);
            if self.masked {
                self.masks.copy_within(last * m..(last + 1) * m, row * m);
            }
            let tick = self.tick;
            self.slots[self.ids[row].slot as usize].set_staged(tick, row as u32 + 1);
        }
        self.obs.truncate(last * o);
        if self.masked {
            self.masks.truncate(last * m);
        }
        if self.ids.is_empty() {
            self.masked = false;
            self.any_start = false;
            self.starts.clear();
        }
    }

    /// Withdraw `id`'s observation of this tick, if it has one (true if it had). The agent stays alive.
    pub fn unobserve(&mut self, id: AgentId) -> bool {
        match self.slot(id) {
            Ok(s) if s.staged(self.tick) != 0 => {
                let (tick, row) = (self.tick, s.staged(self.tick) as usize - 1);
                self.slots[id.slot as usize].set_staged(tick, 0);
                self.unstage(row);
                true
            }
            _ => false,
        }
    }

    /// Agents observed this tick (the next act()'s batch).
    pub fn staged(&self) -> usize {
        self.ids.len()
    }

    /// Withdraw every row staged this tick.
    pub fn clear_staged(&mut self) {
        for id in &self.ids {
            self.slots[id.slot as usize].set_staged(self.tick, 0);
        }
        self.ids.clear();
        self.obs.clear();
        self.starts.clear();
        self.any_start = false;
        self.masks.clear();
        self.masked = false;
    }

    /// One act() for every agent observed this tick (none observed: no call, an empty tick). Sampled from the
    /// stream (seed, env id, tick) unless deterministic; agents spawned or respawned since their last step start
    /// a new episode. On success the staging is cleared and the tick advances; a refused act() changes nothing.
    pub fn act(&mut self) -> Result<Tick<'_>, AgentsError> {
        self.act_on(None)
    }

    /// [`Agents::act`], on `obs` where given (the staged rows' observations, in their order, staged without them:
    /// [`Agents::tick_rows`]' whole ticks) rather than the staged copies.
    fn act_on(&mut self, obs: Option<&[f32]>) -> Result<Tick<'_>, AgentsError> {
        let batch = self.ids.len();
        if batch > 0 {
            let mode = if self.config.deterministic {
                ActMode::Deterministic
            } else {
                ActMode::Sample {
                    seed: self.config.seed,
                    step: self.tick,
                }
            };
            self.env_ids.clear();
            self.env_ids.extend(self.ids.iter().map(|id| id.slot));
            let obs = obs.unwrap_or(&self.obs);
            let mut req =
                Request::new(Observations::F32(obs), batch, mode).envs(EnvIds::List(&self.env_ids));
            if self.any_start {
                req = req.episode_starts(&self.starts);
            }
            if self.masked {
                req = req.action_mask(&self.masks);
            }
            if !self.config.values {
                req = req.skip_value();
            }
            self.session.act(&req)?;
        }
        // Committed: the staged agents' rows become the last act's rows as the tick advances (`Slot::rows`); the
        // episodes that started are under way.
        if self.any_start {
            for (id, _) in self.ids.iter().zip(&self.starts).filter(|(_, s)| **s) {
                self.slots[id.slot as usize].start = false;
            }
        }
        std::mem::swap(&mut self.acted, &mut self.ids);
        self.ids.clear();
        self.obs.clear();
        self.starts.clear();
        self.any_start = false;
        self.masks.clear();
        self.masked = false;
        if batch > 0 {
            self.tick += 1;
        } else {
            self.acted.clear();
        }
        Ok(self.last())
    }

    /// Stage many agents at once: row `i` of `obs` (and of `masks` when given) for `ids[i]`, as
    /// [`Agents::observe`] / [`Agents::observe_masked`] would one by one, in that order, at a fraction of their
    /// cost per agent where no row is unusual (one pass over the agents' slots, then the ids and observations
    /// appended as two copies). All or nothing: on a refusal the rows this call staged are withdrawn (rows
    /// staged before it stay) and the first refusal is returned.
    pub fn observe_rows(
        &mut self,
        ids: &[AgentId],
        obs: &[f32],
        masks: Option<&[bool]>,
    ) -> Result<(), AgentsError> {
        let (o, m) = (self.shape.obs_len, self.shape.mask_len);
        let mut staged = 0;
        let mut result = Ok(());
        if masks.is_none() && self.stage_rows(ids, obs, true) {
            staged = ids.len();
        }
        for (i, id) in ids.iter().enumerate().skip(staged) {
            let (Some(row), mask) = (
                obs.get(i * o..(i + 1) * o),
                masks.map(|ms| ms.get(i * m..(i + 1) * m)),
            ) else {
                result = Err(AgentsError::ObservationLength {
                    agent: *id,
                    expected: o,
                    found: obs.len().saturating_sub(i * o).min(o),
                });
                break;
            };
            let r = match mask {
                None => self.observe(*id, row),
                Some(Some(mask)) => self.observe_masked(*id, row, mask),
                Some(None) => Err(AgentsError::MaskLength {
                    agent: *id,
                    expected: m,
                    found: masks.map_or(0, |ms| ms.len().saturating_sub(i * m).min(m)),
                }),
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            staged += 1;
        }
        if result.is_ok() && obs.len() != ids.len() * o {
            result = Err(AgentsError::ObservationLength {
                agent: ids.last().copied().unwrap_or(AgentId::from_bits(u64::MAX)),
                expected: ids.len() * o,
                found: obs.len(),
            });
        }
        if let Err(e) = result {
            for id in &ids[..staged] {
                self.unobserve(*id);
            }
            return Err(e);
        }
        Ok(())
    }

    /// A whole tick in one call, for engines that gather their agents into arrays (the C ABI's `pp_agents_tick`,
    /// Godot's runner): stage `ids` (row `i` of `obs`, and of `masks` when given, for `ids[i]`), act once, and
    /// write each agent's outputs in the same order into `out`. Rows staged earlier act in the same call. On error
    /// the rows this call staged are withdrawn (nothing else changes) and `out` is left as it was.
    pub fn tick_rows(
        &mut self,
        ids: &[AgentId],
        obs: &[f32],
        masks: Option<&[bool]>,
        out: &mut RowOutputs,
    ) -> Result<(), AgentsError> {
        // Rows staged earlier in this tick come first: this call's rows are `base..base + ids.len()`.
        let base = self.ids.len();
        // The whole tick this call's, unmasked: its rows are staged without their observations and the act reads
        // the caller's where they are (NatureCNN frames at 1 000 agents are 113 MB: copying them into the
        // staging cost C# and Godot ~10 % over the act).
        let whole = base == 0 && masks.is_none() && self.stage_rows(ids, obs, false);
        if !whole {
            self.observe_rows(ids, obs, masks)?;
        }
        let acting = bench_timing::Mark::now();
        let acted = self.act_on(whole.then_some(obs)).map(|_| ());
        acting.add_to_act();
        if let Err(e) = acted {
            // Withdrawn: the whole tick at once (rows staged without observations cannot be unobserved one by
            // one), or this call's rows.
            match whole {
                true => self.clear_staged(),
                false => {
                    for id in ids {
                        self.unobserve(*id);
                    }
                }
            }
            return Err(e);
        }
        // act() acts on the staged rows in the order they were staged, so this call's outputs are one run of
        // rows, `base..base + ids.len()`, copied as slices (no lookup per id: it was ~5 ns of a Godot agent's
        // ~25). `acted` is checked to hold exactly these ids there; `out` is untouched unless it does.
        let (k, n) = (self.shape.action_len, ids.len());
        let o = self.session.outputs();
        let missing = || {
            AgentsError::UnknownAgent(ids.first().copied().unwrap_or(AgentId::from_bits(u64::MAX)))
        };
        if self.acted.get(base..base + n) != Some(ids) {
            return Err(missing());
        }
        let rows = |len: usize, per_row: usize| {
            if len == 0 {
                0..0
            } else {
                base * per_row..(base + n) * per_row
            }
        };
        let (discrete, continuous, value) = (
            o.discrete.get(rows(o.discrete.len(), k)),
            o.continuous.get(rows(o.continuous.len(), k)),
            o.value.get(rows(o.value.len(), 1)),
        );
        let (Some(discrete), Some(continuous), Some(value)) = (discrete, continuous, value) else {
            return Err(missing());
        };
        out.discrete.clear();
        out.discrete.extend_from_slice(discrete);
        out.continuous.clear();
        out.continuous.extend_from_slice(continuous);
        out.value.clear();
        out.value.extend_from_slice(value);
        Ok(())
    }

    /// [`Agents::tick_rows`]'s common case in bulk: unmasked rows (`obs` holds exactly `ids.len()` rows). True
    /// when every row was staged, in order; **false with nothing staged** where any row is not the common case
    /// (an agent not alive or already observed this tick, a tick with masks, `obs` of another length): the caller
    /// then stages row by row ([`Agents::observe`]) for the precise error.
    ///
    /// One pass checks each slot and marks its row; the ids and observations are then appended as two copies,
    /// and episode-start flags written only in a tick where some row starts one. Per agent that is a slot read
    /// and write instead of [`Agents::observe`]'s pushes (which store each Vec's length at every row: ~8 ns of a
    /// 100-agent Godot tick's agent, measured with perf).
    ///
    /// `copy_obs` false: the observations are not copied (the caller acts on them where they are:
    /// [`Agents::act_on`]); the staged rows then have no observations of their own until that act.
    fn stage_rows(&mut self, ids: &[AgentId], obs: &[f32], copy_obs: bool) -> bool {
        let base = self.ids.len();
        if self.masked
            || obs.len() != ids.len() * self.shape.obs_len
            || base + ids.len() >= u32::MAX as usize
        {
            return false;
        }
        let tick = self.tick;
        let (mut marked, mut any_start) = (0, false);
        for id in ids {
            match self.slots.get_mut(id.slot as usize) {
                Some(s) if s.takes(*id, tick) => {
                    any_start |= s.start;
                    marked += 1;
                    s.set_staged(tick, (base + marked) as u32);
                }
                _ => break,
            }
        }
        if marked < ids.len() {
            // Unmarked again (every slot marked here was unstaged before: the check above), nothing else done.
            for id in &ids[..marked] {
                self.slots[id.slot as usize].set_staged(tick, 0);
            }
            return false;
        }
        if base == 0 && !ids.is_empty() {
            self.tick_starts();
        }
        self.ids.extend_from_slice(ids);
        if copy_obs {
            self.obs.extend_from_slice(obs);
        }
        if any_start || self.any_start {
            if !self.any_start {
                self.starts.clear();
                self.starts.resize(base, false);
                self.any_start = true;
            }
            let slots = &self.slots;
            self.starts
                .extend(ids.iter().map(|id| slots[id.slot as usize].start));
        }
        true
    }

    /// The outputs of the last act() (empty before the first, or after a tick with no agent observed).
    pub fn last(&self) -> Tick<'_> {
        Tick {
            agents: self,
            out: self.session.outputs(),
        }
    }
}

/// [`Agents::tick_rows`]'s outputs, in the order of the ids it was given (buffers reused across ticks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowOutputs {
    /// `ids × action_len` discrete actions (empty for continuous policies).
    pub discrete: Vec<i64>,
    /// `ids × action_len` continuous actions (empty for discrete policies).
    pub continuous: Vec<f32>,
    /// One value per id (empty without a value head).
    pub value: Vec<f32>,
}

/// What one act() answered, viewed by agent id.
pub struct Tick<'a> {
    agents: &'a Agents,
    out: &'a ActOutputs,
}

impl<'a> Tick<'a> {
    /// The agents that acted, in row order.
    pub fn agents(&self) -> &'a [AgentId] {
        &self.agents.acted
    }

    /// How many agents acted.
    pub fn len(&self) -> usize {
        self.agents.acted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.acted.is_empty()
    }

    /// The row of `id` in this tick's outputs, if it acted in it.
    pub fn row(&self, id: AgentId) -> Option<usize> {
        let s = self.agents.slot(id).ok()?;
        // The last act() ended tick `tick - 1` (none yet at 0; an act with no agents clears `acted`).
        let row = s.staged(self.agents.tick.checked_sub(1)?);
        (row != 0 && !self.agents.acted.is_empty())
            .then(|| row as usize - 1)
            .filter(|r| self.agents.acted.get(*r) == Some(&id))
    }

    /// A discrete policy's actions for `id` ([`Agents::action_len`] of them), if it acted this tick.
    pub fn discrete(&self, id: AgentId) -> Option<&'a [i64]> {
        let n = self.agents.shape.action_len;
        let r = self.row(id)?;
        self.agents
            .shape
            .discrete
            .then(|| &self.out.discrete[r * n..(r + 1) * n])
    }

    /// A continuous policy's action for `id`, if it acted this tick.
    pub fn continuous(&self, id: AgentId) -> Option<&'a [f32]> {
        let n = self.agents.shape.action_len;
        let r = self.row(id)?;
        (!self.agents.shape.discrete).then(|| &self.out.continuous[r * n..(r + 1) * n])
    }

    /// The value estimate for `id`, if the policy has one, the tick computed values ([`AgentsConfig::values`])
    /// and `id` acted this tick.
    pub fn value(&self, id: AgentId) -> Option<f32> {
        let r = self.row(id)?;
        self.out.value.get(r).copied()
    }

    /// Every output of this tick, by row ([`Tick::agents`] gives each row's agent).
    pub fn outputs(&self) -> &'a ActOutputs {
        self.out
    }
}
