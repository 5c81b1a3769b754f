//! [`CompiledPolicy`]: the validated artifact, its decoded head, its preprocessing, and its lowered program on
//! one backend — immutable, `Send + Sync`, shared behind an `Arc` by every [`Session`] (tract's plan; the
//! session is the state). Loading, backend selection and golden verification live here; act() lives in the
//! session.

use std::sync::Arc;

use policyport_format::sampling::ActMode;
use policyport_format::{
    ActionSpace, Artifact, GoldenCase, HeadPlan, Limits, Manifest, ObservationSpace, ValidatedPlan,
    read_artifact, validate,
};

use crate::backend::{Backend, CpuOptions};
use crate::error::{BackendError, PolicyError};
use crate::executor::{Executor, ExecutorBuilder, StepInput};
use crate::golden::{GoldenReport, GoldenShape, compare_golden, golden_modes};
use crate::observations::{Observations, Preprocessor};
use crate::session::{ActOutputs, EnvIds, MAX_BATCH, Request, Session};

/// What a loaded policy is.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyInfo {
    pub name: String,
    pub backend: Backend,
    pub format_version: (u16, u16),
    pub observation: ObservationSpace,
    pub action: ActionSpace,
    pub obs_len: usize,
    pub action_len: usize,
    pub dist_params_len: usize,
    pub has_value: bool,
    pub recurrent_states: usize,
    pub parameters: usize,
    /// How the backend was chosen ([`CompiledPolicy::load_auto`]: the measured latencies).
    pub selection: Option<Selection>,
    /// GPU dispatches one act() issues (wgpu backend), None on CPU backends.
    pub dispatches_per_act: Option<usize>,
}

/// How [`CompiledPolicy::load_auto`] chose a backend: each candidate's median act() time at `batch`, or why it
/// could not be timed.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub batch: usize,
    pub measured: Vec<(Backend, Result<f64, PolicyError>)>,
    pub chosen: Backend,
}

impl Selection {
    /// The median µs of a backend that was timed.
    pub fn micros(&self, backend: Backend) -> Option<f64> {
        self.measured
            .iter()
            .find(|(b, _)| *b == backend)
            .and_then(|(_, r)| r.as_ref().ok().copied())
    }
}

impl std::fmt::Display for Selection {
    /// `auto at batch 1: cpu 5.7 us, wgpu 1832.8 us -> cpu`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "auto at batch {}: ", self.batch)?;
        for (i, (b, r)) in self.measured.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match r {
                Ok(us) => write!(f, "{b} {us:.1} us")?,
                Err(e) => write!(f, "{b}: unavailable ({e})")?,
            }
        }
        write!(f, " -> {}", self.chosen)
    }
}

/// A loaded, validated policy bound to one backend. Immutable; share it (`Arc`) and give each caller a
/// [`Session`].
pub struct CompiledPolicy {
    artifact: Artifact,
    plan: ValidatedPlan,
    exec: Box<dyn Executor>,
    /// What built `exec` (golden probes build one-off programs with it).
    builder: Arc<dyn ExecutorBuilder>,
    pre: Preprocessor,
    selection: Option<Selection>,
    /// The limits it was validated under; act() checks its memory against them.
    limits: Limits,
    /// The most bytes an act() was estimated to need that a reservation proved the machine can give, for an
    /// executor that cannot fail an allocation itself (see `check_memory`).
    probed_bytes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPolicy")
            .field("name", &self.artifact.manifest.name)
            .field("backend", &self.exec.backend())
            .finish()
    }
}

/// The most bytes of zero observations one warm-up act at load may use (see `CompiledPolicy::warm_up_batches`).
const WARM_UP_OBS_BYTES: usize = 16 << 20;

impl CompiledPolicy {
    /// Read, checksum and validate the artifact, lower it for `backend` (weights packed / uploaded once) and warm
    /// up (one act at batch 1; on a GPU also batch 64, so every kernel variant's pipeline exists), so the first
    /// real call pays no setup. A backend compiled out gives [`PolicyError::NotCompiled`].
    pub fn load(bytes: &[u8], backend: Backend) -> Result<Arc<Self>, PolicyError> {
        Self::from_artifact(read_artifact(bytes)?, backend)
    }

    /// [`CompiledPolicy::load`] from a decoded artifact.
    pub fn from_artifact(artifact: Artifact, backend: Backend) -> Result<Arc<Self>, PolicyError> {
        backend.check_compiled()?;
        Self::with_builder(artifact, Arc::new(backend))
    }

    /// [`CompiledPolicy::load`] on the native cpu backend with `options` (e.g. `Precision::Bf16`: a typed
    /// `MissingCpuFeature` where the CPU lacks the kernels).
    pub fn load_cpu(bytes: &[u8], options: CpuOptions) -> Result<Arc<Self>, PolicyError> {
        Self::with_builder(read_artifact(bytes)?, Arc::new(options))
    }

    /// [`CompiledPolicy::load`] under other [`Limits`] than the defaults (a stricter memory budget for a
    /// policy from an untrusted source, or a larger one for a big model on a big machine). The limits stay with
    /// the policy: every act() is checked against `limits.max_memory_bytes` before anything is allocated.
    pub fn load_with_limits(
        bytes: &[u8],
        backend: Backend,
        limits: Limits,
    ) -> Result<Arc<Self>, PolicyError> {
        backend.check_compiled()?;
        Self::with_builder_and_limits(read_artifact(bytes)?, Arc::new(backend), limits)
    }

    /// [`CompiledPolicy::from_artifact`] on an executor built by `builder`: how a backend whose executor lives in
    /// another crate (libtorch, `policyport_torch::load`) gets the same policy, sessions, request checks, state
    /// model, sampling and golden verification as the built-in ones.
    pub fn with_builder(
        artifact: Artifact,
        builder: Arc<dyn ExecutorBuilder>,
    ) -> Result<Arc<Self>, PolicyError> {
        Self::with_builder_and_limits(artifact, builder, Limits::default())
    }

    /// [`CompiledPolicy::with_builder`] under other [`Limits`] ([`CompiledPolicy::load_with_limits`]).
    pub fn with_builder_and_limits(
        artifact: Artifact,
        builder: Arc<dyn ExecutorBuilder>,
        limits: Limits,
    ) -> Result<Arc<Self>, PolicyError> {
        let policy = Arc::new(Self::build(artifact, builder, limits)?);
        // A WebGPU program in a browser cannot block on its warm-up readback: load_async warms it instead.
        if !(cfg!(target_family = "wasm") && policy.exec.placement().sampling) {
            for batch in policy.warm_up_batches() {
                policy.warm_up(batch)?;
            }
        }
        Ok(policy)
    }

    fn build(
        artifact: Artifact,
        builder: Arc<dyn ExecutorBuilder>,
        limits: Limits,
    ) -> Result<Self, PolicyError> {
        let plan = validate(&artifact, &limits)?;
        let exec = builder.build(&artifact, &plan, None)?;
        let pre = Preprocessor::new(
            &artifact.manifest.observation,
            &plan.preprocess,
            plan.obs_shape.iter().product(),
        );
        Ok(CompiledPolicy {
            artifact,
            plan,
            exec,
            builder,
            pre,
            selection: None,
            limits,
            probed_bytes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// [`CompiledPolicy::load`] for callers that cannot block (the browser): the WebGPU device is initialised
    /// asynchronously (once per process) and the warm-up acts are awaited.
    pub async fn load_async(bytes: &[u8], backend: Backend) -> Result<Arc<Self>, PolicyError> {
        crate::builtin::prepare_async(backend).await?;
        let policy = Arc::new(Self::build(
            read_artifact(bytes)?,
            Arc::new(backend),
            Limits::default(),
        )?);
        for batch in policy.warm_up_batches() {
            let mut s = policy.session();
            let obs = policy.zero_obs(batch);
            s.act_async(&policy.zero_request(&obs, batch, 0)).await?;
        }
        Ok(policy)
    }

    /// GPU programs also warm the large-batch (tiled) kernels, so no batch size meets an uncompiled pipeline.
    /// The executor's warm-up batches ([`Executor::warm_up_batches`]), each capped so its zero observations stay
    /// within [`WARM_UP_OBS_BYTES`]. Why: the batch-64 warm-up used to run for every executor that samples, the
    /// sandboxed plugin included; a policy with a 1000 × 1000 observation then copied 64 × 4 MB into the plugin
    /// at load and hit its default 256 MiB memory cap (found on ONNX's MaxPool2d_stride_padding_dilation;
    /// regression test in tests/conformance/onnx_backend.rs).
    fn warm_up_batches(&self) -> Vec<usize> {
        let per_env = 4 * self.artifact.manifest.observation.raw_len().max(1);
        let cap = (WARM_UP_OBS_BYTES / per_env).max(1);
        let mut batches: Vec<usize> = self
            .exec
            .warm_up_batches()
            .iter()
            .map(|b| (*b).clamp(1, cap))
            .collect();
        batches.dedup();
        batches
    }

    fn warm_up(self: &Arc<Self>, batch: usize) -> Result<(), PolicyError> {
        let mut s = self.session();
        let obs = self.zero_obs(batch);
        s.act(&self.zero_request(&obs, batch, 0)).map(|_| ())
    }

    /// Zero observations for `batch` envs (warm-up and timing; a discrete space's raw length is 1).
    fn zero_obs(&self, batch: usize) -> Vec<f32> {
        vec![0.0f32; batch * self.artifact.manifest.observation.raw_len()]
    }

    fn zero_request<'a>(&self, obs: &'a [f32], batch: usize, step: u64) -> Request<'a> {
        Request::new(
            Observations::F32(obs),
            batch,
            ActMode::Sample { seed: 0, step },
        )
    }

    /// Load on every backend worth trying here (native cpu, and wgpu when compiled and an adapter exists), time
    /// act() at the caller's batch size on each, and keep the fastest; `info().selection` says what was measured.
    /// A backend that fails to load is skipped (and named in the selection). In a browser use
    /// [`CompiledPolicy::load_auto_async`] (WebGPU cannot be timed synchronously, and there is no `Instant`).
    pub fn load_auto(bytes: &[u8], batch: usize) -> Result<Arc<Self>, PolicyError> {
        let batch = batch.clamp(1, MAX_BATCH);
        let now_us = monotonic_us();
        let mut timed = vec![];
        for backend in Self::auto_candidates() {
            let result =
                Self::load(bytes, backend).and_then(|p| Ok((p.time_act(batch, &now_us)?, p)));
            timed.push((backend, result));
        }
        Self::pick_fastest(timed, batch)
    }

    /// [`CompiledPolicy::load_auto`] for callers that cannot block, timed with the caller's clock (`now_us`: a
    /// monotonic time in microseconds, e.g. `performance.now() * 1000` in a browser).
    pub async fn load_auto_async(
        bytes: &[u8],
        batch: usize,
        now_us: &dyn Fn() -> f64,
    ) -> Result<Arc<Self>, PolicyError> {
        let batch = batch.clamp(1, MAX_BATCH);
        let mut timed = vec![];
        for backend in Self::auto_candidates() {
            let result = match Self::load_async(bytes, backend).await {
                Ok(p) => match p.time_act_async(batch, now_us).await {
                    Ok(us) => Ok((us, p)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            timed.push((backend, result));
        }
        Self::pick_fastest(timed, batch)
    }

    /// The backends `auto` times: the native cpu kernels and the GPU (flex is burn's reference CPU path, never
    /// faster than cpu).
    fn auto_candidates() -> Vec<Backend> {
        [Backend::Cpu, Backend::Wgpu]
            .into_iter()
            .filter(|b| b.check_compiled().is_ok())
            .collect()
    }

    /// Keep the fastest of the timed backends; a failed non-cpu backend is recorded in the selection, a failed
    /// cpu backend (a bad artifact) is the error.
    fn pick_fastest(
        timed: Vec<(Backend, Result<(f64, Arc<Self>), PolicyError>)>,
        batch: usize,
    ) -> Result<Arc<Self>, PolicyError> {
        let mut best: Option<(f64, Arc<Self>)> = None;
        let mut measured = vec![];
        for (backend, result) in timed {
            match result {
                Ok((us, p)) => {
                    measured.push((backend, Ok(us)));
                    if best.as_ref().is_none_or(|(b, _)| us < *b) {
                        best = Some((us, p));
                    }
                }
                Err(e) if backend != Backend::Cpu => measured.push((backend, Err(e))),
                Err(e) => return Err(e),
            }
        }
        let (_, mut p) = best.expect("the cpu backend always loads");
        let chosen = p.backend();
        // The timing sessions are gone and the loser was dropped: this is the only reference.
        Arc::get_mut(&mut p)
            .expect("a freshly loaded policy has no other owner")
            .selection = Some(Selection {
            batch,
            measured,
            chosen,
        });
        Ok(p)
    }

    /// Median µs of a few warm act() calls at `batch` (zero observations, fresh state), under 0.2 s.
    fn time_act(
        self: &Arc<Self>,
        batch: usize,
        now_us: &dyn Fn() -> f64,
    ) -> Result<f64, PolicyError> {
        let mut s = self.session();
        let obs = self.zero_obs(batch);
        let mut timer = ActTimer::new(now_us);
        for step in timer.steps() {
            let t0 = now_us();
            s.act(&self.zero_request(&obs, batch, step))?;
            if timer.record(t0) {
                break;
            }
        }
        Ok(timer.median())
    }

    async fn time_act_async(
        self: &Arc<Self>,
        batch: usize,
        now_us: &dyn Fn() -> f64,
    ) -> Result<f64, PolicyError> {
        let mut s = self.session();
        let obs = self.zero_obs(batch);
        let mut timer = ActTimer::new(now_us);
        for step in timer.steps() {
            let t0 = now_us();
            s.act_async(&self.zero_request(&obs, batch, step)).await?;
            if timer.record(t0) {
                break;
            }
        }
        Ok(timer.median())
    }

    /// A new session (its own scratch, state and outputs) on this policy.
    pub fn session(self: &Arc<Self>) -> Session {
        Session::new(self.clone())
    }

    pub fn backend(&self) -> Backend {
        self.exec.backend()
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

    /// The limits this policy was loaded under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Refuse an act() of `batch` rows in a session holding state for `envs` envs when the estimate
    /// ([`ValidatedPlan::memory`]) is over `max_memory_bytes`: a typed error before anything is allocated.
    pub(crate) fn check_memory(&self, batch: usize, envs: usize) -> Result<(), PolicyError> {
        let bytes = self
            .plan
            .memory
            .bytes_for(batch, envs)
            .saturating_add(self.exec.extra_bytes_per_row().saturating_mul(batch as u64));
        if bytes > self.limits.max_memory_bytes {
            return Err(PolicyError::Memory {
                batch,
                envs,
                bytes,
                limit: self.limits.max_memory_bytes,
            });
        }
        if !self.exec.allocations_are_fallible() {
            self.probe_memory(bytes)?;
        }
        Ok(())
    }

    /// Issue 36: burn's flex and wgpu backends allocate infallibly, so an act() the budget allows but the machine
    /// (or `ulimit -v`) cannot hold aborted the process inside burn ("memory allocation failed"). Before such an
    /// executor's act at a new high-water mark, the estimate is reserved from the allocator and released at once: a
    /// reservation refused is `PolicyError::Allocation`, nothing changed. On Linux the reservation only maps
    /// address space (no page is touched), so it costs microseconds, once per new size; it fails exactly where the
    /// library's own allocation of that size would (the overcommit heuristic, an address-space limit). The wgpu
    /// backend's device memory is its driver's, not covered here (on lavapipe it is this memory).
    fn probe_memory(&self, bytes: u64) -> Result<(), PolicyError> {
        use std::sync::atomic::Ordering;
        if bytes <= self.probed_bytes.load(Ordering::Relaxed) {
            return Ok(());
        }
        let refused = PolicyError::Allocation {
            what: "the act's working memory on a backend that cannot fail an allocation itself",
            bytes,
        };
        let len = usize::try_from(bytes).map_err(|_| refused.clone())?;
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(len).map_err(|_| refused)?;
        drop(probe);
        self.probed_bytes.fetch_max(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The decoded action head (the one decoder of the distribution).
    pub fn head(&self) -> &HeadPlan {
        &self.plan.head
    }

    pub fn selection(&self) -> Option<&Selection> {
        self.selection.as_ref()
    }

    pub(crate) fn executor(&self) -> &dyn Executor {
        &*self.exec
    }

    pub(crate) fn preprocessor(&self) -> &Preprocessor {
        &self.pre
    }

    pub(crate) fn one_hot_width(&self) -> Option<usize> {
        self.plan.preprocess.one_hot_width()
    }

    pub fn info(&self) -> PolicyInfo {
        let m = &self.artifact.manifest;
        let head = self.head();
        PolicyInfo {
            name: m.name.clone(),
            backend: self.backend(),
            format_version: self.artifact.version,
            observation: m.observation.clone(),
            action: m.action.clone(),
            obs_len: m.observation.raw_len(),
            action_len: head.action_len,
            dist_params_len: head.dist_params_len,
            has_value: head.has_value(),
            recurrent_states: self.exec.state_sizes().len(),
            parameters: self.artifact.tensors.values().map(|t| t.data.len()).sum(),
            selection: self.selection.clone(),
            dispatches_per_act: self.exec.dispatches_per_act(),
        }
    }

    /// Check every golden vector of the artifact on this policy's backend (each case in a fresh session).
    pub fn verify(self: &Arc<Self>) -> Result<Vec<GoldenReport>, PolicyError> {
        let cases = &self.artifact.manifest.golden;
        let mut reports = vec![];
        for case in cases {
            let (mut det, mut sampled) = (ActOutputs::default(), ActOutputs::default());
            for (mode, out) in golden_modes(case).into_iter().zip([&mut det, &mut sampled]) {
                let mut s = self.session();
                *out = s.act(&golden_request(case, mode))?.clone();
            }
            reports.push(self.score_case(case, &det, &sampled)?);
        }
        Ok(reports)
    }

    /// [`CompiledPolicy::verify`] for callers that cannot block (the browser's WebGPU backend). Golden values
    /// that are not act() outputs (intermediate values) need a blocking probe there and are reported as errors.
    pub async fn verify_async(self: &Arc<Self>) -> Result<Vec<GoldenReport>, PolicyError> {
        let cases = &self.artifact.manifest.golden;
        let mut reports = vec![];
        for case in cases {
            let (mut det, mut sampled) = (ActOutputs::default(), ActOutputs::default());
            for (mode, out) in golden_modes(case).into_iter().zip([&mut det, &mut sampled]) {
                let mut s = self.session();
                *out = s.act_async(&golden_request(case, mode)).await?.clone();
            }
            reports.push(self.score_case(case, &det, &sampled)?);
        }
        Ok(reports)
    }

    fn score_case(
        &self,
        case: &GoldenCase,
        det: &ActOutputs,
        sampled: &ActOutputs,
    ) -> Result<GoldenReport, PolicyError> {
        let head = self.head();
        let shape = GoldenShape {
            action_len: head.action_len,
            dist_params_len: head.dist_params_len,
            discrete: head.is_discrete(),
        };
        compare_golden(
            case,
            &self.artifact.manifest,
            shape,
            det,
            sampled,
            &mut |name| self.probe(case, name),
        )
    }

    /// Evaluate an arbitrary named value (debugging, golden checks): the same lowering, reading back `name`.
    pub fn probe(&self, case: &GoldenCase, name: &str) -> Result<Vec<f32>, PolicyError> {
        if !self.plan.shapes.contains_key(name) {
            return Err(PolicyError::Artifact(
                policyport_format::FormatError::UndefinedValue {
                    name: name.into(),
                    user: format!("golden case '{}'", case.name),
                },
            ));
        }
        // The probe program's buffers and the case's state rows, bounded like any act() (on wasm32 the products
        // below would otherwise wrap).
        self.check_memory(case.batch, case.batch)?;
        if cfg!(target_family = "wasm") && self.exec.placement().sampling {
            return Err(BackendError::Unsupported(
                "intermediate golden values need a blocking readback, impossible on WebGPU",
            )
            .into());
        }
        let exec = self
            .builder
            .build(&self.artifact, &self.plan, Some(&[name]))?;
        let mut scratch = exec.new_scratch();
        let mut obs = Vec::new();
        self.pre
            .run(Observations::F32(&case.obs), case.batch, &mut obs)?;
        let states: Vec<Vec<f32>> = exec
            .state_sizes()
            .iter()
            .map(|n| vec![0.0; n * case.batch])
            .collect();
        let ids: Vec<u32> = (0..case.batch as u32).collect();
        let step = StepInput {
            batch: case.batch,
            obs: &obs,
            raw: None,
            env_ids: &ids,
            mode: ActMode::Deterministic,
            states: &states,
            num_envs: case.batch,
            skip_value: false,
        };
        let mut rows = vec![];
        exec.launch(&mut scratch, &step, &mut rows)?
            .wait(&mut rows)?;
        Ok(rows)
    }
}

fn golden_request(case: &GoldenCase, mode: ActMode) -> Request<'_> {
    Request::new(Observations::F32(&case.obs), case.batch, mode)
        .envs(EnvIds::Range(case.env_offset))
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

/// A monotonic microsecond clock: `Instant` natively; on wasm (no clock without JS) a counter that makes every
/// timed call look equal, so the sync [`CompiledPolicy::load_auto`] keeps the cpu backend there.
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
