//! The module's rpath: `$ORIGIN/../torch/lib` and the CUDA runtime wheel's `$ORIGIN/../nvidia/cu13/lib` (torch
//! 2.11's layout; the module needs libcudart directly for the CUDA-graph shim). Built with the libtorch executor (the workspace build unifies
//! `policyport-torch/tch` in), the module needs libtorch's shared libraries; installed in site-packages next to
//! torch, this finds them without LD_LIBRARY_PATH and without importing torch first. Harmless otherwise.
fn main() {
    println!(
        "cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN/../torch/lib:$ORIGIN/../nvidia/cu13/lib"
    );
    println!("cargo:rerun-if-changed=build.rs");
}
