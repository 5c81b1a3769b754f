//! The native libtorch executor: an artifact's submodules built as libtorch ops (no TorchScript), on CPU or CUDA.
//! It implements the runtime's `Executor` trait ([`policyport::executor::Executor`]) and loads through
//! [`CompiledPolicy::with_builder`]: a libtorch policy is a `CompiledPolicy` on `Backend::Torch`, and its sessions
//! run the same request check, state model (per-env state, resets, episode starts), host sampler and golden
//! verification as every other backend. The executor does preprocessing and keeps recurrent state on the device,
//! and with `Sampling::Device` draws the seeded Philox samples there too.
//!
//! On CUDA, act() can be captured as CUDA graphs, one per batch bucket and act mode, over static input and output
//! buffers: preprocessing, every submodule, the distribution, Philox sampling and the recurrent-state update all
//! replay as one graph launch, with one host→device copy of the inputs and one readback. AMP runs the dense
//! layers and activations in fp16 or bf16 (explicit casts, so both work on CPU and CUDA) and keeps softmax /
//! log-softmax, observation normalisation, the distribution and sampling in fp32. No GradScaler: that exists to
//! keep *gradients* from underflowing; inference has none.
//!
//! Built only with the cargo feature `tch` (it needs a libtorch; see README.md). Without it every type here
//! still exists and [`load`] returns [`TorchError::NotCompiled`].

pub mod buckets;
#[cfg(feature = "tch")]
mod exec;
#[cfg(feature = "tch")]
mod graph;
#[cfg(feature = "tch")]
mod philox;

use std::sync::Arc;

use policyport::{CompiledPolicy, PolicyError, Session};
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

/// The dense layers' and activations' arithmetic precision: the runtime's one [`policyport::Precision`] (libtorch
/// computes all three; f16 and bf16 keep the sensitive parts in f32).
pub use policyport::Precision;

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
    /// The options a policy really runs with: the static paths (CUDA graphs, static buffers) always sample on
    /// the device, whatever `sampling` says.
    pub fn effective(&self) -> TorchOptions {
        let mut o = self.clone();
        if o.launch != Launch::Eager {
            o.sampling = Sampling::Device;
        }
        o
    }

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

/// Load an artifact on libtorch: a [`CompiledPolicy`] on [`Backend::Torch`](policyport::Backend) like any other
/// (immutable, shared behind an `Arc`; one [`policyport::Session`] per caller holds that caller's device state,
/// bucket buffers and CUDA graphs). Reads, checksums and validates the artifact, uploads the weights in the
/// compute precision once, and warms up. CUDA graphs are captured per session, on the first call of each bucket.
pub fn load(bytes: &[u8], opts: &TorchOptions) -> Result<Arc<CompiledPolicy>, TorchError> {
    #[cfg(feature = "tch")]
    {
        let artifact = policyport::format::read_artifact(bytes)?;
        let builder = exec::builder(&opts.effective())?;
        let _guard = tch::no_grad_guard();
        CompiledPolicy::with_builder(artifact, builder).map_err(|e| match e {
            PolicyError::Artifact(f) => TorchError::Artifact(f),
            e => TorchError::Policy(e),
        })
    }
    #[cfg(not(feature = "tch"))]
    {
        let _ = (bytes, opts);
        Err(TorchError::NotCompiled)
    }
}

/// What a session of a policy [`load`]ed with `opts` runs on: the options as the executor applies them
/// ([`TorchOptions::effective`]: device, precision, launch, sampling, buckets) and the policy's shape. There is no
/// second policy type for libtorch: a libtorch policy is a [`CompiledPolicy`] and acts through its
/// [`Session`]s like every backend's.
pub fn info(session: &Session, opts: &TorchOptions) -> TorchInfo {
    let opts = opts.effective();
    let policy = session.policy().info();
    TorchInfo {
        name: policy.name,
        device: match opts.device {
            TorchDevice::Cpu => "Cpu".into(),
            TorchDevice::Cuda(i) => format!("Cuda({i})"),
        },
        precision: opts.precision,
        launch: opts.launch,
        sampling: opts.sampling,
        buckets: if opts.launch == Launch::Eager {
            vec![]
        } else {
            opts.bucket_plan().sizes().to_vec()
        },
        obs_len: policy.obs_len,
        action_len: policy.action_len,
        recurrent_states: policy.recurrent_states,
        num_envs: session.num_envs(),
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
        assert!(matches!(
            load(b"", &TorchOptions::default()),
            Err(TorchError::NotCompiled)
        ));
        assert_eq!(cuda_device_count(), 0);
    }
}
