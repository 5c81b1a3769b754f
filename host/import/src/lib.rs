//! policyport's toolchain: importers (foreign model files → manifest + weights), golden vectors, the artifact
//! writer, the float64 reference interpreter and inspection. Never part of the runtime (`policyport`, in
//! `guest/`): a program that only runs policies does not link this crate.
//!
//! Where things go: a new import route is one module here producing an [`Imported`]; an op the importer learns
//! is lowered onto the format's IR in `onnx.rs` (and needs the runtime's kernels, see `guest/README.md`).

mod builder;
pub mod cleanrl;
mod compile;
mod fixture;
pub mod inspect;
pub mod npy_pickle;
pub mod onnx;
mod onnx_proto;
pub mod pickle;
pub mod reference;
pub mod rllib;
pub mod sb3;
pub mod spec;
pub mod torchfile;
pub mod zipread;

use policyport_format::FormatError;
use thiserror::Error;

pub use cleanrl::CleanrlLayout;
pub use compile::{
    compile_cleanrl, compile_imported, compile_onnx, compile_rllib, compile_rllib_module,
    compile_sb3, random_obs,
};
pub use fixture::{FixtureCase, FixtureIo, golden_from_fixture};
pub use onnx::{Imported, import_onnx};
/// The weights' storage in a written artifact (`--storage`): the format's own enum.
pub use policyport_format::container::StorageDType;
pub use spec::{DistSpec, ImportSpec, LogStdSpec, NormalizeSpec, StatePair};

#[derive(Debug, Error)]
pub enum ImportError {
    #[error("unsupported op {op} at node '{node}': {detail}. Fix: {hint}")]
    UnsupportedOp {
        op: String,
        node: String,
        detail: String,
        hint: String,
    },
    #[error("unsupported model: {what}. Fix: {hint}")]
    Unsupported { what: String, hint: String },
    #[error("malformed model: {0}")]
    Malformed(String),
    #[error("import spec: {0}")]
    Spec(String),
    #[error("golden vectors: {0}")]
    Golden(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Pickle(#[from] pickle::PickleError),
    /// Weights of the file that no layer of the importer read (and that are not training-only): a layer it does
    /// not know, or a renamed one, which compiling would drop without a word.
    #[error(
        "malformed model: {what}: {count} weight(s) of the file are not read by any layer this importer builds \
         (first: {keys:?}); a renamed or unknown layer would be dropped, so nothing was compiled"
    )]
    UnreadWeights {
        what: &'static str,
        keys: Vec<String>,
        count: usize,
    },
    /// A Box action bound that is NaN (or a finite number past f32): only ±inf means "unbounded", so reading it as
    /// such would drop the artifact's clip without a word.
    #[error(
        "malformed model: action space Box.{side}[{index}] is {value}: a bound is a number or ±inf (unbounded)"
    )]
    ActionBound {
        side: &'static str,
        index: usize,
        value: f64,
    },
}

/// One Box action bound as the manifest holds it: ±inf is unbounded (`None`), a finite number is the bound, and a
/// NaN, or a finite value past f32's range, is [`ImportError::ActionBound`] (every importer reads bounds here).
pub(crate) fn action_bound(
    value: f64,
    side: &'static str,
    index: usize,
) -> Result<Option<f32>, ImportError> {
    if value.is_infinite() {
        return Ok(None);
    }
    let bound = value as f32;
    if !bound.is_finite() {
        return Err(ImportError::ActionBound { side, index, value });
    }
    Ok(Some(bound))
}

/// What a model file is, decided by its content. Every front end (CLI, Python) dispatches on this, so a damaged
/// file is named as what it is — a truncated zip, an SB3 archive missing `policy.pth`, an empty file — instead of
/// falling through to the ONNX route and asking for `--spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A Stable-Baselines3 `model.zip` (`data` + `policy.pth`).
    Sb3Archive,
    /// A PyTorch state dict: a `torch.save` zip (`<archive>/data.pkl`), a bare pickle or a safetensors file.
    StateDict,
    /// Anything that starts like a protobuf message (an ONNX `ModelProto`); the ONNX reader names any damage.
    Onnx,
}

/// [`ModelKind`] of `bytes`, or what makes them none of the model files policyport reads.
pub fn detect_model(bytes: &[u8]) -> Result<ModelKind, ImportError> {
    if bytes.is_empty() {
        return Err(ImportError::Malformed("the model file is empty".into()));
    }
    if zipread::is_zip(bytes) || bytes.starts_with(b"PK\x05\x06") {
        let zip = zipread::Zip::open(bytes).map_err(|e| {
            ImportError::Malformed(format!(
                "a zip archive (a Stable-Baselines3 model.zip or a torch.save file?) that cannot be read, \
                 truncated or damaged: {e}"
            ))
        })?;
        let has = |name: &str| zip.names().any(|n| n == name);
        if has("data") || has("policy.pth") {
            for part in ["data", "policy.pth"] {
                if !has(part) {
                    return Err(ImportError::Malformed(format!(
                        "a Stable-Baselines3 archive without its '{part}' entry (model.zip holds 'data' and \
                         'policy.pth')"
                    )));
                }
            }
            return Ok(ModelKind::Sb3Archive);
        }
        if zip
            .names()
            .any(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        {
            return Ok(ModelKind::StateDict);
        }
        let names: Vec<&str> = zip.names().take(8).collect();
        return Err(ImportError::Malformed(format!(
            "a zip archive that is neither a Stable-Baselines3 model.zip ('data' + 'policy.pth') nor a torch.save \
             file ('<archive>/data.pkl'); it holds {names:?}"
        )));
    }
    if bytes[0] == 0x80 || torchfile::is_safetensors(bytes) {
        return Ok(ModelKind::StateDict);
    }
    // A protobuf message starts with a field tag: field 1..=20 of wire type varint (0) or length-delimited (2).
    // ONNX's ModelProto starts with ir_version (field 1, varint: 0x08).
    let (field, wire) = (bytes[0] >> 3, bytes[0] & 7);
    if (1..=20).contains(&field) && (wire == 0 || wire == 2) {
        return Ok(ModelKind::Onnx);
    }
    Err(ImportError::Malformed(format!(
        "not a model file policyport reads (ONNX, a Stable-Baselines3 model.zip, a torch.save or safetensors state \
         dict, or an RLlib checkpoint directory): it starts with {:02x?}",
        &bytes[..bytes.len().min(8)]
    )))
}

/// Is this a state dict a layout can read: a `torch.save` file or a safetensors file?
pub fn state_dict_like(bytes: &[u8]) -> bool {
    pickle_like(bytes) || torchfile::is_safetensors(bytes)
}

/// Is this a PyTorch `torch.save` file (a zip holding `<archive>/data.pkl`) or a bare pickle?
pub fn pickle_like(bytes: &[u8]) -> bool {
    if torchfile::is_safetensors(bytes) {
        return false;
    }
    if bytes.first() == Some(&0x80) {
        return true;
    }
    zipread::is_zip(bytes)
        && zipread::Zip::open(bytes).is_ok_and(|z| z.names().any(|n| n.ends_with("/data.pkl")))
}

#[cfg(test)]
mod detect_tests {
    use super::*;
    use zipread::stored_zip;

    /// Issue 36: a truncated SB3 zip, an archive missing `data` or `policy.pth`, and an empty file fell through to
    /// the ONNX route ("say what the outputs mean: --spec"). Each is now named by what it is.
    #[test]
    fn damaged_trainer_files_are_named_not_sent_to_the_onnx_route() {
        let sb3 = stored_zip(&[("data", b"{}"), ("policy.pth", b"x")]);
        assert_eq!(detect_model(&sb3).unwrap(), ModelKind::Sb3Archive);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty"),
            (sb3[..sb3.len() - 10].to_vec(), "cannot be read"),
            (stored_zip(&[("data", b"{}")]), "without its 'policy.pth'"),
            (stored_zip(&[("policy.pth", b"x")]), "without its 'data'"),
            (
                stored_zip(&[("notes.txt", b"x")]),
                "neither a Stable-Baselines3",
            ),
            (b"\xff\xfe garbage".to_vec(), "not a model file"),
        ];
        for (bytes, want) in cases {
            let e = detect_model(&bytes).unwrap_err().to_string();
            assert!(e.contains(want), "want '{want}', got: {e}");
        }
        let torch = stored_zip(&[("archive/data.pkl", b"\x80\x02}.")]);
        assert_eq!(detect_model(&torch).unwrap(), ModelKind::StateDict);
        assert_eq!(detect_model(b"\x80\x02}.").unwrap(), ModelKind::StateDict);
        // ONNX: ModelProto's ir_version (field 1, varint) first.
        assert_eq!(
            detect_model(b"\x08\x08\x12\x07pytorch").unwrap(),
            ModelKind::Onnx
        );
    }
}
