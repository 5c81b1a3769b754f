//! The hostile-input corpus. Every case must come back as the right typed error — no panic, nothing lost: the
//! policy keeps working after a refused call.

use policyport::{
    ActMode, Backend, CompiledPolicy, EnvIds, ObservationError, Observations, PolicyError, Request,
    Session,
};
use policyport_conformance::{compile_fixture, load_fixture};
use policyport_format::container::{assemble, sections};
use policyport_format::philox::Stream;
use policyport_format::{FormatError, Limits, read_artifact, validate};

fn cartpole() -> Vec<u8> {
    compile_fixture(&load_fixture("cartpole"))
}

fn load_err(bytes: &[u8]) -> FormatError {
    match CompiledPolicy::load(bytes, Backend::Flex) {
        Err(PolicyError::Artifact(e)) => e,
        Err(other) => panic!("expected an artifact error, got {other}"),
        Ok(_) => panic!("hostile artifact accepted"),
    }
}

/// Edit the manifest JSON and re-assemble a container with valid checksums.
fn with_manifest(bytes: &[u8], edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let (m, w) = sections(bytes).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(m).unwrap();
    edit(&mut v);
    assemble(&serde_json::to_vec(&v).unwrap(), w)
}

#[test]
fn container_corruption() {
    let good = cartpole();
    assert!(matches!(load_err(&[]), FormatError::Truncated { .. }));
    assert!(matches!(
        load_err(&good[..5]),
        FormatError::Truncated { .. }
    ));
    for cut in [16, 95, 96, 500, good.len() - 1] {
        assert!(
            matches!(load_err(&good[..cut]), FormatError::Truncated { .. }),
            "cut at {cut}"
        );
    }
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(load_err(&bad), FormatError::BadMagic { .. }));
    for (major, minor) in [
        (2u16, 0u16),
        (1, policyport_format::FORMAT_MINOR + 1),
        (0, 9),
    ] {
        let mut v = good.clone();
        v[8..10].copy_from_slice(&major.to_le_bytes());
        v[10..12].copy_from_slice(&minor.to_le_bytes());
        assert!(
            matches!(load_err(&v), FormatError::UnsupportedVersion { found_major, found_minor, .. } if found_major == major && found_minor == minor)
        );
    }
    let mut v = good.clone();
    v.push(0);
    assert!(matches!(load_err(&v), FormatError::BadHeader(_)));
    let mut v = good.clone();
    v[12..16].copy_from_slice(&10u32.to_le_bytes());
    assert!(matches!(load_err(&v), FormatError::BadHeader(_)));
    let mut v = good.clone();
    v[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        load_err(&v),
        FormatError::BadHeader(_) | FormatError::Truncated { .. }
    ));
    // Found by cargo fuzz: a manifest length near u64::MAX once overflowed the 64-byte alignment of the weights.
    let mut v = good.clone();
    v[16..24].copy_from_slice(&(u64::MAX - 99).to_le_bytes());
    assert!(matches!(load_err(&v), FormatError::BadHeader(_)));
    let mut v = good.clone();
    v[120] ^= 0x20; // inside the manifest
    assert!(matches!(
        load_err(&v),
        FormatError::ChecksumMismatch {
            section: "manifest"
        }
    ));
    let mut v = good.clone();
    let n = v.len();
    v[n - 3] ^= 1; // inside the weights
    assert!(matches!(
        load_err(&v),
        FormatError::ChecksumMismatch { section: "weights" }
    ));
}

#[test]
fn manifest_and_weights_attacks() {
    let good = cartpole();
    let (m, w) = sections(&good).unwrap();
    assert!(matches!(
        load_err(&assemble(b"{not json", w)),
        FormatError::BadManifest(_)
    ));
    assert!(matches!(
        load_err(&assemble(m, b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")),
        FormatError::BadWeights(_)
    ));
    assert!(matches!(
        load_err(&assemble(m, &[0xff; 64])),
        FormatError::BadWeights(_)
    ));

    let unknown = with_manifest(&good, |v| {
        v["modules"][0]["nodes"][1]["op"] = serde_json::json!({"kind": "hardswish"})
    });
    match load_err(&unknown) {
        FormatError::UnknownOp { op, module, .. } => {
            assert_eq!((op.as_str(), module.as_str()), ("hardswish", "pi"))
        }
        e => panic!("{e}"),
    }
    let absurd = with_manifest(&good, |v| {
        v["observation"]["shape"] = serde_json::json!([1u64 << 40])
    });
    assert!(matches!(load_err(&absurd), FormatError::TooLarge { .. }));
    let absurd = with_manifest(&good, |v| {
        v["observation"]["shape"] = serde_json::json!([65536, 65536, 65536])
    });
    assert!(matches!(load_err(&absurd), FormatError::TooLarge { .. }));
    let zero = with_manifest(&good, |v| {
        v["observation"]["shape"] = serde_json::json!([0])
    });
    assert!(matches!(load_err(&zero), FormatError::Shape { .. }));
    let missing = with_manifest(&good, |v| {
        v["modules"][0]["nodes"][0]["op"]["weight"] = "nope".into()
    });
    assert!(matches!(
        load_err(&missing),
        FormatError::MissingTensor { .. }
    ));
    let wrong_obs = with_manifest(&good, |v| {
        v["observation"]["shape"] = serde_json::json!([5])
    });
    assert!(matches!(
        load_err(&wrong_obs),
        FormatError::TensorShape { .. }
    ));
    let undefined = with_manifest(&good, |v| {
        v["modules"][0]["nodes"][1]["inputs"][0] = "ghost".into()
    });
    assert!(matches!(
        load_err(&undefined),
        FormatError::UndefinedValue { .. }
    ));
    let dup = with_manifest(&good, |v| {
        let out = v["modules"][0]["nodes"][0]["output"].clone();
        v["modules"][0]["nodes"][1]["output"] = out;
    });
    assert!(matches!(load_err(&dup), FormatError::DuplicateValue { .. }));
    let mismatch = with_manifest(&good, |v| {
        v["action"] = serde_json::json!({"kind": "discrete", "n": 3})
    });
    assert!(matches!(load_err(&mismatch), FormatError::Shape { .. }));
    let wrong_dist = with_manifest(&good, |v| {
        v["action"] =
            serde_json::json!({"kind": "box", "shape": [2], "low": [-1, -1], "high": [1, 1]})
    });
    assert!(matches!(load_err(&wrong_dist), FormatError::Invalid { .. }));
    let golden = with_manifest(&good, |v| v["golden"][0]["obs"] = serde_json::json!([1.0]));
    assert!(matches!(load_err(&golden), FormatError::Invalid { .. }));

    // Non-finite weights: refused by validation (reader and writer alike).
    let mut art = read_artifact(&good).unwrap();
    let t = art.tensors.values_mut().next().unwrap();
    t.data[3] = f32::NAN;
    assert!(matches!(
        validate(&art, &Limits::default()),
        Err(FormatError::NonFiniteWeight { index: 3, .. })
    ));
    let w = policyport_format::write_artifact(&art.manifest, &art.tensors, &|_| {
        policyport_format::container::StorageDType::F32
    });
    assert!(matches!(w, Err(FormatError::NonFiniteWeight { .. })));
}

fn bad_observations_and_calls(backend: Backend) {
    let policy = policyport_conformance::load(&cartpole(), backend).unwrap();
    let mut p = policy.session();
    let mode = ActMode::Sample { seed: 1, step: 2 };
    let act = |p: &mut Session, obs: Observations, batch: usize, envs: EnvIds| {
        p.act(&Request::new(obs, batch, mode).envs(envs))
            .map(|_| ())
    };
    let nan = [0.0, f32::NAN, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    assert!(matches!(
        act(&mut p, Observations::F32(&nan), 2, EnvIds::Range(0)),
        Err(PolicyError::Observation(ObservationError::NonFinite { env: 0, element: 1, value })) if value.is_nan()
    ));
    let inf = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, f32::NEG_INFINITY, 0.0];
    assert!(matches!(
        act(&mut p, Observations::F32(&inf), 2, EnvIds::Range(0)),
        Err(PolicyError::Observation(ObservationError::NonFinite {
            env: 1,
            element: 2,
            ..
        }))
    ));
    assert!(matches!(
        act(&mut p, Observations::F32(&[0.0; 7]), 2, EnvIds::Range(0)),
        Err(PolicyError::Observation(ObservationError::Length {
            expected: 8,
            found: 7,
            ..
        }))
    ));
    assert!(matches!(
        act(&mut p, Observations::F32(&[]), 0, EnvIds::Range(0)),
        Err(PolicyError::Batch { batch: 0, .. })
    ));
    assert!(matches!(
        act(
            &mut p,
            Observations::F32(&[0.0; 4]),
            usize::MAX,
            EnvIds::Range(0)
        ),
        Err(PolicyError::Batch { .. })
    ));
    assert!(matches!(
        act(&mut p, Observations::F32(&[0.0; 8]), 2, EnvIds::List(&[1])),
        Err(PolicyError::EnvIds(_))
    ));
    assert!(matches!(
        act(
            &mut p,
            Observations::F32(&[0.0; 8]),
            2,
            EnvIds::Range(u32::MAX)
        ),
        Err(PolicyError::EnvIds(_))
    ));
    assert!(matches!(
        act(&mut p, Observations::U8(&[0; 4]), 1, EnvIds::Range(0)),
        Err(PolicyError::Observation(ObservationError::DType { .. }))
    ));
    // Nothing lost: the policy still answers, and still passes its golden vectors.
    assert!(act(&mut p, Observations::F32(&[0.01; 8]), 2, EnvIds::Range(0)).is_ok());
    assert!(policy.verify().unwrap().iter().all(|r| r.passed));
}
per_backend!(bad_observations_and_calls);

/// A seeded mutation fuzz of the manifest behind valid checksums (the checksum would otherwise stop almost
/// every random edit at the door): every outcome is Ok or a typed error, never a panic.
fn mutated_manifests_never_panic(backend: Backend) {
    let good = cartpole();
    let (m, w) = sections(&good).unwrap();
    let mut refused = 0;
    for i in 0..400u32 {
        let mut s = Stream::new(0xF022, i, 0);
        let mut mm = m.to_vec();
        for k in 0..1 + (s.word(0) % 4) {
            let pos = s.word(1 + 2 * k) as usize % mm.len();
            let choice = s.word(2 + 2 * k);
            mm[pos] = b"0123456789-.e,:[]{}\"axz "[choice as usize % 24];
        }
        let bytes = assemble(&mm, w);
        match std::panic::catch_unwind(|| policyport_conformance::load(&bytes, backend).map(|_| ()))
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!(
                "panic on mutation {i} ({backend:?}): {}",
                String::from_utf8_lossy(&mm)
            ),
        }
    }
    assert!(
        refused > 200,
        "mutations should mostly be refused on {backend:?} ({refused})"
    );
}
per_backend!(mutated_manifests_never_panic);

// ---- Hostile artifacts that pass the container checks: each once reached a panic, an abort or a silent wrong
// answer inside load's warm-up or act() (issue 15). Each is now refused by validation or at act() with a typed
// error, on every backend. Built from JSON + tensors with the unvalidated encoder, as a hostile writer would.

/// A manifest from JSON plus named tensors, encoded without validation.
pub(crate) fn hostile_artifact(
    manifest: serde_json::Value,
    tensors: &[(&str, Vec<usize>, Vec<f32>)],
) -> Vec<u8> {
    let m: policyport_format::Manifest =
        serde_json::from_value(manifest).expect("test manifest parses");
    let t = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.to_string(),
                policyport_format::container::Tensor::new(s.clone(), d.clone()),
            )
        })
        .collect();
    policyport_format::container::encode_unvalidated(&m, &t, &|_| {
        policyport_format::container::StorageDType::F32
    })
    .unwrap()
}

/// A one-module policy: `obs` (the given space and preprocessing) -> nodes -> `logits` for a Discrete(n) action
/// (or the given action / distribution), no golden cases.
pub(crate) fn policy_json(
    observation: serde_json::Value,
    preprocess: serde_json::Value,
    nodes: serde_json::Value,
    action: serde_json::Value,
    distribution: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "name": "hostile", "producer": {"tool": "test", "version": "0", "source": "", "notes": ""},
        "observation": observation, "action": action, "preprocess": preprocess,
        "modules": [{"name": "pi", "role": "policy_head", "inputs": ["obs"], "outputs": ["logits"], "nodes": nodes}],
        "distribution": distribution, "value": null, "recurrent": null, "golden": []
    })
}

pub(crate) fn dense(input: &str, weight: &str, output: &str) -> serde_json::Value {
    serde_json::json!({"name": output, "op": {"kind": "dense", "weight": weight, "bias": null},
                       "inputs": [input], "output": output})
}

/// `backend` refuses `bytes` at load with an artifact error (never a panic), and the error matches. (Each test
/// that calls it is one test per backend: `per_backend!`.)
fn refused_on(backend: Backend, bytes: &[u8], what: &str, matches: impl Fn(&FormatError) -> bool) {
    let r = std::panic::catch_unwind(|| policyport_conformance::load(bytes, backend).map(|_| ()));
    match r {
        Err(_) => panic!("{what}: panic on {backend:?}"),
        Ok(Ok(())) => panic!("{what}: accepted on {backend:?}"),
        Ok(Err(e)) => {
            let text = e.to_string();
            if let PolicyError::Artifact(f) = &e {
                assert!(matches(f), "{what} on {backend:?}: unexpected error {f}");
            } else if !text.contains("invalid artifact") {
                panic!("{what} on {backend:?}: not an artifact error: {text}");
            }
        }
    }
}

fn preprocessing_before_one_hot_is_refused(backend: Backend) {
    // A scale of 1000 before one_hot made the one-hot write 1000x out of bounds (a panic in warm-up; in the
    // browser, an abort of the page's whole wasm instance); a fraction silently picked another state.
    for step in [
        serde_json::json!({"kind": "scale", "factor": 1000.0}),
        serde_json::json!({"kind": "normalize", "mean": "m", "std": "s", "clip": null}),
    ] {
        let bytes = hostile_artifact(
            policy_json(
                serde_json::json!({"kind": "discrete", "n": 4}),
                serde_json::json!([step, {"kind": "one_hot", "n": 4}]),
                serde_json::json!([dense("obs", "w", "logits")]),
                serde_json::json!({"kind": "discrete", "n": 2}),
                serde_json::json!({"kind": "categorical", "logits": "logits"}),
            ),
            &[
                ("w", vec![2, 4], vec![0.5; 8]),
                ("m", vec![1], vec![0.5]),
                ("s", vec![1], vec![0.001]),
            ],
        );
        refused_on(backend, &bytes, "step before one_hot", |e| {
            matches!(e, FormatError::Invalid { .. })
        });
    }
}
per_backend!(preprocessing_before_one_hot_is_refused);

fn multi_discrete_nvec_that_wraps_is_refused(backend: Backend) {
    let bytes = wrapping_nvec_artifact();
    refused_on(backend, &bytes, "wrapping nvec", |e| {
        matches!(e, FormatError::TooLarge { .. })
    });
}
per_backend!(multi_discrete_nvec_that_wraps_is_refused);

fn affine_scale_and_shift_of_different_groups_are_refused(backend: Backend) {
    // A scale over the last axis with a shift over the whole [2, 3] value (and the reverse) panicked in the
    // cpu executor, silently used a prefix of the shift on others, and failed to broadcast in burn.
    for (scale_n, shift_n) in [(3usize, 6usize), (6, 3)] {
        let nodes = serde_json::json!([
            {"name": "r", "op": {"kind": "reshape", "shape": [2, 3]}, "inputs": ["obs"], "output": "r"},
            {"name": "a", "op": {"kind": "affine", "scale": "sc", "shift": "sh"}, "inputs": ["r"], "output": "a"},
            {"name": "f", "op": {"kind": "reshape", "shape": [6]}, "inputs": ["a"], "output": "f"},
            dense("f", "w", "logits"),
        ]);
        let bytes = hostile_artifact(
            policy_json(
                serde_json::json!({"kind": "box", "shape": [6], "dtype": "f32"}),
                serde_json::json!([]),
                nodes,
                serde_json::json!({"kind": "discrete", "n": 2}),
                serde_json::json!({"kind": "categorical", "logits": "logits"}),
            ),
            &[
                ("sc", vec![scale_n], vec![2.0; scale_n]),
                ("sh", vec![shift_n], vec![1.0; shift_n]),
                ("w", vec![2, 6], vec![0.1; 12]),
            ],
        );
        refused_on(backend, &bytes, "affine groups", |e| {
            matches!(e, FormatError::Shape { .. })
        });
    }
}
per_backend!(affine_scale_and_shift_of_different_groups_are_refused);

fn graphs_over_the_memory_budget_are_refused_before_allocating(backend: Backend) {
    // One 16M-element weight read by 200 Dense nodes: every node packs its own copy (~13 GB). The file is
    // one 64 MB tensor and a little JSON; it used to allocate until the host died.
    let bytes = memory_bomb(4096, 200);
    refused_on(backend, &bytes, "memory budget", |e| {
        matches!(e, FormatError::MemoryBudget { .. })
    });
}
per_backend!(graphs_over_the_memory_budget_are_refused_before_allocating);

/// A stricter budget is the caller's choice, and holds at act() too: the same small policy refuses a batch whose
/// rows do not fit, with a typed error, and then keeps working (the cpu backend's `load_with_limits`).
#[test]
fn a_stricter_memory_budget_holds_at_load_and_at_act() {
    let good = cartpole();
    let small = Limits {
        max_memory_bytes: 200_000,
        ..Limits::default()
    };
    assert!(matches!(
        CompiledPolicy::load_with_limits(
            &good,
            Backend::Cpu,
            Limits {
                max_memory_bytes: 1_000,
                ..Limits::default()
            }
        ),
        Err(PolicyError::Artifact(FormatError::MemoryBudget { .. }))
    ));
    let p = CompiledPolicy::load_with_limits(&good, Backend::Cpu, small).unwrap();
    let per_env = p.plan().memory.bytes_per_env as usize;
    let too_many = (200_000 / per_env) + 10;
    let obs = vec![0.0f32; too_many * 4];
    let mut s = Session::new(p.clone());
    let req = Request::new(Observations::F32(&obs), too_many, ActMode::Deterministic);
    assert!(
        matches!(s.act(&req), Err(PolicyError::Memory { .. })),
        "batch {too_many}"
    );
    let req = Request::new(Observations::F32(&obs[..4]), 1, ActMode::Deterministic);
    assert!(s.act(&req).is_ok());
}

#[test]
fn golden_cases_that_check_nothing_are_refused() {
    // `verify` said ok for a case with no values and no actions, and for a tolerance of +inf or 1e300 (with
    // which a NaN output, relative error infinity, passed).
    let good = cartpole();
    let vacuous = with_manifest(&good, |v| {
        let g = &mut v["golden"][0];
        g["values"] = serde_json::json!({});
        g["sampled_actions"] = serde_json::json!([]);
        g["deterministic_actions"] = serde_json::json!([]);
    });
    assert!(matches!(load_err(&vacuous), FormatError::Invalid { .. }));
    for tol in [1e300, 2.0] {
        let loose = with_manifest(&good, |v| {
            v["golden"][0]["tolerance"] = serde_json::json!(tol)
        });
        assert!(
            matches!(load_err(&loose), FormatError::Invalid { .. }),
            "tolerance {tol}"
        );
    }
    // JSON has no infinity: serde writes null, which is refused as a malformed manifest.
    let inf = with_manifest(&good, |v| {
        v["golden"][0]["tolerance"] = serde_json::Value::Null
    });
    assert!(matches!(load_err(&inf), FormatError::BadManifest(_)));
}

fn non_finite_outputs_are_a_typed_error(backend: Backend) {
    // Weights near f32::MAX times an observation of 10 overflow to inf, then tanh(inf) - ... : here a logit of
    // +inf and one of -inf. Before, argmax picked one action and sampling (total = NaN) fell through to the last.
    let bytes = hostile_artifact(
        policy_json(
            serde_json::json!({"kind": "box", "shape": [2], "dtype": "f32"}),
            serde_json::json!([]),
            serde_json::json!([dense("obs", "w", "logits")]),
            serde_json::json!({"kind": "discrete", "n": 2}),
            serde_json::json!({"kind": "categorical", "logits": "logits"}),
        ),
        &[("w", vec![2, 2], vec![3e38, 3e38, -3e38, -3e38])],
    );
    let p = policyport_conformance::load(&bytes, backend)
        .expect("finite at the zero warm-up observation");
    let mut s = Session::new(p);
    let obs = [10.0f32, 10.0, 0.1, 0.1];
    for mode in [ActMode::Deterministic, ActMode::Sample { seed: 1, step: 0 }] {
        let req = Request::new(Observations::F32(&obs), 2, mode);
        match s.act(&req) {
            Err(PolicyError::NonFiniteOutput { row: 0, .. }) => {}
            // The sandbox refuses inside the plugin: its typed code (-9) comes back through the host as the same
            // kind.
            Err(PolicyError::Sandbox(e))
                if backend == Backend::Wasmtime && e.kind() == policyport::ErrorKind::NonFinite => {
            }
            Err(e) => panic!("{backend:?}: wrong error {e}"),
            Ok(o) => panic!("{backend:?}: answered {:?} for infinite logits", o.discrete),
        }
    }
    // Still works for finite rows.
    let req = Request::new(Observations::F32(&obs[2..]), 1, ActMode::Deterministic);
    assert!(s.act(&req).is_ok(), "{backend:?}");
}
per_backend!(non_finite_outputs_are_a_typed_error);

// ---- The hostile-input table: every input through every API, each cell a typed error (never a panic, an
// abort or a silent answer). Written to `<target>/hostile-inputs.md` (the README's table comes from there).

/// One API's answer, in words, or a failure of the contract.
enum Cell {
    Typed(String),
    Broken(String),
}

fn cli_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(2).unwrap().join("policyport")
}

/// `policyport <args>`: exit 1 and exactly one stderr line, starting `Error:`.
fn cli_cell(args: &[&std::ffi::OsStr]) -> Cell {
    let out = std::process::Command::new(cli_bin())
        .args(args)
        .output()
        .expect("run the CLI");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    match out.status.code() {
        Some(1) if lines.len() == 1 && lines[0].starts_with("Error: ") => {
            Cell::Typed(format!("exit 1: {}", short(&lines[0]["Error: ".len()..])))
        }
        code => Cell::Broken(format!("exit {code:?}, stderr {err:?}")),
    }
}

fn short(s: &str) -> String {
    let s = s.replace('|', "/");
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

fn c_status(st: policyport_capi::PpStatus) -> Cell {
    let msg = unsafe { std::ffi::CStr::from_ptr(policyport_capi::pp_last_error()) }
        .to_string_lossy()
        .into_owned();
    match st {
        policyport_capi::PpStatus::Panic | policyport_capi::PpStatus::Ok => {
            Cell::Broken(format!("{st:?}: {msg}"))
        }
        st => Cell::Typed(format!("{st:?}")),
    }
}

#[test]
fn hostile_inputs_through_every_api_are_typed_errors() {
    use policyport_capi::*;
    let good = cartpole();
    let dir = std::env::temp_dir().join(format!("pp-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = policyport_conformance::plugin_wasm();
    let plugin_path = dir.join("plugin.wasm");
    std::fs::write(&plugin_path, &plugin).unwrap();
    let plugin_c = std::ffi::CString::new(plugin_path.to_str().unwrap()).unwrap();
    let rt = policyport_conformance::plugin_runtime();

    let mut artifacts: Vec<(&str, Vec<u8>)> = vec![
        ("truncated file", good[..1000].to_vec()),
        ("bad magic", [b"NOTAPOLI".as_slice(), &good[8..]].concat()),
        ("damaged manifest (checksum)", {
            let mut v = good.clone();
            v[120] ^= 0x20;
            v
        }),
        (
            "unknown op",
            with_manifest(&good, |v| {
                v["modules"][0]["nodes"][1]["op"] = serde_json::json!({"kind": "hardswish"})
            }),
        ),
        (
            "observation of 2^120 elements",
            with_manifest(&good, |v| {
                v["observation"]["shape"] = serde_json::json!([1u64 << 40, 1u64 << 40, 1u64 << 40])
            }),
        ),
        (
            "golden case that checks nothing",
            with_manifest(&good, |v| {
                let g = &mut v["golden"][0];
                g["values"] = serde_json::json!({});
                g["sampled_actions"] = serde_json::json!([]);
                g["deterministic_actions"] = serde_json::json!([]);
            }),
        ),
        (
            "golden tolerance 1e300",
            with_manifest(&good, |v| {
                v["golden"][0]["tolerance"] = serde_json::json!(1e300)
            }),
        ),
    ];
    artifacts.push(("scale before one_hot", hostile_artifact(
        policy_json(
            serde_json::json!({"kind": "discrete", "n": 4}),
            serde_json::json!([{"kind": "scale", "factor": 1000.0}, {"kind": "one_hot", "n": 4}]),
            serde_json::json!([dense("obs", "w", "logits")]),
            serde_json::json!({"kind": "discrete", "n": 2}),
            serde_json::json!({"kind": "categorical", "logits": "logits"}),
        ),
        &[("w", vec![2, 4], vec![0.5; 8])],
    )));
    artifacts.push(("nvec summing past usize::MAX", wrapping_nvec_artifact()));
    artifacts.push((
        "memory bomb (a 64 MB weight read by 200 nodes)",
        memory_bomb(4096, 200),
    ));

    // The same artifacts for the browser suite (tests/browser/run.mjs loads each in Chromium and expects a
    // PolicyportArtifactError, the page's other policy still acting): those under 4 MB, plus a memory bomb sized
    // for wasm32's default budget (1 GiB: a 4 MB weight read by 300 nodes needs ~1.3 GB; natively it would fit).
    let target = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf();
    let hostile_dir = target.join("hostile");
    let _ = std::fs::remove_dir_all(&hostile_dir);
    std::fs::create_dir_all(&hostile_dir).unwrap();
    for (name, bytes) in artifacts.iter().filter(|(_, b)| b.len() < 4 << 20) {
        let slug: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        std::fs::write(hostile_dir.join(format!("{slug}.policy")), bytes).unwrap();
    }
    // Every artifact at its native size for the Python column (tests/python/test_api.py loads each through the
    // wheel; the browser's 4 MB cut does not apply there).
    let native_dir = target.join("hostile-native");
    let _ = std::fs::remove_dir_all(&native_dir);
    std::fs::create_dir_all(&native_dir).unwrap();
    for (name, bytes) in &artifacts {
        let slug: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        std::fs::write(native_dir.join(format!("{slug}.policy")), bytes).unwrap();
    }
    let wasm32_bomb = memory_bomb(1024, 300);
    std::fs::write(
        hostile_dir.join("memory_bomb_for_wasm32.policy"),
        &wasm32_bomb,
    )
    .unwrap();

    let mut rows = vec![];
    let mut broken = vec![];
    let mut record = |input: &str, cells: Vec<(&str, Cell)>| {
        let mut row = format!("| {input} |");
        for (api, c) in cells {
            match c {
                Cell::Typed(s) => row.push_str(&format!(" {s} |")),
                Cell::Broken(s) => {
                    row.push_str(&format!(" **BROKEN** {} |", short(&s)));
                    broken.push(format!("{input} via {api}: {s}"));
                }
            }
        }
        rows.push(row);
    };
    for (name, bytes) in &artifacts {
        let path = dir.join("hostile.policy");
        std::fs::write(&path, bytes).unwrap();
        let rust = match std::panic::catch_unwind(|| {
            CompiledPolicy::load(bytes, Backend::Cpu).map(|_| ())
        }) {
            Ok(Err(PolicyError::Artifact(e))) => Cell::Typed(format!(
                "FormatError::{}",
                format!("{e:?}").split([' ', '{', '(']).next().unwrap()
            )),
            Ok(Err(e)) => Cell::Typed(format!("PolicyError: {}", short(&e.to_string()))),
            Ok(Ok(())) => Cell::Broken("accepted".into()),
            Err(_) => Cell::Broken("panic".into()),
        };
        let plugin_cell = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            policyport_wasmtime::load(&rt, bytes, policyport_wasmtime::WasmLimits::default())
                .map(|_| ())
        })) {
            Ok(Err(e)) => Cell::Typed(format!("{} ({})", short(&e.to_string()), e.kind())),
            Ok(Ok(())) => Cell::Broken("accepted".into()),
            Err(_) => Cell::Broken("host panic".into()),
        };
        let mut p: *mut PpPolicy = std::ptr::null_mut();
        let c_native = c_status(unsafe {
            pp_policy_load(bytes.as_ptr(), bytes.len(), PpBackend::Cpu as u32, &mut p)
        });
        let c_wasm = c_status(unsafe {
            pp_policy_load_wasm(bytes.as_ptr(), bytes.len(), plugin_c.as_ptr(), 0, 0, &mut p)
        });
        let cli = cli_cell(&["verify".as_ref(), path.as_os_str()]);
        record(
            name,
            vec![
                ("Rust", rust),
                ("plugin", plugin_cell),
                ("C", c_native),
                ("C sandboxed", c_wasm),
                ("CLI verify", cli),
            ],
        );
    }

    // Calls on a valid policy: every API refuses them and then still answers a good call the same way.
    let obs_ok = [0.01f32, 0.0, 0.02, 0.0];
    let calls: Vec<(&str, Vec<f32>, usize, u32)> = vec![
        ("NaN observation", vec![0.0, f32::NAN, 0.0, 0.0], 1, 0),
        ("3 numbers for a 4-number observation", vec![0.0; 3], 1, 0),
        ("batch 0", vec![], 0, 0),
        ("env ids past u32::MAX", vec![0.0; 8], 2, u32::MAX),
    ];
    let policy = CompiledPolicy::load(&good, Backend::Cpu).unwrap();
    let mut native = policy.session();
    let mut sandboxed =
        policyport_wasmtime::load(&rt, &good, policyport_wasmtime::WasmLimits::default())
            .unwrap()
            .session();
    let mut c: *mut PpPolicy = std::ptr::null_mut();
    assert_eq!(
        unsafe { pp_policy_load(good.as_ptr(), good.len(), PpBackend::Cpu as u32, &mut c) },
        PpStatus::Ok
    );
    let want = native
        .act(&Request::new(
            Observations::F32(&obs_ok),
            1,
            ActMode::Deterministic,
        ))
        .unwrap()
        .discrete
        .clone();
    let policy_path = dir.join("cartpole.policy");
    std::fs::write(&policy_path, &good).unwrap();
    for (name, obs, batch, offset) in &calls {
        let req = Request::new(Observations::F32(obs), *batch, ActMode::Deterministic)
            .envs(EnvIds::Range(*offset));
        let rust = match native.act(&req) {
            Err(e) => Cell::Typed(format!("PolicyError: {}", short(&e.to_string()))),
            Ok(_) => Cell::Broken("answered".into()),
        };
        let plugin_cell = match sandboxed.act(&req) {
            Err(e) => Cell::Typed(format!("{} ({})", short(&e.to_string()), e.kind())),
            Ok(_) => Cell::Broken("answered".into()),
        };
        let mut a = [0i64; 4];
        let ptr = if obs.is_empty() {
            obs_ok.as_ptr()
        } else {
            obs.as_ptr()
        };
        // The C ABI takes a batch, not a length: a short buffer is the caller's broken promise, not an input it
        // can see (calling it would read past this test's array).
        let c_cell = if !obs.is_empty() && obs.len() != batch * 4 {
            Cell::Typed("n/a (takes a batch, not a length)".into())
        } else {
            c_status(unsafe {
                pp_policy_act(
                    c,
                    ptr,
                    *batch,
                    *offset,
                    0,
                    0,
                    0,
                    a.as_mut_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null(),
                )
            })
        };
        let obs_path = dir.join("obs.json");
        let rows_json: Vec<Vec<f32>> = if *batch == 0 {
            vec![]
        } else {
            obs.chunks(obs.len().div_ceil(*batch).max(1))
                .map(|r| r.to_vec())
                .collect()
        };
        let text = serde_json::to_string(&rows_json)
            .unwrap()
            .replace("null", "NaN");
        std::fs::write(&obs_path, text).unwrap();
        let offset_s = offset.to_string();
        let cli = cli_cell(&[
            "run".as_ref(),
            policy_path.as_os_str(),
            "--obs".as_ref(),
            obs_path.as_os_str(),
            "--env-offset".as_ref(),
            offset_s.as_ref(),
        ]);
        record(
            name,
            vec![
                ("Rust", rust),
                ("plugin", plugin_cell),
                ("C", c_cell),
                ("C sandboxed", Cell::Typed("(as plugin)".into())),
                ("CLI run", cli),
            ],
        );
        // Nothing was lost: the next good call answers as before, on every API.
        let good_req = Request::new(Observations::F32(&obs_ok), 1, ActMode::Deterministic);
        assert_eq!(
            native.act(&good_req).unwrap().discrete,
            want,
            "{name}: Rust"
        );
        assert_eq!(
            sandboxed.act(&good_req).unwrap().discrete,
            want,
            "{name}: sandbox"
        );
    }
    unsafe { pp_policy_free(c) };

    let table = format!(
        "| input | Rust (`CompiledPolicy`, cpu) | sandbox (`policyport_wasmtime::load`) | C ABI | C ABI, sandboxed | CLI |\n|---|---|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    let out = target.join("hostile-inputs.md");
    std::fs::write(&out, &table).unwrap();
    println!("{table}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        broken.is_empty(),
        "inputs that broke an API's contract:\n{}",
        broken.join("\n")
    );
}

/// A chain of `depth` dense layers all reading one `width x width` weight (one copy in the file, a batch x width
/// buffer per node at run time): a small file whose plan asks for `depth` times that memory.
fn memory_bomb(width: usize, depth: usize) -> Vec<u8> {
    let mut nodes = vec![];
    let mut prev = "obs".to_string();
    for i in 0..depth {
        let out = if i + 1 == depth {
            "h".to_string()
        } else {
            format!("n{i}")
        };
        nodes.push(dense(&prev, "w", &out));
        prev = out;
    }
    nodes.push(dense("h", "head", "logits"));
    hostile_artifact(
        policy_json(
            serde_json::json!({"kind": "box", "shape": [width], "dtype": "f32"}),
            serde_json::json!([]),
            serde_json::Value::Array(nodes),
            serde_json::json!({"kind": "discrete", "n": 2}),
            serde_json::json!({"kind": "categorical", "logits": "logits"}),
        ),
        &[
            ("w", vec![width, width], vec![0.001; width * width]),
            ("head", vec![2, width], vec![0.0; 2 * width]),
        ],
    )
}

/// nvec = [usize::MAX, 5]: summed (wrapping) to 4 it matched 4 logits, and the sampler sliced past them.
fn wrapping_nvec_artifact() -> Vec<u8> {
    hostile_artifact(
        policy_json(
            serde_json::json!({"kind": "box", "shape": [3], "dtype": "f32"}),
            serde_json::json!([]),
            serde_json::json!([dense("obs", "w", "logits")]),
            serde_json::json!({"kind": "multi_discrete", "nvec": [u64::MAX, 5]}),
            serde_json::json!({"kind": "multi_categorical", "logits": "logits"}),
        ),
        &[("w", vec![4, 3], vec![0.1; 12])],
    )
}
