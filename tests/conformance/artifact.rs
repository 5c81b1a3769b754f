use policyport::{Backend, CompiledPolicy, PolicyError};
use policyport_conformance::{compile_fixture, fixture_names, fixtures_dir, load_fixture};
use policyport_format::{Limits, read_artifact, validate, write_artifact};
use policyport_import::{StorageDType, compile_onnx, inspect, reference};

#[test]
fn write_read_write_is_byte_identical() {
    for name in fixture_names() {
        let bytes = compile_fixture(&load_fixture(&name));
        let art = read_artifact(&bytes).unwrap();
        let again = write_artifact(&art.manifest, &art.tensors, &|_| {
            policyport_format::container::StorageDType::F32
        })
        .unwrap();
        assert_eq!(bytes, again, "{name}");
        // The lowest version able to hold it: MLPs stay 1.0 (loadable by runtimes shipped before 1.1).
        assert_eq!(art.version, (1, art.manifest.required_minor()), "{name}");
        // (catch: the demo's pixel policy, two convolutions.)
        let convolutional = name.contains("cnn") || name == "catch";
        // (The recurrent fixtures lower to 1.0 ops: the dynamo exporter's unit-axis reshapes are folded away.)
        assert_eq!(
            art.version.1,
            if name.starts_with("dict_obs") {
                2
            } else if convolutional || name.contains("layernorm") {
                1
            } else {
                0
            },
            "{name}"
        );
    }
}

/// A file that says 1.0 but uses an op of 1.1 was stamped wrongly by some writer: refused, naming the op.
#[test]
fn a_newer_op_in_an_older_file_is_refused() {
    let bytes = compile_fixture(&load_fixture("nature_cnn"));
    let (m, w) = policyport_format::container::sections(&bytes).unwrap();
    let stamped = policyport_format::container::assemble_versioned(m, w, 0);
    match read_artifact(&stamped).unwrap_err() {
        policyport_format::FormatError::OpNewerThanFile { op, since, file } => {
            assert_eq!((op.as_str(), since, file), ("conv2d", (1, 1), (1, 0)));
        }
        other => panic!("{other}"),
    }
    assert!(read_artifact(&policyport_format::container::assemble_versioned(m, w, 1)).is_ok());
}

/// Format 1.2's dict observation: a file holding one is stamped 1.2 (and an MLP on a box stays 1.0); one stamped
/// older is refused naming the dict; a dict with a repeated or empty key, or no parts, is refused at validation.
#[test]
fn a_dict_observation_needs_format_1_2() {
    let zip = std::fs::read(fixtures_dir().join("sb3/ppo_multi_input_dict/model.zip")).unwrap();
    let bytes =
        policyport_import::compile_sb3(&zip, None, "dict", None, StorageDType::F32).unwrap();
    let art = read_artifact(&bytes).unwrap();
    assert_eq!(art.version, (1, 2));
    let policyport_format::ObservationSpace::Dict { spaces } = &art.manifest.observation else {
        panic!("{:?}", art.manifest.observation)
    };
    let keys: Vec<&str> = spaces.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["image", "vec"]);
    assert_eq!(art.manifest.observation.raw_len(), 3 * 36 * 36 + 5);
    let (m, w) = policyport_format::container::sections(&bytes).unwrap();
    match read_artifact(&policyport_format::container::assemble_versioned(m, w, 1)).unwrap_err() {
        policyport_format::FormatError::OpNewerThanFile { op, since, file } => {
            assert_eq!(
                (op.as_str(), since, file),
                ("observation kind 'dict'", (1, 2), (1, 1))
            )
        }
        other => panic!("{other}"),
    }
    for bad in [
        |s: &mut Vec<policyport_format::DictEntry>| s[1].key = "image".into(),
        |s: &mut Vec<policyport_format::DictEntry>| s[0].key = String::new(),
        |s: &mut Vec<policyport_format::DictEntry>| s.clear(),
        |s: &mut Vec<policyport_format::DictEntry>| s[1].shape = vec![0],
    ] {
        let mut a = art.clone();
        if let policyport_format::ObservationSpace::Dict { spaces } = &mut a.manifest.observation {
            bad(spaces);
        }
        let e = validate(&a, &Limits::default()).unwrap_err();
        assert!(
            matches!(
                e,
                policyport_format::FormatError::Invalid { .. }
                    | policyport_format::FormatError::Shape { .. }
                    | policyport_format::FormatError::TooLarge { .. }
            ),
            "{e:?}"
        );
    }
}

/// The float64 reference interpreter (the toolchain's oracle for bare ONNX files) agrees with PyTorch float64.
#[test]
fn reference_interpreter_matches_pytorch_float64() {
    for name in fixture_names() {
        let f = load_fixture(&name);
        let art = read_artifact(&compile_fixture(&f)).unwrap();
        for g in &art.manifest.golden {
            let vals = reference::eval(&art.manifest, &art.tensors, &g.obs, g.batch).unwrap();
            for (v, want) in &g.values {
                let got: Vec<f32> = vals[v].iter().map(|x| *x as f32).collect();
                let err = policyport::rel_err(&got, want);
                // f32 weights vs PyTorch's f64 copies of the same f32 weights: only output rounding remains.
                assert!(err < 1e-6, "{name}/{}/{v}: {err}", g.name);
            }
        }
    }
}

/// Without oracle outputs the compiler embeds reference-interpreter goldens; they pass on every backend.
fn compile_without_golden_uses_the_reference_interpreter(b: Backend) {
    let f = load_fixture("pendulum");
    let bytes = compile_onnx(&f.onnx, &f.spec, "pendulum", None, StorageDType::F32).unwrap();
    let art = read_artifact(&bytes).unwrap();
    assert!(
        art.manifest
            .golden
            .iter()
            .all(|g| g.name.starts_with("reference_"))
    );
    let reports = policyport_conformance::load(&bytes, b)
        .unwrap()
        .verify()
        .unwrap();
    assert!(reports.iter().all(|r| r.passed), "{reports:?}");
}
per_backend!(compile_without_golden_uses_the_reference_interpreter);

#[test]
fn half_precision_storage_round_trips_within_its_tolerance() {
    let f = load_fixture("mlp64");
    for storage in [StorageDType::F16, StorageDType::BF16] {
        let bytes = compile_onnx(&f.onnx, &f.spec, "mlp64", Some(&f.io), storage).unwrap();
        let f32_len = compile_fixture(&f).len();
        assert!(
            bytes.len() < f32_len * 6 / 10,
            "{storage:?}: {} vs {f32_len}",
            bytes.len()
        );
        let reports = CompiledPolicy::load(&bytes, Backend::Flex)
            .unwrap()
            .verify()
            .unwrap();
        assert!(reports.iter().all(|r| r.passed), "{storage:?}: {reports:?}");
    }
}

/// `policyport inspect` output is pinned; re-bless with POLICYPORT_BLESS=1 after a deliberate change (the file is
/// rewritten only when it differs, and only for exactly `1`; the test still fails on that run, so a bless is never
/// silent).
#[test]
fn inspect_summaries_match_blessed_snapshots() {
    for name in ["cartpole", "mlp64", "nature_cnn"] {
        let bytes = compile_fixture(&load_fixture(name));
        let art = read_artifact(&bytes).unwrap();
        let plan = validate(&art, &Limits::default()).unwrap();
        let got = inspect::summary(&art, &plan, bytes.len());
        let path = fixtures_dir()
            .parent()
            .unwrap()
            .join("expected")
            .join(format!("{name}.inspect.txt"));
        policyport_conformance::assert_snapshot(&path, &got);
    }
    // The benchmark model's cost, as inspect reports it: 2 * (64*256 + 256*256 + 256*5) MACs + biases + tanh.
    let art = read_artifact(&compile_fixture(&load_fixture("mlp64"))).unwrap();
    let plan = validate(&art, &Limits::default()).unwrap();
    assert_eq!(
        inspect::flops_per_env(&art, &plan),
        2 * (64 * 256 + 256 * 256 + 256 * 5) + 256 + 256 + 5 + 512
    );
    // NatureCNN: /255 over the frame, three convolutions (+ bias) and their ReLUs, the 3136 -> 512 layer, heads.
    let art = read_artifact(&compile_fixture(&load_fixture("nature_cnn"))).unwrap();
    let plan = validate(&art, &Limits::default()).unwrap();
    let convs = 12800 * (2 * 4 * 8 * 8 + 1) + 5184 * (2 * 32 * 16 + 1) + 3136 * (2 * 64 * 9 + 1);
    let relus = 12800 + 5184 + 3136 + 512;
    let dense = 2 * 3136 * 512 + 512 + 2 * 512 * 6 + 6 + 2 * 512 + 1;
    assert_eq!(
        inspect::flops_per_env(&art, &plan),
        84 * 84 * 4 + convs + relus + dense
    );
}

#[test]
fn a_backend_compiled_out_is_a_typed_error() {
    let bytes = compile_fixture(&load_fixture("cartpole"));
    match CompiledPolicy::load(&bytes, Backend::Wgpu) {
        Ok(_) => assert!(Backend::compiled().contains(&Backend::Wgpu)),
        Err(e) => assert!(
            matches!(
                e,
                PolicyError::NotCompiled {
                    backend: Backend::Wgpu,
                    ..
                }
            ),
            "{e}"
        ),
    }
}

#[test]
fn info_describes_the_policy() {
    let p =
        CompiledPolicy::load(&compile_fixture(&load_fixture("pendulum")), Backend::Flex).unwrap();
    let i = p.info();
    assert_eq!(
        (
            i.obs_len,
            i.action_len,
            i.dist_params_len,
            i.has_value,
            i.recurrent_states
        ),
        (3, 1, 2, true, 0)
    );
    assert_eq!(i.format_version, (1, 0));
    assert!(i.parameters > 8000);
}

/// Golden values inside the graph (a hidden layer, not an act() output) are checked by a one-off probe program of
/// the same lowering on every backend that can build one: the runtime's own, and libtorch. The plugin's ABI
/// returns act() outputs only, so there it is a typed "unsupported" error, never a silent pass. (Until this test
/// no fixture named an intermediate value, so no backend's probe path ever ran.)
fn golden_values_inside_the_graph_are_probed_on_every_backend(b: Backend) {
    for name in ["cartpole", "pendulum"] {
        let mut art = read_artifact(&compile_fixture(&load_fixture(name))).unwrap();
        let head: Vec<String> = art
            .manifest
            .distribution
            .param_values()
            .iter()
            .map(|s| s.to_string())
            .chain(art.manifest.value.clone())
            .collect();
        let inner: Vec<String> = art
            .manifest
            .modules
            .iter()
            .flat_map(|m| m.nodes.iter().map(|n| n.output.clone()))
            .filter(|v| !head.contains(v))
            .collect();
        assert!(
            inner.len() >= 2,
            "{name}: no intermediate values: {inner:?}"
        );
        let manifest = art.manifest.clone();
        for g in &mut art.manifest.golden {
            let vals = reference::eval(&manifest, &art.tensors, &g.obs, g.batch).unwrap();
            for v in &inner {
                g.values.insert(v.clone(), vals[v].clone());
            }
        }
        let bytes = write_artifact(&art.manifest, &art.tensors, &|_| {
            policyport_format::container::StorageDType::F32
        })
        .unwrap();
        let p = policyport_conformance::load(&bytes, b).unwrap();
        match (b, p.verify()) {
            (Backend::Wasmtime, Err(e)) => assert!(
                matches!(
                    e,
                    PolicyError::Backend(policyport::BackendError::Unsupported(_))
                ),
                "{name} on {b:?}: {e}"
            ),
            (_, Ok(reports)) => {
                assert_eq!(reports.len(), art.manifest.golden.len());
                for r in reports {
                    assert!(r.passed, "{name} on {b:?}: {r:?}");
                    for v in &inner {
                        let err = r.values.iter().find(|(n, _)| n == v).map(|(_, e)| *e);
                        assert!(
                            err.is_some_and(|e| e <= 1e-5),
                            "{name} on {b:?}: {v} probed with error {err:?}"
                        );
                    }
                }
            }
            (_, other) => panic!("{name} on {b:?}: {other:?}"),
        }
    }
}
per_backend!(golden_values_inside_the_graph_are_probed_on_every_backend);
