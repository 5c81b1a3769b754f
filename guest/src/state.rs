//! The host rows of one session's recurrent state, indexed by env id. Executors that keep state on their device
//! ([`Placement::state`](crate::executor::Placement)) hold the authoritative copy in their scratch and these rows
//! are refreshed from it only when the session is asked for its state.

/// One row per env and state tensor, zeros after a reset.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostState {
    pub(crate) num_envs: usize,
    /// Per state tensor: (numel per env, `num_envs x numel` values).
    pub(crate) tensors: Vec<(usize, Vec<f32>)>,
}

use crate::error::{PolicyError, try_resize};

impl HostState {
    pub(crate) fn new(sizes: &[usize]) -> Self {
        HostState {
            num_envs: 0,
            tensors: sizes.iter().map(|&n| (n, vec![])).collect(),
        }
    }

    pub(crate) fn is_recurrent(&self) -> bool {
        !self.tensors.is_empty()
    }

    /// Grow to hold at least `num_envs` envs (new envs start at zero); never shrinks. Fallible: an env count
    /// the machine cannot hold is [`PolicyError::Allocation`] (tensors grown before the failure keep their
    /// zeroed tail; `num_envs` moves only when every tensor grew).
    pub(crate) fn grow(&mut self, num_envs: usize) -> Result<(), PolicyError> {
        if num_envs > self.num_envs {
            for (n, data) in &mut self.tensors {
                try_resize(data, n.saturating_mul(num_envs), 0.0, "recurrent state")?;
            }
            self.num_envs = num_envs;
        }
        Ok(())
    }

    /// Zero the rows of env `env` (< num_envs).
    pub(crate) fn zero(&mut self, env: u32) {
        let e = env as usize;
        for (n, data) in &mut self.tensors {
            data[e * *n..(e + 1) * *n].iter_mut().for_each(|v| *v = 0.0);
        }
    }

    /// Replace the rows with a device copy (`num_envs x n` per tensor; a shorter copy leaves the rest zero).
    pub(crate) fn overwrite(&mut self, device: Vec<Vec<f32>>) {
        for ((_, host), data) in self.tensors.iter_mut().zip(device) {
            let n = data.len().min(host.len());
            host[..n].copy_from_slice(&data[..n]);
            host[n..].iter_mut().for_each(|v| *v = 0.0);
        }
    }
}
