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

use std::sync::Mutex;

pub mod cartpole;

use bevy_app::{App, FixedUpdate, Plugin};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{InternedScheduleLabel, ScheduleLabel};
use policyport_agents::{AgentId, Agents, AgentsError};

/// Which policy of [`Policies`] an agent acts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyHandle(usize);

/// The policies agents act with (each a `policyport_agents::Agents`: native, any backend, or sandboxed).
#[derive(Resource, Default)]
pub struct Policies {
    agents: Vec<Mutex<Agents>>,
}

impl Policies {
    /// Add a policy's agents; entities name it by the returned handle.
    pub fn add(&mut self, agents: Agents) -> PolicyHandle {
        self.agents.push(Mutex::new(agents));
        PolicyHandle(self.agents.len() - 1)
    }

    /// The policy's agents (e.g. to switch deterministic acting, read its tick or its backend).
    pub fn get_mut(&mut self, policy: PolicyHandle) -> Option<&mut Agents> {
        self.agents
            .get_mut(policy.0)
            .map(|m| m.get_mut().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Every policy's agents, shared (the Act set's action writing reads them all at once).
    fn all(&mut self) -> Vec<&Agents> {
        self.agents
            .iter_mut()
            .map(|m| &*m.get_mut().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }
}

/// An entity that acts through a policy.
#[derive(Component, Debug, Clone)]
#[require(Action)]
pub struct Agent {
    pub policy: PolicyHandle,
    /// Set by the game when this entity starts a new episode (a respawn): its recurrent state is zeroed before
    /// its next step. Cleared by the Act system.
    pub episode_start: bool,
    id: Option<AgentId>,
    /// The policy `id` belongs to (a game may move the entity to another policy).
    registered: Option<PolicyHandle>,
}

impl Agent {
    pub fn new(policy: PolicyHandle) -> Self {
        Agent {
            policy,
            episode_start: false,
            id: None,
            registered: None,
        }
    }

    /// The agent's id in its policy's agents (after its first tick).
    pub fn id(&self) -> Option<AgentId> {
        self.id
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

/// What the last tick's act() refused, per policy (empty when every policy acted).
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

type AgentRow<'a> = (
    Entity,
    &'a mut Agent,
    &'a Observation,
    Option<&'a ActionMask>,
    &'a mut Action,
);

/// Stage one registered agent's observation (and mask) with its policy; a refusal withdraws that policy's rows
/// for this tick and records the error.
fn stage(
    policies: &mut Policies,
    agent: &mut Mut<'_, Agent>,
    obs: &Observation,
    mask: Option<&ActionMask>,
    failed: &mut Vec<PolicyHandle>,
    errors: &mut Vec<(PolicyHandle, AgentsError)>,
) {
    let Some(id) = agent.id else { return };
    if obs.0.is_empty() || failed.contains(&agent.policy) {
        return;
    }
    let Some(a) = policies.get_mut(agent.policy) else {
        return;
    };
    if agent.episode_start {
        let _ = a.respawn(id);
        agent.episode_start = false;
    }
    let staged = match mask {
        Some(m) if !m.0.is_empty() => a.observe_masked(id, &obs.0, &m.0),
        _ => a.observe(id, &obs.0),
    };
    if let Err(err) = staged {
        a.clear_staged();
        failed.push(agent.policy);
        errors.push((agent.policy, err));
    }
}

/// The Act set's system: release despawned agents, register new ones (in entity index order: ids never depend
/// on query order), stage every observed agent with its policy, act once per policy, write each agent's [`Action`].
fn act_system(
    mut policies: ResMut<Policies>,
    mut errors: ResMut<PolicyportErrors>,
    mut registered: ResMut<Registered>,
    mut removed: RemovedComponents<Agent>,
    mut q: Query<AgentRow<'_>>,
) {
    errors.0.clear();
    for e in removed.read() {
        registered.release(e, &mut policies);
    }
    // One pass stages every registered agent with an observation and sets the new ones (and agents whose
    // policy changed: the component remembers its registration, so no map lookup per agent per tick) aside; those
    // are registered in entity-index order after it, then staged.
    let mut failed: Vec<PolicyHandle> = vec![];
    let mut fresh: Vec<Entity> = vec![];
    for (e, mut agent, obs, mask, _) in q.iter_mut() {
        if agent.id.is_none() || agent.registered != Some(agent.policy) {
            fresh.push(e);
            continue;
        }
        stage(
            &mut policies,
            &mut agent,
            obs,
            mask,
            &mut failed,
            &mut errors.0,
        );
    }
    // By index (Entity's own Ord compares its bit pattern, whose index part is stored inverted: newest first).
    fresh.sort_unstable_by_key(|e| (e.index_u32(), e.generation().to_bits()));
    for e in fresh {
        let Ok((_, mut agent, obs, mask, _)) = q.get_mut(e) else {
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
                stage(
                    &mut policies,
                    &mut agent,
                    obs,
                    mask,
                    &mut failed,
                    &mut errors.0,
                );
            }
            Err(err) => {
                agent.id = None;
                agent.registered = None;
                errors.0.push((policy, err));
            }
        }
    }
    // Act, per policy.
    for p in 0..policies.len() {
        let handle = PolicyHandle(p);
        if failed.contains(&handle) {
            continue;
        }
        let a = policies.get_mut(handle).expect("in range");
        if a.staged() == 0 {
            continue;
        }
        if let Err(err) = a.act() {
            a.clear_staged();
            errors.0.push((handle, err));
            failed.push(handle);
        }
    }
    // Write actions: each policy's tick looked up once (not per agent), then one row lookup per agent and plain
    // slices of the tick's outputs.
    let ticks: Vec<Option<(policyport_agents::Tick<'_>, usize, u64)>> = policies
        .all()
        .into_iter()
        .enumerate()
        .map(|(p, a)| {
            (!failed.contains(&PolicyHandle(p))).then(|| (a.last(), a.action_len(), a.tick()))
        })
        .collect();
    for (_, agent, _, _, mut action) in q.iter_mut() {
        let Some(id) = agent.id else { continue };
        let Some(Some((tick, k, now))) = ticks.get(agent.policy.0) else {
            continue;
        };
        let (k, now) = (*k, *now);
        let Some(r) = tick.row(id) else { continue };
        let out = tick.outputs();
        action.discrete.clear();
        action.continuous.clear();
        if !out.discrete.is_empty() {
            action
                .discrete
                .extend_from_slice(&out.discrete[r * k..(r + 1) * k]);
        }
        if !out.continuous.is_empty() {
            action
                .continuous
                .extend_from_slice(&out.continuous[r * k..(r + 1) * k]);
        }
        action.value = out.value.get(r).copied();
        action.tick = now;
    }
}
