//! [`ScriptRunner`]: the agents layer as a scripting language sees it (GDScript in Godot 3 and 4).
//!
//! A script has integers, packed arrays and no exceptions: ids travel as `i64` ([`AgentId::to_bits`]), a whole
//! tick is two arrays in and arrays out, and a refused call answers `false` / `-1` with the reason kept for
//! [`ScriptRunner::last_error`]. Both Godot bindings are thin shells over this type, so the two engines cannot
//! drift apart in what a call means; the semantics underneath (stable ids, the tick as the sampling step, a refused
//! tick changes nothing) are [`Agents`]'.

use std::sync::Arc;

use policyport::{Backend, CompiledPolicy, PolicyError};

use crate::{AgentId, Agents, AgentsConfig, AgentsError, RowOutputs};

/// Why the last call of a [`ScriptRunner`] was refused (what `last_error()` prints).
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("no policy loaded (call load() first)")]
    NotLoaded,
    #[error("could not load the policy: {0}")]
    Load(#[from] PolicyError),
    #[error(transparent)]
    Agents(#[from] AgentsError),
    /// An action mask byte other than 0 / 1 (a script that passed scores or counts, not flags).
    #[error("action mask byte {index} is {value}: masks hold 0 (forbidden) or 1 (allowed)")]
    MaskByte { index: usize, value: u8 },
    /// What the engine binding found wrong with a call's arguments (their types, counts).
    #[error("{0}")]
    Argument(String),
}

/// One policy's agents for a script. Buffers are reused across ticks.
#[derive(Debug, Default)]
pub struct ScriptRunner {
    agents: Option<Agents>,
    rows: RowOutputs,
    ids: Vec<AgentId>,
    mask: Vec<bool>,
    /// [`AgentsConfig::values`] for this runner's agents (kept across loads).
    values: bool,
    last_error: Option<ScriptError>,
}

impl ScriptRunner {
    /// Keeps `e` for [`ScriptRunner::last_error`] and answers `false`.
    pub fn fail(&mut self, e: impl Into<ScriptError>) -> bool {
        self.last_error = Some(e.into());
        false
    }

    fn ok(&mut self) -> bool {
        self.last_error = None;
        true
    }

    /// Why the last refused call was refused ("" after a call that succeeded).
    pub fn last_error(&self) -> String {
        self.last_error
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// The typed reason of the last refusal.
    pub fn last_error_kind(&self) -> Option<&ScriptError> {
        self.last_error.as_ref()
    }

    /// The agents, once a policy is loaded.
    pub fn agents(&self) -> Option<&Agents> {
        self.agents.as_ref()
    }

    fn agents_mut(&mut self) -> Result<&mut Agents, ScriptError> {
        self.agents.as_mut().ok_or(ScriptError::NotLoaded)
    }

    /// Load an artifact on the native cpu backend; every agent of a policy loaded before is gone. `sample`: false
    /// for greedy / mean actions. On error the runner keeps what it had.
    pub fn load_bytes(&mut self, bytes: &[u8], seed: i64, sample: bool) -> bool {
        match CompiledPolicy::load(bytes, Backend::Cpu) {
            Ok(p) => self.load_policy(p, seed, sample),
            Err(e) => self.fail(e),
        }
    }

    /// [`ScriptRunner::load_bytes`] for a policy already loaded.
    pub fn load_policy(&mut self, policy: Arc<CompiledPolicy>, seed: i64, sample: bool) -> bool {
        let config = AgentsConfig {
            seed: seed as u64,
            deterministic: !sample,
            values: self.values,
            ..Default::default()
        };
        self.agents = Some(Agents::new(policy, config));
        self.rows = RowOutputs::default();
        self.ok()
    }

    /// A new agent's id (its first tick starts a new episode), or -1.
    pub fn spawn(&mut self) -> i64 {
        match self.agents_mut().and_then(|a| Ok(a.spawn()?)) {
            Ok(id) => {
                self.ok();
                id.to_bits() as i64
            }
            Err(e) => {
                self.fail(e);
                -1
            }
        }
    }

    /// The agent is gone; its id is refused from now on.
    pub fn despawn(&mut self, id: i64) -> bool {
        let id = AgentId::from_bits(id as u64);
        match self.agents_mut().and_then(|a| Ok(a.despawn(id)?)) {
            Ok(()) => self.ok(),
            Err(e) => self.fail(e),
        }
    }

    /// The agent starts a new episode at its next tick.
    pub fn respawn(&mut self, id: i64) -> bool {
        let id = AgentId::from_bits(id as u64);
        match self.agents_mut().and_then(|a| Ok(a.respawn(id)?)) {
            Ok(()) => self.ok(),
            Err(e) => self.fail(e),
        }
    }

    /// One act for the agents `ids`: row `i` of `observations` (and of `mask`, one 0/1 byte per logit, when
    /// given) is `ids[i]`'s. The outputs are then [`ScriptRunner::outputs`], in the ids' order. False, and
    /// nothing changed (no id staged, no step taken, the last outputs kept), if anything was refused.
    pub fn tick(
        &mut self,
        ids: impl IntoIterator<Item = i64>,
        observations: &[f32],
        mask: Option<&[u8]>,
    ) -> bool {
        let mut staged = std::mem::take(&mut self.ids);
        staged.clear();
        staged.extend(ids.into_iter().map(|i| AgentId::from_bits(i as u64)));
        let mut flags = std::mem::take(&mut self.mask);
        flags.clear();
        let mut result = Ok(());
        if let Some(bytes) = mask {
            for (index, &value) in bytes.iter().enumerate() {
                match value {
                    0 | 1 => flags.push(value == 1),
                    _ => {
                        result = Err(ScriptError::MaskByte { index, value });
                        break;
                    }
                }
            }
        }
        let mut rows = std::mem::take(&mut self.rows);
        let result = result.and_then(|()| {
            let masks = mask.map(|_| flags.as_slice());
            let agents = self.agents_mut()?;
            Ok(agents.tick_rows(&staged, observations, masks, &mut rows)?)
        });
        (self.ids, self.rows, self.mask) = (staged, rows, flags);
        match result {
            Ok(()) => self.ok(),
            Err(e) => self.fail(e),
        }
    }

    /// Compute the agents' value estimates from the next tick on (off by default: [`AgentsConfig::values`]);
    /// kept across loads.
    pub fn set_values(&mut self, values: bool) {
        self.values = values;
        if let Some(a) = &mut self.agents {
            a.set_values(values);
        }
    }

    /// The last successful tick's outputs, in its ids' order.
    pub fn outputs(&self) -> &RowOutputs {
        &self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_before_load_are_typed_refusals() {
        let mut r = ScriptRunner::default();
        assert_eq!(r.spawn(), -1);
        assert!(matches!(r.last_error_kind(), Some(ScriptError::NotLoaded)));
        assert!(!r.tick([0], &[0.0; 4], None));
        assert!(r.last_error().contains("load()"));
        assert!(!r.load_bytes(b"not an artifact", 0, true));
        assert!(matches!(r.last_error_kind(), Some(ScriptError::Load(_))));
        assert!(r.agents().is_none());
    }

    #[test]
    fn a_mask_byte_other_than_0_or_1_is_refused_by_index() {
        let mut r = ScriptRunner::default();
        assert!(!r.tick([0], &[0.0; 4], Some(&[1, 0, 2])));
        assert!(matches!(
            r.last_error_kind(),
            Some(ScriptError::MaskByte { index: 2, value: 2 })
        ));
    }
}
