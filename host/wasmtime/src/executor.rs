//! The sandboxed plugin as a runtime [`Executor`]: a plugin policy is a [`CompiledPolicy`] on
//! `Backend::Wasmtime`, and its [`policyport::Session`]s run the same request check, state model (per-env state,
//! resets, episode starts) and golden verification as every other backend — so the whole conformance suite runs
//! on the sandbox, not a hand-copied part of it.
//!
//! Each session owns one instance of the plugin (its own store, memory cap and deadline: the isolation unit is
//! the caller, as with [`WasmPolicy`]); the compiled module is shared through the [`WasmRuntime`]. The executor
//! does everything inside the sandbox — preprocessing, the recurrent state (read back through `pp_state`),
//! sampling — so its rows are `[actions | distribution parameters | value]`.
//!
//! This route also reads and validates the artifact on the host (the same reader the native runtime uses, and
//! fuzzed): the session needs the decoded head and state sizes. A host that must never parse an untrusted
//! artifact natively uses [`WasmPolicy`] alone.
//!
//! A trap, deadline or memory-cap hit leaves the session's instance unusable (the plugin's state may be torn):
//! every later call of that session is a typed error naming the first failure; make a new session.

use std::sync::Arc;

use policyport::executor::{
    ExecScratch, Executor, ExecutorBuilder, Pending, Placement, StepInput, scratch_of,
};
use policyport::format::{Artifact, ValidatedPlan, read_artifact};
use policyport::{
    ActOutputs, Backend, BackendError, CompiledPolicy, EnvIds, Observations, PolicyError, Request,
};

use crate::{WasmError, WasmLimits, WasmPolicy, WasmRuntime};

/// Load `artifact` as a [`CompiledPolicy`] whose sessions run in instances of `rt`'s plugin under `limits`.
pub fn load(
    rt: &Arc<WasmRuntime>,
    artifact: &[u8],
    limits: WasmLimits,
) -> Result<Arc<CompiledPolicy>, WasmError> {
    let art: Artifact = read_artifact(artifact).map_err(|e| WasmError::Policy(e.into()))?;
    let builder = Arc::new(PluginBuilder {
        rt: rt.clone(),
        bytes: Arc::from(artifact),
        limits,
    });
    CompiledPolicy::with_builder(art, builder).map_err(WasmError::Policy)
}

/// Builds plugin executors for one artifact (kept by the policy).
struct PluginBuilder {
    rt: Arc<WasmRuntime>,
    bytes: Arc<[u8]>,
    limits: WasmLimits,
}

impl ExecutorBuilder for PluginBuilder {
    fn backend(&self) -> Backend {
        Backend::Wasmtime
    }

    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError> {
        if readback.is_some() {
            return Err(BackendError::Unsupported(
                "the plugin ABI returns act() outputs only: golden probes of intermediate values need a native backend",
            )
            .into());
        }
        let low = policyport::lower::lower(art, plan, &policyport::lower::step_readback(art, plan));
        let head = &plan.head;
        Ok(Box::new(PluginExecutor {
            rt: self.rt.clone(),
            bytes: self.bytes.clone(),
            limits: self.limits,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            action_len: head.action_len,
            params_len: head.dist_params_len,
            has_value: head.has_value(),
            discrete: head.is_discrete(),
        }))
    }
}

struct PluginExecutor {
    rt: Arc<WasmRuntime>,
    bytes: Arc<[u8]>,
    limits: WasmLimits,
    state_sizes: Vec<usize>,
    action_len: usize,
    params_len: usize,
    has_value: bool,
    discrete: bool,
}

/// One session's instance (made on first use), its outputs buffer, and the failure that made it unusable.
struct PluginScratch {
    instance: Option<WasmPolicy>,
    out: ActOutputs,
    broken: Option<String>,
}

impl PluginExecutor {
    /// The session's instance: instantiated and loaded on first use; refused after a trap.
    fn instance<'a>(&self, s: &'a mut PluginScratch) -> Result<&'a mut WasmPolicy, PolicyError> {
        if let Some(why) = &s.broken {
            return Err(BackendError::Device(format!(
                "this session's sandboxed instance failed earlier ({why}); make a new session"
            ))
            .into());
        }
        if s.instance.is_none() {
            let p = WasmPolicy::load(&self.rt, &self.bytes, self.limits)
                .map_err(|e| BackendError::Device(e.to_string()))?;
            // The rows below are cut by the host's own reading of the head; a plugin that reports other sizes
            // (a hostile or mismatched module) would have the host slice past its outputs: refuse it here.
            let i = p.info();
            let expected = (
                self.action_len,
                self.params_len,
                self.has_value,
                self.discrete,
                self.state_sizes.len(),
            );
            let found = (
                i.action_len,
                i.dist_params_len,
                i.has_value,
                i.discrete,
                i.recurrent_states,
            );
            if expected != found {
                return Err(BackendError::Device(format!(
                    "the plugin describes the policy as (action numbers, distribution numbers, value, discrete, \
                     state tensors) = {found:?}, the host read {expected:?}: refusing a mismatched plugin"
                ))
                .into());
            }
            s.instance = Some(p);
        }
        Ok(s.instance.as_mut().expect("made above"))
    }

    /// A failed call: traps, deadlines and memory caps poison the instance (its state may be torn).
    fn failed(s: &mut PluginScratch, e: WasmError) -> PolicyError {
        let msg = e.to_string();
        if matches!(
            e,
            WasmError::Trap { .. } | WasmError::Deadline { .. } | WasmError::MemoryCap { .. }
        ) {
            s.instance = None;
            s.broken = Some(msg.clone());
        }
        match e {
            WasmError::Policy(p) => p,
            _ => BackendError::Device(msg).into(),
        }
    }
}

impl Executor for PluginExecutor {
    /// The sandbox's memory is capped (`WasmLimits::memory_bytes`): a guest that cannot grow it fails its call
    /// with a typed error; the host allocates only the outputs.
    fn allocations_are_fallible(&self) -> bool {
        true
    }

    fn backend(&self) -> Backend {
        Backend::Wasmtime
    }

    fn placement(&self) -> Placement {
        Placement {
            preprocess: true,
            state: true,
            sampling: true,
            // The request's observations go into the sandbox as the caller gave them (uint8 frames as bytes, a
            // quarter of an f32 copy): the plugin's own session checks and widens them.
            raw_observations: true,
        }
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        self.action_len + self.params_len + self.has_value as usize
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(PluginScratch {
            instance: None,
            out: ActOutputs::default(),
            broken: None,
        })
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let s = scratch_of::<PluginScratch>(scratch);
        let batch = step.batch;
        let obs = step.raw.unwrap_or(Observations::F32(step.obs));
        let mut req =
            Request::new(obs, batch, step.mode).envs(EnvIds::List(&step.env_ids[..batch]));
        req.skip_value = step.skip_value;
        let mut out = std::mem::take(&mut s.out);
        let r = self.instance(s)?.act(&req, &mut out);
        if let Err(e) = r {
            s.out = out;
            return Err(Self::failed(s, e));
        }
        let (k, np) = (self.action_len, self.params_len);
        rows.clear();
        for row in 0..batch {
            if self.discrete {
                rows.extend(
                    out.discrete[row * k..(row + 1) * k]
                        .iter()
                        .map(|a| *a as f32),
                );
            } else {
                rows.extend_from_slice(&out.continuous[row * k..(row + 1) * k]);
            }
            rows.extend_from_slice(&out.dist_params[row * np..(row + 1) * np]);
            if self.has_value {
                // A skipped value's column (the session does not read it).
                rows.push(out.value.get(row).copied().unwrap_or(0.0));
            }
        }
        s.out = out;
        Ok(Pending::Ready)
    }

    fn reset_state(&self, scratch: &mut ExecScratch, envs: &[u32]) -> Result<(), PolicyError> {
        let s = scratch_of::<PluginScratch>(scratch);
        let r = self.instance(s)?.reset(envs);
        r.map_err(|e| Self::failed(s, e))
    }

    fn read_state(&self, scratch: &mut ExecScratch) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        if self.state_sizes.is_empty() {
            return Ok(None);
        }
        let s = scratch_of::<PluginScratch>(scratch);
        let mut all = vec![];
        for k in 0..self.state_sizes.len() {
            let r = self.instance(s)?.state(k);
            all.push(r.map_err(|e| Self::failed(s, e))?);
        }
        Ok(Some(all))
    }
}
