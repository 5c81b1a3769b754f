//! Which backend a policy runs on. A backend compiled out still has its variant; asking for it returns
//! [`PolicyError::NotCompiled`] (the API is the same in every build).

#[cfg(feature = "burn")]
use burn::tensor::Device;

use crate::error::PolicyError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Native CPU kernels (fused dense + activation, runtime ISA dispatch): the fast CPU path.
    Cpu,
    /// burn-flex: pure-Rust CPU through burn's tensor ops (native and wasm).
    Flex,
    /// burn-wgpu: Vulkan / Metal / DX12 / WebGPU.
    Wgpu,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
        }
    }

    /// Every backend this build can run.
    pub fn compiled() -> Vec<Backend> {
        [Backend::Cpu, Backend::Flex, Backend::Wgpu]
            .into_iter()
            .filter(|b| b.check_compiled().is_ok())
            .collect()
    }

    /// Ok if this build has the backend, else the typed "not compiled with X" error.
    pub fn check_compiled(self) -> Result<(), PolicyError> {
        match self {
            Backend::Cpu => Ok(()),
            Backend::Flex if cfg!(feature = "flex") => Ok(()),
            Backend::Flex => Err(PolicyError::NotCompiled {
                backend: "flex",
                feature: "flex",
            }),
            Backend::Wgpu if cfg!(feature = "wgpu") => Ok(()),
            Backend::Wgpu => Err(PolicyError::NotCompiled {
                backend: "wgpu",
                feature: "wgpu",
            }),
        }
    }

    /// The burn device of a burn backend (the native CPU backend has none).
    #[cfg(feature = "burn")]
    pub fn device(self) -> Result<Device, PolicyError> {
        self.check_compiled()?;
        match self {
            Backend::Cpu => Err(PolicyError::Backend(
                "the native cpu backend does not run on a burn device".into(),
            )),
            #[cfg(feature = "flex")]
            Backend::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => wgpu_device(),
            #[allow(unreachable_patterns)]
            _ => unreachable!("check_compiled refused backends this build lacks"),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "flex" => Ok(Backend::Flex),
            "wgpu" => Ok(Backend::Wgpu),
            _ => Err(format!("unknown backend '{s}' (cpu, flex, wgpu)")),
        }
    }
}

/// The process's wgpu device: initialised once (the first adapter wgpu offers: a GPU, or Mesa's lavapipe on a
/// machine without one), then shared. No adapter is a typed error, remembered so later loads fail fast.
#[cfg(feature = "wgpu")]
static WGPU_DEVICE: std::sync::OnceLock<Result<Device, String>> = std::sync::OnceLock::new();

#[cfg(feature = "wgpu")]
pub(crate) fn wgpu_device() -> Result<Device, PolicyError> {
    #[cfg(not(target_family = "wasm"))]
    let device = WGPU_DEVICE.get_or_init(|| {
        Device::wgpu_options()
            .init()
            .map_err(|e| format!("no usable wgpu adapter: {e}"))
    });
    // In a browser the adapter is requested asynchronously: only load_async can make the device.
    #[cfg(target_family = "wasm")]
    let device = WGPU_DEVICE.get().ok_or_else(|| {
        PolicyError::Backend("WebGPU initialises asynchronously: load with load_async".into())
    })?;
    device.clone().map_err(PolicyError::Backend)
}

/// The same device, initialised without blocking (required in a browser; fine natively).
#[cfg(feature = "wgpu")]
pub(crate) async fn wgpu_device_async() -> Result<Device, PolicyError> {
    if let Some(d) = WGPU_DEVICE.get() {
        return d.clone().map_err(PolicyError::Backend);
    }
    let made = Device::wgpu_options()
        .init_async()
        .await
        .map_err(|e| format!("no usable WebGPU/wgpu adapter: {e}"));
    // Another load may have finished first while this one awaited: keep whichever was stored.
    let _ = WGPU_DEVICE.set(made);
    wgpu_device()
}
