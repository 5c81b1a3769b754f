//! Frozen artifacts (tract's rule): `.policy` files written by an earlier release of the format, committed byte
//! for byte under `tests/frozen/v<major>.<minor>/`, which every later reader must keep loading with the same
//! answers. Without them a change that breaks reader and writer alike (both sides of a round trip move together)
//! passes every other test.
//!
//! Each `<name>.policy` has a `<name>.expected.json`: the file's SHA-256 (a tripwire against regenerating a frozen
//! file), its format version, and the outputs of a seeded batch (deterministic and sampled). The expected outputs
//! were written once by the cpu backend and are re-blessed only on a mismatch with `POLICYPORT_BLESS=1` (never
//! under CI). The frozen `.policy` files themselves are never regenerated: a new format version gets a new
//! directory (tests/frozen/README.md says how they were made).

use std::path::{Path, PathBuf};

use policyport::{ActMode, Backend, Observations, Request};
use policyport_conformance::fixtures_dir;
use policyport_format::read_artifact;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const BATCH: usize = 8;
const OBS_SEED: u64 = 5;
const MODES: [ActMode; 2] = [
    ActMode::Deterministic,
    ActMode::Sample { seed: 11, step: 3 },
];

fn frozen_files() -> Vec<(String, PathBuf)> {
    let root = fixtures_dir().parent().unwrap().join("frozen");
    let mut files = vec![];
    for dir in std::fs::read_dir(&root).expect("tests/frozen") {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let version = dir.file_name().unwrap().to_string_lossy().into_owned();
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "policy") {
                files.push((version.clone(), f));
            }
        }
    }
    files.sort();
    files
}

/// The outputs of one backend on the seeded batch: per mode, one or two steps (two for recurrent policies, so the
/// carried state is covered too).
fn outputs(bytes: &[u8], backend: Backend) -> Value {
    let p = policyport_conformance::load(bytes, backend)
        .unwrap_or_else(|e| panic!("load on {backend:?}: {e}"));
    let obs = policyport_import::random_obs(&p.manifest().observation, BATCH, OBS_SEED);
    let recurrent = p.info().recurrent_states > 0;
    let mut cases = vec![];
    for mode in MODES {
        // A fresh session per mode: state starts at zero.
        let mut s = p.session();
        for step in 0..if recurrent { 2 } else { 1 } {
            let out = s
                .act(&Request::new(Observations::F32(&obs), BATCH, mode))
                .unwrap_or_else(|e| panic!("act on {backend:?}: {e}"));
            cases.push(json!({
                "mode": format!("{mode:?}"),
                "step": step,
                "discrete": out.discrete,
                "continuous": out.continuous,
                "value": out.value,
                "dist_params": out.dist_params,
            }));
        }
    }
    Value::Array(cases)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Discrete actions equal; every float output within 1e-5 of the expected, relative to its largest magnitude.
fn assert_close(file: &Path, backend: Backend, got: &Value, want: &Value) {
    let (got, want) = (got.as_array().unwrap(), want.as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{}: cases", file.display());
    for (g, w) in got.iter().zip(want) {
        let at = format!(
            "{} on {backend:?}, {} step {}",
            file.display(),
            w["mode"],
            w["step"]
        );
        assert_eq!(g["mode"], w["mode"], "{at}");
        assert_eq!(g["discrete"], w["discrete"], "{at}: discrete actions");
        for key in ["continuous", "value", "dist_params"] {
            let (gv, wv) = (floats(&g[key]), floats(&w[key]));
            assert_eq!(gv.len(), wv.len(), "{at}: {key} length");
            let scale = wv.iter().fold(1e-12f64, |m, x| m.max(x.abs()));
            let err = gv
                .iter()
                .zip(&wv)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            assert!(err <= 1e-5, "{at}: {key} rel err {err:e}");
        }
    }
}

fn every_frozen_artifact_loads_and_answers_the_same_on_every_backend(backend: Backend) {
    let files = frozen_files();
    // v1.0 f32 and bf16 storage at least: an empty directory must not pass.
    assert!(files.len() >= 2, "frozen artifacts missing: {files:?}");
    for (version, file) in files {
        let bytes = std::fs::read(&file).unwrap();
        let sha = format!("{:x}", Sha256::digest(&bytes));
        let art = read_artifact(&bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (major, minor) = art.version;
        assert_eq!(version, format!("v{major}.{minor}"), "{}", file.display());

        let expected_path = file.with_extension("expected.json");
        let mut record = json!({
            "sha256": sha,
            "format_version": [major, minor],
            "batch": BATCH,
            "obs": format!("policyport_import::random_obs(space, {BATCH}, {OBS_SEED})"),
            "outputs": outputs(&bytes, Backend::Cpu),
        });
        match std::fs::read(&expected_path) {
            Ok(text) => {
                let want: Value = serde_json::from_slice(&text).unwrap();
                assert_eq!(
                    want["sha256"],
                    record["sha256"],
                    "{} changed: frozen files are never rewritten (add a new version directory instead)",
                    file.display()
                );
                record["outputs"] = want["outputs"].clone();
            }
            Err(_) => {
                // Written once, the first time, from the cpu backend (then compared like any later run).
                policyport_conformance::assert_snapshot(
                    &expected_path,
                    &serde_json::to_string_pretty(&record).unwrap(),
                );
            }
        }
        let p = policyport_conformance::load(&bytes, backend).unwrap();
        for r in p.verify().unwrap() {
            assert!(
                r.passed,
                "{} golden case on {backend:?}: {r:?}",
                file.display()
            );
        }
        assert_close(
            &file,
            backend,
            &outputs(&bytes, backend),
            &record["outputs"],
        );
    }
}
per_backend!(every_frozen_artifact_loads_and_answers_the_same_on_every_backend);
