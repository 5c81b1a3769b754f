//! [`Session`]: one caller's use of a shared [`CompiledPolicy`] — its scratch buffers, its recurrent state per
//! env id, its outputs, and the one request check every backend goes through.
//!
//! The state model (the same for Rust, the C ABI, the wasm plugin and the browser): state exists per env id,
//! starts at zero, grows on demand up to [`Session::max_envs`] envs, is zeroed by [`Session::reset`] or by the
//! request's `episode_starts` flags (SB3's `episode_starts`: the row's state is zeroed *before* the step), and
//! is advanced by every act(). Feed-forward policies have no state; their env ids only select sampling streams.

use std::sync::Arc;

use policyport_format::RowControls;
use policyport_format::philox::Stream;
use policyport_format::sampling::ActMode;

use crate::compiled::CompiledPolicy;
use crate::error::{
    BackendError, EnvIdError, ObservationError, PolicyError, StateError, try_reserve_len,
};
use crate::executor::{ExecScratch, Pending, StepInput};
use crate::observations::{Observations, check_observations};
use crate::state::HostState;

/// Largest batch act() accepts.
pub const MAX_BATCH: usize = 1 << 20;

/// Default limit on the envs one recurrent session holds state for ([`Session::set_max_envs`]).
pub const DEFAULT_MAX_ENVS: usize = 1 << 16;

/// Per-row flags as every boundary receives them — bytes, non-zero meaning true (the C ABI's and the plugin's
/// `episode_starts` and `action_mask`, the browser's `Uint8Array`s) — written into `out` (cleared first, its
/// allocation reused across calls) for [`Request::episode_starts`] / [`Request::action_mask`]. One reading of the
/// bytes for every boundary (issue 37).
pub fn flags_into(bytes: &[u8], out: &mut Vec<bool>) {
    out.clear();
    out.extend(bytes.iter().map(|b| *b != 0));
}

/// Which env each row of a batch is (for sampling streams and recurrent state).
#[derive(Debug, Clone, Copy)]
pub enum EnvIds<'a> {
    /// Rows are envs `start, start + 1, …`.
    Range(u32),
    /// One id per row.
    List(&'a [u32]),
}

impl EnvIds<'_> {
    /// The env id of batch row `row` (after [`EnvIds::resolve`] accepted the batch).
    #[inline]
    pub fn get(&self, row: usize) -> u32 {
        match self {
            EnvIds::Range(start) => start + row as u32,
            EnvIds::List(ids) => ids[row],
        }
    }

    /// The request check of env ids, for every runtime: the ids of a batch of `batch` rows, written to `out`
    /// (cleared first; its capacity is reused).
    pub fn resolve(&self, batch: usize, out: &mut Vec<u32>) -> Result<(), EnvIdError> {
        out.clear();
        match *self {
            EnvIds::Range(start) => {
                if start as u64 + batch as u64 > u32::MAX as u64 + 1 {
                    return Err(EnvIdError::RangeOverflow { start, batch });
                }
                out.extend((0..batch as u32).map(|r| start + r));
            }
            EnvIds::List(ids) => {
                if ids.len() != batch {
                    return Err(EnvIdError::Count {
                        found: ids.len(),
                        batch,
                    });
                }
                out.extend_from_slice(ids);
            }
        }
        Ok(())
    }

    /// An env id naming two rows of this batch, if any (the smallest such id). With per-env recurrent state two
    /// rows of one env would read the same state and race to write the next one (on a CPU the last write would
    /// silently win, on a GPU which write wins is unspecified), so every runtime refuses such a batch for a
    /// recurrent policy. `scratch` is reused across calls (no allocation once warm); sorting a copy keeps the
    /// cost O(batch log batch) whatever the ids' range.
    pub fn duplicate(&self, batch: usize, scratch: &mut Vec<u32>) -> Option<u32> {
        let EnvIds::List(ids) = self else {
            return None; // distinct by construction
        };
        scratch.clear();
        scratch.extend_from_slice(&ids[..batch.min(ids.len())]);
        scratch.sort_unstable();
        scratch.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    }

    /// [`EnvIds::duplicate`] as the typed error every runtime returns.
    pub fn check_distinct(&self, batch: usize, scratch: &mut Vec<u32>) -> Result<(), EnvIdError> {
        match self.duplicate(batch, scratch) {
            Some(env) => Err(EnvIdError::Duplicate { env }),
            None => Ok(()),
        }
    }
}

/// One act() call.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `batch x observation.raw_len()` numbers, row-major.
    pub obs: Observations<'a>,
    pub batch: usize,
    pub mode: ActMode,
    pub envs: EnvIds<'a>,
    /// Per row: the env starts a new episode at this step, so its recurrent state is zeroed before the step
    /// (callers need not call [`Session::reset`]). Ignored by feed-forward policies (but its length is checked).
    pub episode_starts: Option<&'a [bool]>,
    /// Per row, one flag per logit (per Q value; multi-discrete components concatenated, `batch x
    /// dist_params_len`): `false` forbids the action. Applied before argmax, sampling and log-probabilities,
    /// as sb3-contrib's `MaskableCategorical` does; forbidden entries of `dist_params` read
    /// [`policyport_format::MASKED_LOGIT`]. Every component of every row must allow one action at least.
    pub action_mask: Option<&'a [bool]>,
    /// A Q-value head's exploration rate for this request (sampled mode), instead of the artifact's.
    pub epsilon: Option<f32>,
    /// The caller does not want the value estimate: [`ActOutputs::value`] is left empty, and the executor may
    /// skip the layers only the value needs (the cpu backend does: a PPO policy with a separate critic, SB3's
    /// default, does about half its work for the value). What a game acting with a trained policy wants; a
    /// trainer collecting rollouts wants the value. Default `false` (the value is computed).
    pub skip_value: bool,
}

impl<'a> Request<'a> {
    /// Rows `0..batch` are envs `0..batch`, sampled with `(seed, step)`.
    pub fn new(obs: Observations<'a>, batch: usize, mode: ActMode) -> Self {
        Request {
            obs,
            batch,
            mode,
            envs: EnvIds::Range(0),
            episode_starts: None,
            action_mask: None,
            epsilon: None,
            skip_value: false,
        }
    }

    /// Leave the value estimate out of this act() (see [`Request::skip_value`]).
    pub fn skip_value(mut self) -> Self {
        self.skip_value = true;
        self
    }

    pub fn action_mask(mut self, mask: &'a [bool]) -> Self {
        self.action_mask = Some(mask);
        self
    }

    pub fn epsilon(mut self, epsilon: f32) -> Self {
        self.epsilon = Some(epsilon);
        self
    }

    /// The per-row controls of row `row` (its slice of the mask).
    fn controls_of(&self, row: usize, per_row: usize) -> RowControls<'a> {
        RowControls {
            mask: self
                .action_mask
                .map(|m| &m[row * per_row..(row + 1) * per_row]),
            epsilon: self.epsilon,
        }
    }

    pub fn envs(mut self, envs: EnvIds<'a>) -> Self {
        self.envs = envs;
        self
    }

    pub fn episode_starts(mut self, starts: &'a [bool]) -> Self {
        self.episode_starts = Some(starts);
        self
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
    /// Value estimate per row (empty without a critic, and for a request with [`Request::skip_value`]).
    pub value: Vec<f32>,
    /// Distribution parameters per row: logits (concatenated for multi-discrete), or mean then log-std.
    pub dist_params: Vec<f32>,
}

/// The most threads [`Session::set_threads`] starts for one session.
pub const MAX_THREADS: usize = 256;

/// One caller's session on a shared policy. Not `Sync` by design (one caller at a time); make one per thread:
/// they share the policy's weights.
pub struct Session {
    policy: Arc<CompiledPolicy>,
    scratch: ExecScratch,
    state: HostState,
    max_envs: usize,
    out: ActOutputs,
    /// Where an executor that writes outputs itself
    /// ([`Placement::outputs`](crate::executor::Placement::outputs)) writes the next act's: swapped with `out`
    /// once they pass the session's checks (a failed act leaves `out` as it was, at no copy).
    staged: ActOutputs,
    obs_buf: Vec<f32>,
    rows: Vec<f32>,
    ids: Vec<u32>,
    sorted_ids: Vec<u32>,
    gathered: Vec<Vec<f32>>,
    starts: Vec<u32>,
    /// Each row's sampling stream's first block, computed for the batch at once (`philox::first_blocks`).
    first_blocks: Vec<[u32; 4]>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("policy", &self.policy.manifest().name)
            .field("backend", &self.policy.backend())
            .field("num_envs", &self.state.num_envs)
            .finish()
    }
}

/// Where an executor writes a step: rows for the session to unpack, or the outputs themselves
/// ([`Placement::outputs`](crate::executor::Placement::outputs)).
enum Sink<'r> {
    Rows(&'r mut Vec<f32>),
    Outputs(&'r mut ActOutputs),
}

/// What one act() checked and prepared before anything was mutated.
struct Prepared {
    batch: usize,
    mode: ActMode,
    /// The request's [`Request::skip_value`] on a policy that has a value.
    skip_value: bool,
    /// The request's observations go to the executor as they are (checked, f32, no preprocessing): the session
    /// copied nothing.
    obs_as_given: bool,
    /// Largest env id + 1 of a recurrent batch (the state grows to it).
    envs_needed: usize,
}

impl Session {
    pub fn new(policy: Arc<CompiledPolicy>) -> Self {
        let exec = policy.executor();
        Session {
            scratch: exec.new_scratch(),
            state: HostState::new(exec.state_sizes()),
            gathered: exec.state_sizes().iter().map(|_| vec![]).collect(),
            max_envs: DEFAULT_MAX_ENVS,
            policy,
            out: ActOutputs::default(),
            staged: ActOutputs::default(),
            obs_buf: vec![],
            rows: vec![],
            ids: vec![],
            sorted_ids: vec![],
            starts: vec![],
            first_blocks: vec![],
        }
    }

    pub fn policy(&self) -> &Arc<CompiledPolicy> {
        &self.policy
    }

    /// The outputs of the last successful act().
    pub fn outputs(&self) -> &ActOutputs {
        &self.out
    }

    /// Envs the recurrent state holds now (0 for feed-forward policies).
    pub fn num_envs(&self) -> usize {
        self.state.num_envs
    }

    pub fn max_envs(&self) -> usize {
        self.max_envs
    }

    /// Limit the envs this session may hold state for (memory is `max_envs x state size`); env ids at or above
    /// it are a typed error. Default [`DEFAULT_MAX_ENVS`]. Whatever the limit, growing the state past the
    /// policy's memory budget ([`CompiledPolicy::limits`]) is refused with [`PolicyError::Memory`].
    pub fn set_max_envs(&mut self, max_envs: usize) {
        self.max_envs = max_envs;
    }

    /// Split this session's act() over `threads` threads by batch rows: the calling thread and `threads - 1`
    /// worker threads the session owns (they spin briefly after a step, then sleep; dropped with the session),
    /// where that measures faster than the calling thread alone ([`Session::set_thread_split`]).
    /// 0 means one per core the OS reports; 1 (the default) runs on the calling thread only. The batch is cut into
    /// up to four parts per thread that the threads take in turn, so a worker that is slow to start (asleep since
    /// the last act) delays the call by at most the part it runs. Only the cpu backend
    /// has intra-op threads (others accept 1 and refuse more with [`BackendError::Unsupported`]); a platform
    /// without threads (wasm) refuses with [`BackendError::Threads`]. Results are the same whatever the count:
    /// every row is computed by the same kernels in the same order. Small batches use fewer threads (at least 8
    /// rows per thread: a batch under 16 stays on the calling thread).
    ///
    /// [`BackendError::Unsupported`]: crate::BackendError::Unsupported
    /// [`BackendError::Threads`]: crate::BackendError::Threads
    pub fn set_threads(&mut self, threads: usize) -> Result<(), PolicyError> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n if n > MAX_THREADS => {
                return Err(crate::BackendError::Threads(format!(
                    "{n} threads asked for; at most {MAX_THREADS}"
                ))
                .into());
            }
            n => n,
        };
        self.policy
            .executor()
            .set_threads(&mut self.scratch, threads)
    }

    /// The threads this session's act() uses (see [`Session::set_threads`]).
    pub fn threads(&mut self) -> usize {
        self.policy.executor().threads(&mut self.scratch)
    }

    /// How act() uses this session's threads: [`ThreadSplit::Measured`] (the default) splits a batch only while
    /// splitting measures faster than the calling thread alone, per batch size — so threads never make act()
    /// slower than one thread (beyond a probe now and then), also when other work takes the cores;
    /// [`ThreadSplit::Always`] splits every batch big enough (for tests and benchmarks of the split). Results
    /// are the same either way. Kept across [`Session::set_threads`]; a no-op on backends without threads.
    ///
    /// [`ThreadSplit::Measured`]: crate::ThreadSplit::Measured
    /// [`ThreadSplit::Always`]: crate::ThreadSplit::Always
    pub fn set_thread_split(&mut self, mode: crate::ThreadSplit) {
        self.policy
            .executor()
            .set_thread_split(&mut self.scratch, mode);
    }

    /// The mode [`Session::set_thread_split`] set.
    pub fn thread_split(&mut self) -> crate::ThreadSplit {
        self.policy.executor().thread_split(&mut self.scratch)
    }

    /// Wake this session's worker threads now, so that an act() in the next few tens of µs finds them awake.
    /// Why: a worker spins ~60 µs after each act() and then sleeps, and an act() that comes later starts before
    /// its workers are running again (the caller then takes the parts they have not started: see
    /// [`Session::set_threads`]). An engine calls this when a tick starts gathering its observations, so the
    /// wake-up overlaps with the gathering (`policyport-agents` does, on a tick's first observation). Measured on
    /// a 2-core VM, 1 000 CartPole agents on 2 threads in Bevy, ticks back to back: ~190 → ~182 µs per tick.
    /// Cheap (one wake per worker); a no-op without threads, and when the measured split
    /// ([`Session::set_thread_split`]) will run the next step on the calling thread alone (its time is counted
    /// into the next step's when that step splits, so the split is judged with what waking costs).
    pub fn wake_threads(&mut self) {
        self.policy.executor().wake_threads(&mut self.scratch);
    }

    /// One step for `req.batch` envs: observations in, actions (+ value, distribution parameters) out, recurrent
    /// state advanced. Sampling draws from the stream (seed, env id, step) of each row, as SPEC.md defines. A
    /// refused request changes nothing (state, outputs and scratch stay as they were).
    ///
    /// On WebGPU in a browser use [`Session::act_async`] (this returns a typed error there).
    pub fn act(&mut self, req: &Request<'_>) -> Result<&ActOutputs, PolicyError> {
        let p = self.prepare(req)?;
        if self.policy.executor().placement().outputs {
            return self.act_into_outputs(&p, req);
        }
        let mut rows = std::mem::take(&mut self.rows);
        let result = self
            .launch(&p, req.obs, Sink::Rows(&mut rows))
            .and_then(|pending| pending.wait(&mut rows));
        self.complete(result, rows, &p, req)
    }

    /// act() on an executor that writes the outputs itself
    /// ([`Placement::outputs`](crate::executor::Placement::outputs); it never defers).
    fn act_into_outputs(
        &mut self,
        p: &Prepared,
        req: &Request<'_>,
    ) -> Result<&ActOutputs, PolicyError> {
        let mut staged = std::mem::take(&mut self.staged);
        let result = self
            .launch(p, req.obs, Sink::Outputs(&mut staged))
            .map(|_ready| ())
            .and_then(|()| self.check_outputs(&staged, p));
        if let Err(e) = result {
            self.staged = staged;
            return Err(e);
        }
        if req.action_mask.is_some() || req.epsilon.is_some() {
            self.redraw(&mut staged, p, req);
        }
        std::mem::swap(&mut self.out, &mut staged);
        self.staged = staged;
        Ok(&self.out)
    }

    /// Every check [`Session::act`] makes on `req` (batch, env ids, episode starts, masks, observations), without
    /// acting: for a caller that must change something else only if the act will be taken (a binding writing
    /// caller-owned state first). Nothing changes but reused scratch buffers.
    pub fn check(&mut self, req: &Request<'_>) -> Result<(), PolicyError> {
        self.prepare(req).map(|_| ())
    }

    /// [`Session::act`] for callers that cannot block (the browser): identical results; on a device the one
    /// readback is awaited instead of waited for. CPU backends finish without awaiting anything.
    pub async fn act_async(&mut self, req: &Request<'_>) -> Result<&ActOutputs, PolicyError> {
        let p = self.prepare(req)?;
        if self.policy.executor().placement().outputs {
            return self.act_into_outputs(&p, req);
        }
        let mut rows = std::mem::take(&mut self.rows);
        let result = match self.launch(&p, req.obs, Sink::Rows(&mut rows)) {
            Ok(pending) => pending.wait_async(&mut rows).await,
            Err(e) => Err(e),
        };
        self.complete(result, rows, &p, req)
    }

    /// How many envs the state must hold to take `envs` (the largest id + 1), checked against the session's env
    /// limit and the policy's memory limit; nothing is changed.
    fn envs_to_hold(&self, envs: &[u32]) -> Result<usize, PolicyError> {
        if let Some(&env) = envs.iter().find(|e| **e as usize >= self.max_envs) {
            return Err(EnvIdError::BeyondLimit {
                env,
                limit: self.max_envs,
            }
            .into());
        }
        let needed = envs.iter().map(|e| *e as usize + 1).max().unwrap_or(0);
        self.policy
            .check_memory(1, needed.max(self.state.num_envs))?;
        Ok(needed)
    }

    /// Zero the recurrent state of these envs (episode boundaries); grows the state to hold them. A no-op for
    /// feed-forward policies.
    pub fn reset(&mut self, envs: &[u32]) -> Result<(), PolicyError> {
        if !self.state.is_recurrent() {
            return Ok(());
        }
        let needed = self.envs_to_hold(envs)?;
        self.state.grow(needed)?;
        for &e in envs {
            self.state.zero(e);
        }
        self.policy.executor().reset_state(&mut self.scratch, envs)
    }

    /// Overwrite the recurrent state of `envs` with caller-owned values: `values[k]` holds `envs.len() x numel_k`
    /// numbers for state tensor `k` (row i for `envs[i]`). For callers that keep the state themselves between
    /// steps (RLlib's `STATE_IN` / `STATE_OUT` columns, SB3's `predict(obs, state)`): write, act, read back.
    /// Grows the state to hold the envs. Checked first (tensor count, lengths, duplicate ids, the env limit,
    /// finiteness): a refused call changes nothing.
    pub fn write_state(&mut self, envs: &[u32], values: &[&[f32]]) -> Result<(), PolicyError> {
        if !self.state.is_recurrent() {
            return Err(StateError::NotRecurrent.into());
        }
        let count = self.state.tensors.len();
        if values.len() != count {
            return Err(StateError::TensorCount {
                found: values.len(),
                count,
            }
            .into());
        }
        for (index, ((numel, _), v)) in self.state.tensors.iter().zip(values).enumerate() {
            if v.len() != envs.len() * numel {
                return Err(StateError::Values {
                    index,
                    found: v.len(),
                    envs: envs.len(),
                    numel: *numel,
                }
                .into());
            }
            if let Some(i) = crate::observations::first_non_finite(v) {
                return Err(StateError::NonFinite {
                    index,
                    env: envs[i / (*numel).max(1)],
                    value: v[i],
                }
                .into());
            }
        }
        EnvIds::List(envs).check_distinct(envs.len(), &mut self.sorted_ids)?;
        let needed = self.envs_to_hold(envs)?;
        // Device-state executors hold the authoritative copy: bring the host rows up to date first, so the rows
        // of other envs stay right when they are read or re-uploaded.
        let exec = self.policy.executor();
        if let Some(device) = exec.read_state(&mut self.scratch)? {
            self.state.overwrite(device);
        }
        // The executor first: a backend that refuses leaves the host rows as they were.
        exec.write_state(
            &mut self.scratch,
            envs,
            values,
            needed.max(self.state.num_envs),
        )?;
        self.state.grow(needed)?;
        for ((numel, data), v) in self.state.tensors.iter_mut().zip(values) {
            for (i, &e) in envs.iter().enumerate() {
                let e = e as usize;
                data[e * *numel..(e + 1) * *numel]
                    .copy_from_slice(&v[i * *numel..(i + 1) * *numel]);
            }
        }
        Ok(())
    }

    /// Every state tensor of `envs`, `envs.len() x numel_k` per tensor (row i for `envs[i]`; envs the state does
    /// not hold yet read as zeros, as they would start). One device readback on device-state backends.
    pub fn states_of(&mut self, envs: &[u32]) -> Result<Vec<Vec<f32>>, PolicyError> {
        if !self.state.is_recurrent() {
            return Err(StateError::NotRecurrent.into());
        }
        if let Some(device) = self.policy.executor().read_state(&mut self.scratch)? {
            self.state.overwrite(device);
        }
        let num_envs = self.state.num_envs;
        Ok(self
            .state
            .tensors
            .iter()
            .map(|(n, data)| {
                let mut out = Vec::with_capacity(envs.len() * n);
                for &e in envs {
                    let e = e as usize;
                    if e < num_envs {
                        out.extend_from_slice(&data[e * n..(e + 1) * n]);
                    } else {
                        out.extend(std::iter::repeat_n(0.0, *n));
                    }
                }
                out
            })
            .collect())
    }

    /// State tensor `k` of env `env` (read back from the device first on device-state backends).
    pub fn state(&mut self, k: usize, env: u32) -> Result<&[f32], PolicyError> {
        let count = self.state.tensors.len();
        if k >= count {
            return Err(StateError::NoSuchTensor { index: k, count }.into());
        }
        if env as usize >= self.state.num_envs {
            return Err(StateError::EnvOutOfRange {
                env,
                num_envs: self.state.num_envs,
            }
            .into());
        }
        if let Some(device) = self.policy.executor().read_state(&mut self.scratch)? {
            self.state.overwrite(device);
        }
        let (n, data) = &self.state.tensors[k];
        let e = env as usize;
        Ok(&data[e * n..(e + 1) * n])
    }

    /// The request check (batch, env ids incl. duplicates, episode starts, observations) and preprocessing, for
    /// every backend. Mutates nothing but reused scratch buffers.
    fn prepare(&mut self, req: &Request<'_>) -> Result<Prepared, PolicyError> {
        let batch = req.batch;
        if batch == 0 || batch > MAX_BATCH {
            return Err(PolicyError::Batch {
                batch,
                max: MAX_BATCH,
            });
        }
        self.policy.check_memory(batch, self.state.num_envs)?;
        req.envs.resolve(batch, &mut self.ids)?;
        if let Some(s) = req.episode_starts
            && s.len() != batch
        {
            return Err(StateError::EpisodeStarts {
                found: s.len(),
                batch,
            }
            .into());
        }
        self.policy
            .head()
            .check_controls(req.action_mask, req.epsilon, batch)?;
        let policy = &self.policy;
        let placement = policy.executor().placement();
        // f32 observations with nothing to do on the host go to the executor as they are (no copy): those of a
        // policy without preprocessing, and every f32 batch of an executor that preprocesses on its device.
        let obs_as_given = matches!(req.obs, Observations::F32(_))
            && match placement.preprocess {
                true => !placement.raw_observations,
                false => policy.preprocessor().passes_through(),
            };
        // The preprocessed observations' room, fallibly (a u8 frame batch becomes four times its bytes here).
        let obs_numbers = match req.obs {
            Observations::F32(x) => x.len(),
            Observations::U8(x) => x.len(),
        };
        if !obs_as_given && self.obs_buf.capacity() < obs_numbers {
            self.obs_buf.clear();
            try_reserve_len(
                &mut self.obs_buf,
                obs_numbers,
                "the preprocessed observations",
            )?;
        }
        if placement.preprocess {
            // The device preprocesses; the host only checks (same typed errors on every backend).
            check_observations(
                &policy.manifest().observation,
                &policy.one_hot_width(),
                req.obs,
                batch,
            )?;
            self.obs_buf.clear();
            // An executor that takes the request's observations as they are (`StepInput::raw`) gets no copy.
            if let (false, Observations::U8(x)) = (placement.raw_observations, req.obs) {
                self.obs_buf.extend(x.iter().map(|&b| b as f32));
            }
        } else if obs_as_given {
            policy
                .preprocessor()
                .check(req.obs, batch)
                .map_err(|e: ObservationError| PolicyError::from(e))?;
        } else {
            policy
                .preprocessor()
                .run(req.obs, batch, &mut self.obs_buf)
                .map_err(|e: ObservationError| PolicyError::from(e))?;
        }
        let mut envs_needed = 0;
        if self.state.is_recurrent() {
            req.envs.check_distinct(batch, &mut self.sorted_ids)?;
            let max = self.ids.iter().copied().max().unwrap_or(0);
            if max as usize >= self.max_envs {
                return Err(EnvIdError::BeyondLimit {
                    env: max,
                    limit: self.max_envs,
                }
                .into());
            }
            envs_needed = max as usize + 1;
            self.policy
                .check_memory(batch, envs_needed.max(self.state.num_envs))?;
        }
        self.starts.clear();
        if let Some(s) = req.episode_starts
            && self.state.is_recurrent()
        {
            self.starts
                .extend(self.ids.iter().zip(s).filter(|(_, s)| **s).map(|(e, _)| *e));
        }
        Ok(Prepared {
            batch,
            mode: req.mode,
            skip_value: req.skip_value && self.policy.head().has_value(),
            obs_as_given,
            envs_needed,
        })
    }

    /// Apply the accepted request's state changes (growth, episode starts), gather host state rows, launch.
    /// `obs`: the request's observations (checked), handed over as they are where the executor takes them so.
    fn launch(
        &mut self,
        p: &Prepared,
        obs: Observations<'_>,
        sink: Sink<'_>,
    ) -> Result<Pending, PolicyError> {
        let exec = self.policy.executor();
        let placement = exec.placement();
        if self.state.is_recurrent() {
            self.state.grow(p.envs_needed)?;
            for &e in &self.starts {
                self.state.zero(e);
            }
            if !self.starts.is_empty() {
                exec.reset_state(&mut self.scratch, &self.starts)?;
            }
            if !placement.state {
                for ((n, data), out) in self.state.tensors.iter().zip(&mut self.gathered) {
                    out.clear();
                    for &e in &self.ids {
                        let e = e as usize;
                        out.extend_from_slice(&data[e * n..(e + 1) * n]);
                    }
                }
            }
        }
        let obs_f32 = match (p.obs_as_given, obs) {
            (true, Observations::F32(x)) => x,
            _ => &self.obs_buf[..],
        };
        let step = StepInput {
            batch: p.batch,
            obs: obs_f32,
            raw: (placement.preprocess && placement.raw_observations).then_some(obs),
            env_ids: &self.ids,
            mode: p.mode,
            states: &self.gathered,
            num_envs: self.state.num_envs,
            skip_value: p.skip_value,
        };
        match sink {
            Sink::Rows(rows) => exec.launch(&mut self.scratch, &step, rows),
            Sink::Outputs(out) => exec
                .launch_outputs(&mut self.scratch, &step, out)
                .map(|()| Pending::Ready),
        }
    }

    /// The outputs an executor wrote itself ([`Placement::outputs`](crate::executor::Placement::outputs)),
    /// checked before they become the session's:
    /// the sizes the head gives, every number finite (the same rule as for rows: `non_finite_outputs_are_a_typed_
    /// error`), and every discrete action one of its component's. The sandbox's plugin is not trusted to keep
    /// them: a broken or hostile one must not hand a game an action index past its action space.
    fn check_outputs(&self, out: &ActOutputs, p: &Prepared) -> Result<(), PolicyError> {
        let head = self.policy.head();
        let (batch, k, np) = (p.batch, head.action_len, head.dist_params_len);
        let discrete = head.is_discrete();
        let wants_value = head.has_value() && !p.skip_value;
        let (actions, other) = match discrete {
            true => (out.discrete.len(), out.continuous.len()),
            false => (out.continuous.len(), out.discrete.len()),
        };
        if out.batch != batch
            || actions != batch * k
            || other != 0
            || out.dist_params.len() != batch * np
            || out.value.len() != if wants_value { batch } else { 0 }
        {
            return Err(BackendError::Device(format!(
                "the {} executor wrote outputs of other sizes than the policy's head: batch {} (asked {batch}), \
                 {actions} actions ({k} per row), {} distribution numbers ({np} per row), {} values",
                self.policy.backend().name(),
                out.batch,
                out.dist_params.len(),
                out.value.len(),
            ))
            .into());
        }
        let non_finite = |values: &[f32], per_row: usize, what: &'static str| {
            match crate::observations::first_non_finite(values) {
                Some(i) => Err(PolicyError::NonFiniteOutput {
                    row: i / per_row.max(1),
                    what,
                    value: values[i],
                }),
                None => Ok(()),
            }
        };
        non_finite(&out.dist_params, np, "output (action distribution)")?;
        non_finite(&out.continuous, k, "action")?;
        non_finite(&out.value, 1, "value")?;
        if discrete {
            for (i, (&a, &n)) in out
                .discrete
                .iter()
                .zip(head.segments.iter().cycle())
                .enumerate()
            {
                if a < 0 || a as u64 >= n as u64 {
                    return Err(BackendError::Device(format!(
                        "the {} executor answered action {a} for env row {} (component {} has {n} actions)",
                        self.policy.backend().name(),
                        i / k.max(1),
                        i % k.max(1),
                    ))
                    .into());
                }
            }
        }
        Ok(())
    }

    /// A request's mask or epsilon on outputs an executor drew
    /// ([`Placement::outputs`](crate::executor::Placement::outputs)): the host draws again
    /// from the finished parameters, with the same code as every other backend (`finish`'s `host_draws`).
    fn redraw(&mut self, out: &mut ActOutputs, p: &Prepared, req: &Request<'_>) {
        let head = self.policy.head();
        let batch = p.batch;
        let streams = match p.mode {
            ActMode::Sample { seed, step } => {
                policyport_format::philox::first_blocks(
                    seed,
                    step,
                    &self.ids[..batch],
                    &mut self.first_blocks,
                );
                Some((seed, step))
            }
            ActMode::Deterministic => None,
        };
        let mask_len = head.mask_len();
        for row in 0..batch {
            let stream = streams.map(|(seed, step)| {
                Stream::with_first_block(seed, self.ids[row], step, self.first_blocks[row])
            });
            draw_row(head, out, row, &req.controls_of(row, mask_len), stream);
        }
    }

    fn complete(
        &mut self,
        result: Result<(), PolicyError>,
        rows: Vec<f32>,
        p: &Prepared,
        req: &Request<'_>,
    ) -> Result<&ActOutputs, PolicyError> {
        if let Err(e) = result {
            self.rows = rows;
            return Err(e);
        }
        // Non-finite outputs are an error, never an answer: with a NaN logit the sampler and argmax disagreed
        // (argmax skipped it, sampling fell through to the last action), and a NaN mean or value went out as
        // the action (regression test `non_finite_outputs_are_a_typed_error`). O(row width) per row.
        let width = self.policy.executor().row_width();
        // A skipped value's column is not an output: whatever it holds is never read (an executor that computed
        // it anyway must not fail the act for it).
        let non_finite = match crate::observations::first_non_finite(&rows) {
            // (The whole rows first: the common case, one pass; the cpu backend writes zeros there.)
            Some(_) if p.skip_value => {
                let column = self.value_column();
                (0..rows.len()).find(|&i| i % width.max(1) != column && !rows[i].is_finite())
            }
            other => other,
        };
        if let Some(i) = non_finite {
            let value = rows[i];
            self.rows = rows;
            return Err(PolicyError::NonFiniteOutput {
                row: if width == 0 { 0 } else { i / width },
                what: "output (action distribution or value)",
                value,
            });
        }
        // The outputs' room first, fallibly: the previous outputs stay as they were if it is not there.
        let head = self.policy.head();
        let (batch, k, np) = (p.batch, head.action_len, head.dist_params_len);
        let out = &mut self.out;
        let room = try_reserve_len(
            &mut out.dist_params,
            batch.saturating_mul(np),
            "the act's outputs",
        )
        .and_then(|()| match p.skip_value {
            true => Ok(()),
            false => try_reserve_len(&mut out.value, batch, "the act's outputs"),
        })
        .and_then(|()| match head.is_discrete() {
            true => try_reserve_len(
                &mut out.discrete,
                batch.saturating_mul(k),
                "the act's outputs",
            ),
            false => try_reserve_len(
                &mut out.continuous,
                batch.saturating_mul(k),
                "the act's outputs",
            ),
        });
        if let Err(e) = room {
            self.rows = rows;
            return Err(e);
        }
        self.finish(&rows, p, req);
        self.rows = rows;
        Ok(&self.out)
    }

    /// The column of the value estimate in an executor's row (a policy with a value): after the head's raw
    /// parameters, or, where the executor samples, after its actions and finished parameters.
    fn value_column(&self) -> usize {
        let head = self.policy.head();
        match self.policy.executor().placement().sampling {
            true => head.action_len + head.dist_params_len,
            false => head.raw_params_len,
        }
    }

    /// The host side after execution: unpack the rows into the outputs (sampling on the host unless the
    /// executor sampled) and scatter next states into the host rows (unless the executor keeps them).
    fn finish(&mut self, rows: &[f32], p: &Prepared, req: &Request<'_>) {
        let policy = &self.policy;
        let exec = policy.executor();
        let placement = exec.placement();
        let head = policy.head();
        let width = exec.row_width();
        let batch = p.batch;
        debug_assert_eq!(rows.len(), batch * width);
        let (k, np, raw) = (head.action_len, head.dist_params_len, head.raw_params_len);
        let has_value = head.has_value();
        let wants_value = has_value && !p.skip_value;
        // The rows drawn on the host: every stream's block 0 for the batch at once (eight rows a step), not one
        // row's at a time inside its draw.
        let host_draws = !placement.sampling || req.action_mask.is_some() || req.epsilon.is_some();
        let streams = match p.mode {
            ActMode::Sample { seed, step } if host_draws => {
                policyport_format::philox::first_blocks(
                    seed,
                    step,
                    &self.ids[..batch],
                    &mut self.first_blocks,
                );
                Some((seed, step))
            }
            _ => None,
        };
        let out = &mut self.out;
        out.batch = batch;
        out.dist_params.resize(batch * np, 0.0);
        out.value.resize(if wants_value { batch } else { 0 }, 0.0);
        let discrete = head.is_discrete();
        let mask_len = head.mask_len();
        // A mask or an epsilon override (accepted for Q-value heads only): the device's draw, if any, is replaced
        // by the host's, from the same read-back parameters and with the same code on every backend
        // (`host_draws`, above).
        if discrete {
            out.discrete.resize(batch * k, 0);
            out.continuous.clear();
        } else {
            out.continuous.resize(batch * k, 0.0);
            out.discrete.clear();
        }
        for row in 0..batch {
            let src = &rows[row * width..(row + 1) * width];
            let params = &mut out.dist_params[row * np..(row + 1) * np];
            let controls = req.controls_of(row, mask_len);
            if placement.sampling {
                // [actions | finished params | value]: actions were drawn on the device.
                params.copy_from_slice(&src[k..k + np]);
                if wants_value {
                    out.value[row] = src[k + np];
                }
                if !host_draws {
                    if discrete {
                        for (d, a) in out.discrete[row * k..(row + 1) * k]
                            .iter_mut()
                            .zip(&src[..k])
                        {
                            *d = *a as i64;
                        }
                    } else {
                        out.continuous[row * k..(row + 1) * k].copy_from_slice(&src[..k]);
                    }
                    continue;
                }
            } else {
                params[..raw].copy_from_slice(&src[..raw]);
                head.finish_params(params);
                if wants_value {
                    out.value[row] = src[raw];
                }
            }
            let stream = streams.map(|(seed, step)| {
                Stream::with_first_block(seed, self.ids[row], step, self.first_blocks[row])
            });
            draw_row(head, out, row, &controls, stream);
        }
        if self.state.is_recurrent() && !placement.state {
            let mut off = raw + has_value as usize;
            for (n, data) in self.state.tensors.iter_mut() {
                for (row, &e) in self.ids.iter().enumerate() {
                    let e = e as usize;
                    let src = &rows[row * width + off..row * width + off + *n];
                    data[e * *n..(e + 1) * *n].copy_from_slice(src);
                }
                off += *n;
            }
        }
    }
}

/// One row's draw on the host (`Session::finish`'s rows, `Session::redraw`'s outputs): the request's mask applied
/// to the row's finished distribution parameters, then the head's action from them into the row's actions.
fn draw_row(
    head: &policyport_format::HeadPlan,
    out: &mut ActOutputs,
    row: usize,
    controls: &RowControls<'_>,
    stream: Option<Stream>,
) {
    let (k, np) = (head.action_len, head.dist_params_len);
    let params = &mut out.dist_params[row * np..(row + 1) * np];
    if let Some(m) = controls.mask {
        head.mask_params(params, m);
    }
    let (d, c) = if head.is_discrete() {
        (&mut out.discrete[row * k..(row + 1) * k], &mut [][..])
    } else {
        (&mut [][..], &mut out.continuous[row * k..(row + 1) * k])
    };
    head.act_row_from(params, stream, controls, d, c);
}

#[cfg(test)]
mod tests {
    /// Every boundary read its flag bytes with its own loop (C twice, the plugin, the browser); one reading now:
    /// any non-zero byte is true, and the buffer is cleared first (a longer earlier call leaves nothing behind).
    #[test]
    fn flag_bytes_read_nonzero_as_true_into_a_cleared_buffer() {
        let mut flags = vec![true; 8];
        super::flags_into(&[0, 1, 7, 255, 0], &mut flags);
        assert_eq!(flags, [false, true, true, true, false]);
        super::flags_into(&[], &mut flags);
        assert!(flags.is_empty());
    }
}
