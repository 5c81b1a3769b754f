//! Per-env recurrent state, owned by the caller and indexed by env id.
//!
//! On the wgpu backend the authoritative copy lives on the device between steps (gathered and scattered by
//! `shaders/state.wgsl`, never read back per step); the host rows are refreshed only when asked for ([`get`],
//! cloning) and `reset` zeroes rows on the device directly. CPU backends use the host rows.
//!
//! [`get`]: RecurrentState::get

use crate::error::PolicyError;
use crate::policy::Policy;

/// Recurrent state for `num_envs` envs: one row per env and state tensor, zeros after reset.
#[derive(Debug)]
pub struct RecurrentState {
    pub(crate) num_envs: usize,
    /// Per state tensor: (numel per env, `num_envs x numel` values).
    pub(crate) tensors: Vec<(usize, Vec<f32>)>,
    /// The device copy (wgpu); when present and `host_stale`, `tensors` is out of date.
    #[cfg(feature = "wgpu")]
    pub(crate) device: Option<crate::gpu::DeviceState>,
}

impl Clone for RecurrentState {
    /// A deep copy: a device copy is duplicated on the device (two states never share a buffer).
    fn clone(&self) -> Self {
        RecurrentState {
            num_envs: self.num_envs,
            tensors: self.tensors.clone(),
            #[cfg(feature = "wgpu")]
            device: self.device.as_ref().map(|d| d.deep_copy()),
        }
    }
}

impl RecurrentState {
    /// Zero state for envs `0..num_envs` of this policy.
    pub fn new(policy: &Policy, num_envs: usize) -> Self {
        let tensors = policy
            .state_sizes()
            .iter()
            .map(|&n| (n, vec![0.0; n * num_envs]))
            .collect();
        RecurrentState {
            num_envs,
            tensors,
            #[cfg(feature = "wgpu")]
            device: None,
        }
    }

    pub fn num_envs(&self) -> usize {
        self.num_envs
    }

    /// Bring the host rows up to date with the device copy (one readback; nothing to do on CPU backends).
    pub fn sync(&mut self) -> Result<(), PolicyError> {
        #[cfg(feature = "wgpu")]
        if let Some(d) = &mut self.device
            && d.host_stale
        {
            for ((_, host), data) in self.tensors.iter_mut().zip(d.read()?) {
                *host = data;
            }
            d.host_stale = false;
        }
        Ok(())
    }

    /// [`RecurrentState::sync`] without blocking (a browser's WebGPU device).
    pub async fn sync_async(&mut self) -> Result<(), PolicyError> {
        #[cfg(feature = "wgpu")]
        if let Some(d) = &mut self.device
            && d.host_stale
        {
            for ((_, host), data) in self.tensors.iter_mut().zip(d.read_async().await?) {
                *host = data;
            }
            d.host_stale = false;
        }
        Ok(())
    }

    /// Grow to hold at least `num_envs` envs (new envs start at zero); never shrinks.
    pub fn ensure_envs(&mut self, num_envs: usize) {
        if num_envs > self.num_envs {
            // A device copy of the old size is dropped after syncing; the next act() uploads the grown state.
            #[cfg(feature = "wgpu")]
            if self.sync().is_ok() {
                self.device = None;
            }
            for (n, data) in &mut self.tensors {
                data.resize(*n * num_envs, 0.0);
            }
            self.num_envs = num_envs;
        }
    }

    /// Zero the state of these envs (episode boundaries).
    pub fn reset(&mut self, envs: &[u32]) -> Result<(), PolicyError> {
        for &e in envs {
            let e = e as usize;
            if e >= self.num_envs {
                return Err(PolicyError::State(format!(
                    "env {e} out of range (state holds {} envs)",
                    self.num_envs
                )));
            }
            for (n, data) in &mut self.tensors {
                data[e * *n..(e + 1) * *n].iter_mut().for_each(|v| *v = 0.0);
            }
        }
        #[cfg(feature = "wgpu")]
        if let Some(d) = &mut self.device {
            d.zero_rows(envs)?;
        }
        Ok(())
    }

    /// State tensor `k` of env `env` (reads the device copy back first when it is newer).
    pub fn get(&mut self, k: usize, env: u32) -> Option<&[f32]> {
        self.sync().ok()?;
        let (n, data) = self.tensors.get(k)?;
        let e = env as usize;
        (e < self.num_envs).then(|| &data[e * n..(e + 1) * n])
    }
}
