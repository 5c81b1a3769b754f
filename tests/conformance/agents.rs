//! The engine-neutral agents layer (`policyport-agents`, issue 35) on every backend and in the sandbox:
//!
//! - the bundled trained CartPole and Pendulum policies driving one agent per evaluation episode, observed in a
//!   different shuffled order every tick, despawned when the episode ends, give exactly the returns of the demo's
//!   own batched runner (`policyport demo`; agent env ids are the episode numbers, the tick is the step), and
//!   CartPole's equal the PyTorch policy's seeded returns;
//! - agents that spawn, despawn and respawn at random ticks on a recurrent policy keep their rows isolated: each
//!   agent acts as if it ran alone in its own session (fresh state at each of its episode starts, even on an env
//!   id a despawned agent held), whatever else shares its batch;
//! - every backend, the sandbox (`policyport_wasmtime::load`, `on_wasmtime`) among them, gives the native cpu
//!   backend's actions (values within rounding);
//! - stale ids, a second observation in one tick, wrong lengths and a refused act() are typed errors that change
//!   nothing.

use std::sync::Arc;

use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request, Session};
use policyport_agents::{AgentId, Agents, AgentsConfig, AgentsError};
use policyport_cli::demo::run_episodes_batched;
use policyport_cli::envs::{CartPole, Env, Pendulum};
use policyport_conformance::{compile_fixture, fixtures_dir, load_fixture, plugin_runtime};
use policyport_import::{FixtureIo, StorageDType, compile_sb3};
use policyport_wasmtime::WasmLimits;

/// xorshift64: the test's own stream for orders, spawn times and observations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

fn sandboxed(bytes: &[u8], config: AgentsConfig) -> Result<Agents, AgentsError> {
    let limits = WasmLimits {
        deadline: std::time::Duration::from_secs(60),
        ..Default::default()
    };
    let policy = policyport_wasmtime::load(&plugin_runtime(), bytes, limits)?;
    Ok(Agents::new(policy, config))
}

/// Agents on `bytes` on one backend of the suite (each test that takes one is one test per backend,
/// `per_backend!`; the sandbox is `on_wasmtime`), with the backend's name for messages.
fn agents_on(bytes: &[u8], backend: Backend, config: AgentsConfig) -> (String, Agents) {
    let p = policyport_conformance::load(bytes, backend).unwrap();
    (backend.name().to_string(), Agents::new(p, config))
}

/// One agent per evaluation episode, spawned at tick 0 in episode order (so agent env ids are the episode
/// numbers, as the demo's), observed in a new shuffled order each tick, despawned when its episode ends.
fn episode_returns<E: Env<Obs = f32>>(
    agents: &mut Agents,
    episodes: u32,
    env_seed: u64,
    order_seed: u64,
) -> Vec<f64> {
    let ids: Vec<AgentId> = (0..episodes).map(|_| agents.spawn().unwrap()).collect();
    assert!(
        ids.iter()
            .enumerate()
            .all(|(e, id)| id.env_id() == e as u32)
    );
    let mut envs: Vec<E> = (0..episodes).map(|e| E::reset(env_seed, e)).collect();
    let mut returns = vec![0.0; episodes as usize];
    let mut running: Vec<usize> = (0..episodes as usize).collect();
    let mut rng = Rng(order_seed);
    let mut obs = vec![0f32; E::OBS_LEN];
    for _ in 0..E::MAX_STEPS {
        if running.is_empty() {
            break;
        }
        rng.shuffle(&mut running);
        for &e in &running {
            envs[e].observe(&mut obs);
            agents.observe(ids[e], &obs).unwrap();
        }
        let tick = agents.act().unwrap();
        assert_eq!(tick.len(), running.len());
        let actions: Vec<(i64, Vec<f32>)> = running
            .iter()
            .map(|&e| match tick.discrete(ids[e]) {
                Some(d) => (d[0], vec![]),
                None => (0, tick.continuous(ids[e]).unwrap().to_vec()),
            })
            .collect();
        let mut still = vec![];
        for (&e, (d, c)) in running.iter().zip(actions) {
            let (r, done) = envs[e].step(d, &c);
            returns[e] += r;
            if done {
                agents.despawn(ids[e]).unwrap();
            } else {
                still.push(e);
            }
        }
        running = still;
    }
    for &e in &running {
        agents.despawn(ids[e]).unwrap();
    }
    assert!(agents.is_empty());
    returns
}

/// The trained fixtures' evaluation episodes through agents in shuffled order equal the demo's own batched
/// runner (`policyport demo`: one act() per step, rows in episode order) exactly, on `backend` (the demo on the
/// same backend); CartPole's equal the PyTorch policy's too.
fn replay_through_agents<E: Env<Obs = f32>>(fixture: &str, backend: Backend) {
    let f = load_fixture(fixture);
    let eval = f.io.eval.clone().unwrap();
    let bytes = compile_fixture(&f);
    let (env_seed, policy_seed) = (
        eval["env_seed"].as_u64().unwrap(),
        eval["policy_seed"].as_u64().unwrap(),
    );
    for (deterministic, key) in [(false, "sampled_returns"), (true, "deterministic_returns")] {
        let episodes = eval[key].as_array().unwrap().len() as u32;
        let config = AgentsConfig {
            seed: policy_seed,
            deterministic,
            ..Default::default()
        };
        let demo = {
            let p = policyport_conformance::load(&bytes, backend).unwrap();
            run_episodes_batched::<E>(
                &mut p.session(),
                episodes,
                env_seed,
                policy_seed,
                !deterministic,
            )
            .unwrap()
            .returns
        };
        for order_seed in [1, 0x9e37_79b9_7f4a_7c15] {
            let (name, mut agents) = agents_on(&bytes, backend, config);
            let got = episode_returns::<E>(&mut agents, episodes, env_seed, order_seed);
            assert_eq!(
                got, demo,
                "{fixture} {key} on {name}, observation order {order_seed:#x}"
            );
            if fixture == "cartpole" {
                let want: Vec<f64> = serde_json::from_value(eval[key].clone()).unwrap();
                assert_eq!(got, want, "{key} on {name}: the PyTorch returns");
            }
        }
    }
}

fn agents_in_any_order_replay_the_demos_episodes_on_every_backend(backend: Backend) {
    replay_through_agents::<CartPole>("cartpole", backend);
    replay_through_agents::<Pendulum>("pendulum", backend);
}
per_backend!(agents_in_any_order_replay_the_demos_episodes_on_every_backend);

/// What one agent did in one tick: (tick, its actions, its value).
type Step = (u64, Vec<i64>, f32);

/// Agents spawning, despawning and respawning at random ticks on a recurrent policy (SB3 RecurrentPPO on
/// CartPole: an LSTM per agent). Returns each agent life's steps, by spawn order.
fn churn(
    agents: &mut Agents,
    rng_seed: u64,
    ticks: u64,
) -> Vec<(u32, Vec<[f32; 4]>, Vec<bool>, Vec<Step>)> {
    let mut rng = Rng(rng_seed);
    // (id, env id, observations, episode starts, steps) per life.
    let mut lives: Vec<(AgentId, Vec<[f32; 4]>, Vec<bool>, Vec<Step>)> = vec![];
    let mut alive: Vec<usize> = vec![];
    let mut pending_start: Vec<bool> = vec![];
    for t in 0..ticks {
        // Spawns and despawns between ticks.
        if alive.len() < 12 && rng.below(3) == 0 || alive.is_empty() {
            for _ in 0..1 + rng.below(3) {
                let id = agents.spawn().unwrap();
                lives.push((id, vec![], vec![], vec![]));
                pending_start.push(true);
                alive.push(lives.len() - 1);
            }
        }
        if alive.len() > 3 && rng.below(4) == 0 {
            let i = alive.swap_remove(rng.below(alive.len()));
            agents.despawn(lives[i].0).unwrap();
        }
        if !alive.is_empty() && rng.below(5) == 0 {
            let i = alive[rng.below(alive.len())];
            agents.respawn(lives[i].0).unwrap();
            pending_start[i] = true;
        }
        // Some alive agents skip this tick (an engine need not observe every agent every frame).
        let mut observed: Vec<usize> = alive
            .iter()
            .copied()
            .filter(|_| rng.below(6) != 0)
            .collect();
        rng.shuffle(&mut observed);
        for &i in &observed {
            let o = [
                rng.unit(),
                rng.unit() * 2.0,
                rng.unit() * 0.2,
                rng.unit() * 2.0,
            ];
            agents.observe(lives[i].0, &o).unwrap();
            lives[i].1.push(o);
            lives[i].2.push(std::mem::take(&mut pending_start[i]));
        }
        // Now and then an observed agent respawns after its observation (the start reaches its staged row, in a
        // tick where it may be the only row starting), or its row is withdrawn (a start it carried waits for its
        // next observation).
        if observed.len() > 1 && rng.below(3) == 0 {
            let k = rng.below(observed.len());
            let i = observed[k];
            if rng.below(2) == 0 {
                agents.respawn(lives[i].0).unwrap();
                *lives[i].2.last_mut().unwrap() = true;
            } else {
                assert!(agents.unobserve(lives[i].0));
                lives[i].1.pop();
                pending_start[i] = lives[i].2.pop().unwrap();
                observed.swap_remove(k);
            }
        }
        let step = agents.tick();
        let tick = agents.act().unwrap();
        assert_eq!(tick.len(), observed.len());
        for &i in &observed {
            let id = lives[i].0;
            let a = tick.discrete(id).unwrap().to_vec();
            let v = tick.value(id).unwrap();
            lives[i].3.push((step, a, v));
        }
        let advanced = agents.tick() - step;
        assert_eq!(
            advanced,
            u64::from(!observed.is_empty()),
            "tick {t}: an empty tick is no step"
        );
    }
    lives
        .into_iter()
        .map(|(id, o, s, st)| (id.env_id(), o, s, st))
        .collect()
}

/// The churn's policy (SB3 RecurrentPPO on CartPole), its agents' config, and the churn on the native cpu backend:
/// the reference every backend and the sandbox are held to.
fn churn_reference() -> (
    Vec<u8>,
    AgentsConfig,
    Vec<(u32, Vec<[f32; 4]>, Vec<bool>, Vec<Step>)>,
) {
    let dir = fixtures_dir().join("sb3").join("recurrent_ppo_cartpole");
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    let bytes = compile_sb3(
        &std::fs::read(dir.join("model.zip")).unwrap(),
        None,
        "recurrent_ppo_cartpole",
        Some(&io),
        StorageDType::F32,
    )
    .unwrap();
    let config = AgentsConfig {
        seed: 77,
        values: true,
        ..Default::default()
    };
    let cpu = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    let reference = churn(&mut Agents::new(cpu, config), 5, 60);
    (bytes, config, reference)
}

/// The reference churn on the cpu backend: many lives, env ids reused, and each life acts as if it ran alone in its
/// own session.
#[test]
fn churning_agents_keep_their_recurrent_rows_isolated() {
    let (bytes, config, reference) = churn_reference();
    let cpu: Arc<CompiledPolicy> = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    assert!(reference.len() > 20, "{} lives", reference.len());
    let reused = {
        let mut ids: Vec<u32> = reference.iter().map(|l| l.0).collect();
        ids.sort_unstable();
        ids.windows(2).filter(|w| w[0] == w[1]).count()
    };
    assert!(reused > 3, "env ids reused by later agents: {reused}");
    // Each life alone in its own session (fresh state, batch 1, its env id, the same ticks and starts).
    for (env, obs, starts, steps) in &reference {
        let mut alone = Session::new(cpu.clone());
        for ((o, s), (t, a, v)) in obs.iter().zip(starts).zip(steps) {
            let out = alone
                .act(
                    &Request::new(
                        Observations::F32(o),
                        1,
                        ActMode::Sample {
                            seed: config.seed,
                            step: *t,
                        },
                    )
                    .envs(EnvIds::List(std::slice::from_ref(env)))
                    .episode_starts(std::slice::from_ref(s)),
                )
                .unwrap();
            assert_eq!(&out.discrete, a, "env {env} tick {t}: actions");
            assert!(
                (out.value[0] - v).abs() <= 1e-5 * v.abs().max(1.0),
                "env {env} tick {t}: value {} vs {v} in the shared batch",
                out.value[0]
            );
        }
    }
}

/// The same churn on every backend: the cpu reference's actions, and its values (bit for bit on the cpu backend
/// itself).
fn churning_agents_keep_their_recurrent_rows_isolated_on_every_backend(backend: Backend) {
    churn_like_the_reference(backend);
}
per_backend!(churning_agents_keep_their_recurrent_rows_isolated_on_every_backend);

fn churn_like_the_reference(backend: Backend) {
    let (bytes, config, reference) = churn_reference();
    // The same churn on every backend (the sandbox too): the same actions.
    let (name, mut agents) = agents_on(&bytes, backend, config);
    let got = churn(&mut agents, 5, 60);
    assert_eq!(got.len(), reference.len(), "{name}");
    for (g, r) in got.iter().zip(&reference) {
        for (gs, rs) in g.3.iter().zip(&r.3) {
            assert_eq!((gs.0, &gs.1), (rs.0, &rs.1), "{name}: env {} actions", r.0);
            // Bit for bit on the cpu backend itself; elsewhere (the sandbox's 128-bit kernels, flex, wgpu,
            // libtorch) within rounding: their sums run in another order.
            if name == "cpu" {
                assert_eq!(
                    gs.2.to_bits(),
                    rs.2.to_bits(),
                    "{name}: env {} value bits",
                    r.0
                );
            } else {
                assert!(
                    (gs.2 - rs.2).abs() <= 1e-4 * rs.2.abs().max(1.0),
                    "{name}: value"
                );
            }
        }
    }
}

fn agents_calls_that_do_not_fit_are_typed_errors_that_change_nothing(backend: Backend) {
    calls_that_do_not_fit(backend);
}
per_backend!(agents_calls_that_do_not_fit_are_typed_errors_that_change_nothing);

fn calls_that_do_not_fit(backend: Backend) {
    let f = load_fixture("cartpole");
    let bytes = compile_fixture(&f);
    let (name, mut agents) = agents_on(&bytes, backend, AgentsConfig::default());
    // Intra-op threads: one is every runner's; more only on the cpu backend (a typed refusal elsewhere, in the
    // sandbox too). The rest of this test then runs with them on the cpu backend.
    agents.set_threads(1).unwrap();
    let more = agents.set_threads(2);
    match backend {
        Backend::Cpu => {
            more.unwrap();
            assert_eq!(agents.threads(), 2);
            // A session set up by the caller keeps its threads (what the C ABI's pp_agents_new hands over).
            let mut session = policyport_conformance::load(&bytes, Backend::Cpu)
                .unwrap()
                .session();
            session.set_threads(2).unwrap();
            assert_eq!(
                Agents::from_session(session, AgentsConfig::default()).threads(),
                2
            );
        }
        _ => {
            assert!(
                matches!(more, Err(AgentsError::Policy(_))),
                "{name}: {more:?}"
            );
            assert_eq!(agents.threads(), 1, "{name}");
        }
    }
    let a = agents.spawn().unwrap();
    let b = agents.spawn().unwrap();
    agents.observe(a, &[0.0; 4]).unwrap();
    assert!(matches!(agents.observe(a, &[0.0; 4]), Err(AgentsError::AlreadyObserved(x)) if x == a));
    assert!(matches!(
        agents.observe(b, &[0.0; 3]),
        Err(AgentsError::ObservationLength {
            expected: 4,
            found: 3,
            ..
        })
    ));
    assert!(matches!(
        agents.observe_masked(b, &[0.0; 4], &[true]),
        Err(AgentsError::MaskLength {
            expected: 2,
            found: 1,
            ..
        })
    ));
    // A non-finite observation: the runtime refuses the act; the staging, ids and tick stay.
    agents.observe(b, &[f32::NAN, 0.0, 0.0, 0.0]).unwrap();
    assert!(
        matches!(agents.act(), Err(AgentsError::Policy(_))),
        "{name}"
    );
    assert_eq!(
        (agents.staged(), agents.tick(), agents.len()),
        (2, 0, 2),
        "{name}"
    );
    // Withdraw b's row by despawning it: a's row stays and acts.
    agents.despawn(b).unwrap();
    assert!(matches!(agents.observe(b, &[0.0; 4]), Err(AgentsError::UnknownAgent(x)) if x == b));
    let c = agents.spawn().unwrap();
    assert_eq!(
        c.env_id(),
        b.env_id(),
        "the free list gives b's env id to the next agent"
    );
    assert_ne!(c, b, "a new generation: b's stale id names nobody");
    let tick = agents.act().unwrap();
    assert_eq!(tick.agents(), &[a]);
    assert!(tick.discrete(a).is_some() && tick.discrete(c).is_none() && tick.discrete(b).is_none());
    // Ids round-trip through an integer (C, C#, GDScript); a forged one is unknown.
    assert_eq!(AgentId::from_bits(a.to_bits()), a);
    assert!(!agents.contains(AgentId::from_bits(a.to_bits() + (7 << 32))));
    // The limit on live agents.
    let mut few = Agents::new(
        CompiledPolicy::load(&bytes, Backend::Cpu).unwrap(),
        AgentsConfig {
            max_agents: 2,
            ..Default::default()
        },
    );
    few.spawn().unwrap();
    let y = few.spawn().unwrap();
    assert!(matches!(
        few.spawn(),
        Err(AgentsError::TooManyAgents { max: 2 })
    ));
    few.despawn(y).unwrap();
    few.spawn().unwrap();
    // No agent observed: no call, an empty tick, no step.
    assert!(few.act().unwrap().is_empty() && few.tick() == 0);
}

/// A mask per agent: forbidden actions are never chosen; agents without one in the same tick act unmasked.
fn agents_masks_reach_the_runtime_per_agent(backend: Backend) {
    masks_per_agent(backend);
}
per_backend!(agents_masks_reach_the_runtime_per_agent);

fn masks_per_agent(backend: Backend) {
    let dir = fixtures_dir().join("sb3").join("maskable_ppo_discrete");
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    let bytes = compile_sb3(
        &std::fs::read(dir.join("model.zip")).unwrap(),
        None,
        "maskable_ppo_discrete",
        Some(&io),
        StorageDType::F32,
    )
    .unwrap();
    let (name, mut agents) = agents_on(&bytes, backend, AgentsConfig::default());
    let n = agents.mask_len();
    let obs_len = agents.obs_len();
    let ids: Vec<AgentId> = (0..8).map(|_| agents.spawn().unwrap()).collect();
    let mut rng = Rng(3);
    for t in 0..50 {
        let mut only = vec![None; ids.len()];
        for (k, id) in ids.iter().enumerate() {
            let obs: Vec<f32> = (0..obs_len).map(|_| rng.below(4) as f32).collect();
            // Odd ticks stage an unmasked row before the first masked one (the rows before it are filled
            // all-allowed when the first mask arrives).
            if (k + t) % 2 == 0 {
                let allowed = rng.below(n);
                let mask: Vec<bool> = (0..n).map(|i| i == allowed).collect();
                agents.observe_masked(*id, &obs, &mask).unwrap();
                only[k] = Some(allowed as i64);
            } else {
                agents.observe(*id, &obs).unwrap();
            }
        }
        // Every fifth tick a masked row and an unmasked row are withdrawn again (the last rows move into
        // their places, masks with them).
        let withdrawn = if t % 5 == 0 {
            vec![t % 2, 1 - t % 2]
        } else {
            vec![]
        };
        for &k in &withdrawn {
            assert!(agents.unobserve(ids[k]));
        }
        let tick = agents.act().unwrap();
        for (k, id) in ids.iter().enumerate() {
            if withdrawn.contains(&k) {
                assert!(
                    tick.discrete(*id).is_none(),
                    "{name}: agent {k} was withdrawn"
                );
            } else if let Some(a) = only[k] {
                assert_eq!(tick.discrete(*id).unwrap()[0], a, "{name}: agent {k}");
            }
        }
    }
}

/// `Agents::auto` times each candidate at the real agent count and returns a fresh instance of the fastest: no
/// agent alive, no tick acted; a candidate that cannot be built is reported and skipped.
#[test]
fn agents_auto_picks_a_timed_candidate_and_returns_it_fresh() {
    let f = load_fixture("cartpole");
    let bytes = compile_fixture(&f);
    let cpu = || -> Result<Agents, AgentsError> {
        Ok(Agents::new(
            CompiledPolicy::load(&bytes, Backend::Cpu)?,
            AgentsConfig::default(),
        ))
    };
    let sandbox = || -> Result<Agents, AgentsError> { sandboxed(&bytes, AgentsConfig::default()) };
    let broken = || -> Result<Agents, AgentsError> {
        Ok(Agents::new(
            CompiledPolicy::load(b"junk", Backend::Cpu)?,
            AgentsConfig::default(),
        ))
    };
    let (chosen, measured) = Agents::auto(&[&cpu, &sandbox, &broken], 100).unwrap();
    assert_eq!(measured.len(), 3);
    assert!(
        measured[0].2.is_ok() && measured[1].2.is_ok(),
        "{measured:?}"
    );
    assert!(matches!(measured[2].2, Err(AgentsError::Unavailable(_))));
    let fastest = measured
        .iter()
        .filter_map(|(i, b, r)| r.as_ref().ok().map(|us| (*i, b.clone(), *us)))
        .min_by(|a, b| a.2.total_cmp(&b.2))
        .unwrap();
    assert_eq!(chosen.backend(), fastest.1);
    assert_eq!((chosen.len(), chosen.tick()), (0, 0), "a fresh instance");
    assert!(Agents::auto(&[&broken], 10).is_err());
}

/// Regression for the per-slot double entry (an act() writes nothing per agent: an agent's staged row becomes its
/// row in the last act's outputs as the tick advances, and the next tick stages into the other entry): the last
/// tick's outputs stay readable by id while the next tick is staged, withdrawn, refused, cleared or acted empty,
/// and go with a despawn; ticks later, an agent that sat ticks out still finds no stale row.
#[test]
fn agents_last_tick_stays_readable_by_id_while_the_next_is_staged() {
    let f = load_fixture("cartpole");
    let bytes = compile_fixture(&f);
    let policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    let config = AgentsConfig {
        deterministic: true,
        ..Default::default()
    };
    let mut agents = Agents::new(policy, config);
    let ids: Vec<AgentId> = (0..4).map(|_| agents.spawn().unwrap()).collect();
    let obs = |k: usize| [0.02 * k as f32, -0.1, 0.03 * k as f32, 0.2 - 0.1 * k as f32];
    // Tick 0: agents 3, 1, 0 (2 sits out).
    for k in [3, 1, 0] {
        agents.observe(ids[k], &obs(k)).unwrap();
    }
    agents.act().unwrap();
    let first: Vec<Option<Vec<i64>>> = ids
        .iter()
        .map(|id| agents.last().discrete(*id).map(<[i64]>::to_vec))
        .collect();
    assert!(first[0].is_some() && first[1].is_some() && first[3].is_some());
    assert_eq!(first[2], None, "agent 2 sat tick 0 out");
    let rows: Vec<Option<usize>> = ids.iter().map(|id| agents.last().row(*id)).collect();
    let unchanged = |agents: &Agents, when: &str| {
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(agents.last().row(*id), rows[k], "agent {k} {when}: its row");
            assert_eq!(
                agents.last().discrete(*id).map(<[i64]>::to_vec),
                first[k],
                "agent {k} {when}"
            );
        }
    };
    // Tick 1 staged in another order, one row withdrawn, one refused observation: tick 0 reads the same.
    for k in [0, 2, 3] {
        agents.observe(ids[k], &obs(k)).unwrap();
    }
    assert!(agents.unobserve(ids[3]));
    assert!(agents.observe(ids[1], &[0.0; 3]).is_err());
    unchanged(&agents, "while tick 1 is staged");
    agents.clear_staged();
    unchanged(&agents, "after tick 1's staging was cleared");
    // Restaged and acted: agents 2 and 0 now; 1 and 3 sat tick 1 out and have no row in it.
    for k in [2, 0] {
        agents.observe(ids[k], &obs(k)).unwrap();
    }
    agents.act().unwrap();
    let tick = agents.last();
    assert_eq!(tick.agents(), &[ids[2], ids[0]]);
    assert_eq!(tick.row(ids[2]), Some(0));
    assert_eq!(tick.row(ids[0]), Some(1));
    assert_eq!(
        tick.row(ids[1]),
        None,
        "agent 1's tick-0 row is not tick 1's"
    );
    assert_eq!(tick.row(ids[3]), None, "agent 3 was withdrawn from tick 1");
    assert_eq!(
        tick.discrete(ids[0]).map(<[i64]>::to_vec),
        first[0],
        "deterministic"
    );
    // Tick 2 with agent 1 alone, then an empty act: no rows at all.
    agents.observe(ids[1], &obs(1)).unwrap();
    agents.act().unwrap();
    assert_eq!(agents.last().row(ids[1]), Some(0));
    assert_eq!(agents.last().row(ids[0]), None, "two ticks later");
    assert_eq!(agents.last().row(ids[2]), None, "two ticks later");
    agents.act().unwrap();
    assert!(agents.last().is_empty());
    assert!(
        ids.iter().all(|id| agents.last().row(*id).is_none()),
        "an empty act"
    );
    // Tick 3: agent 1 staged and despawned (its row withdrawn); its env id's next agent starts clean.
    agents.observe(ids[1], &obs(1)).unwrap();
    agents.observe(ids[0], &obs(0)).unwrap();
    agents.despawn(ids[1]).unwrap();
    let reused = agents.spawn().unwrap();
    assert_eq!(reused.env_id(), ids[1].env_id());
    agents.observe(reused, &obs(1)).unwrap();
    agents.act().unwrap();
    let tick = agents.last();
    assert_eq!(tick.agents(), &[ids[0], reused]);
    assert_eq!(tick.row(ids[1]), None, "a despawned id");
    assert_eq!(tick.row(reused), Some(1));
    assert_eq!(tick.discrete(reused).map(<[i64]>::to_vec), first[1]);
}

/// Regression for `Agents::tick_rows`' bulk staging and its outputs copied as one run of rows (the Godot runner's
/// and the C ABI's tick): on the recurrent policy, with agents spawning, despawning and respawning (episode starts
/// in the bulk rows, some ticks with none), rows staged earlier in the tick by `observe` (the bulk rows then start
/// past them), and refused calls (a duplicate or a dead id in the middle, a short observation, a non-finite one the
/// act refuses) that must stage nothing and leave the last outputs as they were, every agent's actions and values equal those of the same
/// agents observed one by one in another `Agents`.
#[test]
fn tick_rows_in_bulk_gives_what_observing_one_by_one_gives() {
    let (bytes, config, _) = churn_reference();
    let policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    let (mut one_by_one, mut bulk) = (
        Agents::new(policy.clone(), config),
        Agents::new(policy, config),
    );
    let mut rng = Rng(41);
    let mut alive: Vec<AgentId> = vec![];
    let mut out = policyport_agents::RowOutputs::default();
    let (mut refused, mut with_earlier_rows, mut starts) = (0, 0, 0);
    for t in 0..80 {
        if alive.len() < 16 && rng.below(2) == 0 || alive.len() < 3 {
            for _ in 0..1 + rng.below(3) {
                let id = one_by_one.spawn().unwrap();
                assert_eq!(bulk.spawn().unwrap(), id, "the same ids in the same order");
                alive.push(id);
                starts += 1;
            }
        }
        if alive.len() > 4 && rng.below(4) == 0 {
            let id = alive.swap_remove(rng.below(alive.len()));
            one_by_one.despawn(id).unwrap();
            bulk.despawn(id).unwrap();
        }
        if rng.below(4) == 0 {
            let id = alive[rng.below(alive.len())];
            one_by_one.respawn(id).unwrap();
            bulk.respawn(id).unwrap();
            starts += 1;
        }
        let mut observed: Vec<AgentId> = alive
            .iter()
            .copied()
            .filter(|_| rng.below(5) != 0)
            .collect();
        rng.shuffle(&mut observed);
        let obs: Vec<f32> = (0..observed.len() * 4)
            .map(|i| rng.unit() * (1 + i % 4) as f32 * 0.5)
            .collect();
        for (k, id) in observed.iter().enumerate() {
            one_by_one.observe(*id, &obs[k * 4..k * 4 + 4]).unwrap();
        }
        one_by_one.act().unwrap();
        // Some rows first by observe(), the rest in one tick_rows.
        let early = if observed.len() > 2 && rng.below(3) == 0 {
            1 + rng.below(observed.len() - 1)
        } else {
            0
        };
        for (k, id) in observed[..early].iter().enumerate() {
            bulk.observe(*id, &obs[k * 4..k * 4 + 4]).unwrap();
        }
        with_earlier_rows += usize::from(early > 0);
        let rest = &observed[early..];
        if rest.len() > 1 && rng.below(3) == 0 {
            let before = out.clone();
            let dead = AgentId::from_bits(u64::MAX - 5);
            let mut dup = rest.to_vec();
            dup[rest.len() - 1] = rest[0];
            let mut with_dead = rest.to_vec();
            with_dead.insert(rest.len() / 2, dead);
            let p = early * 4 + rest.len() / 2 * 4;
            let obs_dead = [&obs[early * 4..p], &[0.0; 4][..], &obs[p..]].concat();
            // Staged, then refused by the act itself (a whole tick's rows are acted on where they are, not
            // copied: the refusal must withdraw them all the same).
            let mut obs_nan = obs[early * 4..].to_vec();
            obs_nan[rest.len() / 2 * 4 + 1] = f32::NAN;
            for (what, ids, o) in [
                ("a duplicate id", &dup[..], &obs[early * 4..]),
                ("a dead id in the middle", &with_dead[..], &obs_dead[..]),
                ("a short observation", rest, &obs[early * 4..obs.len() - 1]),
                ("a non-finite observation", rest, &obs_nan[..]),
            ] {
                assert!(
                    bulk.tick_rows(ids, o, None, &mut out).is_err(),
                    "tick {t}: {what}"
                );
                assert_eq!(bulk.staged(), early, "tick {t}: {what} staged nothing");
                assert_eq!(
                    out, before,
                    "tick {t}: {what} left the outputs as they were"
                );
            }
            refused += 1;
        }
        bulk.tick_rows(rest, &obs[early * 4..], None, &mut out)
            .unwrap();
        let last = one_by_one.last();
        for (k, id) in rest.iter().enumerate() {
            assert_eq!(
                out.discrete[k..k + 1],
                *last.discrete(*id).unwrap(),
                "tick {t}: agent {id}'s action"
            );
            assert_eq!(
                out.value[k],
                last.value(*id).unwrap(),
                "tick {t}: agent {id}'s value"
            );
        }
        let bulk_last = bulk.last();
        for id in &observed[..early] {
            assert_eq!(
                bulk_last.discrete(*id),
                last.discrete(*id),
                "tick {t}: agent {id} observed first"
            );
        }
    }
    assert!(
        refused > 5 && with_earlier_rows > 5 && starts > 20,
        "{refused} refusals, {with_earlier_rows} ticks with earlier rows, {starts} starts"
    );
}
