//! RLlib checkpoint directories (`algo.save()`, written by RLlib 2.60 itself in tests/fixtures/generate_rllib.py)
//! compile with nothing but the directory and reproduce the RLModule on every backend: distribution parameters
//! and value within 1e-5 of the module run in float64 (after the MeanStdFilter's statistics, where saved), Philox
//! samples equal to the Python sampler's, and the actions RLlib's own env runner sends the env with
//! explore=False (`to_deterministic()`, then `unsquash_action`; DQN: `forward_inference`'s greedy actions). PPO,
//! APPO, IMPALA, SAC, DQN (dueling, plain, distributional on frames) and the example action-masking module.

use std::path::PathBuf;

use policyport::Backend;
use policyport_conformance::fixtures_dir;
use policyport_import::{FixtureIo, ImportError, StorageDType, compile_rllib};

const FIXTURES: [&str; 14] = [
    "ppo_cartpole",
    "ppo_pendulum_meanstd",
    "ppo_pendulum_clip_actions",
    "ppo_lstm_cartpole",
    "ppo_cnn_frames",
    "ppo_pendulum_shared_layernorm",
    "sac_push",
    "ppo_dict_flatten",
    "dqn_cartpole",
    "dqn_cartpole_plain",
    "dqn_frames_distributional",
    "appo_cartpole",
    "impala_pendulum",
    "ppo_action_masking",
];

fn dir(name: &str) -> PathBuf {
    fixtures_dir().join("rllib").join(name)
}

fn every_rllib_checkpoint_reproduces_rllib_on_every_backend(backend: Backend) {
    let mut table = vec![];
    for name in FIXTURES {
        let io: FixtureIo =
            serde_json::from_slice(&std::fs::read(dir(name).join("io.json")).unwrap()).unwrap();
        let trainer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir(name).join("trainer.json")).unwrap())
                .unwrap();
        let bytes = compile_rllib(
            &dir(name).join("checkpoint"),
            name,
            Some(&io),
            StorageDType::F32,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = policyport_conformance::load(&bytes, backend)
            .unwrap_or_else(|e| panic!("{name} on {}: {e}", backend.name()));
        for r in p.verify().unwrap() {
            let worst = r.values.iter().map(|(_, e)| *e).fold(0.0, f64::max);
            table.push(format!(
                "{name:<22} {:<8} {:<22} max rel err {worst:.2e}",
                backend.name(),
                r.name
            ));
            assert!(r.passed, "{name} on {}: {r:?}", backend.name());
        }
        policyport_conformance::assert_trainer_cases(
            &p,
            &io,
            &trainer,
            &format!("{name} on {}", backend.name()),
        );
    }
    println!("{}", table.join("\n"));
}
per_backend!(every_rllib_checkpoint_reproduces_rllib_on_every_backend);

/// The same module from its own directory and from the MultiRLModule's: the same artifact as from the checkpoint.
#[test]
fn every_rllib_checkpoint_compiles_the_same_from_its_module_directories() {
    for name in FIXTURES {
        let io: FixtureIo =
            serde_json::from_slice(&std::fs::read(dir(name).join("io.json")).unwrap()).unwrap();
        let ckpt = dir(name).join("checkpoint");
        let bytes = compile_rllib(&ckpt, name, Some(&io), StorageDType::F32)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let module = ckpt.join("learner_group/learner/rl_module/default_policy");
        assert!(
            compile_rllib(&module, name, Some(&io), StorageDType::F32).unwrap() == bytes,
            "{name}"
        );
        assert!(
            compile_rllib(
                &module.parent().unwrap(),
                name,
                Some(&io),
                StorageDType::F32
            )
            .unwrap()
                == bytes
        );
    }
}

/// RLlib's SAC: a squashed Gaussian whose deterministic action is the un-squashed mean rescaled and clipped
/// (format 1.3's `clipped_mean`: the file is stamped 1.3, so an older runtime refuses it rather than acting
/// differently), log-std clamped to [-5, 2], no value. A Dict observation through FlattenObservations: the
/// artifact's observation is the env's Dict in RLlib's flatten order (keys sorted, not the space's own order),
/// with the MeanStdFilter that follows the flatten over the flat vector.
#[test]
fn rllib_sac_and_flattened_dict_checkpoints_keep_rllibs_semantics() {
    use policyport_format::{Distribution, ObservationSpace, SquashedDeterministic, read_artifact};
    let sac = compile_rllib(
        &dir("sac_push").join("checkpoint"),
        "sac",
        None,
        StorageDType::F32,
    )
    .unwrap();
    let art = read_artifact(&sac).unwrap();
    assert_eq!(art.version, (1, 3));
    match &art.manifest.distribution {
        Distribution::SquashedGaussian {
            deterministic,
            log_std_range,
            ..
        } => {
            assert_eq!(*deterministic, SquashedDeterministic::ClippedMean);
            assert_eq!(*log_std_range, Some((-5.0, 2.0)));
        }
        other => panic!("{other:?}"),
    }
    assert!(art.manifest.value.is_none());
    // A 1.2 stamp on the same manifest is refused by name, not read with the tanh deterministic action.
    let mut old = sac.clone();
    old[10..12].copy_from_slice(&2u16.to_le_bytes());
    let e = read_artifact(&old).unwrap_err();
    assert!(e.to_string().contains("clipped_mean"), "{e}");

    let dict = compile_rllib(
        &dir("ppo_dict_flatten").join("checkpoint"),
        "dict",
        None,
        StorageDType::F32,
    )
    .unwrap();
    let art = read_artifact(&dict).unwrap();
    let ObservationSpace::Dict { spaces } = &art.manifest.observation else {
        panic!("{:?}", art.manifest.observation);
    };
    let parts: Vec<(&str, &[usize])> = spaces
        .iter()
        .map(|e| (e.key.as_str(), e.shape.as_slice()))
        .collect();
    assert_eq!(parts, [("grid", &[2, 3][..]), ("velocity", &[3][..])]);
    assert_eq!(
        art.manifest.preprocess.len(),
        1,
        "the MeanStdFilter after the flatten"
    );
}

/// What a user might point the compiler at, or a hostile checkpoint: each a typed error naming the problem.
#[test]
fn wrong_or_hostile_rllib_checkpoints_are_typed_errors() {
    let tmp = std::env::temp_dir().join(format!("policyport-rllib-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        for e in walk(from) {
            let rel = e.strip_prefix(from).unwrap();
            std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
            std::fs::copy(&e, to.join(rel)).unwrap();
        }
    };
    let src = dir("ppo_pendulum_meanstd").join("checkpoint");
    let module = "learner_group/learner/rl_module/default_policy";
    // An empty directory: no module.
    std::fs::create_dir_all(tmp.join("empty")).unwrap();
    assert!(compile_rllib(&tmp.join("empty"), "x", None, StorageDType::F32).is_err());
    // The MeanStdFilter piece in the pipeline but its statistics deleted: refused, never silently unfiltered.
    let c = tmp.join("no_stats");
    copy(&src, &c);
    std::fs::remove_dir_all(c.join("env_runner/env_to_module_connector/MeanStdFilter")).unwrap();
    let e = compile_rllib(&c, "x", None, StorageDType::F32).unwrap_err();
    assert!(e.to_string().contains("MeanStdFilter"), "{e}");
    // A module class pickle naming os.system: the offending global, nothing run.
    let c = tmp.join("evil");
    copy(&src, &c);
    std::fs::write(
        c.join(module).join("class_and_ctor_args.pkl"),
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x8c\x06system\x93.",
    )
    .unwrap();
    match compile_rllib(&c, "x", None, StorageDType::F32).unwrap_err() {
        ImportError::Unsupported { what, .. } => assert!(what.contains("posix.system"), "{what}"),
        other => panic!("{other}"),
    }
    // Truncated weights, at several lengths.
    let state = std::fs::read(src.join(module).join("module_state.pkl")).unwrap();
    for cut in [0, 1, 20, state.len() / 3, state.len() - 1] {
        let c = tmp.join(format!("cut{cut}"));
        copy(&src, &c);
        std::fs::write(c.join(module).join("module_state.pkl"), &state[..cut]).unwrap();
        assert!(
            compile_rllib(&c, "x", None, StorageDType::F32).is_err(),
            "cut at {cut}"
        );
    }
    // Two modules (multi-agent): say which to give.
    let c = tmp.join("two");
    copy(&src, &c);
    copy(
        &src.join(module),
        &c.join("learner_group/learner/rl_module/other_policy"),
    );
    let e = compile_rllib(&c, "x", None, StorageDType::F32).unwrap_err();
    assert!(e.to_string().contains("2 RLModules"), "{e}");
    // Same-length byte edits of the new modules' pickles (names are length-prefixed, so each stays a valid
    // pickle): each is a typed error naming what no longer fits, never a policy missing a part.
    let edit = |fixture: &str, file: &str, from: &[u8], to: &[u8]| -> ImportError {
        let c = tmp.join(format!("{fixture}-{}", String::from_utf8_lossy(to)));
        copy(&dir(fixture).join("checkpoint"), &c);
        let path = c.join(module).join(file);
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(from.len())
            .position(|w| w == from)
            .unwrap_or_else(|| panic!("{fixture}/{file} lacks {}", String::from_utf8_lossy(from)));
        let mut b = bytes.clone();
        b[at..at + to.len()].copy_from_slice(to);
        std::fs::write(&path, b).unwrap();
        compile_rllib(&c, "x", None, StorageDType::F32).unwrap_err()
    };
    // A dueling DQN whose value stream lost its last layer: refused (it would otherwise add 16 numbers to Q).
    let e = edit(
        "dqn_cartpole",
        "module_state.pkl",
        b"vf.net.mlp.2.weight",
        b"vX.net.mlp.2.weight",
    );
    assert!(
        e.to_string().contains("dueling vf head has 16 outputs"),
        "{e}"
    );
    // A model_config key the importer does not know (here a misspelt epsilon): refused by name.
    let e = edit(
        "dqn_cartpole",
        "class_and_ctor_args.pkl",
        b"epsilon",
        b"epsilom",
    );
    assert!(e.to_string().contains("'epsilom'"), "{e}");
    // The action-masking Dict with another key than its two: refused by name.
    let e = edit(
        "ppo_action_masking",
        "class_and_ctor_args.pkl",
        b"action_mask",
        b"action_maxk",
    );
    assert!(e.to_string().contains("action_maxk"), "{e}");
    let _ = std::fs::remove_dir_all(&tmp);
}

fn walk(d: &std::path::Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
