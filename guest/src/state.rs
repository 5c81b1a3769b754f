//! Per-env recurrent state, owned by the caller and indexed by env id.

use crate::error::PolicyError;
use crate::policy::Policy;

/// Recurrent state for `num_envs` envs: one row per env and state tensor, zeros after reset.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentState {
    pub(crate) num_envs: usize,
    /// Per state tensor: (numel per env, `num_envs x numel` values).
    pub(crate) tensors: Vec<(usize, Vec<f32>)>,
}

impl RecurrentState {
    /// Zero state for envs `0..num_envs` of this policy.
    pub fn new(policy: &Policy, num_envs: usize) -> Self {
        let tensors = policy
            .state_sizes()
            .iter()
            .map(|&n| (n, vec![0.0; n * num_envs]))
            .collect();
        RecurrentState { num_envs, tensors }
    }

    pub fn num_envs(&self) -> usize {
        self.num_envs
    }

    /// Grow to hold at least `num_envs` envs (new envs start at zero); never shrinks.
    pub fn ensure_envs(&mut self, num_envs: usize) {
        if num_envs > self.num_envs {
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
        Ok(())
    }

    /// State tensor `k` of env `env`.
    pub fn get(&self, k: usize, env: u32) -> Option<&[f32]> {
        let (n, data) = self.tensors.get(k)?;
        let e = env as usize;
        (e < self.num_envs).then(|| &data[e * n..(e + 1) * n])
    }
}
