//! The WGSL kernels as the runtime embeds them: comments and indentation stripped (`OUT_DIR/<name>.wgsl`). The
//! committed `.wgsl` files keep their long "why" comments; the browser bundle (3 MB gzipped goal) carries only the
//! code, and naga validates exactly the text that ships (this crate's tests). WGSL has no string literals and the
//! kernels use no block comments, so a `//` always starts a comment.

use std::path::Path;

fn main() {
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    for name in [
        "dense_small",
        "dense_tiled",
        "sample",
        "preprocess",
        "state",
        "conv2d",
    ] {
        let src_path = format!("{name}.wgsl");
        println!("cargo:rerun-if-changed={src_path}");
        let src = std::fs::read_to_string(&src_path).expect("a committed WGSL kernel");
        assert!(
            !src.contains("/*"),
            "{src_path}: block comments are not stripped"
        );
        let code: Vec<&str> = src
            .lines()
            .map(|l| l.split_once("//").map_or(l, |(code, _)| code).trim())
            .filter(|l| !l.is_empty())
            .collect();
        std::fs::write(Path::new(&out).join(&src_path), code.join("\n") + "\n")
            .expect("write the stripped kernel");
    }
}
