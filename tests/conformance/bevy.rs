//! The Bevy plugin (`policyport-bevy`), headless with `App::update()`: the CartPole scene (host/bevy/src/
//! cartpole.rs: 32 carts as entities, respawning when their poles fall, cart 0 replaced midway, the world's
//! queries visiting carts out of their order) plays exactly the episodes of the C example `agents.c` for the same
//! policy and seed (its printed returns), natively and in the sandbox, for a feed-forward and a recurrent policy
//! (respawns start new episodes; a new entity on a freed env id starts fresh); a policy that refuses a tick is an
//! entry of `PolicyportErrors`, never a panic.

use bevy_app::{App, Update};
use bevy_ecs::prelude::*;
use policyport::{Backend, CompiledPolicy};
use policyport_agents::{Agents, AgentsConfig};
use policyport_bevy::cartpole::{self, Scene};
use policyport_bevy::{Observation, Policies, PolicyportErrors, PolicyportPlugin, PolicyportSet};
use policyport_conformance::{fixtures_dir, plugin_runtime};
use policyport_import::{StorageDType, compile_sb3};

use crate::capi::{compile_c_example, run_agents_example};

fn sb3(name: &str) -> Vec<u8> {
    let zip = std::fs::read(fixtures_dir().join("sb3").join(name).join("model.zip")).unwrap();
    compile_sb3(&zip, None, name, None, StorageDType::F32).unwrap()
}

/// The scene in a headless app, the plugin in `Update` (one `app.update()` = one tick).
fn scene_app(agents: Agents, carts: usize, ticks: u64) -> App {
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    let policy = app.world_mut().resource_mut::<Policies>().add(agents);
    app.add_systems(
        Update,
        (
            cartpole::observe.in_set(PolicyportSet::Observe),
            cartpole::apply.in_set(PolicyportSet::Apply),
        ),
    );
    cartpole::spawn_scene(app.world_mut(), Scene::new(carts, policy, Some(ticks / 2)));
    app
}

/// A headless app with the plugin in `Update` and SB3's CartPole PPO as its one policy.
fn cartpole_app(config: AgentsConfig) -> (App, policyport_bevy::PolicyHandle) {
    let policy = CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap();
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    let h = app
        .world_mut()
        .resource_mut::<Policies>()
        .add(Agents::new(policy, config));
    (app, h)
}

/// A headless app with the plugin in `Update` and `n` policies, each `policy` acting deterministically with its
/// value estimates (what [`values_of`] computes for a row).
fn app_with_copies(
    policy: &std::sync::Arc<CompiledPolicy>,
    n: usize,
) -> (App, Vec<policyport_bevy::PolicyHandle>) {
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    let config = AgentsConfig {
        deterministic: true,
        values: true,
        ..Default::default()
    };
    let handles = {
        let mut p = app.world_mut().resource_mut::<Policies>();
        (0..n)
            .map(|_| p.add(Agents::new(policy.clone(), config)))
            .collect()
    };
    (app, handles)
}

/// Each row's value estimate from a bare session (what each agent's `Action::value` must say): `n` rows of `obs`.
fn values_of(policy: &std::sync::Arc<CompiledPolicy>, obs: &[f32], n: usize) -> Vec<f32> {
    use policyport::{ActMode, Observations, Request};
    policy
        .session()
        .act(&Request::new(
            Observations::F32(obs),
            n,
            ActMode::Deterministic,
        ))
        .unwrap()
        .value
        .clone()
}

/// An agent of policy `h` with observation `obs`, spawned.
fn spawn_agent(app: &mut App, h: policyport_bevy::PolicyHandle, obs: Vec<f32>) -> Entity {
    app.world_mut()
        .spawn((policyport_bevy::Agent::new(h), Observation(obs)))
        .id()
}

/// A value an agent's `Action` holds is its row's (`want`, from [`values_of`]) within the suite's tolerance.
fn value_matches(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

fn play(agents: Agents, carts: usize, ticks: u64) -> Vec<f64> {
    let mut app = scene_app(agents, carts, ticks);
    for _ in 0..ticks {
        app.update();
        assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    }
    app.world().resource::<Scene>().returns.clone()
}

/// agents.c's printed returns for `artifact` (32 agents, 1 200 ticks, seed 7, sampled).
fn c_returns(artifact: &[u8], dir: &std::path::Path, sandboxed: bool) -> Vec<f64> {
    let path = dir.join("policy.policy");
    std::fs::write(&path, artifact).unwrap();
    let exe = compile_c_example("agents", dir);
    run_agents_example(&exe, &path, sandboxed)
        .lines()
        .next()
        .unwrap()
        .split(' ')
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn bevy_cartpole_scene_plays_the_c_examples_episodes_natively_and_sandboxed() {
    let dir = std::env::temp_dir().join(format!("policyport-bevy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = AgentsConfig {
        seed: 7,
        ..Default::default()
    };
    // SB3's briefly trained PPO (episodes of every length) and RecurrentPPO (an LSTM per cart).
    for name in ["ppo_cartpole", "recurrent_ppo_cartpole"] {
        let bytes = sb3(name);
        let want = c_returns(&bytes, &dir, false);
        assert!(want.len() > 40, "{name}: {} episodes", want.len());
        let native = Agents::new(CompiledPolicy::load(&bytes, Backend::Cpu).unwrap(), config);
        assert_eq!(
            play(native, 32, 1200),
            want,
            "{name}: Bevy (native cpu) vs agents.c"
        );
        let wasm =
            policyport_wasmtime::load(&plugin_runtime(), &bytes, Default::default()).unwrap();
        let got = play(Agents::new(wasm, config), 32, 1200);
        assert_eq!(
            got,
            c_returns(&bytes, &dir, true),
            "{name}: Bevy (sandboxed) vs agents.c (sandboxed)"
        );
        let distinct: std::collections::BTreeSet<u64> = want.iter().map(|r| *r as u64).collect();
        assert!(distinct.len() > 10, "{name}: varied episodes {distinct:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bevy_a_tick_the_policy_refuses_is_an_error_entry_never_a_panic() {
    let bytes = sb3("ppo_cartpole");
    let agents = Agents::new(
        CompiledPolicy::load(&bytes, Backend::Cpu).unwrap(),
        AgentsConfig::default(),
    );
    let mut app = scene_app(agents, 4, 100);
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    // A game system writing a 3-number observation for one cart (the third: in the middle of the staging pass's
    // run of agents through their policy): that policy's tick is refused, typed.
    fn short(mut q: Query<&mut Observation, With<cartpole::Cart>>) {
        if let Some(mut o) = q.iter_mut().nth(2) {
            o.0.truncate(3);
        }
    }
    app.add_systems(
        Update,
        short
            .after(cartpole::observe)
            .in_set(PolicyportSet::Observe),
    );
    app.update();
    let errors = &app.world().resource::<PolicyportErrors>().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].1.to_string().contains("3 observation numbers"),
        "{}",
        errors[0].1
    );
}

/// Regression for the Act system's row bookkeeping (the staging pass notes each agent's row; the action pass reads
/// it back in the query's order): every agent must get its own row's action and value whatever else is in the
/// world. Twelve agents on two policies, each with its own observation (so its value names its row) and most with
/// a mask that allows one action (its own), one agent without an `Observation`, one with an empty one (it sits the
/// tick out), an agent moved to the other policy between ticks, and one whose `Action` the game removed.
/// With 2 policies, and with 4 more that no agent uses added first (6 in all: past the action pass's stack room
/// for 4, `INLINE_POLICIES`, so its per-tick list is the heap one).
#[test]
fn bevy_each_agent_gets_its_own_row_with_masks_two_policies_and_a_policy_switch() {
    for idle_policies in [0, 4] {
        each_agent_gets_its_own_row(idle_policies);
    }
}

fn each_agent_gets_its_own_row(idle_policies: usize) {
    use policyport_bevy::{Action, ActionMask, Agent};
    let bytes = sb3("ppo_cartpole");
    let policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    let obs_of = |k: usize| {
        let k = k as f32;
        vec![
            0.05 * k - 0.3,
            0.1 - 0.02 * k,
            0.03 * k - 0.15,
            0.2 - 0.01 * k,
        ]
    };
    // The value of each agent's observation, from a bare session (what the agent's Action must say).
    let n = 12;
    let all_obs: Vec<f32> = (0..n).flat_map(obs_of).collect();
    let want_values = values_of(&policy, &all_obs, n);
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    let config = |seed| AgentsConfig {
        seed,
        values: true,
        ..Default::default()
    };
    let (a, b) = {
        let mut p = app.world_mut().resource_mut::<Policies>();
        for i in 0..idle_policies {
            p.add(Agents::new(policy.clone(), config(10 + i as u64)));
        }
        (
            p.add(Agents::new(policy.clone(), config(1))),
            p.add(Agents::new(policy.clone(), config(2))),
        )
    };
    let allowed = |k: usize| k % 2;
    let masked = |k: usize| k % 4 != 3;
    let mut entities = vec![];
    for k in 0..n {
        let mut e = app.world_mut().spawn((
            Agent::new(if k % 3 == 0 { b } else { a }),
            Observation(if k == 5 { vec![] } else { obs_of(k) }),
        ));
        if masked(k) {
            e.insert(ActionMask((0..2).map(|j| j == allowed(k)).collect()));
        }
        entities.push(e.id());
    }
    // An agent with no Observation component at all: never staged, never written.
    let bare = app.world_mut().spawn(Agent::new(a)).id();
    for tick in 1..=3u64 {
        if tick == 2 {
            // The game removes entity 2's Action (`Agent` requires one at spawn, not forever): it is staged and
            // acts, and no other agent's Action may take its row (the staging pass and the action pass then visit
            // different entities).
            app.world_mut().entity_mut(entities[2]).remove::<Action>();
        }
        if tick == 3 {
            // Entity 1 moves from policy a to policy b.
            app.world_mut()
                .get_mut::<Agent>(entities[1])
                .unwrap()
                .policy = b;
        }
        app.update();
        let errors = &app.world().resource::<PolicyportErrors>().0;
        assert!(errors.is_empty(), "tick {tick}: {errors:?}");
        for (k, &e) in entities.iter().enumerate() {
            if k == 2 && tick >= 2 {
                assert!(app.world().get::<Action>(e).is_none());
                continue;
            }
            let action = app.world().get::<Action>(e).unwrap();
            if k == 5 {
                assert_eq!(*action, Action::default(), "the empty observation sat out");
                continue;
            }
            assert_eq!(action.discrete.len(), 1, "agent {k}, tick {tick}");
            if masked(k) {
                assert_eq!(
                    action.discrete[0],
                    allowed(k) as i64,
                    "agent {k}, tick {tick}: its own mask"
                );
            }
            let v = action.value.unwrap();
            assert!(
                value_matches(v, want_values[k]),
                "agent {k}, tick {tick}: value {v}, its row's {}",
                want_values[k]
            );
            // Ticks count per policy (both act every tick here: entity 1's first tick on b is b's third).
            assert_eq!(action.tick, tick, "agent {k}");
        }
        assert_eq!(*app.world().get::<Action>(bare).unwrap(), Action::default());
    }
    // Entity 1 is now b's: a released its old id.
    let id = app.world().get::<Agent>(entities[1]).unwrap().id().unwrap();
    let mut p = app.world_mut().resource_mut::<Policies>();
    assert!(p.get_mut(b).unwrap().contains(id));
    // a: entities 1, 2, 4, 5 (its empty observation registered it all the same), 7, 8, 10, 11, less entity 1.
    assert_eq!(p.get_mut(a).unwrap().len(), 7);
}

/// Regression for the action pass's short path (one discrete action, no value: only the action and the tick are
/// stored): an `Action` whatever it held before — a value from a tick that asked for values, continuous numbers or
/// extra discrete ones a game wrote, an emptied one — holds exactly the tick's outputs afterwards, and the value
/// comes back when asked for again.
#[test]
fn bevy_an_action_holds_exactly_its_ticks_outputs_whatever_it_held() {
    use policyport_bevy::Action;
    let (mut app, h) = cartpole_app(AgentsConfig {
        values: true,
        deterministic: true,
        ..Default::default()
    });
    let entities: Vec<_> = (0..4)
        .map(|k| spawn_agent(&mut app, h, vec![0.01 * k as f32, 0.0, -0.02, 0.1]))
        .collect();
    app.update();
    let first: Vec<Action> = entities
        .iter()
        .map(|e| app.world().get::<Action>(*e).unwrap().clone())
        .collect();
    assert!(
        first
            .iter()
            .all(|a| a.value.is_some() && a.discrete.len() == 1)
    );
    // Values off; the game scribbles on three of the actions.
    app.world_mut()
        .resource_mut::<Policies>()
        .get_mut(h)
        .unwrap()
        .set_values(false);
    for (k, scribble) in [
        (
            1,
            Action {
                continuous: vec![0.5],
                ..first[1].clone()
            },
        ),
        (
            2,
            Action {
                discrete: vec![7, 7],
                ..first[2].clone()
            },
        ),
        (
            3,
            Action {
                discrete: vec![],
                ..first[3].clone()
            },
        ),
    ] {
        *app.world_mut().get_mut::<Action>(entities[k]).unwrap() = scribble;
    }
    for tick in 2..=3 {
        app.update();
        for (k, e) in entities.iter().enumerate() {
            let a = app.world().get::<Action>(*e).unwrap();
            let want = Action {
                discrete: first[k].discrete.clone(),
                continuous: vec![],
                value: None,
                tick,
            };
            assert_eq!(
                *a, want,
                "agent {k}, tick {tick} (deterministic: the first tick's action)"
            );
        }
    }
    // Values on again: every Action carries one.
    app.world_mut()
        .resource_mut::<Policies>()
        .get_mut(h)
        .unwrap()
        .set_values(true);
    app.update();
    for (k, e) in entities.iter().enumerate() {
        let a = app.world().get::<Action>(*e).unwrap();
        assert_eq!(a.value, first[k].value, "agent {k}: its value again");
    }
}

/// Regression for the Act system's change mark on `PolicyportErrors`: it cleared the list every tick through
/// `ResMut` (an empty list too), so a game's `resource_changed::<PolicyportErrors>` fired every tick. Now the
/// resource changes on a tick whose list holds errors, and on the first clean tick after one, and not otherwise.
#[test]
fn bevy_the_errors_resource_changes_only_with_its_errors() {
    #[derive(Resource, Default)]
    struct Seen(Vec<bool>);
    #[derive(Resource, Default)]
    struct Shorten(bool);
    let agents = Agents::new(
        CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap(),
        AgentsConfig::default(),
    );
    let mut app = scene_app(agents, 4, 100);
    app.init_resource::<Seen>().init_resource::<Shorten>();
    // A game system that cuts one cart's observation short while `Shorten` says so (the policy refuses that tick),
    // and one that records whether the errors resource changed since it last ran, as a run condition would.
    fn short(on: Res<Shorten>, mut q: Query<&mut Observation, With<cartpole::Cart>>) {
        if let (true, Some(mut o)) = (on.0, q.iter_mut().next()) {
            o.0.truncate(3);
        }
    }
    fn record(errors: Res<PolicyportErrors>, mut seen: ResMut<Seen>) {
        seen.0.push(errors.is_changed());
    }
    app.add_systems(
        Update,
        (
            short
                .after(cartpole::observe)
                .in_set(PolicyportSet::Observe),
            record.in_set(PolicyportSet::Apply),
        ),
    );
    let script = [false, false, false, true, true, false, false, false];
    for &cut in &script {
        app.world_mut().resource_mut::<Shorten>().0 = cut;
        app.update();
        let n = app.world().resource::<PolicyportErrors>().0.len();
        assert_eq!(n, usize::from(cut), "errors this tick");
    }
    // The first tick sees the resource as added; then: clean, clean, error, error, first clean, clean, clean.
    assert_eq!(
        app.world().resource::<Seen>().0,
        [true, false, false, true, true, true, false, false]
    );
}

/// Regression for `Agent`'s derived `Clone`: a clone (Bevy's `clone_and_spawn`, a game's prefab) carried the
/// original's agent id, so two entities staged the same id — the second observe was refused as a double
/// observation, and with it the whole policy's tick, every tick; once the original was despawned, its id (still
/// held by the clone) was released and the clone's stale id refused every tick after. A clone is a new agent now.
#[test]
fn bevy_a_cloned_agent_entity_is_a_new_agent_with_its_own_id() {
    use policyport_bevy::{Action, Agent};
    let (mut app, h) = cartpole_app(AgentsConfig {
        deterministic: true,
        ..Default::default()
    });
    let obs = vec![0.01f32, 0.0, -0.02, 0.1];
    let a = spawn_agent(&mut app, h, obs.clone());
    app.update();
    let id_a = app.world().get::<Agent>(a).unwrap().id();
    assert!(id_a.is_some());
    // Bevy's own entity cloning (every Clone component), and a game cloning the component by hand.
    let b = app.world_mut().entity_mut(a).clone_and_spawn();
    let agent = app.world().get::<Agent>(a).unwrap().clone();
    assert_eq!(
        agent.id(),
        None,
        "a clone holds no id before its first tick"
    );
    let c = app.world_mut().spawn((agent, Observation(obs))).id();
    for tick in 2..=3u64 {
        app.update();
        assert!(
            app.world().resource::<PolicyportErrors>().0.is_empty(),
            "tick {tick}: {:?}",
            app.world().resource::<PolicyportErrors>().0
        );
        let ids: Vec<_> = [a, b, c]
            .iter()
            .map(|e| app.world().get::<Agent>(*e).unwrap().id().unwrap())
            .collect();
        assert!(
            ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
            "{ids:?}"
        );
        assert_eq!(ids[0], id_a.unwrap(), "the original keeps its id");
        for e in [a, b, c] {
            assert_eq!(app.world().get::<Action>(e).unwrap().tick, tick);
        }
    }
    // The original leaves; the clones act on.
    app.world_mut().despawn(a);
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    for e in [b, c] {
        assert_eq!(app.world().get::<Action>(e).unwrap().tick, 4);
    }
}

/// Regression for the staging pass's gathered runs (a policy's common-case agents staged in one
/// `Agents::observe_rows` call at the end of their run): a run the policy refuses — here an agent the game staged
/// itself through `Policies` before the Act set — is that policy's error entry for the tick (typed, never a
/// panic), its agents keep their last actions, another policy's agents act, and the next tick is clean.
#[test]
fn bevy_a_gathered_run_the_policy_refuses_is_an_error_entry() {
    use policyport_agents::AgentsError;
    use policyport_bevy::{Action, Agent};
    let policy = CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap();
    let config = || AgentsConfig {
        deterministic: true,
        ..Default::default()
    };
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    let (h, other) = {
        let mut policies = app.world_mut().resource_mut::<Policies>();
        (
            policies.add(Agents::new(policy.clone(), config())),
            policies.add(Agents::new(policy, config())),
        )
    };
    let obs = vec![0.01f32, 0.0, -0.02, 0.1];
    let mine: Vec<Entity> = (0..5)
        .map(|_| spawn_agent(&mut app, h, obs.clone()))
        .collect();
    let theirs = spawn_agent(&mut app, other, obs.clone());
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    let ticks = |app: &App, es: &[Entity]| -> Vec<u64> {
        es.iter()
            .map(|e| app.world().get::<Action>(*e).unwrap().tick)
            .collect()
    };
    assert_eq!(ticks(&app, &mine), vec![1; 5]);
    // The game stages the third agent's id itself: the plugin's run then stages it a second time.
    let id = app.world().get::<Agent>(mine[2]).unwrap().id().unwrap();
    app.world_mut()
        .resource_mut::<Policies>()
        .get_mut(h)
        .unwrap()
        .observe(id, &obs)
        .unwrap();
    app.update();
    let errors = &app.world().resource::<PolicyportErrors>().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, h);
    assert!(
        matches!(errors[0].1, AgentsError::AlreadyObserved(a) if a == id),
        "{:?}",
        errors[0].1
    );
    assert_eq!(
        ticks(&app, &mine),
        vec![1; 5],
        "the refused tick wrote no action"
    );
    assert_eq!(ticks(&app, &[theirs]), vec![2], "the other policy acted");
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    assert_eq!(ticks(&app, &mine), vec![2; 5]);
    assert_eq!(ticks(&app, &[theirs]), vec![3]);
}

/// Regression for the staging pass's gathered runs written by index into buffers kept across ticks (grown on the
/// out-of-line path, in the middle of a run): 300 agents whose policy changes in blocks of 70 and 5 (runs that end
/// on another policy's agent, some longer than the buffers on the first tick), one respawn and one mask in the
/// middle of a run (the run ends, the agent takes the general path, a new run begins after its row), one
/// observation of the wrong length: every agent's value is its own observation's, tick after tick, and the
/// refused policy's agents keep their last actions.
#[test]
fn bevy_runs_longer_than_their_buffers_keep_every_agents_row() {
    use policyport_agents::AgentsError;
    use policyport_bevy::{Action, ActionMask, Agent};
    let policy = CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap();
    let n = 300;
    let obs_of = |k: usize| {
        let k = k as f32;
        vec![
            (0.37 * k).sin() * 0.4,
            (0.11 * k).cos() * 0.5,
            (0.23 * k).sin() * 0.2,
            (0.05 * k).cos() * 0.3,
        ]
    };
    let all: Vec<f32> = (0..n).flat_map(obs_of).collect();
    let want = values_of(&policy, &all, n);
    let (mut app, handles) = app_with_copies(&policy, 3);
    // Blocks of 70 agents of policies 0 and 1 in turn, every fifth block 5 agents of policy 2.
    let policy_of = |k: usize| match k % 150 {
        0..70 => handles[0],
        70..75 => handles[2],
        _ => handles[1],
    };
    let entities: Vec<Entity> = (0..n)
        .map(|k| spawn_agent(&mut app, policy_of(k), obs_of(k)))
        .collect();
    let values = |app: &App| -> Vec<Option<f32>> {
        entities
            .iter()
            .map(|e| app.world().get::<Action>(*e).unwrap().value)
            .collect()
    };
    let close = |got: Option<f32>, k: usize| got.is_some_and(|v| value_matches(v, want[k]));
    for tick in 1..=4u64 {
        match tick {
            // A respawn in the middle of policy 0's first run and a mask in the middle of policy 1's.
            2 => {
                app.world_mut()
                    .get_mut::<Agent>(entities[30])
                    .unwrap()
                    .episode_start = true;
                app.world_mut()
                    .entity_mut(entities[100])
                    .insert(ActionMask(vec![true, false]));
            }
            // Agent 200 (policy 0) observes a wrong length: policy 0 refuses the tick.
            3 => {
                app.world_mut()
                    .get_mut::<Observation>(entities[200])
                    .unwrap()
                    .0 = vec![0.0; 3]
            }
            4 => {
                app.world_mut()
                    .get_mut::<Observation>(entities[200])
                    .unwrap()
                    .0 = obs_of(200)
            }
            _ => {}
        }
        let before = values(&app);
        app.update();
        let errors = &app.world().resource::<PolicyportErrors>().0;
        let got = values(&app);
        if tick == 3 {
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(matches!(
                errors[0],
                (h, AgentsError::ObservationLength { .. }) if h == handles[0]
            ));
        } else {
            assert!(errors.is_empty(), "tick {tick}: {errors:?}");
        }
        for k in 0..n {
            let refused = tick == 3 && policy_of(k) == handles[0];
            match refused {
                true => assert_eq!(got[k], before[k], "tick {tick}, agent {k}: kept"),
                false => assert!(
                    close(got[k], k),
                    "tick {tick}, agent {k}: {:?}, its row's {}",
                    got[k],
                    want[k]
                ),
            }
            let action = app.world().get::<Action>(entities[k]).unwrap();
            let policy_tick = if policy_of(k) == handles[0] && tick >= 3 {
                tick - 1
            } else {
                tick
            };
            assert_eq!(action.tick, policy_tick, "tick {tick}, agent {k}");
        }
        if tick >= 2 {
            assert_eq!(
                app.world().get::<Action>(entities[100]).unwrap().discrete,
                vec![0],
                "the masked agent's own mask"
            );
        }
    }
}

/// The staging pass writes each agent's row on its `Agent` every tick without Bevy's change mark: a game's
/// `Changed<Agent>` sees an agent when it is spawned (registered), when its respawn flag is taken, and when the
/// game itself changes it, not at every tick.
#[test]
fn bevy_acting_does_not_mark_agents_changed() {
    use policyport_bevy::Agent;
    #[derive(Resource, Default)]
    struct Seen(Vec<usize>);
    fn count(q: Query<(), Changed<Agent>>, mut seen: ResMut<Seen>) {
        seen.0.push(q.iter().count());
    }
    let policy = CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap();
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    app.init_resource::<Seen>();
    app.add_systems(Update, count.in_set(PolicyportSet::Apply));
    let h = app
        .world_mut()
        .resource_mut::<Policies>()
        .add(Agents::new(policy, AgentsConfig::default()));
    let agents: Vec<Entity> = (0..4)
        .map(|_| spawn_agent(&mut app, h, vec![0.01, 0.0, -0.02, 0.1]))
        .collect();
    for _ in 0..3 {
        app.update();
    }
    // A respawn the game asks for: the game's own change, and the plugin clearing the flag.
    app.world_mut()
        .get_mut::<Agent>(agents[1])
        .unwrap()
        .episode_start = true;
    app.update();
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    assert_eq!(app.world().resource::<Seen>().0, vec![4, 0, 0, 1, 0]);
}

/// Regression: an agent whose id the game released itself through `Policies` (`Agents::despawn`) while its entity
/// lived made its policy's every later tick an `UnknownAgent` error (every agent of that policy stopped acting,
/// for good). Now the tick that meets the released id is that policy's one error entry, and from the next tick the
/// agent acts under a new id (a new episode) beside the others.
#[test]
fn bevy_an_id_the_game_released_through_policies_costs_one_tick() {
    use policyport_agents::AgentsError;
    use policyport_bevy::{Action, Agent};
    let (mut app, h) = cartpole_app(AgentsConfig {
        deterministic: true,
        ..Default::default()
    });
    let obs = vec![0.01f32, 0.0, -0.02, 0.1];
    let carts: Vec<Entity> = (0..4)
        .map(|_| spawn_agent(&mut app, h, obs.clone()))
        .collect();
    app.update();
    assert!(app.world().resource::<PolicyportErrors>().0.is_empty());
    let id = |app: &App, e: Entity| app.world().get::<Agent>(e).unwrap().id();
    let released = id(&app, carts[1]).unwrap();
    app.world_mut()
        .resource_mut::<Policies>()
        .get_mut(h)
        .unwrap()
        .despawn(released)
        .unwrap();
    app.update();
    let errors = &app.world().resource::<PolicyportErrors>().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        matches!(errors[0], (p, AgentsError::UnknownAgent(a)) if p == h && a == released),
        "{errors:?}"
    );
    // A game that empties the list once it has logged it (the repair must not wait for the next tick to read it).
    app.world_mut().resource_mut::<PolicyportErrors>().0.clear();
    // The policy's own tick count did not advance on the refused tick: updates 3 and 4 are its ticks 2 and 3.
    for tick in 2..=3u64 {
        app.update();
        assert!(
            app.world().resource::<PolicyportErrors>().0.is_empty(),
            "tick {tick}: {:?}",
            app.world().resource::<PolicyportErrors>().0
        );
        for e in &carts {
            assert_eq!(app.world().get::<Action>(*e).unwrap().tick, tick);
        }
    }
    let renewed = id(&app, carts[1]).unwrap();
    assert_ne!(renewed, released, "a new id, so a new episode");
    let alive = app
        .world_mut()
        .resource_mut::<Policies>()
        .get_mut(h)
        .map(|a| a.len());
    assert_eq!(
        alive,
        Some(4),
        "the released id stays released; the agent holds one new id"
    );
}

/// A seeded game of 300 ticks that does everything a game does to its agents, in every order: spawns (some with
/// masks), despawns, respawns, policy switches among three policies, masks inserted and removed (the entity moves
/// to another table, so the staging pass meets the policies' runs in another order), an `Action` removed and put
/// back, observations emptied (the agent sits the tick out) and of the wrong length (its policy refuses the
/// tick). After every tick each agent that acted holds its own row's value (a bare session's for its
/// observation) and its policy's tick, a masked agent an allowed action, and every other agent the action it had.
#[test]
fn bevy_a_random_game_keeps_every_agents_row() {
    use policyport_agents::AgentsError;
    use policyport_bevy::{Action, ActionMask, Agent, PolicyHandle};
    let policy = CompiledPolicy::load(&sb3("ppo_cartpole"), Backend::Cpu).unwrap();
    let (mut app, handles) = app_with_copies(&policy, 3);
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let obs = |seed: u64| -> Vec<f32> {
        (0..4)
            .map(|i| (((seed * 4 + i) * 2_654_435_761) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let mut alive: Vec<Entity> = vec![];
    // Acts per policy so far (an agent's `Action::tick` after its policy acts).
    let mut acts = [0u64; 3];
    // What the game exercised: refused ticks, masked actions checked, actions kept, rows checked.
    let (mut refusals, mut masked, mut kept_actions, mut rows) = (0, 0, 0, 0);
    for tick in 0..300u64 {
        // The game's moves for this tick.
        for _ in 0..next(4) {
            let h = handles[next(3) as usize];
            let mut e = app
                .world_mut()
                .spawn((Agent::new(h), Observation(obs(next(1 << 20)))));
            if next(4) == 0 {
                e.insert(ActionMask(vec![next(2) == 0, true]));
            }
            alive.push(e.id());
        }
        if !alive.is_empty() {
            for _ in 0..3 {
                let e = alive[next(alive.len() as u64) as usize];
                let mut ent = app.world_mut().entity_mut(e);
                match next(12) {
                    0 => {
                        ent.despawn();
                        alive.retain(|x| *x != e);
                    }
                    1 => ent.get_mut::<Agent>().unwrap().episode_start = true,
                    2 => ent.get_mut::<Agent>().unwrap().policy = handles[next(3) as usize],
                    3 => {
                        ent.insert(ActionMask(vec![true, next(2) == 0]));
                    }
                    4 => {
                        ent.remove::<ActionMask>();
                    }
                    5 if ent.contains::<Action>() => {
                        ent.remove::<Action>();
                    }
                    5 => {
                        ent.insert(Action::default());
                    }
                    6 => ent.get_mut::<Observation>().unwrap().0.clear(),
                    7 if next(3) == 0 => ent.get_mut::<Observation>().unwrap().0 = vec![0.5; 3],
                    _ => ent.get_mut::<Observation>().unwrap().0 = obs(next(1 << 20)),
                }
            }
        }
        // What every agent must hold after the tick.
        let before: Vec<Option<Action>> = alive
            .iter()
            .map(|e| app.world().get::<Action>(*e).cloned())
            .collect();
        let policy_of = |app: &App, e: Entity| app.world().get::<Agent>(e).unwrap().policy;
        let obs_of = |app: &App, e: Entity| app.world().get::<Observation>(e).unwrap().0.clone();
        let refused: Vec<PolicyHandle> = handles
            .iter()
            .copied()
            .filter(|h| {
                alive
                    .iter()
                    .any(|e| policy_of(&app, *e) == *h && !matches!(obs_of(&app, *e).len(), 0 | 4))
            })
            .collect();
        for (p, h) in handles.iter().enumerate() {
            let staged = alive
                .iter()
                .any(|e| policy_of(&app, *e) == *h && obs_of(&app, *e).len() == 4);
            if staged && !refused.contains(h) {
                acts[p] += 1;
            }
        }
        app.update();
        let errors = &app.world().resource::<PolicyportErrors>().0;
        let mut refused_now: Vec<PolicyHandle> = errors.iter().map(|(h, _)| *h).collect();
        refused_now.sort_by_key(|h| handles.iter().position(|x| x == h));
        assert_eq!(refused_now, refused, "tick {tick}: {errors:?}");
        refusals += refused.len();
        assert!(
            errors
                .iter()
                .all(|(_, e)| matches!(e, AgentsError::ObservationLength { .. })),
            "tick {tick}: {errors:?}"
        );
        for (i, &e) in alive.iter().enumerate() {
            let Some(action) = app.world().get::<Action>(e) else {
                continue;
            };
            let (h, o) = (policy_of(&app, e), obs_of(&app, e));
            let p = handles.iter().position(|x| *x == h).unwrap();
            let acted = o.len() == 4 && !refused.contains(&h);
            if !acted {
                let kept = before[i].clone().unwrap_or_default();
                assert_eq!(*action, kept, "tick {tick}, {e}: kept its action");
                kept_actions += 1;
                continue;
            }
            let want = values_of(&policy, &o, 1)[0];
            let v = action.value.unwrap();
            assert!(
                value_matches(v, want),
                "tick {tick}, {e} (policy {p}): value {v}, its row's {want}"
            );
            assert_eq!(action.tick, acts[p], "tick {tick}, {e} (policy {p})");
            rows += 1;
            if let Some(m) = app.world().get::<ActionMask>(e) {
                assert!(
                    m.0[action.discrete[0] as usize],
                    "tick {tick}, {e}: action {:?} against its mask {:?}",
                    action.discrete, m.0
                );
                masked += 1;
            }
        }
        // A wrong length is one tick's mistake: the game puts it right before the next.
        for &e in &alive {
            let mut o = app.world_mut().get_mut::<Observation>(e).unwrap();
            if o.0.len() == 3 {
                o.0 = obs(next(1 << 20));
            }
        }
    }
    assert!(alive.len() > 100, "the game grew: {} agents", alive.len());
    assert!(
        refusals > 10 && masked > 1000 && kept_actions > 1000 && rows > 10_000,
        "what the game exercised: {refusals} refused ticks, {masked} masked actions, {kept_actions} kept, {rows} rows"
    );
}
