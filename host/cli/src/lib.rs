//! The library half of the `policyport` command: what the CLI does that is worth testing on its own (demo
//! episodes, `.npy` observations, the static server of `serve-web`). The command itself is `main.rs`; the
//! importer, the wasmtime host and the libtorch executor are crates of their own (`host/import`, `host/wasmtime`,
//! `host/torch`) that this one puts behind subcommands.

pub mod demo;
/// The demo environments (shared with the browser bundle).
pub use policyport_envs as envs;
pub mod npy;
pub mod serve;
