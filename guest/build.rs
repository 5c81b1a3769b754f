//! `cfg(policyport_host_avx512bf16)` when this build's own CPU runs the bf16 dense kernel (AVX512-F and
//! AVX512-BF16) and the target is that CPU's architecture: the bf16 kernel's unit tests are ignored (reported as
//! skipped, with that reason) elsewhere, never passed without running. Nothing but tests reads it: the runtime
//! detects the feature when it runs (POLICYPORT_CPU_BASELINE, read only at run time, turns the kernel off).
//!
//! `cfg(policyport_v128)` when the target has the 128-bit tile's vectors as part of itself (`dense::v128`):
//! x86-64 (SSE2), aarch64 with NEON, wasm32 with SIMD128 — one name for what would otherwise be the same
//! three-way `cfg(any(...))` at every place that picks or names that tile.
//!
//! `cfg(policyport_wasm_threads)` on wasm32 built with `+atomics` (shared memory: the browser bundle
//! `web/pkg/cpu-threads`): std cannot spawn threads there, so the cpu backend's pool borrows Web Workers the page
//! started and lent to it (`crate::web_workers`).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(policyport_host_avx512bf16)");
    println!("cargo::rustc-check-cfg=cfg(policyport_v128)");
    println!("cargo::rustc-check-cfg=cfg(policyport_wasm_threads)");
    println!("cargo::rerun-if-changed=build.rs");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| features.split(',').any(|x| x == f);
    if arch == "x86_64"
        || (arch == "aarch64" && has("neon"))
        || (arch == "wasm32" && has("simd128"))
    {
        println!("cargo::rustc-cfg=policyport_v128");
    }
    if arch == "wasm32" && has("atomics") {
        println!("cargo::rustc-cfg=policyport_wasm_threads");
    }
    #[cfg(target_arch = "x86_64")]
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bf16")
    {
        println!("cargo::rustc-cfg=policyport_host_avx512bf16");
    }
}
