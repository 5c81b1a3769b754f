//! With the `tch` feature: build the CUDA-graph shim (src/cuda_graph.cpp) against the libtorch that tch
//! links. torch-sys publishes its lib dir as `DEP_TCH_LIBTORCH_LIB` (its `links = "tch"`); headers sit beside it.
//! CUDA headers: `$CUDA_HOME/include`, else the pip wheels' `site-packages/nvidia/cu*/include` next to torch, else
//! `/usr/local/cuda/include`. A libtorch without CUDA (or no headers) gets the same ABI as stubs that report it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    #[cfg(feature = "tch")]
    build_shim();
}

#[cfg(feature = "tch")]
fn build_shim() {
    use std::path::PathBuf;
    println!("cargo:rerun-if-changed=src/cuda_graph.cpp");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"),
    );
    let torch_root = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .to_path_buf();
    let mut b = cc::Build::new();
    b.cpp(true)
        .pic(true)
        .warnings(false)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .include(torch_root.join("include"))
        .include(torch_root.join("include/torch/csrc/api/include"));
    let has_cuda_lib = lib.join("libtorch_cuda.so").exists();
    let cuda_include = std::env::var_os("CUDA_HOME")
        .map(|h| PathBuf::from(h).join("include"))
        .into_iter()
        .chain(
            std::fs::read_dir(torch_root.join("../nvidia"))
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("include")),
        )
        .chain([PathBuf::from("/usr/local/cuda/include")])
        .find(|p| p.join("cuda_runtime_api.h").exists());
    match (&cuda_include, has_cuda_lib) {
        (Some(inc), true) => {
            b.include(inc);
            println!("cargo:rustc-link-lib=c10_cuda");
            println!("cargo:rustc-link-lib=torch_cuda");
            // The shim's inline CUDA helpers call the runtime directly. Pip wheels ship only the versioned
            // soname (libcudart.so.13), so link it verbatim from the lib dir beside the headers.
            let cuda_lib = inc.join("../lib");
            let cudart = std::fs::read_dir(&cuda_lib)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("libcudart.so"))
                .min_by_key(|n| n.len());
            match cudart {
                Some(name) => {
                    println!("cargo:rustc-link-search=native={}", cuda_lib.display());
                    println!("cargo:rustc-link-lib=dylib:+verbatim={name}");
                    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda_lib.display());
                }
                None => println!("cargo:rustc-link-lib=cudart"),
            }
        }
        _ => {
            println!(
                "cargo:warning=CUDA graphs compiled as stubs (libtorch_cuda: {has_cuda_lib}, CUDA headers: {cuda_include:?})"
            );
            b.define("PP_NO_CUDA", None);
        }
    }
    b.file("src/cuda_graph.cpp").compile("pp_cuda_graph");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=c10");
    println!("cargo:rustc-link-lib=torch_cpu");
    // The CLI and this crate's tests find libtorch without LD_LIBRARY_PATH (that still takes precedence, e.g.
    // a binary copied to a machine with its own torch).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
