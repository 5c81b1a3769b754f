//! The native libtorch executor: an artifact's submodules built as libtorch ops (no TorchScript), on CPU or CUDA,
//! with the guest's act() semantics (preprocessing, seeded Philox sampling, per-env recurrent state).
//!
//! On CUDA, act() can be captured as CUDA graphs, one per batch bucket and act mode, over static input and output
//! buffers: preprocessing, every submodule, the distribution, Philox sampling and the recurrent-state update all
//! replay as one graph launch, with one host→device copy of the inputs and one readback. AMP runs the dense
//! layers and activations in fp16 or bf16 (explicit casts, so both work on CPU and CUDA) and keeps softmax /
//! log-softmax, observation normalisation, the distribution and sampling in fp32. No GradScaler: that exists to
//! keep *gradients* from underflowing; inference has none.
//!
//! Built only with the cargo feature `tch` (it needs a libtorch; see host/README.md). Without it every type here
//! still exists and [`TorchPolicy::load`] returns [`TorchError::NotCompiled`].

pub mod buckets;
#[cfg(feature = "tch")]
mod exec;
#[cfg(feature = "tch")]
mod graph;
#[cfg(feature = "tch")]
mod philox;

use policyport::{ActOutputs, GoldenReport, PolicyError, Request};
use policyport_format::FormatError;
use thiserror::Error;

/// True when this build has the libtorch executor.
pub const COMPILED: bool = cfg!(feature = "tch");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchDevice {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for TorchDevice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(TorchDevice::Cpu),
            "cuda" => Ok(TorchDevice::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(i)) => Ok(TorchDevice::Cuda(i)),
                _ => Err(format!("unknown torch device '{s}' (cpu, cuda, cuda:N)")),
            },
        }
    }
}

/// Arithmetic precision of the dense layers and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F32,
    /// fp16 compute (tensor cores on CUDA); sensitive parts stay fp32.
    F16,
    /// bf16 compute; sensitive parts stay fp32.
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "f16" | "fp16" => Ok(Precision::F16),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(format!("unknown precision '{s}' (f32, f16, bf16)")),
        }
    }
}

/// Where sampling runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// The guest's sampler on the host, on the parameters read back (exactly the guest's arithmetic).
    Host,
    /// Philox + inverse CDF / Box–Muller as libtorch ops on the device (what a CUDA graph captures).
    Device,
}

/// How act() is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// Op by op, shapes exactly the batch.
    Eager,
    /// Captured CUDA graphs per batch bucket (CUDA only; implies device sampling).
    CudaGraphs,
    /// The CUDA-graph code path (static buffers, buckets, padding, scratch state row) run op by op instead of
    /// replayed: lets the bucket logic be tested on CPU. Not useful otherwise.
    StaticBuffers,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TorchOptions {
    pub device: TorchDevice,
    pub precision: Precision,
    pub launch: Launch,
    /// Only for [`Launch::Eager`] (graphs always sample on the device).
    pub sampling: Sampling,
    /// Largest bucket for the static paths (batches above it run in chunks); buckets are powers of two up to it
    /// unless `buckets` is set.
    pub max_batch: usize,
    pub buckets: Option<Vec<usize>>,
    /// Envs whose recurrent state lives on the device (grown on demand by act(); growing recaptures graphs).
    pub num_envs: usize,
}

impl Default for TorchOptions {
    fn default() -> Self {
        TorchOptions {
            device: TorchDevice::Cpu,
            precision: Precision::F32,
            launch: Launch::Eager,
            sampling: Sampling::Host,
            max_batch: 1024,
            buckets: None,
            num_envs: 1,
        }
    }
}

impl TorchOptions {
    pub fn bucket_plan(&self) -> buckets::BucketPlan {
        self.buckets
            .as_deref()
            .and_then(buckets::BucketPlan::from_sizes)
            .unwrap_or_else(|| buckets::BucketPlan::powers_of_two(self.max_batch))
    }
}

/// What a loaded libtorch policy is running on.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchInfo {
    pub name: String,
    pub device: String,
    pub precision: Precision,
    pub launch: Launch,
    pub sampling: Sampling,
    /// Bucket sizes with captured graphs (or static buffers); empty when eager.
    pub buckets: Vec<usize>,
    pub obs_len: usize,
    pub action_len: usize,
    pub recurrent_states: usize,
    pub num_envs: usize,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum TorchError {
    #[error(
        "policyport-torch was built without the libtorch executor (enable its cargo feature `tch`)"
    )]
    NotCompiled,
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("invalid artifact: {0}")]
    Artifact(#[from] FormatError),
    #[error("CUDA is not available: {0}")]
    NoCuda(String),
    #[error("unsupported here: {0}")]
    Unsupported(String),
    /// An error raised by libtorch (or the CUDA-graph shim); the message is libtorch's.
    #[error("libtorch: {0}")]
    Torch(String),
}

/// Is a CUDA device usable by libtorch in this process? (Always false without the `tch` feature.)
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "tch")]
    {
        exec::cuda_device_count()
    }
    #[cfg(not(feature = "tch"))]
    {
        0
    }
}

/// Threads libtorch uses for CPU ops in this process (no-op without the `tch` feature).
pub fn set_cpu_threads(n: i32) {
    #[cfg(feature = "tch")]
    tch::set_num_threads(n);
    #[cfg(not(feature = "tch"))]
    let _ = n;
}

/// A policy executed by libtorch. Same act() as [`policyport::Session`], except that recurrent state lives on the
/// device inside the policy (indexed by env id; see [`TorchPolicy::reset`]).
pub struct TorchPolicy {
    #[cfg(feature = "tch")]
    inner: exec::TorchExec,
    #[cfg(not(feature = "tch"))]
    _never: std::convert::Infallible,
}

impl std::fmt::Debug for TorchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchPolicy").finish_non_exhaustive()
    }
}

#[cfg(feature = "tch")]
impl TorchPolicy {
    /// Read, checksum and validate the artifact, upload weights in the compute precision, allocate the static
    /// buffers and capture the graphs (when asked), and warm up, so the first act() pays no setup.
    pub fn load(bytes: &[u8], opts: &TorchOptions) -> Result<Self, TorchError> {
        Ok(TorchPolicy {
            inner: exec::TorchExec::load(bytes, opts)?,
        })
    }

    /// One step for `req.batch` envs: the same [`Request`] as [`policyport::Session::act`] (env ids, episode
    /// starts, the same checks); recurrent state is read and written on the device for the rows' env ids.
    pub fn act(&mut self, req: &Request<'_>, out: &mut ActOutputs) -> Result<(), TorchError> {
        self.inner.act(req, out)
    }

    /// Zero the recurrent state of these envs (episode boundaries).
    pub fn reset(&mut self, envs: &[u32]) -> Result<(), TorchError> {
        self.inner.reset(envs)
    }

    /// State tensor `k` of `env`, read back (for tests and debugging).
    pub fn state(&self, k: usize, env: u32) -> Result<Vec<f32>, TorchError> {
        self.inner.state(k, env)
    }

    pub fn info(&self) -> TorchInfo {
        self.inner.info()
    }

    /// Check the artifact's golden vectors on this executor (fresh zero state per case).
    pub fn verify(&mut self) -> Result<Vec<GoldenReport>, TorchError> {
        self.inner.verify()
    }
}

#[cfg(not(feature = "tch"))]
impl TorchPolicy {
    pub fn load(_bytes: &[u8], _opts: &TorchOptions) -> Result<Self, TorchError> {
        Err(TorchError::NotCompiled)
    }
    pub fn act(&mut self, _req: &Request<'_>, _out: &mut ActOutputs) -> Result<(), TorchError> {
        match self._never {}
    }
    pub fn reset(&mut self, _envs: &[u32]) -> Result<(), TorchError> {
        match self._never {}
    }
    pub fn state(&self, _k: usize, _env: u32) -> Result<Vec<f32>, TorchError> {
        match self._never {}
    }
    pub fn info(&self) -> TorchInfo {
        match self._never {}
    }
    pub fn verify(&mut self) -> Result<Vec<GoldenReport>, TorchError> {
        match self._never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        assert_eq!("cuda:1".parse::<TorchDevice>(), Ok(TorchDevice::Cuda(1)));
        assert_eq!("cuda".parse::<TorchDevice>(), Ok(TorchDevice::Cuda(0)));
        assert!("gpu".parse::<TorchDevice>().is_err());
        assert_eq!("bf16".parse::<Precision>(), Ok(Precision::Bf16));
        let o = TorchOptions {
            buckets: Some(vec![3, 1]),
            ..Default::default()
        };
        assert_eq!(o.bucket_plan().sizes(), &[1, 3]);
    }

    #[cfg(not(feature = "tch"))]
    #[test]
    fn torch_compiled_out_is_a_typed_error() {
        assert_eq!(
            TorchPolicy::load(b"", &TorchOptions::default()).unwrap_err(),
            TorchError::NotCompiled
        );
        assert_eq!(cuda_device_count(), 0);
    }
}
