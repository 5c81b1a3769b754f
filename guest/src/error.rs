//! The runtime's typed errors.

use policyport_format::FormatError;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PolicyError {
    /// The artifact was refused (container, manifest, weights or validation).
    #[error("invalid artifact: {0}")]
    Artifact(#[from] FormatError),
    #[error("bad observations: {0}")]
    Observation(#[from] ObservationError),
    #[error("batch size {batch} is not supported (1 ..= {max})")]
    Batch { batch: usize, max: usize },
    #[error("env ids: {0}")]
    EnvIds(String),
    #[error("recurrent state: {0}")]
    State(String),
    /// The backend failed (device lost, readback error). The policy stays usable when the cause is transient.
    #[error("backend error: {0}")]
    Backend(String),
    /// Like candle: the API stays the same when a backend is compiled out.
    #[error(
        "policyport was not compiled with the {backend} backend (enable the cargo feature `{feature}`)"
    )]
    NotCompiled {
        backend: &'static str,
        feature: &'static str,
    },
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ObservationError {
    #[error("expected {expected} numbers ({batch} envs x {per_env}), got {found}")]
    Length {
        expected: usize,
        found: usize,
        batch: usize,
        per_env: usize,
    },
    #[error("non-finite value {value} at env {env}, element {element}")]
    NonFinite {
        env: usize,
        element: usize,
        value: f32,
    },
    #[error("discrete observation {value} at env {env} is not an integer in 0..{n}")]
    Discrete { env: usize, value: f32, n: usize },
    #[error("this policy takes {expected} observations, got {found}")]
    DType {
        expected: &'static str,
        found: &'static str,
    },
}
