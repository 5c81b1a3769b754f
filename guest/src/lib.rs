//! policyport runtime: load a `.policy` artifact, check it, and act() on native CPU kernels or a burn device.
//! Without the `burn` feature (e.g. the sandboxed wasm plugin) only the native `cpu` backend is compiled.
//!
//! ```no_run
//! use policyport::{ActMode, ActOutputs, Backend, EnvIds, Observations, Policy};
//! let bytes = std::fs::read("cartpole.policy").unwrap();
//! let mut policy = Policy::load_on(&bytes, Backend::Cpu).unwrap();
//! let mut out = ActOutputs::default();
//! let obs = [0.01f32, 0.0, -0.02, 0.0];
//! policy.act(Observations::F32(&obs), 1, ActMode::Sample { seed: 7, step: 0 }, EnvIds::Range(0), None, &mut out).unwrap();
//! println!("action {}", out.discrete[0]);
//! ```
//! Importers never live here: this crate only reads artifacts (through `policyport-format`).

mod backend;
mod cpu;
mod dense;
mod error;
#[cfg(feature = "burn")]
mod exec;
#[cfg(feature = "wgpu")]
mod gpu;
mod kernels;
mod lower;
mod observations;
mod policy;
mod state;
#[cfg(feature = "wgpu")]
mod wgpu_setup;

pub use backend::Backend;
#[cfg(feature = "burn")]
pub use burn::tensor::Device;
pub use error::{ObservationError, PolicyError};
pub use lower::act_of as activation_of;
pub use observations::{Observations, check_observations, one_hot_width};
pub use policy::{
    ActOutputs, EnvIds, GoldenReport, GoldenShape, MAX_BATCH, Policy, PolicyInfo, compare_golden,
    rel_err,
};
pub use policyport_format as format;
pub use policyport_format::sampling::ActMode;
pub use policyport_shaders::Activation;
pub use state::RecurrentState;

/// GPU dispatches issued by wgpu programs from this thread so far (compare against
/// [`PolicyInfo::dispatches_per_act`]). Always 0 without the `wgpu` feature.
pub fn wgpu_dispatches_issued() -> usize {
    #[cfg(feature = "wgpu")]
    {
        gpu::DISPATCHES.with(|d| d.get())
    }
    #[cfg(not(feature = "wgpu"))]
    {
        0
    }
}
