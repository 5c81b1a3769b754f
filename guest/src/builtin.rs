//! The one place that builds each built-in backend's [`Executor`]. A backend compiled out still has its variant;
//! asking for it returns [`PolicyError::NotCompiled`] (the API is the same in every build). This file and the
//! executors themselves are the only places that know which backends a build has: the session and act() path
//! never does.

use policyport_format::{Artifact, ValidatedPlan};

use crate::backend::{Backend, CpuOptions, Precision};
use crate::error::{BackendError, PolicyError};
use crate::executor::{Executor, ExecutorBuilder};

impl Backend {
    /// Every backend this build can run through [`CompiledPolicy::load`](crate::CompiledPolicy::load) (the
    /// built-in ones; never `Torch` or `Wasmtime`, which their own crates load).
    pub fn compiled() -> Vec<Backend> {
        Self::ALL
            .into_iter()
            .filter(|b| b.check_compiled().is_ok())
            .collect()
    }

    /// Ok if this build has the backend, else the typed "not compiled with X" error (or, for a backend built by
    /// another crate, the typed error naming its loader).
    pub fn check_compiled(self) -> Result<(), PolicyError> {
        let (compiled, feature) = match self {
            Backend::Cpu => (true, ""),
            Backend::Flex => (cfg!(feature = "flex"), "flex"),
            Backend::Wgpu => (cfg!(feature = "wgpu"), "wgpu"),
            Backend::Torch | Backend::Wasmtime => {
                return Err(BackendError::BuiltElsewhere {
                    backend: self,
                    load_with: match self {
                        Backend::Torch => "policyport_torch::load (crate policyport-torch)",
                        _ => "policyport_wasmtime::load (crate policyport-wasmtime)",
                    },
                }
                .into());
            }
        };
        if compiled {
            Ok(())
        } else {
            Err(PolicyError::NotCompiled {
                backend: self,
                feature,
            })
        }
    }
}

impl Precision {
    /// Whether the cpu backend computes in this precision on this CPU: f32 always, bf16 with AVX512-BF16, f16
    /// never (no f16 kernels).
    pub fn available_on_cpu(self) -> bool {
        match self {
            Precision::F32 => true,
            Precision::F16 => false,
            Precision::Bf16 => crate::dense_bf16::available(),
        }
    }
}

/// The built-in backends build their own executors.
impl ExecutorBuilder for Backend {
    fn backend(&self) -> Backend {
        *self
    }

    /// The one lowering of `art` for this backend: an executor whose step reads back the head values
    /// (distribution values, value estimate) and the next recurrent states; with `readback` given instead, just
    /// those values (golden probes of intermediate values).
    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError> {
        let this = *self;
        this.check_compiled()?;
        let head_and_states = crate::lower::step_readback(art, plan);
        let values = readback.unwrap_or(&head_and_states);
        match this {
            Backend::Cpu => Ok(Box::new(crate::cpu::CpuExecutor::new(art, plan, values))),
            #[cfg(feature = "flex")]
            Backend::Flex => Ok(Box::new(crate::burn_exec::BurnExecutor::new(
                art,
                plan,
                values,
                &burn::tensor::Device::flex(),
                this,
                crate::executor::Readback::Blocking,
            ))),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => {
                let device = wgpu_device()?;
                Ok(match readback {
                    // Probes of intermediate values run op by op on the same device.
                    Some(values) => Box::new(crate::burn_exec::BurnExecutor::new(
                        art,
                        plan,
                        values,
                        &device,
                        this,
                        crate::wgpu_exec::READBACK,
                    )),
                    None => {
                        // Measured 2026-12-02 on lavapipe: a head wider than 32768 numbers per env (actions,
                        // distribution parameters, value: one output row, written by one invocation of the sampling
                        // kernel, shaders/sample.wgsl) read back wrong values — relative error 0.65 to 1.0 at
                        // 33 000, 100 000 and 490 000 logits, right at 32 000 and with a 40 000-wide dense layer
                        // sliced to 10 logits. The cause is not found yet; until it is, such a policy is refused
                        // here with a typed error rather than answered wrong (regression test in
                        // tests/conformance/gpu.rs, found by ONNX's backend test models).
                        let h = &plan.head;
                        if h.action_len + h.dist_params_len + h.has_value() as usize
                            > WGPU_MAX_HEAD_WIDTH
                        {
                            return Err(BackendError::Unsupported(
                                "a policy head wider than 32768 numbers per env (actions + distribution parameters \
                                 + value) reads back wrong on wgpu (a known defect); use the cpu backend",
                            )
                            .into());
                        }
                        Box::new(crate::wgpu_exec::WgpuExecutor::new(
                            art, plan, values, &device,
                        ))
                    }
                })
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("check_compiled refused backends this build lacks"),
        }
    }
}

impl ExecutorBuilder for CpuOptions {
    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError> {
        if self.precision == Precision::F16 {
            return Err(BackendError::Unsupported(
                "the cpu backend computes in f32 or bf16: it has no f16 kernels (f16 is libtorch's, on CUDA)",
            )
            .into());
        }
        if !self.precision.available_on_cpu() {
            return Err(BackendError::MissingCpuFeature {
                wanted: "the cpu backend in bf16",
                feature: "avx512_bf16 (with avx512f)",
            }
            .into());
        }
        let head_and_states = crate::lower::step_readback(art, plan);
        let values = readback.unwrap_or(&head_and_states);
        Ok(Box::new(crate::cpu::CpuExecutor::with_lender(
            art,
            plan,
            values,
            None,
            self.precision,
        )))
    }
}

/// The widest head row the wgpu program is trusted with (see `Backend::Wgpu` in `program`).
#[cfg(feature = "wgpu")]
pub(crate) const WGPU_MAX_HEAD_WIDTH: usize = 32768;

/// The process's wgpu device: initialised once (the first adapter wgpu offers: a GPU, or Mesa's lavapipe on a
/// machine without one), then shared. No adapter is a typed error, remembered so later loads fail fast.
#[cfg(feature = "wgpu")]
static WGPU_DEVICE: std::sync::OnceLock<Result<burn::tensor::Device, BackendError>> =
    std::sync::OnceLock::new();

#[cfg(feature = "wgpu")]
pub(crate) fn wgpu_device() -> Result<burn::tensor::Device, PolicyError> {
    #[cfg(not(target_family = "wasm"))]
    let device = WGPU_DEVICE.get_or_init(|| {
        burn::tensor::Device::wgpu_options()
            .init()
            .map_err(|e| BackendError::NoAdapter(e.to_string()))
    });
    // In a browser the adapter is requested asynchronously: only load_async can make the device.
    #[cfg(target_family = "wasm")]
    let device = WGPU_DEVICE.get().ok_or(BackendError::NeedsAsync {
        use_instead: "CompiledPolicy::load_async",
    })?;
    Ok(device.clone()?)
}

/// The same device, initialised without blocking (required in a browser; fine natively).
#[cfg(feature = "wgpu")]
pub(crate) async fn wgpu_device_async() -> Result<(), PolicyError> {
    if WGPU_DEVICE.get().is_none() {
        let made = burn::tensor::Device::wgpu_options()
            .init_async()
            .await
            .map_err(|e| BackendError::NoAdapter(e.to_string()));
        // Another load may have finished first while this one awaited: keep whichever was stored.
        let _ = WGPU_DEVICE.set(made);
    }
    wgpu_device().map(|_| ())
}

/// Makes the backend's device ready without blocking (WebGPU in a browser); nothing to do elsewhere.
pub(crate) async fn prepare_async(backend: Backend) -> Result<(), PolicyError> {
    backend.check_compiled()?;
    #[cfg(feature = "wgpu")]
    if backend == Backend::Wgpu {
        wgpu_device_async().await?;
    }
    Ok(())
}
