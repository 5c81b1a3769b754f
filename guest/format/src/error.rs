//! Every way an artifact can be refused, as one typed error.

use thiserror::Error;

/// Why an artifact (or a manifest about to be written) was refused. Nothing here panics on bad input.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FormatError {
    #[error("artifact truncated: need at least {needed} bytes for {what}, have {have}")]
    Truncated {
        what: &'static str,
        needed: u64,
        have: u64,
    },
    #[error("not a policyport artifact (magic bytes {found:02x?}, expected {expected:02x?})")]
    BadMagic { found: Vec<u8>, expected: Vec<u8> },
    #[error(
        "artifact format version {found_major}.{found_minor} is newer than this reader ({reader_major}.{reader_minor}); \
         upgrade policyport"
    )]
    UnsupportedVersion {
        found_major: u16,
        found_minor: u16,
        reader_major: u16,
        reader_minor: u16,
    },
    #[error("artifact header is malformed: {0}")]
    BadHeader(String),
    #[error("checksum mismatch in the {section} section (file corrupted or edited)")]
    ChecksumMismatch { section: &'static str },
    #[error("manifest is not valid JSON for format v1: {0}")]
    BadManifest(String),
    #[error("weights section is not a valid safetensors blob: {0}")]
    BadWeights(String),
    #[error("tensor '{name}' referenced by {user} is missing from the weights")]
    MissingTensor { name: String, user: String },
    #[error("tensor '{name}' has dtype {dtype}; v1 stores F32, F16 or BF16")]
    BadTensorDtype { name: String, dtype: String },
    #[error("tensor '{name}' has shape {found:?}, {user} needs {expected:?}")]
    TensorShape {
        name: String,
        user: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor '{name}' holds a non-finite value at element {index}")]
    NonFiniteWeight { name: String, index: usize },
    #[error(
        "op '{op}' needs format {}.{} but the file says {}.{} (a writer stamped the wrong version)",
        since.0, since.1, file.0, file.1
    )]
    OpNewerThanFile {
        op: String,
        since: (u16, u16),
        file: (u16, u16),
    },
    #[error(
        "unknown op '{op}' in node '{node}' of module '{module}' (this runtime knows: {known})"
    )]
    UnknownOp {
        op: String,
        node: String,
        module: String,
        known: &'static str,
    },
    #[error("value '{name}' used by {user} is not defined before it")]
    UndefinedValue { name: String, user: String },
    #[error("value '{name}' is defined twice")]
    DuplicateValue { name: String },
    #[error(
        "{what} needs about {bytes} bytes, over the memory limit of {limit} (Limits::max_memory_bytes)"
    )]
    MemoryBudget {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error("{what} has {found} elements, over the limit of {limit}")]
    TooLarge {
        what: String,
        found: u64,
        limit: u64,
    },
    #[error("shape error in {user}: {detail}")]
    Shape { user: String, detail: String },
    #[error("invalid {field}: {detail}")]
    Invalid { field: String, detail: String },
}

impl FormatError {
    pub(crate) fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            field: field.into(),
            detail: detail.into(),
        }
    }
    pub(crate) fn shape(user: impl Into<String>, detail: impl Into<String>) -> Self {
        FormatError::Shape {
            user: user.into(),
            detail: detail.into(),
        }
    }
}
