//! One module per subcommand family; `main.rs` parses the command line and dispatches here. What the modules
//! share: reading a file with its name in the error, loading a policy on any backend, writing an output file
//! atomically.

use std::path::Path;

use anyhow::{Context, Result};
use policyport::{Backend, CompiledPolicy};

pub mod act;
pub mod bench;
pub mod compile;
pub mod demo;

pub fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

/// Load on any backend: the built-in ones through the runtime, `torch` through the libtorch crate (its default
/// options: CPU, f32, eager; `bench-torch` has the others). A backend this build lacks is a typed error.
pub fn load_policy(bytes: &[u8], backend: Backend) -> Result<std::sync::Arc<CompiledPolicy>> {
    Ok(match backend {
        // A CLI installed with its default features (`cargo install --path host/cli`) has no libtorch, so it
        // starts on any machine; asking it for the torch backend says what the user is missing.
        Backend::Torch => policyport_torch::load(bytes, &Default::default()).map_err(|e| match e {
            policyport_torch::TorchError::NotCompiled => anyhow::anyhow!(
                "{e}: this policyport has no libtorch backend; install one that has it with \
                 `cargo install --path host/cli --features tch` (it links libtorch: see host/torch/README.md)"
            ),
            e => e.into(),
        })?,
        _ => CompiledPolicy::load(bytes, backend)?,
    })
}

/// Write to a fresh temporary file next to `out` (`create_new`: never an existing file, never through a
/// symlink), sync it, and rename it over `out`: a crash never leaves a partial file under `out`'s name, and a
/// failed write leaves no temporary file behind.
pub fn write_atomically(out: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{nanos}",
        out.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
