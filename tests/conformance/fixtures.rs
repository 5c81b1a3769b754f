use sha2::{Digest, Sha256};

use policyport_conformance::{fixture_names, fixtures_dir};

/// The committed files must be byte-for-byte what the seeded generator recorded, and every fixture listed.
#[test]
fn committed_fixtures_match_the_generator_lock() {
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures_dir().join("fixtures.lock.json")).unwrap())
            .unwrap();
    assert_eq!(lock["generator"]["torch"], "2.11.0");
    let files = lock["files"].as_object().unwrap();
    for name in fixture_names() {
        for f in ["policy.onnx", "import.json", "io.json"] {
            let key = format!("{name}/{f}");
            let want = files
                .get(&key)
                .unwrap_or_else(|| panic!("{key} missing from fixtures.lock.json"));
            let got = format!(
                "{:x}",
                Sha256::digest(std::fs::read(fixtures_dir().join(&key)).unwrap())
            );
            assert_eq!(
                want.as_str().unwrap(),
                got,
                "{key} differs from what generate.py wrote: regenerate"
            );
        }
    }
    for key in files.keys() {
        assert!(
            fixtures_dir().join(key).exists(),
            "lock lists {key}, which is gone"
        );
    }
}

#[test]
fn the_suite_has_every_model_class_the_spine_promises() {
    let names = fixture_names();
    for want in [
        "cartpole",
        "pendulum",
        "mlp64",
        "mlp64_dynamo",
        "ops",
        "ops_dynamo",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "fixture {want} missing (have {names:?})"
        );
    }
}

#[test]
fn trained_policies_reached_their_targets_in_pytorch() {
    let io = policyport_conformance::load_fixture("cartpole").io;
    let eval = io.eval.unwrap();
    let returns: Vec<f64> = serde_json::from_value(eval["sampled_returns"].clone()).unwrap();
    let mean = returns.iter().sum::<f64>() / returns.len() as f64;
    assert!(
        returns.len() >= 20 && mean >= 475.0,
        "CartPole PyTorch policy mean {mean} over {}",
        returns.len()
    );
    let io = policyport_conformance::load_fixture("pendulum").io;
    let eval = io.eval.unwrap();
    assert_eq!(eval["env"], "Pendulum-v1");
    let det: Vec<f64> = serde_json::from_value(eval["deterministic_returns"].clone()).unwrap();
    let mean = det.iter().sum::<f64>() / det.len() as f64;
    assert!(mean >= -400.0, "Pendulum PyTorch policy mean {mean}");
}
