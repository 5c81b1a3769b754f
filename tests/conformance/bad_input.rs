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
    for (major, minor) in [(2u16, 0u16), (1, policyport_format::FORMAT_MINOR + 1), (0, 9)] {
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

#[test]
fn bad_observations_and_calls() {
    for backend in policyport_conformance::backends() {
        bad_observations_and_calls_on(backend);
    }
}

fn bad_observations_and_calls_on(backend: Backend) {
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

/// A seeded mutation fuzz of the manifest behind valid checksums (the checksum would otherwise stop almost
/// every random edit at the door): every outcome is Ok or a typed error, never a panic.
#[test]
fn mutated_manifests_never_panic() {
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
        for backend in policyport_conformance::backends() {
            match std::panic::catch_unwind(|| {
                policyport_conformance::load(&bytes, backend).map(|_| ())
            }) {
                Ok(Ok(())) => {}
                Ok(Err(_)) => refused += 1,
                Err(_) => panic!(
                    "panic on mutation {i} ({backend:?}): {}",
                    String::from_utf8_lossy(&mm)
                ),
            }
        }
    }
    assert!(
        refused > 200 * policyport_conformance::backends().len(),
        "mutations should mostly be refused ({refused})"
    );
}
