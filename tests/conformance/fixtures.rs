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
        "catch",
        "mlp64",
        "mlp64_dynamo",
        "ops",
        "ops_dynamo",
        "dict_obs",
        "dict_obs_dynamo",
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
    let eval = policyport_conformance::load_fixture("catch")
        .io
        .eval
        .unwrap();
    assert_eq!(eval["env"], "Catch");
    let det: Vec<f64> = serde_json::from_value(eval["deterministic_returns"].clone()).unwrap();
    let mean = det.iter().sum::<f64>() / det.len() as f64;
    assert!(
        det.len() >= 20 && mean >= 34.0,
        "Catch PyTorch policy mean {mean} (38 is perfect play)"
    );
}

/// A dict observation over a graph with one input per key (both exporters): the artifact's observation is the
/// dict (format 1.2), and a spec that does not match the graph's inputs is a typed spec error naming the
/// problem, never a policy reading the wrong numbers.
#[test]
fn dict_observations_map_graph_inputs_by_key() {
    use policyport_format::{ObsDType, ObservationSpace};
    use policyport_import::ImportError;
    for name in ["dict_obs", "dict_obs_dynamo"] {
        let f = policyport_conformance::load_fixture(name);
        let art =
            policyport_format::read_artifact(&policyport_conformance::compile_fixture(&f)).unwrap();
        let ObservationSpace::Dict { spaces } = &art.manifest.observation else {
            panic!("{name}: {:?}", art.manifest.observation);
        };
        assert_eq!(
            spaces.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
            ["pixels", "state"]
        );
        assert_eq!(art.manifest.observation.raw_dtype(), ObsDType::F32);
        let compile = |spec: &policyport_import::ImportSpec| {
            policyport_import::compile_onnx(
                &f.onnx,
                spec,
                name,
                None,
                policyport_import::StorageDType::F32,
            )
        };
        let edit = |e: &dyn Fn(&mut Vec<policyport_format::DictEntry>)| {
            let mut spec = f.spec.clone();
            let Some(ObservationSpace::Dict { spaces }) = &mut spec.observation else {
                unreachable!()
            };
            e(spaces);
            spec
        };
        let cases: Vec<(&str, policyport_import::ImportSpec, &str)> = vec![
            (
                "renamed key",
                edit(&|s| s[0].key = "image".into()),
                "'pixels' is not a part",
            ),
            (
                "missing part",
                edit(&|s| {
                    s.pop();
                }),
                "'state' is not a part",
            ),
            (
                "wrong shape",
                edit(&|s| s[1].shape = vec![8]),
                "has shape [8]",
            ),
            (
                "uint8 input as f32",
                edit(&|s| s[0].dtype = ObsDType::F32),
                "needs \"dtype\": \"u8\"",
            ),
            (
                "\"input\" beside a dict",
                {
                    let mut spec = f.spec.clone();
                    spec.input = Some("state".into());
                    spec
                },
                "drop \"input\"",
            ),
            (
                "no dict for two inputs",
                {
                    let mut spec = f.spec.clone();
                    spec.observation = None;
                    spec
                },
                "2 run-time inputs",
            ),
        ];
        for (what, spec, want) in cases {
            match compile(&spec) {
                Err(ImportError::Spec(msg)) => {
                    assert!(msg.contains(want), "{name} {what}: {msg}")
                }
                other => panic!("{name} {what}: {:?}", other.map(|b| b.len())),
            }
        }
        // Parts in another order than the trainer's are a different observation layout: it compiles (the
        // user says what the runtime receives), and the fixture's golden vectors, recorded in the trainer's
        // order, fail verification.
        let swapped = edit(&|s| s.swap(0, 1));
        let bytes = policyport_import::compile_onnx(
            &f.onnx,
            &swapped,
            name,
            Some(&f.io),
            policyport_import::StorageDType::F32,
        )
        .unwrap();
        let p = policyport_conformance::load(&bytes, policyport::Backend::Cpu).unwrap();
        assert!(
            p.verify().unwrap().iter().any(|r| !r.passed),
            "{name}: the golden vectors of the fixture's order must refuse the swapped layout"
        );
    }
}
