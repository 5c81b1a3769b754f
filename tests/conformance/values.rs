//! `Request::skip_value`: a caller that does not want the value estimate (a game acting with a trained policy)
//! gets the same actions, distribution parameters and recurrent state as one that does, no value, and — where
//! the executor skips the critic's own layers (the cpu backend, and the sandbox's guest) — no work for it. A
//! value left out is not an output: a critic that overflows does not refuse the act.

use policyport::lower::{lower, needed_without_readback, step_readback};
use policyport::{
    ActMode, Backend, CompiledPolicy, EnvIds, Observations, PolicyError, Request, Session,
};
use policyport_conformance::{compile_fixture, fixtures_dir, load, load_fixture};
use policyport_import::{FixtureIo, StorageDType, compile_sb3};

use crate::bad_input::{dense, hostile_artifact, policy_json};

/// An SB3 fixture's archive, compiled with its recorded outputs as golden cases.
fn sb3(name: &str) -> Vec<u8> {
    let dir = fixtures_dir().join("sb3").join(name);
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    compile_sb3(
        &std::fs::read(dir.join("model.zip")).unwrap(),
        None,
        name,
        Some(&io),
        StorageDType::F32,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Policies with a value of every shape the runtime has: separate actor and critic MLPs (the CleanRL-style ONNX
/// fixture, SB3's PPO), a recurrent core (an LSTM whose state both heads read), a Gaussian head behind
/// VecNormalize, and a CNN encoder shared by both heads on uint8 frames.
fn policies_with_a_value() -> Vec<(String, Vec<u8>)> {
    let mut all = vec![(
        "cartpole".to_string(),
        compile_fixture(&load_fixture("cartpole")),
    )];
    for name in [
        "ppo_cartpole",
        "recurrent_ppo_cartpole",
        "ppo_pendulum_vecnormalize",
        "ppo_cnn_frames",
    ] {
        all.push((name.to_string(), sb3(name)));
    }
    all
}

/// Two sessions fed the same requests, one of them without the value: everything but the value is the same bits.
fn skipping_the_value_changes_nothing_else(backend: Backend) {
    for (name, bytes) in policies_with_a_value() {
        let policy = load(&bytes, backend).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(policy.info().has_value, "{name} has a value");
        let (mut with, mut without) = (Session::new(policy.clone()), Session::new(policy.clone()));
        let (batch, obs_len) = (3, policy.info().obs_len);
        let ids = [4u32, 0, 9];
        for step in 0..3u64 {
            // Whole numbers 0..255: valid observations of float and uint8-frame policies alike.
            let obs: Vec<f32> = (0..batch * obs_len)
                .map(|i| ((i * 7919 + step as usize * 31) % 256) as f32)
                .collect();
            let starts = [step == 0, false, step == 2];
            let req = Request::new(
                Observations::F32(&obs),
                batch,
                ActMode::Sample { seed: 11, step },
            )
            .envs(EnvIds::List(&ids))
            .episode_starts(&starts);
            let a = with
                .act(&req)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .clone();
            let b = without
                .act(&req.skip_value())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .clone();
            let what = format!("{name} on {backend:?}, step {step}");
            assert_eq!(a.value.len(), batch, "{what}: the value when asked for");
            assert!(b.value.is_empty(), "{what}: no value when skipped");
            assert_eq!(a.discrete, b.discrete, "{what}: discrete actions");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&a.continuous),
                bits(&b.continuous),
                "{what}: continuous actions"
            );
            assert_eq!(
                bits(&a.dist_params),
                bits(&b.dist_params),
                "{what}: distribution parameters"
            );
            if policy.info().recurrent_states > 0 {
                assert_eq!(
                    with.states_of(&ids).unwrap(),
                    without.states_of(&ids).unwrap(),
                    "{what}: the next recurrent state"
                );
            }
        }
    }
}
per_backend!(skipping_the_value_changes_nothing_else);

/// A critic that overflows (weights near f32::MAX times an observation of 10) refuses the act that asks for its
/// value, as every non-finite output does, and not one that leaves the value out: there it is not an output.
fn a_skipped_value_is_not_an_output_that_can_refuse_the_act(backend: Backend) {
    let mut manifest = policy_json(
        serde_json::json!({"kind": "box", "shape": [2], "dtype": "f32"}),
        serde_json::json!([]),
        serde_json::json!([dense("obs", "w", "logits")]),
        serde_json::json!({"kind": "discrete", "n": 2}),
        serde_json::json!({"kind": "categorical", "logits": "logits"}),
    );
    manifest["modules"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": "vf", "role": "value_head", "inputs": ["obs"], "outputs": ["v"],
            "nodes": [dense("obs", "wv", "v")]
        }));
    manifest["value"] = serde_json::json!("v");
    let bytes = hostile_artifact(
        manifest,
        &[
            ("w", vec![2, 2], vec![1.0, 0.0, 0.0, 1.0]),
            ("wv", vec![1, 2], vec![3e38, 3e38]),
        ],
    );
    let p = load(&bytes, backend).expect("finite at the zero warm-up observation");
    let mut s = Session::new(p);
    let obs = [10.0f32, 12.0];
    let req = Request::new(Observations::F32(&obs), 1, ActMode::Deterministic);
    match s.act(&req) {
        Err(PolicyError::NonFiniteOutput { .. }) => {}
        Err(e) if backend == Backend::Wasmtime && e.to_string().contains("non-finite") => {}
        other => panic!("{backend:?}: an infinite value answered {other:?}"),
    }
    let out = s
        .act(&req.skip_value())
        .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    assert_eq!(out.discrete, [1], "{backend:?}: argmax of (10, 12)");
    assert!(out.value.is_empty(), "{backend:?}");
    assert_eq!(out.dist_params, [10.0, 12.0], "{backend:?}");
}
per_backend!(a_skipped_value_is_not_an_output_that_can_refuse_the_act);

/// What the cpu backend skips without the value: on the CleanRL-style CartPole (separate 64-64 actor and critic
/// MLPs) exactly the critic's nodes, and on SB3's NatureCNN PPO (one encoder for both heads) only the value's
/// last dense layer.
#[test]
fn without_the_value_only_the_critics_own_nodes_are_skipped() {
    for (name, bytes, critic_nodes) in [
        ("cartpole", compile_fixture(&load_fixture("cartpole")), 3),
        ("ppo_cnn_frames", sb3("ppo_cnn_frames"), 1),
    ] {
        let p = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
        let (art, plan) = (p.artifact(), p.plan());
        let readback = step_readback(art, plan);
        let low = lower(art, plan, &readback);
        let value = readback
            .iter()
            .position(|r| Some(*r) == plan.head.value.as_deref())
            .expect("the value is read back");
        let needed = needed_without_readback(&low, value);
        let skipped: Vec<usize> = (0..needed.len()).filter(|i| !needed[*i]).collect();
        assert_eq!(skipped.len(), critic_nodes, "{name}: {skipped:?}");
        // Every skipped node reads only what feeds the value, and the value is among what they write.
        let value_slot = low.readback[value].0;
        assert!(
            skipped.iter().any(|&i| low.nodes[i].out == value_slot),
            "{name}: the value's own node is skipped"
        );
        for (i, n) in low.nodes.iter().enumerate() {
            if needed[i] {
                continue;
            }
            for (j, m) in low.nodes.iter().enumerate() {
                assert!(
                    !(needed[j] && m.ins.contains(&n.out)),
                    "{name}: skipped node {i} feeds needed node {j}"
                );
            }
        }
    }
}
