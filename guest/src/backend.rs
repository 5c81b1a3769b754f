//! Which backend a policy runs on, and the options of the cpu backend: names and plain values that errors,
//! reports and every boundary use. The one place that builds each built-in backend's executor is `builtin.rs`
//! (this module knows no executor, so the error types and the executor trait can name a backend without
//! depending on every executor).
//!
//! A backend whose executor cannot live in this crate (libtorch: the `policyport-torch` host crate) has a variant
//! too, so policies, reports and errors name it the same way; its crate builds the executor with an
//! [`ExecutorBuilder`](crate::executor::ExecutorBuilder) of its own and
//! [`CompiledPolicy::with_builder`](crate::CompiledPolicy::with_builder).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// Native CPU kernels (fused dense + activation, runtime ISA dispatch): the fast CPU path.
    Cpu,
    /// burn-flex: pure-Rust CPU through burn's tensor ops (native and wasm).
    Flex,
    /// burn-wgpu: Vulkan / Metal / DX12 / WebGPU.
    Wgpu,
    /// libtorch (CPU or CUDA, CUDA graphs, f16 / bf16): built by the host crate `policyport-torch`
    /// (`policyport_torch::load`), never by [`CompiledPolicy::load`](crate::CompiledPolicy::load).
    Torch,
    /// The sandboxed plugin (`guest/plugin`: this runtime's cpu backend compiled to wasm) under wasmtime, one
    /// instance per session: built by the host crate `policyport-wasmtime` (`policyport_wasmtime::load`).
    Wasmtime,
}

/// A backend name that is none of `cpu`, `flex`, `wgpu`, `torch`, `wasmtime`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend '{0}' (cpu, flex, wgpu, torch, wasmtime)")]
pub struct UnknownBackend(pub String);

impl Backend {
    pub const ALL: [Backend; 5] = [
        Backend::Cpu,
        Backend::Flex,
        Backend::Wgpu,
        Backend::Torch,
        Backend::Wasmtime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
            Backend::Torch => "torch",
            Backend::Wasmtime => "wasmtime",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// The arithmetic precision a backend computes a policy's dense layers (and convolution GEMMs) in: one name for
/// every backend, each taking the ones it has kernels for. The cpu backend: `F32` (the default) and `Bf16`;
/// libtorch (`policyport-torch`): all three. A precision a backend does not compute is a typed error at load,
/// never a silent fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 throughout (the default; within the fixtures' 1e-5 of PyTorch float64).
    #[default]
    F32,
    /// fp16 compute (tensor cores on CUDA; libtorch only); sensitive parts stay f32.
    F16,
    /// bf16 weights and layer inputs, products summed in f32. On the cpu backend (`vdpbf16ps`; needs
    /// AVX512-BF16): about twice the multiply-adds per cycle of f32 and half the weight bytes, for ~3 significant
    /// digits in each layer's inputs (measured within 1e-2 of float64 on the MLP fixtures, 3e-2 through
    /// convolutions and recurrent cells); layers of at most 16 outputs (policy and value heads) stay f32, and
    /// elementwise work (activations, normalisation, sampling) is f32 either way. On libtorch: bf16 compute,
    /// sensitive parts f32.
    Bf16,
}

/// A precision name that is not `f32`, `f16` or `bf16` (`fp32` and `fp16` are accepted too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision '{0}' (f32, f16, bf16)")]
pub struct UnknownPrecision(pub String);

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::F16, Precision::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = UnknownPrecision;
    fn from_str(s: &str) -> Result<Self, UnknownPrecision> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "f16" | "fp16" => Ok(Precision::F16),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(UnknownPrecision(s.to_string())),
        }
    }
}

/// The cpu backend with options other than the defaults of [`Backend::Cpu`]: load with
/// `CompiledPolicy::with_builder(read_artifact(bytes)?, Arc::new(CpuOptions { precision: Precision::Bf16 }))`.
/// A precision this CPU cannot run is a typed error at load
/// ([`BackendError::MissingCpuFeature`](crate::BackendError::MissingCpuFeature)), never a
/// silent fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuOptions {
    /// `F32` or `Bf16` (`F16` is refused at load: the cpu backend has no f16 kernels).
    pub precision: Precision,
}
