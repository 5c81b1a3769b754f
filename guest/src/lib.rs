//! policyport runtime: load a `.policy` artifact, check it, and act() on native CPU kernels or a burn device.
//! Without the `burn` feature (e.g. the sandboxed wasm plugin) only the native `cpu` backend is compiled.
//!
//! ```no_run
//! use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request};
//! let bytes = std::fs::read("cartpole.policy").unwrap();
//! // Immutable and Send + Sync: share it between threads, one Session per caller.
//! let policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
//! let mut session = policy.session();
//! let obs = [0.01f32, 0.0, -0.02, 0.0];
//! let req = Request::new(Observations::F32(&obs), 1, ActMode::Sample { seed: 7, step: 0 }).envs(EnvIds::Range(0));
//! let out = session.act(&req).unwrap();
//! println!("action {}", out.discrete[0]);
//! ```
//! Importers never live here: this crate only reads artifacts (through `policyport-format`).
//!
//! Where things go: a backend is one [`Executor`] impl plus one arm in [`Backend`]'s builder (`backend.rs`); an
//! op is one IR entry (format crate), one arm per executor (`cpu.rs`, `burn_graph.rs`, the libtorch host) and one
//! reference; the request check, preprocessing, state and sampling around the graph are the session's
//! (`session.rs`), the same for every backend.

mod aligned;
mod backend;
mod builtin;
#[cfg(feature = "burn")]
mod burn_exec;
#[cfg(feature = "burn")]
mod burn_graph;
mod compiled;
mod conv;
mod cpu;
mod dense;
mod dense_bf16;
mod error;
pub mod executor;
mod golden;
#[cfg(feature = "wgpu")]
mod gpu;
mod kernels;
pub mod lend;
pub mod lower;
mod observations;
mod pool;
mod session;
mod state;
mod thread_split;
pub mod web_workers;
#[cfg(feature = "wgpu")]
mod wgpu_exec;

pub use backend::{Backend, CpuOptions, Precision, UnknownBackend, UnknownPrecision};
pub use compiled::{CompiledPolicy, PolicyInfo, Selection};
pub use error::{
    BackendError, EnvIdError, ErrorKind, HeadControlError, ObservationError, PolicyError,
    SandboxError, StateError,
};
// The backend SPI (what an executor outside this crate implements: libtorch in `policyport-torch`, the sandbox in
// `policyport-wasmtime`) stays in its modules, `policyport::executor` and `policyport::lower`, not at the root,
// which is the API a user runs policies with (issue 37).
pub use golden::{GoldenReport, rel_err};
pub use observations::{
    ObsLayout, Observations, batch_of_shape, channels_last_to_first, layout_of_shape,
};
pub use policyport_format as format;
pub use policyport_format::sampling::ActMode;
pub use policyport_shaders::Activation;
pub use session::{
    ActOutputs, DEFAULT_MAX_ENVS, EnvIds, MAX_BATCH, MAX_THREADS, Request, Session, flags_into,
};
pub use thread_split::ThreadSplit;

/// The instruction set of the `cpu` backend's f32 kernels on this machine, as a policy loaded now would use it:
/// `"avx512"`, `"avx2+fma"`, `"sse+fma"` or `"sse2"` (x86-64), `"neon"` (aarch64), `"simd128"` (wasm), or
/// `"portable"` (plain Rust loops: other architectures). The environment variables that cap the kernels cap it
/// too (`POLICYPORT_CPU_BASELINE`: portable, `POLICYPORT_CPU_SIMD128`: 128-bit, `POLICYPORT_CPU_AVX2`).
pub fn cpu_kernels() -> &'static str {
    kernels::name(kernels::detect())
}

/// Whether this is an x86-64 CPU made by Intel (CPUID's vendor string "GenuineIntel"; false on every other
/// architecture). Choices that depend on how a vendor's hardware or libraries run (the bf16 dot product here;
/// libtorch's tanh in `policyport-torch`) are made by vendor, never by a timing, so one machine always computes
/// the same bits. Read once.
pub fn cpu_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *INTEL.get_or_init(|| {
            // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
            #[allow(unused_unsafe)]
            let id = unsafe { std::arch::x86_64::__cpuid(0) };
            // "GenuineIntel" in ebx, edx, ecx.
            id.ebx == u32::from_le_bytes(*b"Genu")
                && id.edx == u32::from_le_bytes(*b"ineI")
                && id.ecx == u32::from_le_bytes(*b"ntel")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// GPU dispatches issued by wgpu programs from this thread so far (compare against
/// [`PolicyInfo::dispatches_per_act`]). Always 0 without the `wgpu` feature (no other backend counts any).
pub fn wgpu_dispatches_issued() -> usize {
    #[cfg(feature = "burn")]
    {
        burn_graph::dispatches_issued()
    }
    #[cfg(not(feature = "burn"))]
    {
        0
    }
}
