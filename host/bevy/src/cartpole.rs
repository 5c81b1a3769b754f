//! A CartPole scene for the example and the tests: N carts as entities acting through one policy, each
//! respawning when its pole falls (a new episode: [`Agent::episode_start`]), written as a Bevy game would be.
//!
//! Its resets and its order of applying actions are those of `host/capi/examples/agents.c` (the same LCG, the
//! same rotating order, agent 0 replaced by a new entity midway, one agent spawned and despawned before the
//! first tick), so for the same policy and seed the scene's printed returns are the C example's exactly: the
//! tests compare them.

use bevy_ecs::prelude::*;
use policyport_envs::{CartPole, Env};

use crate::{Action, Agent, Observation, PolicyHandle};

/// One cart and its bookkeeping.
#[derive(Component, Debug, Clone)]
pub struct Cart {
    /// The cart's place in the scene (the C example's agent index).
    pub slot: usize,
    pub state: [f64; 4],
    pub ret: f64,
    pub steps: u32,
}

/// The scene: the reset stream, the tick count, the finished episodes' returns in the order they finished.
#[derive(Resource, Debug, Clone)]
pub struct Scene {
    pub carts: usize,
    pub ticks: u64,
    pub returns: Vec<f64>,
    rng: u64,
    /// The tick at which cart 0 is replaced by a new entity (the C example's midway despawn + spawn).
    pub replace_at: Option<u64>,
    pub policy: PolicyHandle,
}

impl Scene {
    pub fn new(carts: usize, policy: PolicyHandle, replace_at: Option<u64>) -> Self {
        Scene {
            carts,
            ticks: 0,
            returns: vec![],
            rng: 0x9E37_79B9_7F4A_7C15,
            replace_at,
            policy,
        }
    }

    /// agents.c's `reset`: four draws of the LCG in [-0.05, 0.05).
    pub fn reset(&mut self) -> [f64; 4] {
        let mut s = [0.0; 4];
        for v in s.iter_mut() {
            self.rng = self
                .rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *v = -0.05 + 0.1 * (self.rng >> 11) as f64 / 9007199254740992.0;
        }
        s
    }

    pub fn mean_return(&self) -> f64 {
        if self.returns.is_empty() {
            0.0
        } else {
            self.returns.iter().sum::<f64>() / self.returns.len() as f64
        }
    }
}

/// A marker some carts carry, so the world keeps carts in two archetypes and queries visit them in another order
/// than the carts' own (the plugin must not care).
#[derive(Component, Debug, Clone, Copy)]
pub struct Painted;

/// Spawn the scene's carts (and, as agents.c does, one extra agent that leaves before acting).
pub fn spawn_scene(world: &mut World, scene: Scene) {
    let mut scene = scene;
    let policy = scene.policy;
    for slot in 0..scene.carts {
        let state = scene.reset();
        let cart = Cart {
            slot,
            state,
            ret: 0.0,
            steps: 0,
        };
        let mut e = world.spawn((Agent::new(policy), Observation::default(), cart));
        if slot % 3 == 1 {
            e.insert(Painted);
        }
    }
    // agents.c spawns one more agent and despawns it before the first tick: its env id goes to the free list.
    world.spawn((Agent::new(policy), Observation::default(), Leaver));
    world.insert_resource(scene);
}

/// The agent agents.c spawns and despawns before any tick.
#[derive(Component, Debug, Clone, Copy)]
pub struct Leaver;

/// Observe: each cart's state as the policy's observation (f32).
pub fn observe(mut carts: Query<(&Cart, &mut Observation)>) {
    for (cart, mut obs) in carts.iter_mut() {
        obs.0.clear();
        obs.0.extend(cart.state.iter().map(|v| *v as f32));
    }
}

/// Apply: step each cart with its action in agents.c's rotating order; a fallen pole (or 500 steps) ends the
/// episode: its return is recorded, the cart is reset and its agent starts a new episode. Midway, cart 0's
/// entity is replaced by a new one (a new agent: it gets the freed env id and a fresh episode).
pub fn apply(
    mut commands: Commands,
    mut scene: ResMut<Scene>,
    mut carts: Query<(Entity, &mut Cart, &mut Agent, &Action)>,
    leavers: Query<Entity, With<Leaver>>,
) {
    for e in leavers.iter() {
        commands.entity(e).despawn();
    }
    let n = scene.carts;
    let t = scene.ticks as usize;
    let mut by_slot: Vec<Entity> = vec![Entity::PLACEHOLDER; n];
    for (e, cart, ..) in carts.iter() {
        by_slot[cart.slot] = e;
    }
    for k in 0..n {
        let slot = (k + t * 7) % n;
        let Ok((_, mut cart, mut agent, action)) = carts.get_mut(by_slot[slot]) else {
            continue;
        };
        let a = action.discrete.first().copied().unwrap_or(0);
        cart.ret += 1.0;
        cart.steps += 1;
        let mut env = CartPole { state: cart.state };
        let (_, done) = env.step(a, &[]);
        cart.state = env.state;
        if done || cart.steps >= 500 {
            scene.returns.push(cart.ret);
            cart.state = scene.reset();
            cart.ret = 0.0;
            cart.steps = 0;
            agent.episode_start = true;
        }
    }
    scene.ticks += 1;
    if scene.replace_at == Some(scene.ticks) {
        // agents.c replaces agent 0 before the tick at ticks / 2 (its episode so far is dropped).
        let policy = scene.policy;
        if let Ok((e, ..)) = carts.get(by_slot[0]) {
            commands.entity(e).despawn();
        }
        let state = scene.reset();
        commands.spawn((
            Agent::new(policy),
            Observation::default(),
            Cart {
                slot: 0,
                state,
                ret: 0.0,
                steps: 0,
            },
        ));
    }
}
