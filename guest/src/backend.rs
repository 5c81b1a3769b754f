//! Which burn device a policy runs on. A backend compiled out still has its variant; asking for it returns
//! [`PolicyError::NotCompiled`].

use burn::tensor::Device;

use crate::error::PolicyError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// burn-flex: pure-Rust CPU (native and wasm).
    Flex,
    /// burn-wgpu: Vulkan / Metal / DX12 / WebGPU.
    Wgpu,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
        }
    }

    /// Every backend this build can run.
    pub fn compiled() -> Vec<Backend> {
        [Backend::Flex, Backend::Wgpu].into_iter().filter(|b| b.device().is_ok()).collect()
    }

    pub fn device(self) -> Result<Device, PolicyError> {
        match self {
            #[cfg(feature = "flex")]
            Backend::Flex => Ok(Device::flex()),
            #[cfg(not(feature = "flex"))]
            Backend::Flex => Err(PolicyError::NotCompiled { backend: "flex", feature: "flex" }),
            Backend::Wgpu => Err(PolicyError::NotCompiled { backend: "wgpu", feature: "wgpu" }),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "flex" | "cpu" => Ok(Backend::Flex),
            "wgpu" | "gpu" => Ok(Backend::Wgpu),
            _ => Err(format!("unknown backend '{s}' (flex, wgpu)")),
        }
    }
}
