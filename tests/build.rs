//! `cfg(policyport_host_avx512bf16)` when this build's own CPU runs the bf16 dense kernel (AVX512-F and
//! AVX512-BF16) and the target is that CPU's architecture: the bf16 kernel's unit tests are ignored (reported as
//! skipped, with that reason) elsewhere, never passed without running. Nothing but tests reads it: the runtime
//! detects the feature when it runs (POLICYPORT_CPU_BASELINE, read only at run time, turns the kernel off).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(policyport_host_avx512bf16)");
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(target_arch = "x86_64")]
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bf16")
    {
        println!("cargo::rustc-cfg=policyport_host_avx512bf16");
    }
}
