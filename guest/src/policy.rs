//! [`Policy`]: load + validate an artifact, then act() on batches of envs.

use policyport_format::sampling::{ActMode, Sampler};
use policyport_format::{
    ActionSpace, Artifact, Distribution, GoldenCase, Limits, Manifest, ObservationSpace,
    ValidatedPlan, read_artifact, validate,
};

#[cfg(feature = "burn")]
use burn::tensor::Device;

use crate::backend::Backend;
use crate::cpu::CpuProgram;
use crate::error::PolicyError;
#[cfg(feature = "burn")]
use crate::exec::Program;
use crate::observations::{Observations, Preprocessor};
use crate::state::RecurrentState;

/// Largest batch act() accepts.
pub const MAX_BATCH: usize = 1 << 20;

/// Which env each row of a batch is (for sampling streams and recurrent state).
#[derive(Debug, Clone, Copy)]
pub enum EnvIds<'a> {
    /// Rows are envs `start, start + 1, …`.
    Range(u32),
    /// One id per row.
    List(&'a [u32]),
}

impl EnvIds<'_> {
    /// The env id of batch row `row`.
    #[inline]
    pub fn get(&self, row: usize) -> u32 {
        match self {
            EnvIds::Range(start) => start + row as u32,
            EnvIds::List(ids) => ids[row],
        }
    }

    /// An env id naming two rows of this batch, if any (the smallest such id). With per-env recurrent state two
    /// rows of one env would read the same state and race to write the next one (on a CPU the last write would
    /// silently win, on a GPU which write wins is unspecified), so every backend refuses such a batch for a
    /// recurrent policy: one rule, checked here for the guest's backends, the plugin and the libtorch executor.
    /// `scratch` is reused across calls (no allocation once warm); sorting a copy keeps the cost O(batch log
    /// batch) whatever the ids' range.
    pub fn duplicate(&self, batch: usize, scratch: &mut Vec<u32>) -> Option<u32> {
        let EnvIds::List(ids) = self else {
            return None; // distinct by construction
        };
        scratch.clear();
        scratch.extend_from_slice(&ids[..batch.min(ids.len())]);
        scratch.sort_unstable();
        scratch.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    }

    /// [`EnvIds::duplicate`] as the typed error every runtime returns (the one place its message is written).
    pub fn check_distinct(&self, batch: usize, scratch: &mut Vec<u32>) -> Result<(), PolicyError> {
        match self.duplicate(batch, scratch) {
            Some(d) => Err(PolicyError::EnvIds(format!(
                "env {d} appears twice in one batch of a recurrent policy"
            ))),
            None => Ok(()),
        }
    }
}

/// Results of one act(), reused across calls (buffers keep their capacity: no allocation once warm).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActOutputs {
    pub batch: usize,
    /// Discrete / multi-discrete actions, `batch x action_len` (empty for continuous policies).
    pub discrete: Vec<i64>,
    /// Continuous actions, `batch x action_len` (empty for discrete policies).
    pub continuous: Vec<f32>,
    /// Value estimate per row (empty without a critic).
    pub value: Vec<f32>,
    /// Distribution parameters per row: logits (concatenated for multi-discrete), or mean then log-std.
    pub dist_params: Vec<f32>,
}

/// What a loaded policy is.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    pub name: String,
    pub backend: String,
    pub format_version: (u16, u16),
    pub observation: ObservationSpace,
    pub action: ActionSpace,
    pub obs_len: usize,
    pub action_len: usize,
    pub dist_params_len: usize,
    pub has_value: bool,
    pub recurrent_states: usize,
    pub parameters: usize,
    /// How the backend was chosen (set by [`Policy::load_auto`]: the measured latencies).
    pub selection: Option<String>,
    /// GPU dispatches one act() issues (wgpu backend), None on CPU backends.
    pub dispatches_per_act: Option<usize>,
}

/// What `build` lowers for.
enum Target<'a> {
    Cpu,
    #[cfg(feature = "burn")]
    Burn(&'a Device),
    /// burn's wgpu device with the fused WGSL kernels, device preprocessing and device sampling.
    #[cfg(feature = "wgpu")]
    Wgpu(&'a Device),
    #[cfg(not(feature = "burn"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

/// Where the lowered graph runs: native CPU kernels, or burn tensors on a device.
enum Exec {
    Cpu(CpuProgram),
    #[cfg(feature = "burn")]
    Burn(Program),
}

impl Exec {
    fn new(like: &Exec, art: &Artifact, plan: &ValidatedPlan, readback: &[&str]) -> Exec {
        match like {
            Exec::Cpu(_) => Exec::Cpu(CpuProgram::new(art, plan, readback)),
            #[cfg(feature = "burn")]
            Exec::Burn(p) => Exec::Burn(Program::new(art, plan, readback, p.device())),
        }
    }

    fn state_slots(&self) -> &[(usize, usize)] {
        match self {
            Exec::Cpu(p) => &p.state_slots,
            #[cfg(feature = "burn")]
            Exec::Burn(p) => &p.state_slots,
        }
    }

    fn readback(&self) -> &[(usize, usize)] {
        match self {
            Exec::Cpu(p) => &p.readback,
            #[cfg(feature = "burn")]
            Exec::Burn(p) => &p.readback,
        }
    }

    /// True when the executor preprocesses and samples on its device (rows start with the actions).
    fn on_device(&self) -> bool {
        match self {
            #[cfg(feature = "wgpu")]
            Exec::Burn(p) => p.gpu.is_some(),
            _ => false,
        }
    }

    fn dispatches_per_act(&self) -> Option<usize> {
        match self {
            #[cfg(feature = "wgpu")]
            Exec::Burn(p) if p.gpu.is_some() => Some(p.dispatches_per_act()),
            _ => None,
        }
    }

    /// True when observations go to the device raw (after the host-side checks).
    fn wants_raw_obs(&self) -> bool {
        match self {
            #[cfg(feature = "wgpu")]
            Exec::Burn(p) => p.gpu.as_ref().is_some_and(|g| g.preprocess.is_some()),
            _ => false,
        }
    }

    fn run(
        &mut self,
        batch: usize,
        obs: &[f32],
        states: Vec<Vec<f32>>,
        rows: &mut Vec<f32>,
        mode: ActMode,
        envs: EnvIds<'_>,
    ) -> Result<(), PolicyError> {
        let _ = (&mode, &envs);
        match self {
            Exec::Cpu(p) => {
                p.run(batch, obs, &states, rows);
                Ok(())
            }
            #[cfg(feature = "burn")]
            Exec::Burn(p) => {
                let obs_len = obs.len() / batch;
                *rows = p
                    .run(batch, obs.to_vec(), obs_len, states)
                    .map_err(PolicyError::Backend)?;
                Ok(())
            }
        }
    }
}

/// A loaded, validated policy bound to one backend.
pub struct Policy {
    artifact: Artifact,
    plan: ValidatedPlan,
    exec: Exec,
    sampler: Sampler,
    pre: Preprocessor,
    backend_name: String,
    /// Numbers per readback row that are distribution values (before completing the log-std).
    raw_params: usize,
    row_width: usize,
    has_value: bool,
    scratch_obs: Vec<f32>,
    scratch_rows: Vec<f32>,
    /// Env ids of the current batch, sorted (the duplicate check of recurrent batches).
    scratch_ids: Vec<u32>,
    selection: Option<String>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.artifact.manifest.name)
            .field("backend", &self.backend_name)
            .finish()
    }
}

impl Policy {
    /// Load on a backend by name; a backend compiled out gives [`PolicyError::NotCompiled`].
    pub fn load_on(bytes: &[u8], backend: Backend) -> Result<Self, PolicyError> {
        backend.check_compiled()?;
        let artifact = read_artifact(bytes)?;
        let mut p = match backend {
            Backend::Cpu => Self::build(artifact, Target::Cpu)?,
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Self::build(artifact, Target::Wgpu(&backend.device()?))?,
            #[cfg(feature = "burn")]
            other => Self::build(artifact, Target::Burn(&other.device()?))?,
            #[cfg(not(feature = "burn"))]
            _ => unreachable!("check_compiled refused every burn backend"),
        };
        p.backend_name = backend.name().to_string();
        Ok(p)
    }

    /// Read, checksum and validate the artifact, upload and pack weights, and warm up (one act at batch 1)
    /// so the first real call pays no setup.
    #[cfg(feature = "burn")]
    pub fn load(bytes: &[u8], device: &Device) -> Result<Self, PolicyError> {
        let artifact = read_artifact(bytes)?;
        Self::from_artifact(artifact, device)
    }

    /// From a decoded artifact, on a burn device.
    #[cfg(feature = "burn")]
    pub fn from_artifact(artifact: Artifact, device: &Device) -> Result<Self, PolicyError> {
        Self::build(artifact, Target::Burn(device))
    }

    fn build(artifact: Artifact, target: Target<'_>) -> Result<Self, PolicyError> {
        let plan = validate(&artifact, &Limits::default())?;
        let m = &artifact.manifest;
        let mut readback: Vec<&str> = m.distribution.param_values();
        let raw_params: usize = readback
            .iter()
            .map(|v| plan.shapes[*v].iter().product::<usize>())
            .sum();
        if let Some(v) = &m.value {
            readback.push(v);
        }
        let next_states: Vec<&str> = m
            .recurrent
            .iter()
            .flat_map(|r| &r.states)
            .map(|s| s.next.as_str())
            .collect();
        readback.extend(&next_states);
        let (exec, backend_name) = match target {
            Target::Cpu => (
                Exec::Cpu(CpuProgram::new(&artifact, &plan, &readback)),
                "cpu".to_string(),
            ),
            #[cfg(feature = "burn")]
            Target::Burn(d) => (
                Exec::Burn(Program::new(&artifact, &plan, &readback, d)),
                format!("{d:?}"),
            ),
            #[cfg(feature = "wgpu")]
            Target::Wgpu(d) => (
                Exec::Burn(crate::wgpu_setup::program(&artifact, &plan, &readback, d)),
                "wgpu".to_string(),
            ),
            #[cfg(not(feature = "burn"))]
            Target::Never(_) => unreachable!(),
        };
        let sampler = Sampler::new(&artifact);
        let row_width = if exec.on_device() {
            // [actions | finished params | value] from the sampling kernel; next states stay on the device.
            sampler.action_len() + sampler.dist_params_len() + m.value.is_some() as usize
        } else {
            exec.readback().iter().map(|(_, n)| n).sum()
        };
        let pre = Preprocessor::new(&artifact, plan.obs_shape.iter().product());
        let mut policy = Policy {
            has_value: m.value.is_some(),
            artifact,
            plan,
            exec,
            sampler,
            pre,
            backend_name,
            raw_params,
            row_width,
            scratch_obs: Vec::new(),
            scratch_rows: Vec::new(),
            scratch_ids: Vec::new(),
            selection: None,
        };
        // A WebGPU program in a browser cannot block on its warm-up readback: load_async warms it instead.
        if !(cfg!(target_family = "wasm") && policy.exec.on_device()) {
            for batch in policy.warm_up_batches() {
                let (obs, mut state, mut out) = policy.warm_up_inputs(batch);
                let st = (!state.tensors.is_empty()).then_some(&mut state);
                policy.act(
                    Observations::F32(&obs),
                    batch,
                    ActMode::Sample { seed: 0, step: 0 },
                    EnvIds::Range(0),
                    st,
                    &mut out,
                )?;
            }
        }
        Ok(policy)
    }

    /// GPU programs also warm the large-batch (tiled) kernels, so no batch size meets an uncompiled pipeline.
    fn warm_up_batches(&self) -> Vec<usize> {
        if self.exec.on_device() {
            vec![1, 64]
        } else {
            vec![1]
        }
    }

    fn warm_up_inputs(&self, batch: usize) -> (Vec<f32>, RecurrentState, ActOutputs) {
        let obs = match &self.artifact.manifest.observation {
            ObservationSpace::Box { .. } => vec![0.0f32; batch * self.pre_raw_len()],
            ObservationSpace::Discrete { .. } => vec![0.0; batch],
        };
        (obs, RecurrentState::new(self, batch), ActOutputs::default())
    }

    /// [`Policy::load_on`] for callers that cannot block (the browser): the WebGPU device is initialised
    /// asynchronously (once per process) and the warm-up acts are awaited, so the first real act() pays no
    /// pipeline compilation. CPU backends load synchronously.
    pub async fn load_async(bytes: &[u8], backend: Backend) -> Result<Self, PolicyError> {
        #[cfg(feature = "wgpu")]
        if backend == Backend::Wgpu {
            crate::backend::wgpu_device_async().await?;
            let mut p = Self::load_on(bytes, backend)?;
            if cfg!(target_family = "wasm") {
                for batch in p.warm_up_batches() {
                    let (obs, mut state, mut out) = p.warm_up_inputs(batch);
                    let st = (!state.tensors.is_empty()).then_some(&mut state);
                    p.act_async(
                        Observations::F32(&obs),
                        batch,
                        ActMode::Sample { seed: 0, step: 0 },
                        EnvIds::Range(0),
                        st,
                        &mut out,
                    )
                    .await?;
                }
            }
            return Ok(p);
        }
        Self::load_on(bytes, backend)
    }

    /// [`Policy::load_auto`] for callers that cannot block, timed with the caller's clock (`now_us`: a
    /// monotonic time in microseconds, e.g. `performance.now() * 1000` in a browser, where `std::time::Instant`
    /// does not exist). Every compiled backend that loads is timed at `batch`; the fastest is kept.
    pub async fn load_auto_async(
        bytes: &[u8],
        batch: usize,
        now_us: &dyn Fn() -> f64,
    ) -> Result<Self, PolicyError> {
        let batch = batch.clamp(1, MAX_BATCH);
        let mut timed = vec![];
        for backend in [Backend::Cpu, Backend::Wgpu] {
            if backend.check_compiled().is_err() {
                continue;
            }
            let result = match Policy::load_async(bytes, backend).await {
                Ok(mut p) => match p.time_act_async(batch, now_us).await {
                    Ok(us) => Ok((us, p)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            timed.push((backend, result));
        }
        Self::pick_fastest(timed, batch)
    }

    /// Keep the fastest of the timed backends; a failed non-cpu backend is named in the note, a failed cpu
    /// backend (a bad artifact) is the error.
    fn pick_fastest(
        timed: Vec<(Backend, Result<(f64, Policy), PolicyError>)>,
        batch: usize,
    ) -> Result<Self, PolicyError> {
        let mut best: Option<(f64, Policy)> = None;
        let mut notes = vec![];
        for (backend, result) in timed {
            match result {
                Ok((us, p)) => {
                    notes.push(format!("{} {us:.1} us", backend.name()));
                    if best.as_ref().is_none_or(|(b, _)| us < *b) {
                        best = Some((us, p));
                    }
                }
                Err(e) if backend != Backend::Cpu => {
                    notes.push(format!("{}: unavailable ({e})", backend.name()))
                }
                Err(e) => return Err(e),
            }
        }
        let (_, mut p) = best.expect("the cpu backend always loads");
        p.selection = Some(format!(
            "auto at batch {batch}: {} -> {}",
            notes.join(", "),
            p.backend_name
        ));
        Ok(p)
    }

    fn pre_raw_len(&self) -> usize {
        self.artifact.manifest.observation.raw_len()
    }

    pub fn manifest(&self) -> &Manifest {
        &self.artifact.manifest
    }

    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }

    pub fn plan(&self) -> &ValidatedPlan {
        &self.plan
    }

    pub(crate) fn state_sizes(&self) -> Vec<usize> {
        self.exec.state_slots().iter().map(|(_, n)| *n).collect()
    }

    pub fn info(&self) -> PolicyInfo {
        let m = &self.artifact.manifest;
        PolicyInfo {
            name: m.name.clone(),
            backend: self.backend_name.clone(),
            format_version: self.artifact.version,
            observation: m.observation.clone(),
            action: m.action.clone(),
            obs_len: m.observation.raw_len(),
            action_len: self.sampler.action_len(),
            dist_params_len: self.sampler.dist_params_len(),
            has_value: self.has_value,
            recurrent_states: self.exec.state_slots().len(),
            parameters: self.artifact.tensors.values().map(|t| t.data.len()).sum(),
            selection: self.selection.clone(),
            dispatches_per_act: self.exec.dispatches_per_act(),
        }
    }

    /// Load on every backend worth trying here (native cpu, and wgpu when compiled and an adapter exists),
    /// time act() at the caller's batch size on each, and keep the fastest; `info().selection` says what was
    /// measured. A backend that fails to load is skipped (and named in the selection note). In a browser use
    /// [`Policy::load_auto_async`] (WebGPU cannot be timed synchronously, and there is no `Instant`).
    pub fn load_auto(bytes: &[u8], batch: usize) -> Result<Self, PolicyError> {
        let batch = batch.clamp(1, MAX_BATCH);
        let now_us = monotonic_us();
        let mut timed = vec![];
        for backend in [Backend::Cpu, Backend::Wgpu] {
            if backend.check_compiled().is_err() {
                continue;
            }
            let result = Policy::load_on(bytes, backend)
                .and_then(|mut p| Ok((p.time_act(batch, &now_us)?, p)));
            timed.push((backend, result));
        }
        Self::pick_fastest(timed, batch)
    }

    /// Median µs of a few warm act() calls at `batch` (zero observations, fresh state), under 0.2 s.
    fn time_act(&mut self, batch: usize, now_us: &dyn Fn() -> f64) -> Result<f64, PolicyError> {
        let (obs, mut state, mut out) = self.warm_up_inputs(batch);
        let has_state = !state.tensors.is_empty();
        let mut timer = ActTimer::new(now_us);
        for step in timer.steps() {
            let t0 = now_us();
            let mode = ActMode::Sample { seed: 0, step };
            let st = has_state.then_some(&mut state);
            self.act(
                Observations::F32(&obs),
                batch,
                mode,
                EnvIds::Range(0),
                st,
                &mut out,
            )?;
            if timer.record(t0) {
                break;
            }
        }
        Ok(timer.median())
    }

    /// [`Policy::time_act`] with awaited readbacks.
    async fn time_act_async(
        &mut self,
        batch: usize,
        now_us: &dyn Fn() -> f64,
    ) -> Result<f64, PolicyError> {
        let (obs, mut state, mut out) = self.warm_up_inputs(batch);
        let has_state = !state.tensors.is_empty();
        let mut timer = ActTimer::new(now_us);
        for step in timer.steps() {
            let t0 = now_us();
            let mode = ActMode::Sample { seed: 0, step };
            let st = has_state.then_some(&mut state);
            self.act_async(
                Observations::F32(&obs),
                batch,
                mode,
                EnvIds::Range(0),
                st,
                &mut out,
            )
            .await?;
            if timer.record(t0) {
                break;
            }
        }
        Ok(timer.median())
    }

    /// Record how the backend was chosen (shown by [`Policy::info`]), for loaders outside this crate.
    pub fn set_selection(&mut self, note: impl Into<String>) {
        self.selection = Some(note.into());
    }

    /// One step for `batch` envs: observations in, actions (+ value, distribution parameters, next recurrent
    /// state) out. Sampling draws from the stream (seed, env id, step) of each row, as SPEC.md defines.
    ///
    /// In a browser the WebGPU backend cannot block on its readback: use [`Policy::act_async`] there (this
    /// returns a typed error for a WebGPU policy on wasm).
    pub fn act(
        &mut self,
        obs: Observations<'_>,
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        #[cfg_attr(not(feature = "wgpu"), allow(unused_mut))] mut state: Option<
            &mut RecurrentState,
        >,
        out: &mut ActOutputs,
    ) -> Result<(), PolicyError> {
        #[cfg(target_family = "wasm")]
        if self.exec.on_device() {
            return Err(PolicyError::Backend(
                "WebGPU reads back asynchronously: call act_async".into(),
            ));
        }
        let (obs_buf, states) = self.act_prepare(obs, batch, envs, state.as_deref())?;
        let mut rows = std::mem::take(&mut self.scratch_rows);
        #[cfg(feature = "wgpu")]
        let result = if self.exec.on_device() {
            self.launch_device(batch, &obs_buf, state.as_deref_mut(), mode, envs)
                .and_then(|packed| crate::exec::read_rows(packed).map_err(PolicyError::Backend))
                .map(|r| rows = r)
        } else {
            self.exec
                .run(batch, &obs_buf, states, &mut rows, mode, envs)
        };
        #[cfg(not(feature = "wgpu"))]
        let result = self
            .exec
            .run(batch, &obs_buf, states, &mut rows, mode, envs);
        self.scratch_obs = obs_buf;
        if let Err(e) = result {
            self.scratch_rows = rows;
            return Err(e);
        }
        self.act_finish(rows, batch, mode, envs, state, out);
        Ok(())
    }

    /// [`Policy::act`] for callers that cannot block (the browser): identical results; on the wgpu backend the
    /// one readback is awaited instead of waited for. CPU backends finish synchronously.
    pub async fn act_async(
        &mut self,
        obs: Observations<'_>,
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        #[cfg_attr(not(feature = "wgpu"), allow(unused_mut))] mut state: Option<
            &mut RecurrentState,
        >,
        out: &mut ActOutputs,
    ) -> Result<(), PolicyError> {
        #[cfg(feature = "wgpu")]
        if self.exec.on_device() {
            let (obs_buf, _) = self.act_prepare(obs, batch, envs, state.as_deref())?;
            let launched = self.launch_device(batch, &obs_buf, state.as_deref_mut(), mode, envs);
            self.scratch_obs = obs_buf;
            let rows = crate::exec::read_rows_async(launched?)
                .await
                .map_err(PolicyError::Backend)?;
            self.act_finish(rows, batch, mode, envs, state, out);
            return Ok(());
        }
        self.act(obs, batch, mode, envs, state, out)
    }

    /// The host side before execution: batch, env id and observation checks, preprocessing (or raw copies for
    /// a device that preprocesses), and the gathered state rows of CPU executors.
    fn act_prepare(
        &mut self,
        obs: Observations<'_>,
        batch: usize,
        envs: EnvIds<'_>,
        state: Option<&RecurrentState>,
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>), PolicyError> {
        if batch == 0 || batch > MAX_BATCH {
            return Err(PolicyError::Batch {
                batch,
                max: MAX_BATCH,
            });
        }
        match envs {
            EnvIds::Range(start) if (start as u64 + batch as u64) > u32::MAX as u64 + 1 => {
                return Err(PolicyError::EnvIds(format!(
                    "range {start} + {batch} overflows u32"
                )));
            }
            EnvIds::List(ids) if ids.len() != batch => {
                return Err(PolicyError::EnvIds(format!(
                    "{} ids for a batch of {batch}",
                    ids.len()
                )));
            }
            _ => {}
        }
        let mut obs_buf = std::mem::take(&mut self.scratch_obs);
        let checked = if self.exec.wants_raw_obs() {
            // The device preprocesses; the host only checks (same typed errors on every backend).
            crate::observations::check_observations(
                &self.artifact.manifest.observation,
                &crate::observations::one_hot_width(&self.artifact),
                obs,
                batch,
            )
            .map(|()| {
                obs_buf.clear();
                match obs {
                    Observations::F32(x) => obs_buf.extend_from_slice(x),
                    Observations::U8(x) => obs_buf.extend(x.iter().map(|&b| b as f32)),
                }
            })
            .map_err(PolicyError::from)
        } else {
            self.pre
                .run(obs, batch, &mut obs_buf)
                .map_err(PolicyError::from)
        };
        if let Err(e) = checked {
            self.scratch_obs = obs_buf;
            return Err(e);
        }

        // Gather recurrent state rows.
        let n_states = self.exec.state_slots().len();
        let states: Vec<Vec<f32>> = match (n_states, state) {
            (0, _) => vec![],
            (_, None) => {
                self.scratch_obs = obs_buf;
                return Err(PolicyError::State(
                    "this policy is recurrent: pass a RecurrentState".into(),
                ));
            }
            (_, Some(st)) => {
                for row in 0..batch {
                    let e = envs.get(row) as usize;
                    if e >= st.num_envs {
                        self.scratch_obs = obs_buf;
                        return Err(PolicyError::State(format!(
                            "env {e} out of range (state holds {} envs)",
                            st.num_envs
                        )));
                    }
                }
                if let Err(e) = envs.check_distinct(batch, &mut self.scratch_ids) {
                    self.scratch_obs = obs_buf;
                    return Err(e);
                }
                if self.exec.on_device() {
                    vec![] // gathered on the device from its copy of the state
                } else {
                    st.tensors
                        .iter()
                        .map(|(n, data)| {
                            let mut v = Vec::with_capacity(batch * n);
                            for row in 0..batch {
                                let e = envs.get(row) as usize;
                                v.extend_from_slice(&data[e * n..(e + 1) * n]);
                            }
                            v
                        })
                        .collect()
                }
            }
        };
        Ok((obs_buf, states))
    }

    /// The host side after execution: unpack the readback rows into `out` (sampling on the host for CPU
    /// executors) and scatter next states into host rows (device programs did that on the device).
    fn act_finish(
        &mut self,
        rows: Vec<f32>,
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        state: Option<&mut RecurrentState>,
        out: &mut ActOutputs,
    ) {
        debug_assert_eq!(rows.len(), batch * self.row_width);
        let k = self.sampler.action_len();
        let p = self.sampler.dist_params_len();
        out.batch = batch;
        out.dist_params.resize(batch * p, 0.0);
        out.value
            .resize(if self.has_value { batch } else { 0 }, 0.0);
        if self.sampler.is_discrete() {
            out.discrete.resize(batch * k, 0);
            out.continuous.clear();
        } else {
            out.continuous.resize(batch * k, 0.0);
            out.discrete.clear();
        }
        let on_device = self.exec.on_device();
        if !on_device {
            for row in 0..batch {
                let src = &rows[row * self.row_width..(row + 1) * self.row_width];
                let params = &mut out.dist_params[row * p..(row + 1) * p];
                params[..self.raw_params].copy_from_slice(&src[..self.raw_params]);
                self.sampler.finish_params(params);
                if self.has_value {
                    out.value[row] = src[self.raw_params];
                }
                let (d, c) = if self.sampler.is_discrete() {
                    (&mut out.discrete[row * k..(row + 1) * k], &mut [][..])
                } else {
                    (&mut [][..], &mut out.continuous[row * k..(row + 1) * k])
                };
                self.sampler.act_row(params, mode, envs.get(row), d, c);
            }
        } else {
            // Rows are [actions | finished params | value]: actions were drawn on the device.
            let disc = self.sampler.is_discrete();
            for row in 0..batch {
                let src = &rows[row * self.row_width..(row + 1) * self.row_width];
                if disc {
                    for (d, a) in out.discrete[row * k..(row + 1) * k]
                        .iter_mut()
                        .zip(&src[..k])
                    {
                        *d = *a as i64;
                    }
                } else {
                    out.continuous[row * k..(row + 1) * k].copy_from_slice(&src[..k]);
                }
                out.dist_params[row * p..(row + 1) * p].copy_from_slice(&src[k..k + p]);
                if self.has_value {
                    out.value[row] = src[k + p];
                }
            }
        }

        // Scatter next states into the host rows (device programs did that on the device).
        if let Some(st) = state.filter(|_| !on_device) {
            let mut off = self.raw_params + self.has_value as usize;
            for (n, data) in st.tensors.iter_mut() {
                for row in 0..batch {
                    let e = envs.get(row) as usize;
                    let src = &rows[row * self.row_width + off..row * self.row_width + off + *n];
                    data[e * *n..(e + 1) * *n].copy_from_slice(src);
                }
                off += *n;
            }
        }
        self.scratch_rows = rows;
    }

    /// Launch one step of a wgpu program and return the packed `[actions | params | value]` rows still on the
    /// device. State rows stay on the device (uploaded once per state, then gathered and scattered there). Always
    /// after `act_prepare`, which checked the env ids.
    #[cfg(feature = "wgpu")]
    fn launch_device(
        &mut self,
        batch: usize,
        obs: &[f32],
        state: Option<&mut RecurrentState>,
        mode: ActMode,
        envs: EnvIds<'_>,
    ) -> Result<burn::tensor::Tensor<2>, PolicyError> {
        let Exec::Burn(p) = &self.exec else {
            unreachable!("on_device programs are burn programs")
        };
        let owner = p.gpu.as_ref().expect("on_device").owner;
        let ids: Vec<u32> = (0..batch).map(|r| envs.get(r)).collect();
        let dev = match state {
            Some(st) => {
                // Env ids were checked by act_prepare (in range, no duplicates: EnvIds::duplicate).
                let fresh = st
                    .device
                    .as_ref()
                    .is_some_and(|d| d.owner == owner && d.num_envs == st.num_envs);
                if !fresh {
                    st.sync()?;
                    st.device = Some(crate::gpu::DeviceState::upload(
                        owner,
                        &st.tensors,
                        st.num_envs,
                        p.device(),
                    ));
                }
                st.device.as_mut()
            }
            None => None,
        };
        let sample = match mode {
            ActMode::Sample { seed, step } => Some((seed, step)),
            ActMode::Deterministic => None,
        };
        Ok(p.launch_gpu(batch, obs.to_vec(), obs.len() / batch, dev, &ids, sample))
    }

    /// Check every golden vector of the artifact on this policy's backend.
    pub fn verify(&mut self) -> Result<Vec<GoldenReport>, PolicyError> {
        let cases = self.artifact.manifest.golden.clone();
        cases.iter().map(|c| self.verify_case(c)).collect()
    }

    /// [`Policy::verify`] for callers that cannot block (the browser's WebGPU backend). Golden values that
    /// are not act() outputs (intermediate values) need a blocking probe there and are reported as errors.
    pub async fn verify_async(&mut self) -> Result<Vec<GoldenReport>, PolicyError> {
        let cases = self.artifact.manifest.golden.clone();
        let mut reports = vec![];
        for case in &cases {
            let (mut det, mut sampled) = (ActOutputs::default(), ActOutputs::default());
            for (mode, out) in golden_modes(case).into_iter().zip([&mut det, &mut sampled]) {
                let mut state = self.golden_state(case);
                let (obs, envs) = (Observations::F32(&case.obs), EnvIds::Range(case.env_offset));
                self.act_async(obs, case.batch, mode, envs, state.as_mut(), out)
                    .await?;
            }
            reports.push(self.score_case(case, &det, &sampled)?);
        }
        Ok(reports)
    }

    fn verify_case(&mut self, case: &GoldenCase) -> Result<GoldenReport, PolicyError> {
        let (mut det, mut sampled) = (ActOutputs::default(), ActOutputs::default());
        for (mode, out) in golden_modes(case).into_iter().zip([&mut det, &mut sampled]) {
            let mut state = self.golden_state(case);
            let (obs, envs) = (Observations::F32(&case.obs), EnvIds::Range(case.env_offset));
            self.act(obs, case.batch, mode, envs, state.as_mut(), out)?;
        }
        self.score_case(case, &det, &sampled)
    }

    /// A fresh state covering a golden case's envs (None for feed-forward policies).
    fn golden_state(&self, case: &GoldenCase) -> Option<RecurrentState> {
        let state = RecurrentState::new(self, case.env_offset as usize + case.batch);
        (!state.tensors.is_empty()).then_some(state)
    }

    fn score_case(
        &mut self,
        case: &GoldenCase,
        det: &ActOutputs,
        sampled: &ActOutputs,
    ) -> Result<GoldenReport, PolicyError> {
        let m = self.artifact.manifest.clone();
        let shape = GoldenShape {
            action_len: self.sampler.action_len(),
            dist_params_len: self.sampler.dist_params_len(),
            discrete: self.sampler.is_discrete(),
        };
        compare_golden(case, &m, shape, det, sampled, &mut |name| {
            self.probe(case, name)
        })
    }

    /// Evaluate an arbitrary named value (debugging, golden checks): lowers a one-off program.
    fn probe(&mut self, case: &GoldenCase, name: &str) -> Result<Vec<f32>, PolicyError> {
        if !self.plan.shapes.contains_key(name) {
            return Err(PolicyError::Artifact(
                policyport_format::FormatError::UndefinedValue {
                    name: name.into(),
                    user: format!("golden case '{}'", case.name),
                },
            ));
        }
        let mut exec = Exec::new(&self.exec, &self.artifact, &self.plan, &[name]);
        let mut obs = Vec::new();
        self.pre
            .run(Observations::F32(&case.obs), case.batch, &mut obs)?;
        let states = self
            .state_sizes()
            .iter()
            .map(|n| vec![0.0; n * case.batch])
            .collect();
        let mut rows = vec![];
        exec.run(
            case.batch,
            &obs,
            states,
            &mut rows,
            ActMode::Deterministic,
            EnvIds::Range(0),
        )?;
        Ok(rows)
    }
}

/// The timing rule of backend selection, shared by the blocking and the async loop: up to 25 acts, at least 3,
/// stop once 0.2 s have passed; the median counts.
struct ActTimer<'a> {
    now_us: &'a dyn Fn() -> f64,
    start: f64,
    times: Vec<f64>,
}

impl<'a> ActTimer<'a> {
    fn new(now_us: &'a dyn Fn() -> f64) -> Self {
        ActTimer {
            start: now_us(),
            now_us,
            times: vec![],
        }
    }

    /// Sampling steps of the timed acts.
    fn steps(&self) -> std::ops::Range<u64> {
        0..25
    }

    /// Record one act that started at `t0`; true when enough were timed.
    fn record(&mut self, t0: f64) -> bool {
        let now = (self.now_us)();
        self.times.push(now - t0);
        self.times.len() >= 3 && now - self.start > 2e5
    }

    fn median(mut self) -> f64 {
        self.times.sort_by(|a, b| a.total_cmp(b));
        self.times[self.times.len() / 2]
    }
}

/// A golden case runs twice: deterministic, then sampled with its (seed, step).
fn golden_modes(case: &GoldenCase) -> [ActMode; 2] {
    [
        ActMode::Deterministic,
        ActMode::Sample {
            seed: case.seed,
            step: case.step,
        },
    ]
}

/// A monotonic microsecond clock: `Instant` natively; on wasm (no clock without JS) a counter that makes every
/// timed call look equal, so the sync [`Policy::load_auto`] keeps the cpu backend there.
fn monotonic_us() -> impl Fn() -> f64 {
    #[cfg(not(target_family = "wasm"))]
    {
        let t0 = std::time::Instant::now();
        move || t0.elapsed().as_secs_f64() * 1e6
    }
    #[cfg(target_family = "wasm")]
    {
        || 0.0
    }
}

/// What [`compare_golden`] needs to know about a policy's outputs.
#[derive(Debug, Clone, Copy)]
pub struct GoldenShape {
    pub action_len: usize,
    pub dist_params_len: usize,
    pub discrete: bool,
}

/// Score one golden case from a deterministic and a sampled act() on its observations (any executor: the guest
/// backends, the libtorch host). Named values that are distribution parameters or the value estimate are read
/// from the act() outputs; any other value is asked of `probe`.
pub fn compare_golden<E>(
    case: &GoldenCase,
    m: &Manifest,
    shape: GoldenShape,
    det: &ActOutputs,
    sampled: &ActOutputs,
    probe: &mut dyn FnMut(&str) -> Result<Vec<f32>, E>,
) -> Result<GoldenReport, E> {
    let (k, p) = (shape.action_len, shape.dist_params_len);
    let mut report = GoldenReport {
        name: case.name.clone(),
        tolerance: case.tolerance,
        ..Default::default()
    };
    let out = sampled;
    for (name, expected) in &case.values {
        let got: Vec<f32> = if m.value.as_deref() == Some(name.as_str()) {
            out.value.clone()
        } else if let Some((col, width)) = dist_column(&m.distribution, name, k, p) {
            (0..case.batch)
                .flat_map(|r| out.dist_params[r * p + col..r * p + col + width].to_vec())
                .collect()
        } else {
            probe(name)?
        };
        report.values.push((name.clone(), rel_err(&got, expected)));
    }
    // Empty expected actions mean "not recorded" (e.g. reduced-precision storage, where argmax may flip).
    for (want, got_d, got_c, mismatches, err) in [
        (
            &case.sampled_actions,
            &out.discrete,
            &out.continuous,
            &mut report.sampled_mismatches,
            &mut report.sampled_action_err,
        ),
        (
            &case.deterministic_actions,
            &det.discrete,
            &det.continuous,
            &mut report.deterministic_mismatches,
            &mut report.deterministic_action_err,
        ),
    ] {
        if want.is_empty() {
            continue;
        }
        if shape.discrete {
            *mismatches = count_mismatch(got_d, want);
        } else {
            *err = rel_err(got_c, want);
        }
    }
    report.passed = report.values.iter().all(|(_, e)| *e <= case.tolerance)
        && report.sampled_mismatches == 0
        && report.deterministic_mismatches == 0
        && report.sampled_action_err <= case.tolerance
        && report.deterministic_action_err <= case.tolerance;
    Ok(report)
}

/// (column offset, width) of a distribution value inside a `dist_params` row of width `p`.
fn dist_column(d: &Distribution, name: &str, k: usize, p: usize) -> Option<(usize, usize)> {
    let values = d.param_values();
    match d {
        Distribution::Categorical { .. } | Distribution::MultiCategorical { .. } => {
            (values[0] == name).then_some((0, p))
        }
        _ => values.iter().position(|v| *v == name).map(|i| (i * k, k)),
    }
}

/// Outcome of one golden case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GoldenReport {
    pub name: String,
    pub tolerance: f64,
    /// (value name, max relative error).
    pub values: Vec<(String, f64)>,
    pub sampled_mismatches: usize,
    pub deterministic_mismatches: usize,
    pub sampled_action_err: f64,
    pub deterministic_action_err: f64,
    pub passed: bool,
}

/// max |a − b| / max(max |b|, 1e-12): error relative to the reference tensor's largest magnitude (SPEC.md).
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    got.iter().zip(want).fold(0.0f64, |m, (g, w)| {
        let e = (*g as f64 - w).abs();
        if e.is_nan() { f64::INFINITY } else { m.max(e) }
    }) / scale
}

fn count_mismatch(got: &[i64], want: &[f64]) -> usize {
    if got.len() != want.len() {
        return want.len().max(1);
    }
    got.iter()
        .zip(want)
        .filter(|(g, w)| **g as f64 != **w)
        .count()
}
