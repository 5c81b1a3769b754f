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
    Storage, compile_cleanrl, compile_imported, compile_onnx, compile_rllib, compile_rllib_module,
    compile_sb3, random_obs,
};
pub use fixture::{FixtureCase, FixtureIo, golden_from_fixture};
pub use onnx::{Imported, import_onnx};
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
pub(crate) fn action_bound(value: f64, side: &'static str, index: usize) -> Result<Option<f32>, ImportError> {
    if value.is_infinite() {
        return Ok(None);
    }
    let bound = value as f32;
    if !bound.is_finite() {
        return Err(ImportError::ActionBound { side, index, value });
    }
    Ok(Some(bound))
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
