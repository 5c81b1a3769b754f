//! Shared helpers of the conformance suite: fixture discovery and compilation, backends under test.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use policyport::{Backend, BackendError, CompiledPolicy, PolicyError};
use policyport_import::{FixtureIo, ImportSpec, StorageDType, compile_onnx};
use policyport_torch::{TorchError, TorchOptions};
use policyport_wasmtime::WasmRuntime;

/// This package's directory (`tests/`) as `cargo test` names it when it runs the binary, else where it was built.
///
/// Why not just `env!("CARGO_MANIFEST_DIR")`: cargo does not rebuild a workspace moved to another directory
/// (fingerprints hold paths relative to the workspace root), so with the shared target dir outside the clone a
/// binary built in one clone kept reading the fixtures of that clone, or of a deleted one ("cartpole/policy.onnx:
/// No such file or directory" from every test, 2026-12-04). `cargo test` sets the variable at run time too.
pub fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// tests/fixtures, or `POLICYPORT_FIXTURES` (a test binary copied to another machine, e.g. the GPU check).
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("POLICYPORT_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => package_dir().join("fixtures"),
    }
}

/// Every fixture directory (one holding a policy.onnx), sorted.
pub fn fixture_names() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("policy.onnx").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub struct Fixture {
    pub name: String,
    pub onnx: Vec<u8>,
    pub spec: ImportSpec,
    pub io: FixtureIo,
}

pub fn load_fixture(name: &str) -> Fixture {
    let d = fixtures_dir().join(name);
    let read = |f: &str| std::fs::read(d.join(f)).unwrap_or_else(|e| panic!("{name}/{f}: {e}"));
    Fixture {
        name: name.to_string(),
        onnx: read("policy.onnx"),
        spec: serde_json::from_slice(&read("import.json")).expect("import.json"),
        io: serde_json::from_slice(&read("io.json")).expect("io.json"),
    }
}

/// Compile a fixture with its PyTorch float64 outputs as golden vectors.
pub fn compile_fixture(f: &Fixture) -> Vec<u8> {
    compile_onnx(
        &f.onnx,
        &f.spec,
        &format!("{}/policy.onnx", f.name),
        Some(&f.io),
        StorageDType::F32,
    )
    .unwrap_or_else(|e| panic!("compiling {}: {e}", f.name))
}

/// The backends this build runs. Every conformance test runs on each of them (load with [`load`]).
///
/// Besides the runtime's own backends (cpu, flex, and wgpu with the suite's `wgpu` feature): `Wasmtime`, the
/// sandboxed plugin under wasmtime (crate policyport-wasmtime; the plugin module test.sh builds), always; and
/// `Torch`, the libtorch executor (crate policyport-torch, its default options: CPU, f32, eager, host sampling)
/// with the suite's `tch` feature — its other configurations (f16 / bf16, device sampling, the CUDA-graph code
/// path on static buffers, CUDA) run in `torch.rs`; the plugin's limits, hostile modules and cache in `wasm.rs`.
///
/// Under `POLICYPORT_CPU_BASELINE=1` (test.sh's rerun of the suite on the cpu backend's portable kernels, no
/// AVX2/AVX-512) only the cpu backend: it is the only one whose code that variable changes, and every backend
/// already ran the whole suite in the first pass.
///
/// Likewise under `POLICYPORT_CPU_AVX2=1` (the rerun on the AVX2 kernels, on a CPU that also has AVX-512) and
/// `POLICYPORT_CPU_SIMD128=1` (the 128-bit kernels: SSE, the NEON tile's x86 twin).
///
/// Under `POLICYPORT_WASM_LEND=1` (test.sh's rerun for the host-lent dense kernel) only `Wasmtime`, loaded with
/// `WasmLimits::lend_dense`: the plugin's dense layers and convolution GEMMs then run natively in the host, the
/// rest in the sandbox — a second configuration of the same backend, so the whole suite runs on it too.
pub fn backends() -> Vec<Backend> {
    if std::env::var_os("POLICYPORT_CPU_BASELINE").is_some()
        || std::env::var_os("POLICYPORT_CPU_AVX2").is_some()
        || std::env::var_os("POLICYPORT_CPU_SIMD128").is_some()
    {
        return vec![Backend::Cpu];
    }
    if wasm_lend() {
        return vec![Backend::Wasmtime];
    }
    let mut b = Backend::compiled();
    assert!(
        b.contains(&Backend::Cpu) && b.contains(&Backend::Flex),
        "cpu and flex must always run the suite: {b:?}"
    );
    assert_eq!(
        b.contains(&Backend::Wgpu),
        cfg!(feature = "wgpu"),
        "the guest's wgpu feature and the suite's disagree: the wgpu-only tests would be skipped or mis-run"
    );
    assert_eq!(
        policyport_torch::COMPILED,
        cfg!(feature = "tch"),
        "policyport-torch/tch and the suite's tch feature disagree"
    );
    if std::env::var("POLICYPORT_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
        assert!(
            b.contains(&Backend::Wgpu),
            "POLICYPORT_REQUIRE_WGPU=1 but the guest was built without the `wgpu` feature"
        );
    }
    if std::env::var("POLICYPORT_REQUIRE_TCH").is_ok_and(|v| v == "1") {
        assert!(
            policyport_torch::COMPILED,
            "POLICYPORT_REQUIRE_TCH=1 but policyport-torch was built without the `tch` feature"
        );
    }
    if policyport_torch::COMPILED {
        b.push(Backend::Torch);
    }
    b.push(Backend::Wasmtime);
    b
}

/// Whether this run lends the sandbox the host's dense kernel (`POLICYPORT_WASM_LEND=1`, see [`backends`]).
pub fn wasm_lend() -> bool {
    std::env::var("POLICYPORT_WASM_LEND").is_ok_and(|v| v == "1")
}

/// One wasmtime runtime (engine + compiled plugin) for the whole suite.
pub fn plugin_runtime() -> Arc<WasmRuntime> {
    static RT: std::sync::OnceLock<Arc<WasmRuntime>> = std::sync::OnceLock::new();
    RT.get_or_init(|| WasmRuntime::new(&plugin_wasm()).expect("the plugin module loads"))
        .clone()
}

/// Load `bytes` on one of [`backends`]: the built-in backends through [`CompiledPolicy::load`], `Torch` through
/// `policyport_torch::load` with its default options, `Wasmtime` through `policyport_wasmtime::load` on
/// [`plugin_runtime`] with the default limits but a 60 s call deadline (the default 1 s is a game loop's hang
/// guard; the suite's IMPALA golden batch takes ~80 ms alone but seconds of wall clock when every test thread
/// shares the 2 CI cores; `wasm.rs` tests the deadline itself). Errors are the runtime's typed errors either way (a
/// libtorch failure is `BackendError::Device`).
pub fn load(bytes: &[u8], backend: Backend) -> Result<Arc<CompiledPolicy>, PolicyError> {
    match backend {
        Backend::Torch => {
            policyport_torch::load(bytes, &TorchOptions::default()).map_err(|e| match e {
                TorchError::Policy(p) => p,
                TorchError::Artifact(f) => PolicyError::Artifact(f),
                other => BackendError::Device(other.to_string()).into(),
            })
        }
        Backend::Wasmtime => {
            let limits = policyport_wasmtime::WasmLimits {
                deadline: std::time::Duration::from_secs(60),
                lend_dense: wasm_lend(),
                ..Default::default()
            };
            policyport_wasmtime::load(&plugin_runtime(), bytes, limits)
        }
        _ => CompiledPolicy::load(bytes, backend),
    }
}

/// The plugin module (`guest/plugin` built for wasm32-unknown-unknown), found next to this test binary's target
/// dir. `tests/scripts/test.sh` builds it first.
pub fn plugin_wasm() -> Vec<u8> {
    let exe = std::env::current_exe().expect("test binary path");
    // <target>/<profile>/deps/<test binary>, or <target>/<profile>/<bin> (the soak binary).
    let rel = "wasm32-unknown-unknown/plugin/policyport_plugin.wasm";
    let path = exe
        .ancestors()
        .map(|d| d.join(rel))
        .find(|p| p.exists())
        .unwrap_or_else(|| exe.ancestors().nth(3).expect("target dir").join(rel));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}. Build the plugin first: cargo build --profile plugin -p policyport-plugin --target wasm32-unknown-unknown",
            path.display()
        )
    })
}

/// Compares `got` with the blessed snapshot at `path`. Re-blessing (wasmtime's rule) happens only on a mismatch,
/// only with `POLICYPORT_BLESS=1` exactly, and never under CI (`CI=true`): the file is rewritten and the test says
/// so. Any other value of the variable is ignored.
pub fn assert_snapshot(path: &Path, got: &str) {
    match compare_or_bless(path, got.as_bytes()) {
        Ok(()) => {}
        Err(None) => panic!(
            "{} missing: run once with POLICYPORT_BLESS=1",
            path.display()
        ),
        Err(Some(want)) => assert_eq!(
            got,
            String::from_utf8_lossy(&want),
            "{} changed; re-bless with POLICYPORT_BLESS=1 if intended",
            path.display()
        ),
    }
}

/// [`assert_snapshot`] for binary files (e.g. a test artifact committed for the browser suite): the same rule,
/// compared byte for byte.
pub fn assert_snapshot_bytes(path: &Path, got: &[u8]) {
    match compare_or_bless(path, got) {
        Ok(()) => {}
        Err(None) => panic!(
            "{} missing: run once with POLICYPORT_BLESS=1",
            path.display()
        ),
        Err(Some(want)) => panic!(
            "{} changed ({} bytes committed, {} now); re-bless with POLICYPORT_BLESS=1 if intended",
            path.display(),
            want.len(),
            got.len()
        ),
    }
}

/// The snapshot rule once: Ok when `got` equals the file or was just re-blessed (a mismatch, `POLICYPORT_BLESS=1`
/// exactly, not under CI); otherwise the file's contents (None when it is missing).
fn compare_or_bless(path: &Path, got: &[u8]) -> Result<(), Option<Vec<u8>>> {
    let want = std::fs::read(path).ok();
    if want.as_deref() == Some(got) {
        return Ok(());
    }
    let bless = std::env::var("POLICYPORT_BLESS").is_ok_and(|v| v == "1")
        && !std::env::var("CI").is_ok_and(|v| v == "true");
    if !bless {
        return Err(want);
    }
    std::fs::write(path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!(
        "re-blessed {} (POLICYPORT_BLESS=1): review the diff before committing",
        path.display()
    );
    Ok(())
}

/// The actions of a step as f64 (discrete or continuous, whichever the policy has).
pub fn actions_f64(out: &policyport::ActOutputs) -> Vec<f64> {
    if out.continuous.is_empty() {
        out.discrete.iter().map(|a| *a as f64).collect()
    } else {
        out.continuous.iter().map(|a| *a as f64).collect()
    }
}

/// Every golden case of `io` acted deterministically on `policy` (a fresh session per case: a recurrent policy's
/// trainer predict without a state starts from zeros) equals the trainer's own actions, `trainer["cases"][i]
/// ["actions"]` (SB3's `predict`, RLlib's env-runner path with `explore=False`).
pub fn assert_trainer_cases(
    policy: &Arc<CompiledPolicy>,
    io: &FixtureIo,
    trainer: &serde_json::Value,
    what: &str,
) {
    let cases = trainer["cases"].as_array().expect("trainer.json: cases");
    assert_eq!(cases.len(), io.cases.len(), "{what}: trainer cases");
    for (case, want) in io.cases.iter().zip(cases) {
        let want: Vec<f64> = serde_json::from_value(want["actions"].clone()).unwrap();
        let mut s = policy.session();
        let out = s
            .act(&policyport::Request::new(
                policyport::Observations::F32(&case.obs),
                case.batch,
                policyport::ActMode::Deterministic,
            ))
            .unwrap();
        assert_trainer_actions(out, &want, &format!("{what} case {}", case.name));
    }
}

/// A step's actions equal a trainer's own deterministic actions (continuous ones to float32 rounding).
pub fn assert_trainer_actions(out: &policyport::ActOutputs, want: &[f64], what: &str) {
    let got = actions_f64(out);
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: {got:?} vs the trainer's {want:?}"
        );
    }
}
