//! The policyport artifact format (`.policy`, version 1): the contract between the toolchain (`host/`) and every
//! runtime. This crate holds the spec types ([`manifest`]), the container reader and writer ([`container`]),
//! the checks every reader runs before executing anything ([`validate`]), and the seeded sampling stream
//! ([`philox`], [`sampling`]) that every backend must reproduce. It has no burn dependency, so the toolchain and
//! the tch host can use it without pulling a tensor library in. The normative text is `SPEC.md` beside this crate.

pub mod container;
pub mod error;
pub mod head;
pub mod manifest;
pub mod philox;
pub mod preprocess;
pub mod sampling;
pub mod validate;

pub use container::{Artifact, FORMAT_MAJOR, FORMAT_MINOR, MAGIC, read_artifact, write_artifact};
pub use error::FormatError;
pub use head::{HeadControlError, HeadKind, HeadPlan, LogStdSource, MASKED_LOGIT, RowControls};
pub use manifest::*;
pub use preprocess::{PreprocessPlan, PreprocessStep};
pub use validate::{
    DEFAULT_MAX_MEMORY_BYTES, Limits, MAX_GOLDEN_TOLERANCE, MemoryEstimate, ValidatedPlan, validate,
};
