//! Recurrent state plumbing on every backend: per-env state in, next state out, env ids honoured, resets zero.
//! The model is a hand-built Elman cell (dense + dense + add + tanh) checked against a float64 loop here.

use std::collections::BTreeMap;

use policyport::{
    ActMode, Backend, CompiledPolicy, EnvIdError, EnvIds, Observations, PolicyError, Request,
    StateError,
};
use policyport_format::container::{StorageDType, Tensor};
use policyport_format::*;

fn node(name: &str, op: Op, inputs: &[&str]) -> Node {
    Node {
        name: name.into(),
        op,
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        output: name.into(),
    }
}

fn weights(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.8)
        .collect()
}

pub(crate) fn elman() -> (Vec<u8>, BTreeMap<String, Tensor>) {
    let mut t = BTreeMap::new();
    t.insert("wx".to_string(), Tensor::new(vec![4, 3], weights(12, 0.1)));
    t.insert("bx".to_string(), Tensor::new(vec![4], weights(4, 0.2)));
    t.insert("wh".to_string(), Tensor::new(vec![4, 4], weights(16, 0.3)));
    t.insert("wp".to_string(), Tensor::new(vec![2, 4], weights(8, 0.4)));
    let manifest = Manifest {
        name: "elman".into(),
        producer: Producer {
            tool: "test".into(),
            version: "0".into(),
            source: "hand-built".into(),
            notes: String::new(),
        },
        observation: ObservationSpace::Box {
            shape: vec![3],
            dtype: ObsDType::F32,
        },
        action: ActionSpace::Discrete { n: 2 },
        preprocess: vec![],
        modules: vec![
            Module {
                name: "core".into(),
                role: ModuleRole::RecurrentCore,
                inputs: vec!["obs".into(), "state/h".into()],
                outputs: vec!["h1".into()],
                nodes: vec![
                    node(
                        "dx",
                        Op::Dense {
                            weight: "wx".into(),
                            bias: Some("bx".into()),
                        },
                        &["obs"],
                    ),
                    node(
                        "dh",
                        Op::Dense {
                            weight: "wh".into(),
                            bias: None,
                        },
                        &["state/h"],
                    ),
                    node("s", Op::Add, &["dx", "dh"]),
                    node("h1", Op::Tanh, &["s"]),
                ],
            },
            Module {
                name: "pi".into(),
                role: ModuleRole::PolicyHead,
                inputs: vec!["h1".into()],
                outputs: vec!["logits".into()],
                nodes: vec![node(
                    "logits",
                    Op::Dense {
                        weight: "wp".into(),
                        bias: None,
                    },
                    &["h1"],
                )],
            },
        ],
        distribution: Distribution::Categorical {
            logits: "logits".into(),
        },
        value: None,
        recurrent: Some(RecurrentSpec {
            states: vec![StateSpec {
                name: "h".into(),
                shape: vec![4],
                next: "h1".into(),
            }],
        }),
        golden: vec![],
        action_masks: false,
    };
    (
        write_artifact(&manifest, &t, &|_| StorageDType::F32).unwrap(),
        t,
    )
}

/// One float64 step of the cell: (next h, logits).
pub(crate) fn step64(t: &BTreeMap<String, Tensor>, x: &[f32], h: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let w = |n: &str| t[n].data.iter().map(|v| *v as f64).collect::<Vec<_>>();
    let (wx, bx, wh, wp) = (w("wx"), w("bx"), w("wh"), w("wp"));
    let h1: Vec<f64> = (0..4)
        .map(|j| {
            let mut s = bx[j];
            for i in 0..3 {
                s += wx[j * 3 + i] * x[i] as f64;
            }
            for i in 0..4 {
                s += wh[j * 4 + i] * h[i];
            }
            s.tanh()
        })
        .collect();
    let logits = (0..2)
        .map(|a| (0..4).map(|i| wp[a * 4 + i] * h1[i]).sum())
        .collect();
    (h1, logits)
}

fn recurrent_state_is_per_env_and_carried_between_steps(backend: Backend) {
    let (bytes, t) = elman();
    let policy = policyport_conformance::load(&bytes, backend).unwrap();
    assert_eq!(policy.info().recurrent_states, 1);
    let mut s = policy.session();
    s.set_max_envs(3);
    let obs = [0.5f32, -0.2, 0.1, 0.3, 0.3, -0.7];
    // Env ids past the session's limit: a typed error, nothing allocated.
    assert!(matches!(
        s.act(
            &Request::new(Observations::F32(&obs), 2, ActMode::Deterministic)
                .envs(EnvIds::List(&[0, 3]))
        ),
        Err(PolicyError::EnvIds(EnvIdError::BeyondLimit {
            env: 3,
            limit: 3
        }))
    ));
    assert_eq!(s.num_envs(), 0);
    let mut h = [vec![0.0f64; 4], vec![0.0f64; 4], vec![0.0f64; 4]];
    for step in 0..4u64 {
        let x: Vec<f32> = obs.iter().map(|v| v * (1.0 + step as f32)).collect();
        let out = s
            .act(
                &Request::new(Observations::F32(&x), 2, ActMode::Sample { seed: 3, step })
                    .envs(EnvIds::List(&[2, 0])),
            )
            .unwrap()
            .clone();
        for (row, env) in [(0usize, 2usize), (1, 0)] {
            let (h1, logits) = step64(&t, &x[row * 3..row * 3 + 3], &h[env]);
            h[env] = h1;
            for a in 0..2 {
                assert!(
                    (out.dist_params[row * 2 + a] as f64 - logits[a]).abs() < 1e-5,
                    "{backend:?} step {step}"
                );
            }
            for i in 0..4 {
                assert!((s.state(0, env as u32).unwrap()[i] as f64 - h[env][i]).abs() < 1e-5);
            }
        }
        assert_eq!(s.state(0, 1).unwrap(), &[0.0; 4], "env 1 never stepped");
    }
    s.reset(&[2]).unwrap();
    assert_eq!(s.state(0, 2).unwrap(), &[0.0; 4]);
    assert_ne!(s.state(0, 0).unwrap(), &[0.0; 4]);
    assert!(matches!(
        s.reset(&[7]),
        Err(PolicyError::EnvIds(EnvIdError::BeyondLimit { .. }))
    ));
    assert!(matches!(
        s.state(1, 0),
        Err(PolicyError::State(StateError::NoSuchTensor { .. }))
    ));
}
per_backend!(recurrent_state_is_per_env_and_carried_between_steps);

/// The state model's episode-start mask (SB3's `episode_starts`): a flagged row's state is zeroed before the
/// step, the others carry on, exactly as if `reset` had been called first — on every backend.
fn episode_starts_zero_the_state_before_the_step_on_every_backend(backend: Backend) {
    let (bytes, t) = elman();
    let obs = [0.5f32, -0.2, 0.1, 0.3, 0.3, -0.7];
    let policy = policyport_conformance::load(&bytes, backend).unwrap();
    let (mut masked, mut reset) = (policy.session(), policy.session());
    let mut h = [vec![0.0f64; 4], vec![0.0f64; 4]];
    for step in 0..5u64 {
        let x: Vec<f32> = obs.iter().map(|v| v * (1.0 + step as f32)).collect();
        // Env 1 starts an episode at steps 2 and 4, env 0 at step 3.
        let starts = [step == 3, step == 2 || step == 4];
        let req = Request::new(Observations::F32(&x), 2, ActMode::Sample { seed: 9, step })
            .envs(EnvIds::List(&[0, 1]));
        let a = masked.act(&req.episode_starts(&starts)).unwrap().clone();
        let ids: Vec<u32> = (0..2u32).filter(|e| starts[*e as usize]).collect();
        reset.reset(&ids).unwrap();
        let b = reset.act(&req).unwrap().clone();
        assert_eq!(a, b, "{backend:?} step {step}: mask and reset disagree");
        for env in 0..2 {
            if starts[env] {
                h[env] = vec![0.0; 4];
            }
            let (h1, logits) = step64(&t, &x[env * 3..env * 3 + 3], &h[env]);
            h[env] = h1;
            for k in 0..2 {
                assert!(
                    (a.dist_params[env * 2 + k] as f64 - logits[k]).abs() < 1e-5,
                    "{backend:?} step {step} env {env}"
                );
            }
        }
    }
    // The mask must have one flag per row.
    let req = Request::new(Observations::F32(&obs), 2, ActMode::Deterministic);
    assert!(matches!(
        masked.act(&req.episode_starts(&[true])),
        Err(PolicyError::State(StateError::EpisodeStarts {
            found: 1,
            batch: 2
        }))
    ));
}
per_backend!(episode_starts_zero_the_state_before_the_step_on_every_backend);

/// Regression (one env-id rule for every runtime): a recurrent batch naming one env twice was refused on wgpu and
/// libtorch, but on cpu, flex and the wasm plugin the second row's next state silently overwrote the first's.
/// Now every runtime refuses it with the same typed error and changes no state: one test per backend of
/// `backends()` (cpu, flex, wgpu, libtorch, wasmtime), and the sandboxed plugin through its ABI (the next test).
fn a_recurrent_batch_naming_one_env_twice_is_refused_everywhere(backend: Backend) {
    let (bytes, _) = elman();
    let obs = [0.5f32, -0.2, 0.1, 0.3, 0.3, -0.7, 0.1, 0.2, 0.3];
    let dup = [2u32, 0, 2];
    let mut p = policyport_conformance::load(&bytes, backend)
        .unwrap()
        .session();
    p.act(
        &Request::new(Observations::F32(&obs[..6]), 2, ActMode::Deterministic)
            .envs(EnvIds::List(&[2, 0])),
    )
    .unwrap();
    let before: Vec<Vec<f32>> = (0..3u32).map(|e| p.state(0, e).unwrap().to_vec()).collect();
    let err = p
        .act(
            &Request::new(Observations::F32(&obs), 3, ActMode::Deterministic)
                .envs(EnvIds::List(&dup)),
        )
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::EnvIds(EnvIdError::Duplicate { env: 2 })),
        "{backend:?}: {err}"
    );
    assert!(err.to_string().contains("env 2 appears twice"), "{err}");
    let after: Vec<Vec<f32>> = (0..3u32).map(|e| p.state(0, e).unwrap().to_vec()).collect();
    assert_eq!(
        before, after,
        "{backend:?}: a refused batch changed the state"
    );
}
per_backend!(a_recurrent_batch_naming_one_env_twice_is_refused_everywhere);

/// The browser suite runs this recurrent policy too (`tests/browser/run.mjs`: per-env state, episode starts and
/// the duplicate-env rule through the JS API, on cpu-wasm and WebGPU): its bytes and a scripted episode with
/// float64 answers are committed under `tests/expected/` and must equal what this code makes (re-blessed only
/// with POLICYPORT_BLESS=1, never under CI). The cpu backend is checked against the same answers here.
#[test]
fn the_recurrent_policy_and_its_float64_answers_are_committed_for_the_browser() {
    let (bytes, t) = elman();
    let dir = policyport_conformance::package_dir().join("expected");
    policyport_conformance::assert_snapshot_bytes(&dir.join("elman.policy"), &bytes);
    let obs = [0.5f32, -0.2, 0.1, 0.3, 0.3, -0.7];
    let ids = [2u32, 0];
    let mut h = [vec![0.0f64; 4], vec![0.0f64; 4]];
    let mut s = CompiledPolicy::load(&bytes, policyport::Backend::Cpu)
        .unwrap()
        .session();
    let mut steps = vec![];
    for step in 0..6u64 {
        let x: Vec<f32> = obs.iter().map(|v| v * (1.0 + step as f32)).collect();
        // Env 2 (row 0) starts an episode at step 3, env 0 (row 1) at step 4.
        let starts = [step == 3, step == 4];
        let mut logits = vec![];
        for row in 0..2 {
            if starts[row] {
                h[row] = vec![0.0; 4];
            }
            let (h1, l) = step64(&t, &x[row * 3..row * 3 + 3], &h[row]);
            h[row] = h1;
            logits.extend(l);
        }
        let got = s
            .act(
                &Request::new(Observations::F32(&x), 2, ActMode::Deterministic)
                    .envs(EnvIds::List(&ids))
                    .episode_starts(&starts),
            )
            .unwrap();
        assert_eq!(got.dist_params.len(), logits.len());
        for (a, b) in got.dist_params.iter().zip(&logits) {
            assert!((*a as f64 - b).abs() < 1e-5, "step {step}: {a} vs {b}");
        }
        steps.push(serde_json::json!({
            "obs": x,
            "envIds": ids,
            "episodeStarts": starts.map(u8::from),
            "logits": logits,
        }));
    }
    let doc = serde_json::json!({
        "what": "elman.policy (tests/conformance/recurrent.rs: elman()), deterministic acts in order; logits in float64",
        "steps": steps,
    });
    policyport_conformance::assert_snapshot(
        &dir.join("elman.steps.json"),
        &serde_json::to_string_pretty(&doc).unwrap(),
    );
}

/// A trainer's recurrent rollout (`sequence.json`, written by tests/fixtures/generate_sb3.py and
/// generate_cleanrl.py): N envs over T steps with random episode starts, the trainer's network run over each
/// sequence in float64, and the trainer's own deterministic actions stepped one observation at a time.
#[derive(serde::Deserialize)]
struct Rollout {
    envs: usize,
    tolerance: f64,
    steps: Vec<RolloutStep>,
}

#[derive(serde::Deserialize)]
struct RolloutStep {
    obs: Vec<f32>,
    episode_starts: Vec<bool>,
    expected: BTreeMap<String, Vec<f64>>,
    trainer_actions: Vec<f64>,
}

/// Every recurrent trainer fixture compiled by its own route: (name, artifact bytes, rollout). Compiled once for
/// the whole run: the two tests that step them run once per backend.
fn recurrent_trainer_fixtures() -> &'static [(String, Vec<u8>, Rollout)] {
    static FIXTURES: std::sync::OnceLock<Vec<(String, Vec<u8>, Rollout)>> =
        std::sync::OnceLock::new();
    FIXTURES.get_or_init(compile_recurrent_trainer_fixtures)
}

fn compile_recurrent_trainer_fixtures() -> Vec<(String, Vec<u8>, Rollout)> {
    use policyport_import::{CleanrlLayout, StorageDType, compile_cleanrl, compile_sb3};
    let dir = policyport_conformance::fixtures_dir();
    let mut out = vec![];
    let mut sb3: Vec<_> = std::fs::read_dir(dir.join("sb3"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("sequence.json").exists())
        .collect();
    sb3.sort();
    for p in sb3 {
        let name = format!("sb3/{}", p.file_name().unwrap().to_string_lossy());
        let bytes = compile_sb3(
            &std::fs::read(p.join("model.zip")).unwrap(),
            None,
            &name,
            None,
            StorageDType::F32,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let rollout =
            serde_json::from_slice(&std::fs::read(p.join("sequence.json")).unwrap()).unwrap();
        out.push((name, bytes, rollout));
    }
    let p = dir.join("cleanrl/ppo_atari_lstm");
    let spaces: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.join("spaces.json")).unwrap()).unwrap();
    let bytes = compile_cleanrl(
        &std::fs::read(p.join("agent.pt")).unwrap(),
        CleanrlLayout::AtariLstm,
        serde_json::from_value(spaces["observation"].clone()).unwrap(),
        serde_json::from_value(spaces["action"].clone()).unwrap(),
        "cleanrl/ppo_atari_lstm",
        None,
        StorageDType::F32,
    )
    .unwrap();
    let rollout = serde_json::from_slice(&std::fs::read(p.join("sequence.json")).unwrap()).unwrap();
    out.push(("cleanrl/ppo_atari_lstm".into(), bytes, rollout));
    for name in ["lstm_policy", "gru_policy_dynamo"] {
        let f = policyport_conformance::load_fixture(name);
        let bytes = policyport_conformance::compile_fixture(&f);
        let rollout =
            serde_json::from_slice(&std::fs::read(dir.join(name).join("sequence.json")).unwrap())
                .unwrap();
        out.push((format!("onnx/{name}"), bytes, rollout));
    }
    let p = dir.join("rllib/ppo_lstm_cartpole");
    let bytes = policyport_import::compile_rllib(
        &p.join("checkpoint"),
        "rllib/ppo_lstm_cartpole",
        None,
        StorageDType::F32,
    )
    .unwrap();
    let rollout = serde_json::from_slice(&std::fs::read(p.join("sequence.json")).unwrap()).unwrap();
    out.push(("rllib/ppo_lstm_cartpole".into(), bytes, rollout));
    out
}

/// Issue 14's recurrent property, against the trainers themselves: stepping the compiled policy one observation
/// at a time, with the rollout's episode starts as the request's mask, equals the trainer's network run over the
/// whole sequence (SB3: `nn.LSTM` over each episode segment; CleanRL: its `get_states` loop), on every backend,
/// within the fixture's tolerance at every step — and the deterministic actions equal the trainer's own
/// (RecurrentPPO's `predict(obs, state, episode_start)`, CleanRL's argmax) at every step.
fn trainer_rollouts_step_like_the_trainers_sequences_on_every_backend(backend: Backend) {
    let fixtures = recurrent_trainer_fixtures();
    let names: Vec<&str> = fixtures.iter().map(|f| f.0.as_str()).collect();
    for want in [
        "sb3/recurrent_ppo_cartpole",
        "sb3/recurrent_ppo_pendulum_shared_2layers",
        "sb3/recurrent_ppo_cnn_frames",
        "cleanrl/ppo_atari_lstm",
        "rllib/ppo_lstm_cartpole",
        "onnx/lstm_policy",
        "onnx/gru_policy_dynamo",
    ] {
        assert!(
            names.contains(&want),
            "recurrent fixture {want} missing: {names:?}"
        );
    }
    let mut table = vec![];
    for (name, bytes, rollout) in fixtures {
        let policy = policyport_conformance::load(bytes, backend)
            .unwrap_or_else(|e| panic!("{name} on {}: {e}", backend.name()));
        assert!(policy.info().recurrent_states > 0, "{name}");
        let mut s = policy.session();
        let (mut worst_params, mut worst_value) = (0.0f64, 0.0f64);
        for (t, step) in rollout.steps.iter().enumerate() {
            let req = Request::new(
                Observations::F32(&step.obs),
                rollout.envs,
                ActMode::Deterministic,
            )
            .episode_starts(&step.episode_starts);
            let out = s
                .act(&req)
                .unwrap_or_else(|e| panic!("{name} step {t}: {e}"));
            let want_params: Vec<f64> = ["logits", "mean", "log_std"]
                .iter()
                .filter_map(|k| step.expected.get(*k))
                .fold(vec![], |mut v, p| {
                    v.extend(p);
                    v
                });
            // dist_params is per row [mean.., log_std..]; the fixture has all means, then all log-stds.
            let got_params: Vec<f32> = if step.expected.contains_key("mean") {
                let k = out.dist_params.len() / rollout.envs / 2;
                let rows = out.dist_params.chunks(2 * k);
                rows.clone()
                    .flat_map(|r| r[..k].to_vec())
                    .chain(rows.flat_map(|r| r[k..].to_vec()))
                    .collect()
            } else {
                out.dist_params.clone()
            };
            let e = policyport::rel_err(&got_params, &want_params);
            let v = policyport::rel_err(&out.value, &step.expected["value"]);
            worst_params = worst_params.max(e);
            worst_value = worst_value.max(v);
            assert!(
                e <= rollout.tolerance && v <= rollout.tolerance,
                "{name} on {} step {t} (starts {:?}): params rel err {e:.2e}, value {v:.2e}",
                backend.name(),
                step.episode_starts
            );
            policyport_conformance::assert_trainer_actions(
                out,
                &step.trainer_actions,
                &format!("{name} on {} step {t}", backend.name()),
            );
        }
        table.push(format!(
            "{name:<44} {:<8} {} steps x {} envs  params max rel err {worst_params:.2e}  value {worst_value:.2e}",
            backend.name(),
            rollout.steps.len(),
            rollout.envs
        ));
    }
    println!("{}", table.join("\n"));
}
per_backend!(trainer_rollouts_step_like_the_trainers_sequences_on_every_backend);

/// Random episode boundaries, env ids in shuffled subsets and orders, on every backend: each step's outputs and
/// each env's state equal the float64 reference interpreter stepped env by env with its own state map (a start
/// zeroes that env's state first). Seeded, 6 patterns × 10 steps, on two real recurrent policies (one LSTM per
/// head over 1 layer; a 2-layer LSTM shared by both heads).
fn random_episode_boundaries_step_like_the_reference_on_every_backend(backend: Backend) {
    use policyport_format::philox::{Stream, u01};
    let fixtures = recurrent_trainer_fixtures();
    for (name, bytes, _) in fixtures
        .iter()
        .filter(|f| !f.0.contains("frames") && !f.0.contains("atari"))
    {
        let art = policyport_format::read_artifact(bytes).unwrap();
        let m = &art.manifest;
        let specs = &m.recurrent.as_ref().unwrap().states;
        let raw = m.observation.raw_len();
        let policy = policyport_conformance::load(bytes, backend).unwrap();
        let mut s = policy.session();
        s.set_max_envs(6);
        // Per env: its states (float64), zeros until stepped.
        let mut state: Vec<Vec<Vec<f64>>> = (0..6)
            .map(|_| {
                specs
                    .iter()
                    .map(|sp| vec![0.0; sp.shape.iter().product()])
                    .collect()
            })
            .collect();
        for pattern in 0..6u64 {
            for step in 0..10u64 {
                let mut rs = Stream::new(pattern, step as u32, 77);
                let mut w = 0;
                let mut draw = || {
                    w += 1;
                    u01(rs.word(w))
                };
                // A shuffled subset of the 6 envs, 1..=6 rows.
                let mut ids: Vec<u32> = (0..6).collect();
                for i in (1..ids.len()).rev() {
                    ids.swap(i, (draw() * (i + 1) as f32) as usize % (i + 1));
                }
                ids.truncate(1 + (draw() * 6.0) as usize % 6);
                let batch = ids.len();
                let starts: Vec<bool> = ids.iter().map(|_| draw() < 0.3).collect();
                let obs: Vec<f32> = (0..batch * raw).map(|_| (draw() - 0.5) * 4.0).collect();
                let req = Request::new(Observations::F32(&obs), batch, ActMode::Deterministic)
                    .envs(EnvIds::List(&ids))
                    .episode_starts(&starts);
                let out = s.act(&req).unwrap().clone();
                for (row, &env) in ids.iter().enumerate() {
                    if starts[row] {
                        state[env as usize]
                            .iter_mut()
                            .for_each(|v| v.iter_mut().for_each(|x| *x = 0.0));
                    }
                    let vals = policyport_import::reference::eval_step(
                        m,
                        &art.tensors,
                        &obs[row * raw..(row + 1) * raw],
                        1,
                        &state[env as usize],
                    )
                    .unwrap();
                    state[env as usize] = specs.iter().map(|sp| vals[&sp.next].clone()).collect();
                    // One number: its error relative to max(|value|, 1) (a value can pass near zero).
                    let want_value = vals[m.value.as_deref().unwrap()][0];
                    let e = (out.value[row] as f64 - want_value).abs() / want_value.abs().max(1.0);
                    assert!(
                        e < 1e-5,
                        "{name} on {} pattern {pattern} step {step}: value {e:.2e}",
                        backend.name()
                    );
                }
                // Every env's state, stepped or not, equals the reference's.
                for env in 0..6u32 {
                    for (k, want) in state[env as usize].iter().enumerate() {
                        if (env as usize) >= s.num_envs() {
                            assert!(want.iter().all(|v| *v == 0.0));
                            continue;
                        }
                        let got = s.state(k, env).unwrap();
                        let scale = want.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
                        for (g, w) in got.iter().zip(want) {
                            assert!(
                                (*g as f64 - w).abs() <= 1e-5 * scale,
                                "{name} on {} pattern {pattern} step {step} env {env} state {k}: {g} vs {w}",
                                backend.name()
                            );
                        }
                    }
                }
            }
        }
    }
}
per_backend!(random_episode_boundaries_step_like_the_reference_on_every_backend);

/// Caller-owned state (`Session::write_state` / `states_of`, what RLlib's STATE_IN / STATE_OUT and SB3's
/// `predict(obs, state)` need): writing an env's state and stepping equals stepping the float64 loop from that
/// state, on every backend that keeps state where it can be written (host rows, wgpu, libtorch); the sandboxed
/// plugin, whose state lives inside the guest, refuses with a typed error and changes nothing. Bad writes (count,
/// widths, duplicates, NaN, the env limit, a feed-forward policy) are typed errors that change nothing.
fn caller_owned_state_is_written_and_read_back_on_every_backend(backend: Backend) {
    let (bytes, t) = elman();
    let x = [0.4f32, -0.3, 0.2, -0.1, 0.6, 0.05];
    let h_in = [vec![0.3f32, -0.2, 0.1, 0.5], vec![-0.6f32, 0.25, 0.0, -0.1]];
    let policy = policyport_conformance::load(&bytes, backend).unwrap();
    let mut s = policy.session();
    s.set_max_envs(8);
    let flat: Vec<f32> = h_in.concat();
    let w = s.write_state(&[5, 1], &[&flat]);
    if backend == Backend::Wasmtime {
        assert!(
            matches!(
                w,
                Err(PolicyError::Backend(policyport::BackendError::Unsupported(
                    _
                )))
            ),
            "{w:?}"
        );
        assert_eq!(
            s.states_of(&[5]).unwrap(),
            vec![vec![0.0; 4]],
            "a refused write changed the state"
        );
        return;
    }
    w.unwrap();
    assert_eq!(
        s.states_of(&[5, 1, 3]).unwrap(),
        vec![[flat.clone(), vec![0.0; 4]].concat()]
    );
    let out = s
        .act(
            &Request::new(Observations::F32(&x), 2, ActMode::Deterministic)
                .envs(EnvIds::List(&[5, 1])),
        )
        .unwrap()
        .clone();
    let next = s.states_of(&[5, 1]).unwrap();
    for row in 0..2 {
        let h64: Vec<f64> = h_in[row].iter().map(|v| *v as f64).collect();
        let (h1, logits) = step64(&t, &x[row * 3..row * 3 + 3], &h64);
        for a in 0..2 {
            assert!(
                (out.dist_params[row * 2 + a] as f64 - logits[a]).abs() < 1e-5,
                "{backend:?}"
            );
        }
        for i in 0..4 {
            assert!(
                (next[0][row * 4 + i] as f64 - h1[i]).abs() < 1e-5,
                "{backend:?} row {row}"
            );
        }
    }
    let before = s.states_of(&[5, 1]).unwrap();
    let bad: [(&[u32], Vec<&[f32]>); 5] = [
        (&[5], vec![]),                               // no tensor
        (&[5], vec![&flat[..3]]),                     // too short
        (&[5, 5], vec![&flat[..]]),                   // duplicate env
        (&[8], vec![&flat[..4]]),                     // beyond the session's limit
        (&[5], vec![&[f32::NAN, 0.0, 0.0, 0.0][..]]), // not finite
    ];
    for (envs, vals) in bad {
        assert!(s.write_state(envs, &vals).is_err(), "{backend:?} {envs:?}");
    }
    assert_eq!(
        s.states_of(&[5, 1]).unwrap(),
        before,
        "{backend:?}: a refused write changed the state"
    );
}
per_backend!(caller_owned_state_is_written_and_read_back_on_every_backend);

/// A feed-forward policy has no state to write: a typed error (the cpu backend).
#[test]
fn caller_owned_state_on_a_feed_forward_policy_is_a_typed_error() {
    let mlp =
        policyport_conformance::compile_fixture(&policyport_conformance::load_fixture("mlp64"));
    let ff = policyport_conformance::load(&mlp, policyport::Backend::Cpu).unwrap();
    assert!(matches!(
        ff.session().write_state(&[0], &[]),
        Err(PolicyError::State(StateError::NotRecurrent))
    ));
}
