//! Shared helpers of the conformance suite: fixture discovery and compilation, backends under test.

use std::path::{Path, PathBuf};

use policyport::Backend;
use policyport_import::{FixtureIo, ImportSpec, Storage, compile_onnx};

/// tests/fixtures, or `POLICYPORT_FIXTURES` (a test binary copied to another machine, e.g. the GPU check).
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("POLICYPORT_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
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
        Storage::F32,
    )
    .unwrap_or_else(|e| panic!("compiling {}: {e}", f.name))
}

/// The backends this build runs. Every conformance test runs on each of them.
///
/// Under `POLICYPORT_CPU_BASELINE=1` (test.sh's rerun of the suite on the cpu backend's portable kernels, no
/// AVX2/AVX-512) only the cpu backend: it is the only one whose code that variable changes, and every backend
/// already ran the whole suite in the first pass.
pub fn backends() -> Vec<Backend> {
    if std::env::var_os("POLICYPORT_CPU_BASELINE").is_some() {
        return vec![Backend::Cpu];
    }
    let b = Backend::compiled();
    assert!(
        b.contains(&Backend::Cpu) && b.contains(&Backend::Flex),
        "cpu and flex must always run the suite: {b:?}"
    );
    assert_eq!(
        b.contains(&Backend::Wgpu),
        cfg!(feature = "wgpu"),
        "the guest's wgpu feature and the suite's disagree: the wgpu-only tests would be skipped or mis-run"
    );
    if std::env::var("POLICYPORT_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
        assert!(
            b.contains(&Backend::Wgpu),
            "POLICYPORT_REQUIRE_WGPU=1 but the guest was built without the `wgpu` feature"
        );
    }
    b
}

/// The plugin module (`guest/plugin` built for wasm32-unknown-unknown), found next to this test binary's target
/// dir. `tests/scripts/test.sh` builds it first.
pub fn plugin_wasm() -> Vec<u8> {
    let exe = std::env::current_exe().expect("test binary path");
    // <target>/<profile>/deps/<test binary>
    let target = exe.ancestors().nth(3).expect("target dir").to_path_buf();
    let path = target.join("wasm32-unknown-unknown/plugin/policyport_plugin.wasm");
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
    let want = std::fs::read_to_string(path).ok();
    if want.as_deref() == Some(got) {
        return;
    }
    let bless = std::env::var("POLICYPORT_BLESS").is_ok_and(|v| v == "1")
        && !std::env::var("CI").is_ok_and(|v| v == "true");
    if bless {
        std::fs::write(path, got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!(
            "re-blessed {} (POLICYPORT_BLESS=1): review the diff before committing",
            path.display()
        );
        return;
    }
    match want {
        None => panic!(
            "{} missing: run once with POLICYPORT_BLESS=1",
            path.display()
        ),
        Some(want) => assert_eq!(
            got,
            want,
            "{} changed; re-bless with POLICYPORT_BLESS=1 if intended",
            path.display()
        ),
    }
}
