//! The sandboxed plugin as a runtime [`Executor`]: a plugin policy is a [`CompiledPolicy`] on
//! `Backend::Wasmtime`, and its [`policyport::Session`]s run the same request check, state model (per-env state,
//! resets, episode starts) and golden verification as every other backend — so the whole conformance suite runs
//! on the sandbox, not a hand-copied part of it, and every host (the C ABI, the agents layer, Bevy) has one
//! policy type for both routes.
//!
//! Each session owns one instance of the plugin (its own store, memory cap and deadline: the isolation unit is
//! the caller); the compiled module is shared through the [`WasmRuntime`]. The executor does everything inside
//! the sandbox — preprocessing, the recurrent state (read back through `pp_state`), sampling — and writes the
//! plugin's outputs into the session's outputs as they are ([`Placement::outputs`]: discrete actions stay
//! integers; the session checks them before they count).
//!
//! The artifact is read and validated on the host too (the same reader the native runtime uses, fuzzed): the
//! session needs the decoded head and state sizes, and checks each request before the plugin sees it.
//!
//! A trap, deadline or memory-cap hit leaves the session's instance unusable (the plugin's state may be torn):
//! every later call of that session is [`SandboxError::Poisoned`], naming the first failure; make a new
//! session.

use std::sync::{Arc, Mutex};

use policyport::executor::{
    ExecScratch, Executor, ExecutorBuilder, Pending, Placement, StepInput, scratch_of,
};
use policyport::format::{Artifact, ValidatedPlan, read_artifact};
use policyport::{
    ActOutputs, Backend, BackendError, CompiledPolicy, EnvIds, Observations, PolicyError, Request,
    SandboxError,
};

use crate::{WasmError, WasmLimits, WasmPolicy, WasmRuntime};

/// Load `artifact` as a [`CompiledPolicy`] whose sessions each run in their own instance of `rt`'s plugin under
/// `limits`. The artifact is read on the host first (a refused one is `PolicyError::Artifact`), then loaded in
/// an instance and acted on once (the warm-up every backend does): a plugin that refuses the artifact, traps,
/// passes its deadline or its memory cap already fails here, typed (`PolicyError::Sandbox`).
pub fn load(
    rt: &Arc<WasmRuntime>,
    artifact: &[u8],
    limits: WasmLimits,
) -> Result<Arc<CompiledPolicy>, PolicyError> {
    let art: Artifact = read_artifact(artifact)?;
    let builder = Arc::new(PluginBuilder {
        rt: rt.clone(),
        bytes: Arc::from(artifact),
        limits,
    });
    CompiledPolicy::with_builder(art, builder)
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
        let exec = PluginExecutor {
            rt: self.rt.clone(),
            bytes: self.bytes.clone(),
            limits: self.limits,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            obs_len: art.manifest.observation.raw_len(),
            action_len: head.action_len,
            params_len: head.dist_params_len,
            has_value: head.has_value(),
            discrete: head.is_discrete(),
            spare: Mutex::new(None),
        };
        // One instance now, for the first session: a plugin that refuses the artifact, traps, or passes its
        // deadline or memory cap loading it fails the load, typed — not the caller's first act() — and the
        // policy is instantiated once, not once to warm up and again for the session (no warm-up act:
        // `warm_up_batches`).
        let first = exec.instantiate()?;
        *exec.spare.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
        Ok(Box::new(exec))
    }
}

struct PluginExecutor {
    rt: Arc<WasmRuntime>,
    bytes: Arc<[u8]>,
    limits: WasmLimits,
    state_sizes: Vec<usize>,
    obs_len: usize,
    action_len: usize,
    params_len: usize,
    has_value: bool,
    discrete: bool,
    /// The instance made at load, never acted on: the first session's.
    spare: Mutex<Option<WasmPolicy>>,
}

/// One session's instance (made on first use) and the failure that made it unusable.
struct PluginScratch {
    instance: Option<WasmPolicy>,
    poisoned: Option<String>,
}

impl PluginExecutor {
    /// A new instance with the artifact loaded, checked to describe the policy as the host read it.
    fn instantiate(&self) -> Result<WasmPolicy, PolicyError> {
        let p = WasmPolicy::load(&self.rt, &self.bytes, self.limits)?;
        // The outputs are read from the plugin's memory with the sizes it reports and checked against the host's
        // reading of the head; a plugin that reports other sizes (a hostile or mismatched module) is refused
        // here, before any act.
        let i = p.info();
        let expected = (
            self.obs_len,
            self.action_len,
            self.params_len,
            self.has_value,
            self.discrete,
            self.state_sizes.len(),
        );
        let found = (
            i.obs_len,
            i.action_len,
            i.dist_params_len,
            i.has_value,
            i.discrete,
            i.recurrent_states,
        );
        if expected != found {
            return Err(SandboxError::Broken(format!(
                "the plugin describes the policy as (observation numbers, action numbers, distribution numbers, \
                 value, discrete, state tensors) = {found:?}, the host read {expected:?}: refusing a mismatched \
                 plugin"
            ))
            .into());
        }
        Ok(p)
    }

    /// The session's instance: the load's spare for the first session, else instantiated on first use; refused
    /// after a trap, deadline or memory-cap hit.
    fn instance<'a>(&self, s: &'a mut PluginScratch) -> Result<&'a mut WasmPolicy, PolicyError> {
        if let Some(why) = &s.poisoned {
            return Err(SandboxError::Poisoned(why.clone()).into());
        }
        let p = match s.instance.take() {
            Some(p) => p,
            None => self.instantiate()?,
        };
        Ok(s.instance.insert(p))
    }

    /// A failed call: traps, deadlines and memory caps poison the instance (its state may be torn).
    fn failed(s: &mut PluginScratch, e: WasmError) -> PolicyError {
        let e = PolicyError::from(e);
        if let PolicyError::Sandbox(fault) = &e
            && fault.poisons_the_instance()
        {
            s.instance = None;
            s.poisoned = Some(fault.to_string());
        }
        e
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
            // The plugin returns outputs: they go into the session's as they are.
            outputs: true,
        }
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        self.action_len + self.params_len + self.has_value as usize
    }

    /// No warm-up act: the load made (and checked) the first session's instance instead.
    fn warm_up_batches(&self) -> &'static [usize] {
        &[]
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(PluginScratch {
            instance: self.spare.lock().unwrap_or_else(|e| e.into_inner()).take(),
            poisoned: None,
        })
    }

    /// Never called: the plugin writes outputs ([`Placement::outputs`], `launch_outputs`).
    fn launch(
        &self,
        _scratch: &mut ExecScratch,
        _step: &StepInput<'_>,
        _rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        Err(BackendError::Unsupported(
            "rows from the sandbox: the plugin writes act() outputs (Executor::launch_outputs)",
        )
        .into())
    }

    /// The request goes into the plugin as the session checked it (observations as the caller gave them, the
    /// rows' env ids, the mode, skip_value; episode starts were applied through `reset_state`, masks and
    /// epsilons are drawn on the host), and the plugin's outputs come back into `out` (the session's spare
    /// buffers) without passing through rows.
    fn launch_outputs(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        out: &mut ActOutputs,
    ) -> Result<(), PolicyError> {
        let s = scratch_of::<PluginScratch>(scratch);
        let batch = step.batch;
        let obs = step.raw.unwrap_or(Observations::F32(step.obs));
        let mut req =
            Request::new(obs, batch, step.mode).envs(EnvIds::List(&step.env_ids[..batch]));
        req.skip_value = step.skip_value;
        let r = self.instance(s)?.act(&req, out);
        r.map_err(|e| Self::failed(s, e))
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
