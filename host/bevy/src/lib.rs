//! policyport in Bevy: agents are entities, and each policy acts once per tick for all of its agents.
//!
//! ```text
//! app.add_plugins(PolicyportPlugin::default());                       // the Act system, in FixedUpdate
//! let cartpole = app.world_mut().resource_mut::<Policies>().add(agents); // a policyport_agents::Agents
//! commands.spawn((Agent::new(cartpole), Observation::default(), MyCart::default()));
//! ```
//!
//! Per tick, in the schedule the plugin was given (`FixedUpdate` unless told otherwise), three system sets run in
//! order: [`PolicyportSet::Observe`] (the game's systems write each agent's [`Observation`], and optionally an
//! [`ActionMask`]), [`PolicyportSet::Act`] (this plugin: every agent with an observation is staged with its own
//! policy, then each policy runs one batched act()), [`PolicyportSet::Apply`] (the game reads each agent's
//! [`Action`]). Nothing depends on query order: agents are keyed by stable ids (`policyport_agents::AgentId`), a
//! new entity gets a new id (and a new episode, even on a reused env id), a despawned entity's id dies with it,
//! and [`Agent::episode_start`] set by the game (a respawn) starts a new episode for the same entity.
//!
//! Errors (a policy refusing a tick: a wrong observation length, a non-finite observation) never panic: the
//! tick's [`PolicyportErrors`] resource lists them, and that policy's agents keep their last actions.

pub mod cartpole;

use bevy_app::{App, FixedUpdate, Plugin};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{InternedScheduleLabel, ScheduleLabel};
use policyport_agents::{AgentId, Agents, AgentsError};

/// Which policy of [`Policies`] an agent acts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyHandle(u32);

/// `T` reachable through `&mut` only, hence `Sync` for any `Send` `T` (what std's unstable `Exclusive` and Bevy's
/// `SyncCell` are): a resource must be `Sync`, and an `Agents` (a session's scratch, a wasmtime store) is not,
/// but the Act system only ever holds `ResMut<Policies>`. Why not a `Mutex`: the staging pass reaches a policy per
/// agent, and a lock (or its poison check) per agent, or a `Vec` of the unlocked policies per tick, is a cost a
/// 100-agent tick shows.
struct Exclusive<T>(T);

// SAFETY: `Exclusive` gives access to its `T` only through `&mut self` (`Exclusive::get`): a shared reference to
// one, on any number of threads, reaches nothing, so sharing it cannot race; sending it moves the `T` (`T: Send`).
unsafe impl<T: Send> Sync for Exclusive<T> {}

impl<T> Exclusive<T> {
    fn get(&mut self) -> &mut T {
        &mut self.0
    }
}

/// The policies agents act with (each a `policyport_agents::Agents`: native, any backend, or sandboxed).
#[derive(Resource, Default)]
pub struct Policies {
    agents: Vec<Exclusive<Agents>>,
}

impl Policies {
    /// Add a policy's agents; entities name it by the returned handle.
    pub fn add(&mut self, agents: Agents) -> PolicyHandle {
        // A u32 handle keeps an `Agent` at 32 bytes (two to a cache line: the staging and action passes read one
        // per entity). 2^32 - 1 policies cannot be reached (each is a session with its buffers); were they, the
        // handle returned would name no policy, and its agents would get `AgentsError::Unavailable`.
        match u32::try_from(self.agents.len()) {
            Ok(index) if index < u32::MAX => {
                self.agents.push(Exclusive(agents));
                PolicyHandle(index)
            }
            _ => PolicyHandle(u32::MAX),
        }
    }

    /// The policy's agents (e.g. to switch deterministic acting, read its tick or its backend).
    pub fn get_mut(&mut self, policy: PolicyHandle) -> Option<&mut Agents> {
        self.agents.get_mut(policy.0 as usize).map(Exclusive::get)
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// The policy `p` (the staging pass reaches one per agent).
    #[inline(always)]
    fn nth(&mut self, p: usize) -> Option<&mut Agents> {
        self.agents.get_mut(p).map(Exclusive::get)
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

/// An entity that acts through a policy.
#[derive(Component, Debug)]
#[require(Action)]
pub struct Agent {
    pub policy: PolicyHandle,
    /// Set by the game when this entity starts a new episode (a respawn): its recurrent state is zeroed before
    /// its next step. Cleared by the Act system.
    pub episode_start: bool,
    id: Option<AgentId>,
    /// The policy `id` belongs to (a game may move the entity to another policy).
    registered: Option<PolicyHandle>,
    /// Its row + 1 in its policy's tick, written by this tick's staging pass for every agent it visits (0: not
    /// staged) and read back by the action pass: kept on the entity, the action pass needs no pairing of two
    /// queries' orders and no check of who acted in that row.
    row: u32,
}

impl Agent {
    pub fn new(policy: PolicyHandle) -> Self {
        Agent {
            policy,
            episode_start: false,
            id: None,
            registered: None,
            row: 0,
        }
    }

    /// The agent's id in its policy's agents (after its first tick).
    pub fn id(&self) -> Option<AgentId> {
        self.id
    }
}

/// A clone is a new agent: it keeps the policy and the episode-start flag, not the id, which stays the original
/// entity's (two entities staging one id would have the policy refuse the tick for all of its agents). Bevy's
/// entity cloning (`clone_and_spawn`, a scene's prefab) goes through this; the clone gets its own id, and a new
/// episode, at its first tick.
impl Clone for Agent {
    fn clone(&self) -> Self {
        Agent {
            episode_start: self.episode_start,
            ..Agent::new(self.policy)
        }
    }
}

/// This tick's observation of an agent (the policy's observation length). An agent whose observation is empty
/// sits the tick out (its [`Action`] keeps the last one).
#[derive(Component, Debug, Clone, Default)]
pub struct Observation(pub Vec<f32>);

/// This tick's action mask of an agent: one flag per logit (per Q value), `false` forbidding the action.
#[derive(Component, Debug, Clone, Default)]
pub struct ActionMask(pub Vec<bool>);

/// What the policy answered for an agent at its last tick.
#[derive(Component, Debug, Clone, Default, PartialEq)]
pub struct Action {
    /// Discrete actions (empty for continuous policies).
    pub discrete: Vec<i64>,
    /// Continuous actions (empty for discrete policies).
    pub continuous: Vec<f32>,
    pub value: Option<f32>,
    /// The tick (the policy's step count) this action was computed at.
    pub tick: u64,
}

/// The order of a policyport tick: the game observes, the plugin acts, the game applies.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyportSet {
    Observe,
    Act,
    Apply,
}

/// What the last tick's act() refused, per policy (empty when every policy acted). For Bevy's change detection
/// (`resource_changed::<PolicyportErrors>`, `Res::is_changed`) it changes on a tick that has errors and on the
/// first clean tick after one, not on other clean ticks. An agent whose id the game released itself (through
/// [`Policies::get_mut`] and `Agents::despawn`) while its entity lives makes its policy's tick an
/// `UnknownAgent` entry once; the plugin then forgets that id, and the agent acts again from the next tick under a
/// new id (a new episode).
#[derive(Resource, Debug, Default)]
pub struct PolicyportErrors(pub Vec<(PolicyHandle, AgentsError)>);

/// Entities that were agents, with their ids (so a despawned entity's id is released).
#[derive(Resource, Default)]
struct Registered(std::collections::HashMap<Entity, (PolicyHandle, AgentId)>);

impl Registered {
    /// Forget `e`'s registration and despawn its agent, if it had one.
    fn release(&mut self, e: Entity, policies: &mut Policies) {
        if let Some((policy, id)) = self.0.remove(&e) {
            if let Some(a) = policies.get_mut(policy) {
                let _ = a.despawn(id);
            }
        }
    }
}

/// Adds [`Policies`], [`PolicyportErrors`] and the Act system to `schedule` (default `FixedUpdate`), ordered
/// Observe -> Act -> Apply.
pub struct PolicyportPlugin {
    pub schedule: InternedScheduleLabel,
}

impl Default for PolicyportPlugin {
    fn default() -> Self {
        PolicyportPlugin {
            schedule: FixedUpdate.intern(),
        }
    }
}

impl PolicyportPlugin {
    /// The plugin in another schedule (e.g. `Update`, or a game's own).
    pub fn in_schedule(schedule: impl ScheduleLabel) -> Self {
        PolicyportPlugin {
            schedule: schedule.intern(),
        }
    }
}

impl Plugin for PolicyportPlugin {
    fn build(&self, app: &mut App) {
        app.init_resource::<Policies>()
            .init_resource::<PolicyportErrors>()
            .init_resource::<Registered>()
            .configure_sets(
                self.schedule,
                (
                    PolicyportSet::Observe,
                    PolicyportSet::Act,
                    PolicyportSet::Apply,
                )
                    .chain(),
            )
            .add_systems(self.schedule, act_system.in_set(PolicyportSet::Act));
    }
}

/// What the staging pass reads of an agent (and the row it writes back, without Bevy's change mark; a respawned
/// agent's flag is cleared after the pass).
type StagingRow<'a> = (
    Entity,
    &'a mut Agent,
    &'a Observation,
    Option<&'a ActionMask>,
);

/// A new agent (or one that changed policy) being registered.
type FreshRow<'a> = (&'a mut Agent, &'a Observation, Option<&'a ActionMask>);

/// What the action pass writes: entities the staging pass visited this tick (hence `With<Observation>` where it
/// is used), each with the row it was given.
type ActionRow<'a> = (&'a Agent, &'a mut Action);

/// One registered agent to stage this tick.
#[derive(Clone, Copy)]
struct Staging<'a> {
    policy: PolicyHandle,
    id: AgentId,
    /// Its `Agent::episode_start` (a respawn the game asked for).
    episode_start: bool,
    obs: &'a Observation,
    mask: Option<&'a ActionMask>,
}

/// Stage one registered agent's observation (and mask) with its policy `a` — the general path: a respawn, a
/// mask, a policy that refused this tick, an observation `Agents` refuses (the common case is the Act system's
/// inline `Agents::observe`). A refusal withdraws that policy's rows for this tick and records the error; a
/// respawn is done unless the policy already refused this tick (then the agent's flag stays set for the next).
/// Returns the agent's row in its policy's tick + 1 (0: not staged; an empty observation sits the tick out).
#[inline(never)]
fn stage(
    a: &mut Agents,
    s: Staging<'_>,
    failed: &mut Vec<PolicyHandle>,
    errors: &mut Vec<(PolicyHandle, AgentsError)>,
) -> u32 {
    let Staging {
        policy,
        id,
        episode_start,
        obs,
        mask,
    } = s;
    if obs.0.is_empty() || failed.contains(&policy) {
        return 0;
    }
    if episode_start {
        let _ = a.respawn(id);
    }
    let staged = match mask {
        Some(m) if !m.0.is_empty() => a.observe_masked(id, &obs.0, &m.0),
        _ => a.observe(id, &obs.0),
    };
    match staged {
        Ok(()) => a.staged() as u32,
        Err(err) => {
            refuse_tick(a, policy, err, failed, errors);
            0
        }
    }
}

/// `policy` (its agents `a`) refused this tick: its staged rows are withdrawn, the policy is out of the tick
/// (`failed`) and the error recorded; its agents keep their last actions. Out of line: never the common case.
#[cold]
#[inline(never)]
fn refuse_tick(
    a: &mut Agents,
    policy: PolicyHandle,
    err: AgentsError,
    failed: &mut Vec<PolicyHandle>,
    errors: &mut Vec<(PolicyHandle, AgentsError)>,
) {
    a.clear_staged();
    failed.push(policy);
    errors.push((policy, err));
}

/// Every agent whose id its policy no longer holds loses it (and its entry in `registered`), so the next staging
/// pass registers it as a new agent. Only after a tick that met such an id: a pass over every agent with an
/// observation (one without is never staged, so its stale id refuses nothing until it has one: then this pass
/// meets it), through the act system's query of new agents.
#[cold]
#[inline(never)]
fn forget_released_ids(
    policies: &mut Policies,
    registered: &mut Registered,
    mut agents: Query<FreshRow<'_>>,
) {
    let mut holds =
        |p: PolicyHandle, id: AgentId| policies.get_mut(p).is_some_and(|a| a.contains(id));
    registered.0.retain(|_, (p, id)| holds(*p, *id));
    for (mut agent, _, _) in agents.iter_mut() {
        if let (Some(id), Some(p)) = (agent.id, agent.registered)
            && !holds(p, id)
        {
            agent.id = None;
            agent.registered = None;
        }
    }
}

/// A policy's last tick, its slices taken out once (the action pass reads them per agent).
struct TickRows<'a> {
    discrete: &'a [i64],
    continuous: &'a [f32],
    value: &'a [f32],
    /// Action numbers per agent.
    k: usize,
    /// One discrete action per agent and no values: an [`Action`] that holds one discrete action already (and
    /// so no continuous ones) and no value takes the action and the tick alone.
    one_discrete: bool,
    now: u64,
}

impl<'a> TickRows<'a> {
    /// Write row `r` into `action`: any shape.
    #[inline(never)]
    fn write(&self, r: usize, action: &mut Action) {
        let k = self.k;
        write_row(
            &mut action.discrete,
            self.discrete.get(r * k..(r + 1) * k).unwrap_or_default(),
        );
        write_row(
            &mut action.continuous,
            self.continuous.get(r * k..(r + 1) * k).unwrap_or_default(),
        );
        action.value = self.value.get(r).copied();
        action.tick = self.now;
    }

    fn of(a: &'a Agents) -> Self {
        let tick = a.last();
        let out = tick.outputs();
        TickRows {
            discrete: &out.discrete,
            continuous: &out.continuous,
            value: &out.value,
            k: a.action_len(),
            one_discrete: a.action_len() == 1 && !out.discrete.is_empty() && out.value.is_empty(),
            now: a.tick(),
        }
    }
}

/// What the staging pass's out-of-line paths reach: the policies, the run's buffers (see [`Run`]) and the lists
/// the general path writes.
struct StagingPass<'s> {
    policies: &'s mut Policies,
    run_ids: &'s mut Vec<AgentId>,
    run_obs: &'s mut Vec<f32>,
    failed: &'s mut Vec<PolicyHandle>,
    errors: &'s mut Vec<(PolicyHandle, AgentsError)>,
    fresh: &'s mut Vec<Entity>,
    respawned: &'s mut Vec<Entity>,
}

/// The agent's id when it is staged by the common path: registered with its policy, no respawn asked for.
#[inline(always)]
fn fast_id(agent: &Agent) -> Option<AgentId> {
    match (
        agent.id,
        agent.registered == Some(agent.policy),
        agent.episode_start,
    ) {
        (Some(id), true, false) => Some(id),
        _ => None,
    }
}

/// The staging pass for any agent: a new one (or one that changed policy) is set aside
/// to be registered after the pass, a respawn is noted, and a registered one is staged with its policy. Returns
/// its row + 1 (0: not staged now).
fn stage_any(
    pass: &mut StagingPass<'_>,
    (e, agent, obs, mask): (Entity, &Agent, &Observation, Option<&ActionMask>),
) -> u32 {
    let StagingPass {
        policies,
        failed,
        errors,
        fresh,
        respawned,
        ..
    } = pass;
    let policy = agent.policy;
    let Some(id) = agent.id.filter(|_| agent.registered == Some(policy)) else {
        fresh.push(e);
        return 0;
    };
    let Some(a) = policies.nth(policy.0 as usize) else {
        return 0;
    };
    let start = agent.episode_start;
    if start && !obs.0.is_empty() && !failed.contains(&policy) {
        respawned.push(e);
    }
    let staging = Staging {
        policy,
        id,
        episode_start: start,
        obs,
        mask,
    };
    stage(a, staging, failed, errors)
}

/// Write one agent's [`Action`] from its row of its policy's tick (`Agent::row`, given by this tick's staging
/// pass; 0: it did not act). Small enough to inline into the query's per-table loop: anything unusual is out of
/// line.
#[inline(always)]
fn write_action(agent: &Agent, action: Mut<'_, Action>, ticks: &[Option<TickRows<'_>>]) {
    let Some(r) = (agent.row as usize).checked_sub(1) else {
        return;
    };
    let Some(Some(t)) = ticks.get(agent.policy.0 as usize) else {
        return;
    };
    let action = action.into_inner();
    // The common shape (one discrete action, no value asked for, the entity's Action already of that shape)
    // stores two numbers.
    if let (true, [d], Some(&a), true, None) = (
        t.one_discrete,
        action.discrete.as_mut_slice(),
        t.discrete.get(r),
        action.continuous.is_empty(),
        action.value,
    ) {
        *d = a;
        action.tick = t.now;
        return;
    }
    t.write(r, action);
}

/// Policy `p`'s last tick for the action pass, unless its act failed this tick.
fn tick_of<'a>(
    failed: &[PolicyHandle],
    (p, a): (usize, &'a mut Exclusive<Agents>),
) -> Option<TickRows<'a>> {
    (!failed.contains(&PolicyHandle(p as u32))).then(|| TickRows::of(a.get()))
}

/// Observation lengths up to which the staging pass gathers agents (see [`Run`]): a longer observation is staged at
/// once, agent by agent, as its copy is then the cost and gathering would copy it twice.
const GATHER_MAX_OBS: usize = 64;

/// A run of common-case agents of one policy (one `Agents`) in the staging pass, gathered (their ids and
/// observations written into the Act system's buffers, each given its row now: `base` + its place) and staged in
/// one `Agents::observe_rows` call when the run ends (another policy's agent, an agent for the general path, the
/// end of the pass). Why: one `Agents::observe` per agent reaches the policy through `Policies` and does four
/// pushes, ~6.5 ns per agent at 1 000 CartPole agents; gathered, ~5 ns (a pass over the slots, two copies).
///
/// A plain value the staging loop holds in registers, and the buffers written by index (kept across ticks, grown
/// only on the out-of-line path). Why: gathered by `Vec::push`, each agent's push loaded the length the last
/// agent's push had just stored (store-to-load forwarding, a chain through memory from agent to agent, in two
/// Vecs): the instruction after the id's store held a third of the loop's `perf` samples. Written by index, the
/// staging pass went from 5.2 to 3.9 ns per agent at 1 000 CartPole agents (Zen 5, 2026-12-07).
#[derive(Clone, Copy)]
struct Run {
    /// The run's policy; [`Run::NONE`] (no policy's) when no run is being gathered.
    policy: PolicyHandle,
    /// Rows the policy had staged when the run began: the run's agents take the rows after them.
    base: usize,
    /// The policy's observation length (`usize::MAX` for none: no observation matches it).
    obs_len: usize,
    /// Agents gathered so far (the buffers' rows in use).
    n: usize,
}

impl Run {
    const NONE: Run = Run {
        policy: PolicyHandle(u32::MAX),
        base: 0,
        obs_len: usize::MAX,
        n: 0,
    };
}

/// `dst = src` for slices of one length: a CartPole-sized observation (the lengths of Gymnasium's classic-control
/// and Box2D tasks) moved as a fixed-size array, a few register moves, rather than by a `memcpy` call for a length
/// known only at run time.
#[inline(always)]
fn copy_observation(dst: &mut [f32], src: &[f32]) {
    fn fixed<const N: usize>(dst: &mut [f32], src: &[f32]) {
        match (<&mut [f32; N]>::try_from(dst), <&[f32; N]>::try_from(src)) {
            (Ok(d), Ok(s)) => *d = *s,
            (Err(_), _) | (_, Err(_)) => {}
        }
    }
    match src.len() {
        1 => fixed::<1>(dst, src),
        2 => fixed::<2>(dst, src),
        3 => fixed::<3>(dst, src),
        4 => fixed::<4>(dst, src),
        6 => fixed::<6>(dst, src),
        8 => fixed::<8>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

impl StagingPass<'_> {
    /// The staging pass for an agent the loop's common case did not take: a common-case agent of another policy
    /// than the run's (or the first of the pass) begins a new run (its policy's observations short enough, see
    /// [`GATHER_MAX_OBS`]; longer ones are staged at once), one of the run's policy is gathered after the buffers
    /// grow; everything else (a new agent or one that changed policy, a respawn, a mask, a policy that refused
    /// this tick, an observation `Agents` refuses) ends the run and takes the general path ([`stage_any`]), after
    /// the gathered rows (they hold the rows below it). Returns the run now and the agent's row + 1 (0: not
    /// staged now). The run in and out by value: the loop keeps it in registers.
    #[inline(never)]
    fn stage_other(
        &mut self,
        mut run: Run,
        (e, agent, obs, mask): (Entity, &Agent, &Observation, Option<&ActionMask>),
    ) -> (Run, u32) {
        let policy = agent.policy;
        if let (Some(id), None, true) = (fast_id(agent), mask, self.failed.is_empty()) {
            if run.policy != policy {
                self.end_run(run);
                run = Run::NONE;
                match self.policies.nth(policy.0 as usize) {
                    Some(a) if a.obs_len() <= GATHER_MAX_OBS => {
                        run = Run {
                            policy,
                            base: a.staged(),
                            obs_len: a.obs_len(),
                            n: 0,
                        };
                    }
                    // A long observation: staged at once (see `GATHER_MAX_OBS`).
                    #[allow(clippy::collapsible_match)]
                    Some(a) => {
                        if a.observe(id, &obs.0).is_ok() {
                            return (run, a.staged() as u32);
                        }
                    }
                    None => {}
                }
            }
            if run.policy == policy && obs.0.len() == run.obs_len {
                let (n, o) = (run.n, run.obs_len);
                if self.run_ids.len() <= n {
                    let rows = (2 * n).max(64);
                    self.run_ids.resize(rows, AgentId::from_bits(0));
                }
                if self.run_obs.len() < (n + 1) * o {
                    self.run_obs.resize(self.run_ids.len() * o, 0.0);
                }
                self.run_ids[n] = id;
                copy_observation(&mut self.run_obs[n * o..(n + 1) * o], &obs.0);
                run.n = n + 1;
                return (run, (run.base + n + 1) as u32);
            }
        }
        self.end_run(run);
        (Run::NONE, stage_any(self, (e, agent, obs, mask)))
    }

    /// Stage the run's gathered agents (nothing to do without a run or with an empty one). Refused (an id the
    /// game released or staged itself through `Policies`), the policy's tick is, as for any agent's refusal.
    #[inline(never)]
    fn end_run(&mut self, run: Run) {
        let (n, o) = (run.n, run.obs_len);
        if n > 0
            && let (Some(ids), Some(obs)) = (self.run_ids.get(..n), self.run_obs.get(..n * o))
            && let Some(a) = self.policies.nth(run.policy.0 as usize)
            && let Err(err) = a.observe_rows(ids, obs, None)
        {
            refuse_tick(a, run.policy, err, self.failed, self.errors);
        }
    }
}

/// Policies whose ticks the action pass holds on the stack; more go to a per-tick Vec.
const INLINE_POLICIES: usize = 4;

/// The Act system's per-tick lists, kept across ticks so a tick allocates nothing once they have grown.
#[derive(Default)]
struct ActScratch {
    failed: Vec<PolicyHandle>,
    /// New agents (and agents that changed policy).
    fresh: Vec<Entity>,
    /// Agents whose episode start was taken this tick (their `Agent::episode_start` is cleared after staging).
    respawned: Vec<Entity>,
    /// The staging pass's gathered run (see [`Run`]): its agents and observations, written by index (rows past
    /// a run's end hold earlier ticks' values).
    run_ids: Vec<AgentId>,
    run_obs: Vec<f32>,
}

/// `dst = src`, reusing `dst`'s buffer (a policy's action is one or a few numbers: no `memcpy` call for one).
#[inline]
fn write_row<T: Copy>(dst: &mut Vec<T>, src: &[T]) {
    match (dst.as_mut_slice(), src) {
        ([], []) => {}
        ([d], [s]) => *d = *s,
        (d, s) if d.len() == s.len() => d.copy_from_slice(s),
        _ => {
            dst.clear();
            dst.extend_from_slice(src);
        }
    }
}

/// The Act set's system: release despawned agents, register new ones (in entity index order: ids never depend
/// on query order), stage every observed agent with its policy, act once per policy, write each agent's [`Action`].
fn act_system(
    mut policies: ResMut<Policies>,
    mut errors: ResMut<PolicyportErrors>,
    mut registered: ResMut<Registered>,
    mut removed: RemovedComponents<Agent>,
    mut scratch: Local<ActScratch>,
    mut queries: ParamSet<(
        Query<StagingRow<'_>>,
        Query<ActionRow<'_>, With<Observation>>,
        Query<FreshRow<'_>>,
    )>,
) {
    // The errors are written without Bevy's change mark (any `DerefMut`, a `clear()` of an empty list too, set
    // it: a game's `resource_changed::<PolicyportErrors>` fired every tick), which is set at the end only where
    // this tick's list differs from the last one's in being empty or not, or holds errors.
    let start = bench_timing::Mark::now();
    let had_errors = !errors.0.is_empty();
    let errors_mark = &mut errors;
    let errors = errors_mark.bypass_change_detection();
    errors.0.clear();
    for e in removed.read() {
        registered.release(e, &mut policies);
    }
    let ActScratch {
        failed,
        fresh,
        respawned,
        run_ids,
        run_obs,
    } = &mut *scratch;
    failed.clear();
    fresh.clear();
    respawned.clear();
    // One pass stages every registered agent with an observation, noting each agent's row (so the action pass
    // below needs no lookup by id), and sets the new ones (and agents whose policy changed: the component
    // remembers its registration, so no map lookup per agent per tick) aside; those are registered in
    // entity-index order after it, then staged.
    {
        let mut pass = StagingPass {
            policies: &mut policies,
            run_ids,
            run_obs,
            failed,
            errors: &mut errors.0,
            fresh,
            respawned,
        };
        // A `for` loop, not `for_each`: Bevy's `QueryIter::fold` calls its closure per entity out of line (the
        // registers saved and the captures reloaded each call). The common case (a registered agent of the run's
        // policy, no respawn, no mask, an observation of the policy's length, room in the buffers) is written here
        // by index, the run held in registers; all else is one call (`StagingPass::stage_other`).
        let mut run = Run::NONE;
        for (e, mut agent_mut, obs, mask) in queries.p0().iter_mut() {
            // No change mark: the row is the plugin's own bookkeeping, not a change a game's `Changed<Agent>`
            // should see every tick.
            let agent = agent_mut.bypass_change_detection();
            let (n, o) = (run.n, run.obs_len);
            if let (Some(id), None) = (fast_id(agent), mask)
                && agent.policy == run.policy
                && obs.0.len() == o
                && let Some(id_slot) = pass.run_ids.get_mut(n)
                && let Some(obs_rows) = pass.run_obs.get_mut(n * o..(n + 1) * o)
            {
                *id_slot = id;
                copy_observation(obs_rows, &obs.0);
                run.n = n + 1;
                agent.row = (run.base + n + 1) as u32;
                continue;
            }
            let row;
            (run, row) = pass.stage_other(run, (e, agent, obs, mask));
            agent.row = row;
        }
        pass.end_run(run);
    }
    let staged = bench_timing::Mark::now();
    // An id its policy no longer holds (the game released it through `Policies` — `Agents::despawn` — while the
    // entity lives) is refused by the staging as `UnknownAgent`, and would refuse its policy's every tick: such
    // agents are forgotten now (in this tick: a game may clear `PolicyportErrors` between ticks), and the next
    // tick registers them afresh (a new id: a new episode).
    if errors
        .0
        .iter()
        .any(|(_, e)| matches!(e, AgentsError::UnknownAgent(_)))
    {
        forget_released_ids(&mut policies, &mut registered, queries.p2());
    }
    for &e in respawned.iter() {
        if let Ok((mut agent, _, _)) = queries.p2().get_mut(e) {
            agent.episode_start = false;
        }
    }
    // By index (Entity's own Ord compares its bit pattern, whose index part is stored inverted: newest first).
    fresh.sort_unstable_by_key(|e| (e.index_u32(), e.generation().to_bits()));
    for &e in fresh.iter() {
        let mut q = queries.p2();
        let Ok((mut agent, obs, mask)) = q.get_mut(e) else {
            continue;
        };
        registered.release(e, &mut policies);
        let policy = agent.policy;
        let spawned = match policies.get_mut(policy) {
            Some(a) => a.spawn(),
            None => Err(AgentsError::Unavailable(format!(
                "no policy {} in Policies ({} added)",
                policy.0,
                policies.len()
            ))),
        };
        match spawned {
            Ok(id) => {
                agent.id = Some(id);
                agent.registered = Some(policy);
                registered.0.insert(e, (policy, id));
                let start = std::mem::take(&mut agent.episode_start);
                if let Some(a) = policies.get_mut(policy) {
                    let staging = Staging {
                        policy,
                        id,
                        episode_start: start,
                        obs,
                        mask,
                    };
                    agent.row = stage(a, staging, failed, &mut errors.0);
                }
            }
            Err(err) => {
                agent.id = None;
                agent.registered = None;
                errors.0.push((policy, err));
            }
        }
    }
    let acting = bench_timing::Mark::now();
    // Act, per policy.
    for p in 0..policies.len() {
        let handle = PolicyHandle(p as u32);
        if failed.contains(&handle) {
            continue;
        }
        let a = policies.get_mut(handle).expect("in range");
        if a.staged() == 0 {
            continue;
        }
        if let Err(err) = a.act() {
            refuse_tick(a, handle, err, failed, &mut errors.0);
        }
    }
    let acted = bench_timing::Mark::now();
    // Write actions: each policy's tick looked up once (not per agent); each agent's row is the one this tick's
    // staging pass wrote on it (every entity here was visited by that pass: `With<Observation>`).
    // Up to INLINE_POLICIES on the stack (a game's usual few policies): no heap allocation per tick.
    let (mut inline, heap): ([Option<TickRows<'_>>; INLINE_POLICIES], Vec<_>);
    let ticks: &[Option<TickRows<'_>>] = if policies.len() <= INLINE_POLICIES {
        inline = [const { None }; INLINE_POLICIES];
        let n = policies.len();
        for (slot, pa) in inline
            .iter_mut()
            .zip(policies.agents.iter_mut().enumerate())
        {
            *slot = tick_of(failed, pa);
        }
        &inline[..n]
    } else {
        heap = policies
            .agents
            .iter_mut()
            .enumerate()
            .map(|pa| tick_of(failed, pa))
            .collect();
        &heap
    };
    queries
        .p1()
        .iter_mut()
        .for_each(|(agent, action)| write_action(agent, action, ticks));
    if had_errors || !errors.0.is_empty() {
        errors_mark.set_changed();
    }
    bench_timing::record([start, staged, acting, acted, bench_timing::Mark::now()]);
}

/// The Act system's own parts timed inside it, for issue 35's benchmark (`examples/tick_bench.rs`): with the
/// `bench-timing` feature the system reads the clock five times per tick and [`bench_timing::last`] returns the
/// last tick's parts (of the last app to tick, process-wide); without it (the default) nothing is read and `last`
/// is None. Why: the plugin's overhead against an act timed in another tick (or another app) carries that
/// act's own variation, ±3 points of a 100-agent ratio run to run; against the act of the same tick it does not.
pub mod bench_timing {
    /// A clock reading (nothing without the `bench-timing` feature): the agents layer's.
    pub(crate) use policyport_agents::bench_timing::Mark;

    /// The last tick's Act system, in seconds: the staging pass (from the system's start: releases,
    /// registration of new agents not included), the policies' act() calls, the action pass (to the system's
    /// end), and the rest (registration, respawn flags).
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Parts {
        pub staging: f64,
        pub act: f64,
        pub actions: f64,
        pub rest: f64,
    }

    #[cfg(feature = "bench-timing")]
    static LAST: std::sync::Mutex<Option<Parts>> = std::sync::Mutex::new(None);

    /// The last tick's parts (None without the `bench-timing` feature, or before a tick).
    pub fn last() -> Option<Parts> {
        #[cfg(feature = "bench-timing")]
        return *LAST.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(not(feature = "bench-timing"))]
        None
    }

    #[inline(always)]
    #[cfg_attr(not(feature = "bench-timing"), allow(unused_variables))]
    pub(crate) fn record(marks: [Mark; 5]) {
        #[cfg(feature = "bench-timing")]
        {
            let [start, staged, acting, acted, end] = marks;
            let secs = |a: Mark, b: Mark| b.secs_since(a);
            *LAST.lock().unwrap_or_else(|e| e.into_inner()) = Some(Parts {
                staging: secs(start, staged),
                act: secs(acting, acted),
                actions: secs(acted, end),
                rest: secs(staged, acting),
            });
        }
    }
}
