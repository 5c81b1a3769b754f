//! The conformance suite: one test binary, run against every backend this build has.
//!
//! - `parity`: every fixture compiled from its ONNX export; float outputs within the fixture's tolerance of
//!   PyTorch float64, seeded samples equal to the independent Python sampler's, on every backend.
//! - `fixtures`: the committed fixture files are exactly what tests/fixtures/generate.py declared.
//! - `artifact`: round trips, storage precisions, inspect snapshots (re-bless with POLICYPORT_BLESS=1).
//! - `bad_input`: the hostile-input corpus: every case a typed error, never a panic.
//! - `episodes`: the trained policies replay the PyTorch policy's evaluation episodes.

mod artifact;
mod bad_input;
mod episodes;
mod fixtures;
mod parity;
