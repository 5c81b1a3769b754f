//! The policyport C ABI. One opaque handle type for both runtimes: the native one (`cpu` kernels or burn-flex)
//! and the wasm-sandboxed plugin under wasmtime (deadline and memory cap per policy).
//!
//! Rules: every function returns a `PpStatus` (0 = ok); on error, `pp_last_error()` gives a message for the
//! calling thread. No panic ever crosses the boundary (each entry point catches unwinds and reports
//! `PP_STATUS_PANIC`). Thread safety: a `PpPolicy` may be used from any thread but by one thread at a time;
//! different policies may be used concurrently. Pointers are checked for null; lengths are the caller's promise.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use policyport::{
    ActMode, ActOutputs, Backend, CompiledPolicy, EnvIds, ErrorKind, Observations, PolicyError,
    PolicyInfo, Request, Session,
};
use policyport_agents::{AgentId, Agents, AgentsConfig, AgentsError, RowOutputs};
use policyport_wasmtime::{WasmError, WasmLimits, WasmRuntime};

/// Path of the generated header (for build scripts and tests).
/// cbindgen:ignore
pub const HEADER: &str = env!("POLICYPORT_HEADER");

/// Version of this C ABI. Version 2 added `pp_policy_act`'s `episode_starts`; version 3 `pp_policy_set_threads`;
/// version 4 `PP_BACKEND_CPU_BF16`, and `pp_policy_load` takes the backend as a `uint32_t` code (the same values);
/// version 5 `pp_policy_act_masked` (action masks and an epsilon override, format 1.4); version 6 the agents
/// (`pp_agents_*`: many game agents by stable id, one batched act() per tick) and `pp_policy_act_ids`; version 7
/// `pp_policy_set_thread_split` (threads used only where they measure faster, the default, or always).
pub const PP_ABI_VERSION: u32 = 7;

/// `pp_policy_set_thread_split`: split a batch over the threads only while that measures faster than the calling
/// thread alone, per batch size (the default; `policyport::ThreadSplit::Measured`).
pub const PP_THREAD_SPLIT_MEASURED: u32 = 0;
/// `pp_policy_set_thread_split`: split every batch of at least 8 rows per thread (for benchmarks and tests of the
/// split; `policyport::ThreadSplit::Always`).
pub const PP_THREAD_SPLIT_ALWAYS: u32 = 1;

/// Result of every call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PpStatus {
    Ok = 0,
    InvalidArtifact = 1,
    BadObservation = 2,
    BadCall = 3,
    State = 4,
    Backend = 5,
    NullPointer = 6,
    Panic = 7,
    Sandbox = 8,
    Io = 9,
    /// Over the policy's memory limit (this batch or number of envs, or the policy itself): nothing allocated.
    TooLarge = 10,
    /// The policy computed NaN or infinity.
    NonFiniteOutput = 11,
}

/// Native backends: the codes `pp_policy_load` takes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PpBackend {
    /// Native CPU kernels (f32).
    Cpu = 0,
    /// burn-flex.
    Flex = 1,
    /// Native CPU kernels with bf16 weights and layer inputs, f32 sums (`vdpbf16ps`): faster, within bf16
    /// tolerance of f32. Needs AVX512-BF16: elsewhere `pp_policy_load` fails with `PP_STATUS_BACKEND`.
    CpuBf16 = 2,
}

impl PpBackend {
    /// The backend a caller's code names, if any. Why codes and not the enum in the signature: a C caller can
    /// pass any integer where an enum is declared, and an out-of-range value in a Rust enum is undefined
    /// behaviour before any check could run; as a `u32` it is a typed `PP_STATUS_BAD_CALL`.
    pub fn from_code(code: u32) -> Option<PpBackend> {
        [PpBackend::Cpu, PpBackend::Flex, PpBackend::CpuBf16]
            .into_iter()
            .find(|b| *b as u32 == code)
    }
}

/// What a policy expects and returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PpInfo {
    /// Observation numbers per env.
    pub obs_len: u32,
    /// Action numbers per env.
    pub action_len: u32,
    /// Distribution parameters per env.
    pub dist_params_len: u32,
    /// 1 if the policy has a value estimate.
    pub has_value: u32,
    /// 1 if actions are discrete (written to `discrete_actions`), 0 if continuous (`continuous_actions`).
    pub discrete: u32,
    /// 1 if the policy runs inside the wasm sandbox.
    pub sandboxed: u32,
}

/// An opaque loaded policy: one runtime `Session` for both routes (its state per env id, outputs and scratch; in
/// the sandbox, its own plugin instance).
pub struct PpPolicy {
    session: Session,
    info: PolicyInfo,
    /// `pp_policy_act`'s episode-start bytes as flags (reused across calls).
    starts: Vec<bool>,
    /// `pp_policy_act_masked`'s mask bytes as flags (reused across calls).
    mask: Vec<bool>,
}

impl PpPolicy {
    fn new(policy: Arc<CompiledPolicy>) -> Self {
        PpPolicy {
            info: policy.info(),
            session: policy.session(),
            starts: vec![],
            mask: vec![],
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl std::fmt::Display) {
    let s = CString::new(msg.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = s);
}

/// The status of a policy error: its kind's ([`ErrorKind`], the one map every boundary shares).
fn status_of(e: &PolicyError) -> PpStatus {
    status_of_kind(e.kind())
}

fn status_of_kind(kind: ErrorKind) -> PpStatus {
    match kind {
        ErrorKind::Artifact => PpStatus::InvalidArtifact,
        ErrorKind::Observation => PpStatus::BadObservation,
        ErrorKind::Call => PpStatus::BadCall,
        ErrorKind::State => PpStatus::State,
        ErrorKind::Backend => PpStatus::Backend,
        ErrorKind::TooLarge => PpStatus::TooLarge,
        ErrorKind::NonFinite => PpStatus::NonFiniteOutput,
        // A deadline, memory cap or trap in the plugin, a broken plugin, a session poisoned by one of these.
        ErrorKind::Sandbox => PpStatus::Sandbox,
        // A kind added to the core after this ABI: the closest status every caller already handles.
        _ => PpStatus::Backend,
    }
}

/// The status of an error making the sandbox's runtime (the plugin module): its kind's, as every error's.
fn wasm_status(e: &WasmError) -> PpStatus {
    status_of_kind(e.kind())
}

/// Run `f`, turning errors and panics into a status and a message.
fn guard(f: impl FnOnce() -> Result<(), (PpStatus, String)>) -> PpStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => PpStatus::Ok,
        Ok(Err((status, msg))) => {
            set_error(msg);
            status
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned());
            set_error(format!(
                "internal panic (a policyport bug): {}",
                msg.unwrap_or_default()
            ));
            PpStatus::Panic
        }
    }
}

fn null(what: &str) -> (PpStatus, String) {
    (PpStatus::NullPointer, format!("{what} is null"))
}

/// A caller's pointer must be aligned for its element type before any slice is made from it (a misaligned
/// `*const f32` turned into `&[f32]` is undefined behaviour, not an error). Null passes (checked elsewhere).
fn aligned<T>(p: *const T, what: &str) -> Result<(), (PpStatus, String)> {
    if p.is_null() || p.is_aligned() {
        Ok(())
    } else {
        Err((
            PpStatus::BadCall,
            format!(
                "{what} ({p:p}) is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ))
    }
}

/// # Safety
/// A non-null `bytes` is valid for reading `len` bytes, which nothing writes for the returned lifetime (null is
/// refused unless `len` is 0).
unsafe fn bytes_arg<'a>(bytes: *const u8, len: usize) -> Result<&'a [u8], (PpStatus, String)> {
    if bytes.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(null("bytes"))
        };
    }
    if len > isize::MAX as usize {
        return Err((
            PpStatus::BadCall,
            format!("len {len} is larger than any object"),
        ));
    }
    // SAFETY: non-null, `len` at most isize::MAX (checked above), and the caller's contract: `len` readable bytes
    // (u8: any address is aligned) that stay unchanged while the slice lives.
    Ok(unsafe { std::slice::from_raw_parts(bytes, len) })
}

/// Copy `src` into a caller's buffer: nothing when the buffer is null (the caller skips that output) or there is
/// nothing to copy (e.g. continuous actions of a discrete policy).
///
/// # Safety
/// A non-null `dst` is aligned and valid for writing `src.len()` elements, and does not overlap `src` (a caller's
/// buffer, never policyport's own).
unsafe fn copy_out<T: Copy>(src: &[T], dst: *mut T) {
    if !dst.is_null() && !src.is_empty() {
        // SAFETY: `src` is a live slice; `dst` is non-null here and, by the caller's contract, aligned, writable
        // for `src.len()` elements and disjoint from `src`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
}

/// The version of this ABI (compare with `PP_ABI_VERSION` from the header you compiled against).
#[unsafe(no_mangle)]
pub extern "C" fn pp_abi_version() -> u32 {
    PP_ABI_VERSION
}

/// The calling thread's last error message (empty if none). Valid until this thread's next policyport call.
#[unsafe(no_mangle)]
pub extern "C" fn pp_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Load a `.policy` artifact (`bytes`, `len`) on a native backend (`backend`: a `PpBackend` value, e.g.
/// `PP_BACKEND_CPU`); `*out` receives the policy.
///
/// # Safety
/// `bytes` covers `len` readable bytes; `out` is a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_load(
    bytes: *const u8,
    len: usize,
    backend: u32,
    out: *mut *mut PpPolicy,
) -> PpStatus {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: this function's contract: `bytes` covers `len` readable bytes, unchanged during the call (the
        // slice does not outlive it: `load` copies what it keeps).
        let bytes = unsafe { bytes_arg(bytes, len) }?;
        let backend = PpBackend::from_code(backend).ok_or_else(|| {
            (
                PpStatus::BadCall,
                format!(
                    "backend {backend}: PP_BACKEND_CPU (0), PP_BACKEND_FLEX (1) or PP_BACKEND_CPU_BF16 (2)"
                ),
            )
        })?;
        let loaded = match backend {
            PpBackend::Cpu => CompiledPolicy::load(bytes, Backend::Cpu),
            PpBackend::Flex => CompiledPolicy::load(bytes, Backend::Flex),
            PpBackend::CpuBf16 => CompiledPolicy::load_cpu(
                bytes,
                policyport::CpuOptions {
                    precision: policyport::Precision::Bf16,
                },
            ),
        };
        let policy = loaded.map_err(|e| (status_of(&e), e.to_string()))?;
        let p = Box::new(PpPolicy::new(policy));
        // SAFETY: `out` is non-null (checked above) and writable (this function's contract).
        unsafe { *out = Box::into_raw(p) };
        Ok(())
    })
}

static RUNTIMES: Mutex<Vec<(std::path::PathBuf, Arc<WasmRuntime>)>> = Mutex::new(Vec::new());

/// Where `pp_policy_load_wasm` keeps precompiled plugins (a private, per-user directory).
fn cache_dir() -> Option<std::path::PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    var("POLICYPORT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("policyport").join("wasm")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("policyport").join("wasm")))
}

/// Load an artifact inside the wasm sandbox: `plugin_path` is `policyport_plugin.wasm` (compiled once per path
/// and process; the compiled module is cached in this user's private cache directory — `$POLICYPORT_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/policyport/wasm`, else `$HOME/.cache/policyport/wasm`, mode 0700 — and compiled
/// without a cache when that directory is not private; see `WasmRuntime::with_cache_dir`); `memory_bytes` caps the
/// instance's memory, `deadline_ms` bounds every call (0 = defaults: 256 MiB, 1000 ms).
///
/// # Safety
/// `bytes` covers `len` bytes; `plugin_path` is a NUL-terminated path; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_load_wasm(
    bytes: *const u8,
    len: usize,
    plugin_path: *const c_char,
    memory_bytes: usize,
    deadline_ms: u32,
    out: *mut *mut PpPolicy,
) -> PpStatus {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if plugin_path.is_null() {
            return Err(null("plugin_path"));
        }
        // SAFETY: this function's contract: `bytes` covers `len` readable bytes, unchanged during the call (the
        // slice does not outlive it).
        let bytes = unsafe { bytes_arg(bytes, len) }?;
        let path = std::path::PathBuf::from(
            // SAFETY: non-null (checked above) and, by the contract, a NUL-terminated string, read here only
            // (copied into the owned path before anything else runs).
            unsafe { CStr::from_ptr(plugin_path) }
                .to_string_lossy()
                .into_owned(),
        );
        let rt = {
            let mut rts = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
            match rts.iter().find(|(p, _)| *p == path) {
                Some((_, rt)) => rt.clone(),
                None => {
                    let wasm = std::fs::read(&path)
                        .map_err(|e| (PpStatus::Io, format!("{}: {e}", path.display())))?;
                    // The cache only saves compile time: without a usable private directory, compile (an
                    // error of the module itself comes from `new` either way).
                    let rt = match cache_dir() {
                        Some(dir) => {
                            WasmRuntime::with_cache_dir(&wasm, &dir).or_else(|e| match e {
                                WasmError::Cache(_) => WasmRuntime::new(&wasm),
                                other => Err(other),
                            })
                        }
                        None => WasmRuntime::new(&wasm),
                    }
                    .map_err(|e| (wasm_status(&e), e.to_string()))?;
                    rts.push((path, rt.clone()));
                    rt
                }
            }
        };
        let mut limits = WasmLimits::default();
        if memory_bytes > 0 {
            limits.memory_bytes = memory_bytes;
        }
        if deadline_ms > 0 {
            limits.deadline = std::time::Duration::from_millis(deadline_ms as u64);
        }
        let policy = policyport_wasmtime::load(&rt, bytes, limits)
            .map_err(|e| (status_of(&e), e.to_string()))?;
        let p = Box::new(PpPolicy::new(policy));
        // SAFETY: `out` is non-null (checked above) and writable (this function's contract).
        unsafe { *out = Box::into_raw(p) };
        Ok(())
    })
}

/// Describe a policy.
///
/// # Safety
/// `policy` came from a load function and was not freed; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_info(policy: *const PpPolicy, out: *mut PpInfo) -> PpStatus {
    guard(|| {
        // SAFETY: the contract: `policy` is null (refused) or a live policy from a load function, not freed, and
        // not used by another thread meanwhile (the module's rule), so a shared borrow for this call is valid.
        let p = unsafe { policy.as_ref() }.ok_or_else(|| null("policy"))?;
        // SAFETY: the contract: `out` is null (refused) or an aligned, writable `PpInfo` the caller does not
        // touch during the call.
        let out = unsafe { out.as_mut() }.ok_or_else(|| null("out"))?;
        let i = &p.info;
        *out = PpInfo {
            obs_len: i.obs_len as u32,
            action_len: i.action_len as u32,
            dist_params_len: i.dist_params_len as u32,
            has_value: i.has_value as u32,
            discrete: i.action.is_discrete() as u32,
            sandboxed: (i.backend == Backend::Wasmtime) as u32,
        };
        Ok(())
    })
}

/// One step for `batch` envs with ids `env_offset, env_offset + 1, …`. `obs`: `batch × obs_len` floats.
/// `sample` 0 = deterministic, else draw with (seed, env, step). Outputs (any may be null to skip):
/// `discrete_actions` (`batch × action_len` int64, discrete policies), `continuous_actions` (float, continuous
/// policies), `value` (`batch`), `dist_params` (`batch × dist_params_len`). `episode_starts` (null for none):
/// `batch` bytes, non-zero where the row's env starts a new episode — its recurrent state is zeroed before the
/// step (the same state model as the Rust `Request`, the wasm plugin and the browser).
///
/// # Safety
/// `policy` is live and not used by another thread during the call; non-null buffers have the sizes above.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_policy_act(
    policy: *mut PpPolicy,
    obs: *const f32,
    batch: usize,
    env_offset: u32,
    sample: i32,
    seed: u64,
    step: u64,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
    dist_params: *mut f32,
    episode_starts: *const u8,
) -> PpStatus {
    // SAFETY: the caller's contract is `pp_policy_act_masked`'s with no mask.
    unsafe {
        pp_policy_act_masked(
            policy,
            obs,
            batch,
            env_offset,
            sample,
            seed,
            step,
            discrete_actions,
            continuous_actions,
            value,
            dist_params,
            episode_starts,
            std::ptr::null(),
            f32::NAN,
        )
    }
}

/// [`pp_policy_act`] with the head controls of format 1.4 (ABI version 5). `action_mask` (null for none):
/// `batch × dist_params_len` bytes of a discrete policy, one per logit or Q value (multi-discrete components
/// concatenated), non-zero allowing the action — forbidden actions are never chosen, and their `dist_params`
/// read -FLT_MAX; every component of every row must allow one action (else `PP_STATUS_BAD_CALL`, and nothing
/// changes). `epsilon`: a Q-value policy's exploration rate for this call, or NaN for the artifact's. Both routes
/// take them (the sandbox through the plugin ABI's `pp_act_masked`, version 6).
///
/// # Safety
/// As [`pp_policy_act`]; a non-null `action_mask` covers `batch × dist_params_len` bytes.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_policy_act_masked(
    policy: *mut PpPolicy,
    obs: *const f32,
    batch: usize,
    env_offset: u32,
    sample: i32,
    seed: u64,
    step: u64,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
    dist_params: *mut f32,
    episode_starts: *const u8,
    action_mask: *const u8,
    epsilon: f32,
) -> PpStatus {
    // SAFETY: the caller's contract, with the env ids a range.
    unsafe {
        act_with(
            policy,
            obs,
            batch,
            Ids::Range(env_offset),
            sample,
            seed,
            step,
            Outputs {
                discrete_actions,
                continuous_actions,
                value,
                dist_params,
            },
            episode_starts,
            action_mask,
            epsilon,
        )
    }
}

/// [`pp_policy_act_masked`] with one env id per row (ABI version 6) instead of a range: `env_ids` covers
/// `batch` ids, distinct for a recurrent policy (`PP_STATUS_BAD_CALL` otherwise) — each row's sampling stream and
/// recurrent state, so a game's agents keep their env ids whatever rows they land in. `action_mask` null and
/// `epsilon` NaN for none, as there.
///
/// # Safety
/// As [`pp_policy_act_masked`]; `env_ids` covers `batch` ids.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_policy_act_ids(
    policy: *mut PpPolicy,
    obs: *const f32,
    batch: usize,
    env_ids: *const u32,
    sample: i32,
    seed: u64,
    step: u64,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
    dist_params: *mut f32,
    episode_starts: *const u8,
    action_mask: *const u8,
    epsilon: f32,
) -> PpStatus {
    if env_ids.is_null() {
        return guard(|| Err(null("env_ids")));
    }
    // SAFETY: the caller's contract.
    unsafe {
        act_with(
            policy,
            obs,
            batch,
            Ids::List(env_ids),
            sample,
            seed,
            step,
            Outputs {
                discrete_actions,
                continuous_actions,
                value,
                dist_params,
            },
            episode_starts,
            action_mask,
            epsilon,
        )
    }
}

/// Which env ids an act call names: a range, or a caller's list of `batch` ids.
#[derive(Clone, Copy)]
enum Ids {
    Range(u32),
    List(*const u32),
}

/// The caller's output buffers (each may be null).
#[derive(Clone, Copy)]
struct Outputs {
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
    dist_params: *mut f32,
}

/// The one act path of both act entry points.
///
/// # Safety
/// `pp_policy_act_masked`'s contract; a `Ids::List` pointer covers `batch` ids.
#[allow(clippy::too_many_arguments)]
unsafe fn act_with(
    policy: *mut PpPolicy,
    obs: *const f32,
    batch: usize,
    ids: Ids,
    sample: i32,
    seed: u64,
    step: u64,
    outputs: Outputs,
    episode_starts: *const u8,
    action_mask: *const u8,
    epsilon: f32,
) -> PpStatus {
    let Outputs {
        discrete_actions,
        continuous_actions,
        value,
        dist_params,
    } = outputs;
    guard(|| {
        // SAFETY: the contract: `policy` is null (refused) or a live policy from a load function that no other
        // thread uses during the call, so this call may borrow it mutably.
        let p = unsafe { policy.as_mut() }.ok_or_else(|| null("policy"))?;
        if obs.is_null() {
            return Err(null("obs"));
        }
        // The batch bounds every slice made below (episode_starts was read as `batch` bytes before the runtime
        // checked the batch).
        if batch == 0 || batch > policyport::MAX_BATCH {
            return Err((
                PpStatus::BadCall,
                format!("batch {batch} is not in 1..={}", policyport::MAX_BATCH),
            ));
        }
        aligned(obs, "obs")?;
        aligned(discrete_actions, "discrete_actions")?;
        aligned(continuous_actions, "continuous_actions")?;
        aligned(value, "value")?;
        aligned(dist_params, "dist_params")?;
        if !episode_starts.is_null() {
            policyport::flags_into(
                // SAFETY: non-null here; the contract: `batch` readable bytes (u8: always aligned); batch is in
                // 1..=MAX_BATCH (checked above), far below isize::MAX.
                unsafe { std::slice::from_raw_parts(episode_starts, batch) },
                &mut p.starts,
            );
        }
        let starts = (!episode_starts.is_null()).then_some(&p.starts[..]);
        let mask_len = p.session.policy().head().mask_len();
        if !action_mask.is_null() {
            let n = batch
                .checked_mul(mask_len)
                .ok_or((PpStatus::BadCall, "batch too large".into()))?;
            policyport::flags_into(
                // SAFETY: the caller's contract: a non-null mask covers batch × dist_params_len bytes.
                unsafe { std::slice::from_raw_parts(action_mask, n) },
                &mut p.mask,
            );
        }
        let mask = (!action_mask.is_null()).then_some(&p.mask[..]);
        let epsilon = (!epsilon.is_nan()).then_some(epsilon);
        let mode = if sample != 0 {
            ActMode::Sample { seed, step }
        } else {
            ActMode::Deterministic
        };
        let envs = match ids {
            Ids::Range(start) => EnvIds::Range(start),
            Ids::List(list) => {
                aligned(list, "env_ids")?;
                // SAFETY: the caller's contract: the list covers `batch` ids (batch was bounded above).
                EnvIds::List(unsafe { std::slice::from_raw_parts(list, batch) })
            }
        };
        let n = batch
            .checked_mul(p.info.obs_len)
            .ok_or((PpStatus::BadCall, "batch too large".into()))?;
        // SAFETY: `obs` is non-null and aligned (both checked above); the contract: it covers `batch × obs_len` =
        // n readable floats, unchanged during the call.
        let o = Observations::F32(unsafe { std::slice::from_raw_parts(obs, n) });
        // A null `value` buffer: the value is not computed (a PPO critic's layers are skipped).
        let req = Request {
            episode_starts: starts,
            action_mask: mask,
            epsilon,
            skip_value: value.is_null(),
            ..Request::new(o, batch, mode).envs(envs)
        };
        let out = p
            .session
            .act(&req)
            .map_err(|e| (status_of(&e), e.to_string()))?;
        // SAFETY: the caller's contract: non-null buffers have the batch's sizes.
        unsafe {
            copy_out(&out.discrete, discrete_actions);
            copy_out(&out.continuous, continuous_actions);
            copy_out(&out.value, value);
            copy_out(&out.dist_params, dist_params);
        }
        Ok(())
    })
}

/// Zero the recurrent state of `n` envs (no-op for feed-forward policies).
///
/// # Safety
/// `policy` is live; `envs` covers `n` ids.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_reset(
    policy: *mut PpPolicy,
    envs: *const u32,
    n: usize,
) -> PpStatus {
    guard(|| {
        // SAFETY: the contract: `policy` is null (refused) or live, and (the module's rule) used by one thread at
        // a time, so this call may borrow it mutably.
        let p = unsafe { policy.as_mut() }.ok_or_else(|| null("policy"))?;
        let ids = if n == 0 {
            &[][..]
        } else if envs.is_null() {
            return Err(null("envs"));
        } else if n > policyport::MAX_BATCH {
            return Err((
                PpStatus::BadCall,
                format!("{n} env ids (at most {})", policyport::MAX_BATCH),
            ));
        } else {
            aligned(envs, "envs")?;
            // SAFETY: non-null and aligned (checked above), n ≤ MAX_BATCH; the contract: `envs` covers n ids.
            unsafe { std::slice::from_raw_parts(envs, n) }
        };
        p.session
            .reset(ids)
            .map_err(|e| (status_of(&e), e.to_string()))
    })
}

/// Split this policy's act() over `threads` threads by batch rows (the calling thread and `threads - 1` workers
/// the policy owns; 0: one per core; 1: the default). The native cpu backend only: `PP_STATUS_BACKEND` on the
/// others for more than 1 thread (the sandboxed plugin runs on the caller's thread), and for more than 256.
/// Results are identical whatever the count.
///
/// # Safety
/// `policy` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_set_threads(policy: *mut PpPolicy, threads: usize) -> PpStatus {
    guard(|| {
        // SAFETY: the contract: `policy` is null (refused) or live, and (the module's rule) used by one thread at
        // a time, so this call may borrow it mutably.
        let p = unsafe { policy.as_mut() }.ok_or_else(|| null("policy"))?;
        p.session
            .set_threads(threads)
            .map_err(|e| (status_of(&e), e.to_string()))
    })
}

/// How this policy's act() uses its threads (`pp_policy_set_threads`): `PP_THREAD_SPLIT_MEASURED` (0, the default:
/// a batch is split only while that measures faster than the calling thread alone, so threads never slow act()
/// down when the game's own threads take the cores) or `PP_THREAD_SPLIT_ALWAYS` (1). Another code is
/// `PP_STATUS_BAD_CALL`. The same results either way; a no-op on backends without threads.
///
/// # Safety
/// `policy` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_set_thread_split(policy: *mut PpPolicy, split: u32) -> PpStatus {
    guard(|| {
        // SAFETY: as in `pp_policy_set_threads`.
        let p = unsafe { policy.as_mut() }.ok_or_else(|| null("policy"))?;
        let split = match split {
            PP_THREAD_SPLIT_MEASURED => policyport::ThreadSplit::Measured,
            PP_THREAD_SPLIT_ALWAYS => policyport::ThreadSplit::Always,
            other => {
                return Err((
                    PpStatus::BadCall,
                    format!(
                        "thread split {other}: PP_THREAD_SPLIT_MEASURED (0) or PP_THREAD_SPLIT_ALWAYS (1)"
                    ),
                ));
            }
        };
        p.session.set_thread_split(split);
        Ok(())
    })
}

/// Free a policy (null is ignored).
///
/// # Safety
/// `policy` came from a load function and is not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_policy_free(policy: *mut PpPolicy) {
    if !policy.is_null() {
        // SAFETY: the contract: a non-null `policy` is the `Box` a load function leaked (`Box::into_raw`), not
        // freed before and not used afterwards, so it is dropped exactly once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(policy) })));
    }
}

// ---- Agents (ABI version 6): many game agents by stable id, one batched act() per tick -------------------------

/// Agents acting through one policy (crate `policyport-agents`): agents by stable 64-bit id, one batched act()
/// per tick, recurrent memory per agent, a new episode whenever an agent (re)spawns.
pub struct PpAgents {
    agents: Agents,
    /// Mask bytes as flags (reused across calls).
    mask: Vec<bool>,
    /// `pp_agents_tick`'s ids and outputs (reused across calls).
    ids: Vec<AgentId>,
    rows: RowOutputs,
}

fn agents_status(e: &AgentsError) -> PpStatus {
    match e {
        AgentsError::UnknownAgent(_)
        | AgentsError::AlreadyObserved(_)
        | AgentsError::MaskLength { .. }
        | AgentsError::MaskOnContinuous { .. } => PpStatus::BadCall,
        AgentsError::ObservationLength { .. } => PpStatus::BadObservation,
        AgentsError::TooManyAgents { .. } => PpStatus::TooLarge,
        AgentsError::Policy(p) => status_of(p),
        AgentsError::Unavailable(_) => PpStatus::Backend,
    }
}

fn agents_err(e: AgentsError) -> (PpStatus, String) {
    (agents_status(&e), e.to_string())
}

/// Turn a loaded policy (native or sandboxed) into agents. On success `*policy` is consumed (freed: do not use
/// or free it again) and `*out` holds the agents; on error nothing changes. Its intra-op threads
/// (`pp_policy_set_threads`) carry over: set them before this call. `sample` 0: deterministic actions;
/// else sampled from the Philox stream (`seed`, the agent's env id, the tick). `max_agents` 0: 65536.
///
/// # Safety
/// `policy` is a live handle not used by another thread; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_new(
    policy: *mut PpPolicy,
    seed: u64,
    sample: i32,
    max_agents: usize,
    out: *mut *mut PpAgents,
) -> PpStatus {
    guard(|| {
        if policy.is_null() {
            return Err(null("policy"));
        }
        if out.is_null() {
            return Err(null("out"));
        }
        let config = AgentsConfig {
            seed,
            deterministic: sample == 0,
            max_agents: if max_agents == 0 {
                policyport_agents::DEFAULT_MAX_AGENTS
            } else {
                max_agents
            },
            // `pp_agents_act` computes values, for `pp_agents_action`'s `value`; `pp_agents_tick` computes them
            // only for a non-null `value` buffer.
            values: true,
        };
        // SAFETY: non-null (checked above); the contract: a live policy from a load function (a leaked `Box`)
        // that no other thread uses; it is consumed here, as this function's docs tell the caller.
        let p = unsafe { Box::from_raw(policy) };
        // The policy's session itself: what `pp_policy_set_threads` set carries over.
        let agents = Agents::from_session(p.session, config);
        let a = Box::new(PpAgents {
            agents,
            mask: vec![],
            ids: vec![],
            rows: RowOutputs::default(),
        });
        // SAFETY: `out` is non-null (checked above) and writable (this function's contract).
        unsafe { *out = Box::into_raw(a) };
        Ok(())
    })
}

/// The caller's agents handle, or the typed refusal of a null one.
///
/// # Safety
/// `a` is null or a live `PpAgents` from `pp_agents_new` that no other thread uses while the returned borrow lives.
unsafe fn agents_mut<'a>(a: *mut PpAgents) -> Result<&'a mut PpAgents, (PpStatus, String)> {
    // SAFETY: this function's contract.
    unsafe { a.as_mut() }.ok_or_else(|| null("agents"))
}

/// A new agent; `*id` receives its id. Its first act() starts a new episode (fresh recurrent state).
///
/// # Safety
/// `agents` is live and not used by another thread during the call; `id` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_spawn(agents: *mut PpAgents, id: *mut u64) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        let a = unsafe { agents_mut(agents) }?;
        if id.is_null() {
            return Err(null("id"));
        }
        let new = a.agents.spawn().map_err(agents_err)?;
        // SAFETY: `id` is non-null (checked above) and writable (this function's contract).
        unsafe { *id = new.to_bits() };
        Ok(())
    })
}

/// The agent is gone: its id is dead from now on (`PP_STATUS_BAD_CALL` wherever it is passed) and its env id
/// goes back to the free list; an observation it had staged this tick is withdrawn.
///
/// # Safety
/// `agents` is live and not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_despawn(agents: *mut PpAgents, id: u64) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        unsafe { agents_mut(agents) }?
            .agents
            .despawn(AgentId::from_bits(id))
            .map_err(agents_err)
    })
}

/// The same agent starts a new episode at its next act() (its recurrent state is zeroed before that step).
///
/// # Safety
/// `agents` is live and not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_respawn(agents: *mut PpAgents, id: u64) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        unsafe { agents_mut(agents) }?
            .agents
            .respawn(AgentId::from_bits(id))
            .map_err(agents_err)
    })
}

/// Stage agent `id`'s observation (`obs_len` floats, the policy's observation) for the next `pp_agents_act`;
/// `action_mask` (null for none): `mask_len` bytes, one per logit / Q value, non-zero allowing the action.
///
/// # Safety
/// `agents` is live and not used by another thread; `obs` covers `obs_len` floats, a non-null `action_mask`
/// `mask_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_observe(
    agents: *mut PpAgents,
    id: u64,
    obs: *const f32,
    obs_len: usize,
    action_mask: *const u8,
    mask_len: usize,
) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        let a = unsafe { agents_mut(agents) }?;
        if obs.is_null() {
            return Err(null("obs"));
        }
        aligned(obs, "obs")?;
        if obs_len > isize::MAX as usize / 4 || mask_len > isize::MAX as usize {
            return Err((PpStatus::BadCall, "a length larger than any object".into()));
        }
        // SAFETY: non-null and aligned (checked above), obs_len · 4 bytes within isize::MAX (checked); the
        // contract: `obs` covers `obs_len` readable floats.
        let o = unsafe { std::slice::from_raw_parts(obs, obs_len) };
        let id = AgentId::from_bits(id);
        if action_mask.is_null() {
            return a.agents.observe(id, o).map_err(agents_err);
        }
        policyport::flags_into(
            // SAFETY: non-null here, u8 (always aligned), mask_len within isize::MAX (checked); the contract: a
            // non-null mask covers `mask_len` bytes.
            unsafe { std::slice::from_raw_parts(action_mask, mask_len) },
            &mut a.mask,
        );
        let PpAgents { agents, mask, .. } = a;
        agents.observe_masked(id, o, mask).map_err(agents_err)
    })
}

/// One act() for every agent observed since the last one; `*acted` (may be null) receives how many acted. On
/// error nothing changes (the observations stay staged).
///
/// # Safety
/// `agents` is live and not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_act(agents: *mut PpAgents, acted: *mut usize) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        let a = unsafe { agents_mut(agents) }?;
        let n = a.agents.act().map_err(agents_err)?.len();
        if !acted.is_null() {
            // SAFETY: non-null; the contract lets `acted` be null or a writable `usize` (the docs: "may be null").
            unsafe { *acted = n };
        }
        Ok(())
    })
}

/// Agent `id`'s outputs of the last act(): `discrete_actions` (`action_len` int64, discrete policies) or
/// `continuous_actions` (`action_len` floats), and `value` (one float, policies with a value); any may be null.
/// `PP_STATUS_BAD_CALL` if `id` did not act in the last act().
///
/// # Safety
/// `agents` is live and not used by another thread; non-null buffers have the sizes above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_action(
    agents: *mut PpAgents,
    id: u64,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        let a = unsafe { agents_mut(agents) }?;
        aligned(discrete_actions, "discrete_actions")?;
        aligned(continuous_actions, "continuous_actions")?;
        aligned(value, "value")?;
        let id = AgentId::from_bits(id);
        let tick = a.agents.last();
        let row = tick.row(id).ok_or_else(|| {
            (
                PpStatus::BadCall,
                format!("{id} did not act in the last act() (not observed, or not alive)"),
            )
        })?;
        // SAFETY: the three buffers were checked aligned above; the contract: non-null ones cover one agent's
        // outputs (`action_len` actions, one value), which is what `write_row` copies.
        unsafe {
            write_row(
                &a.agents,
                tick.outputs(),
                row,
                discrete_actions,
                continuous_actions,
                value,
            )
        };
        Ok(())
    })
}

/// Copy row `row` of `out` into the caller's buffers (null ones skipped).
///
/// # Safety
/// Non-null buffers cover one row: `action_len` actions, one value.
unsafe fn write_row(
    agents: &Agents,
    out: &ActOutputs,
    row: usize,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
) {
    let k = agents.action_len();
    let span = row * k..(row + 1) * k;
    // SAFETY: each source is at most one row (`action_len` actions, one value; `get` yields an empty slice
    // otherwise), which the caller's contract says a non-null buffer covers.
    unsafe {
        copy_out(
            out.discrete.get(span.clone()).unwrap_or(&[]),
            discrete_actions,
        );
        copy_out(out.continuous.get(span).unwrap_or(&[]), continuous_actions);
        copy_out(out.value.get(row..row + 1).unwrap_or(&[]), value);
    }
}

/// A whole tick in one call (what an engine's per-frame system does): stage `n` agents `ids` with their
/// observations (`n × obs_len` floats, row i for `ids[i]`) and masks (null, or `n × mask_len` bytes), act once,
/// and write each agent's outputs in the caller's order (`n × action_len` actions, `n` values; null to skip).
/// Observations staged earlier with `pp_agents_observe` act in the same call. Nothing changes on error (rows
/// staged by this call are withdrawn).
///
/// # Safety
/// `agents` is live and not used by another thread; the buffers have the sizes above.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_agents_tick(
    agents: *mut PpAgents,
    ids: *const u64,
    n: usize,
    obs: *const f32,
    action_mask: *const u8,
    discrete_actions: *mut i64,
    continuous_actions: *mut f32,
    value: *mut f32,
) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        let a = unsafe { agents_mut(agents) }?;
        if n > policyport::MAX_BATCH {
            return Err((
                PpStatus::BadCall,
                format!("{n} agents in one tick: at most {}", policyport::MAX_BATCH),
            ));
        }
        if n > 0 && (ids.is_null() || obs.is_null()) {
            return Err(null(if ids.is_null() { "ids" } else { "obs" }));
        }
        aligned(ids, "ids")?;
        aligned(obs, "obs")?;
        aligned(discrete_actions, "discrete_actions")?;
        aligned(continuous_actions, "continuous_actions")?;
        aligned(value, "value")?;
        let (o_len, m_len) = (a.agents.obs_len(), a.agents.mask_len());
        let ids = if n == 0 {
            &[][..]
        } else {
            // SAFETY: non-null (checked above when n > 0) and aligned (checked), n ≤ MAX_BATCH; the contract:
            // `ids` covers n ids.
            unsafe { std::slice::from_raw_parts(ids, n) }
        };
        let obs = if n == 0 {
            &[][..]
        } else {
            // SAFETY: non-null (checked above when n > 0) and aligned (checked); the contract: `obs` covers
            // n × obs_len floats.
            unsafe { std::slice::from_raw_parts(obs, n * o_len) }
        };
        if !action_mask.is_null() {
            policyport::flags_into(
                // SAFETY: non-null here, u8 (always aligned); the contract: a non-null mask covers n × mask_len
                // bytes.
                unsafe { std::slice::from_raw_parts(action_mask, n * m_len) },
                &mut a.mask,
            );
        }
        let PpAgents {
            agents,
            mask,
            ids: staged,
            rows,
        } = a;
        staged.clear();
        staged.extend(ids.iter().map(|b| AgentId::from_bits(*b)));
        let masks = (!action_mask.is_null()).then_some(&mask[..]);
        // Values only for a caller that takes them (null `value`: the critic's layers are skipped); the handle's
        // own setting (for `pp_agents_act`) is restored after the call.
        let values = agents.values();
        agents.set_values(!value.is_null());
        let ticked = agents.tick_rows(staged, obs, masks, rows);
        agents.set_values(values);
        ticked.map_err(agents_err)?;
        // SAFETY: the caller's contract: non-null buffers cover `n` agents' outputs.
        unsafe {
            copy_out(&rows.discrete, discrete_actions);
            copy_out(&rows.continuous, continuous_actions);
            copy_out(&rows.value, value);
        }
        Ok(())
    })
}

/// What the agents' policy takes and gives, per agent.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PpAgentsInfo {
    pub obs_len: u32,
    pub action_len: u32,
    /// Action-mask bytes per agent (0: continuous actions, no mask).
    pub mask_len: u32,
    pub discrete: u32,
    /// Agents alive now.
    pub alive: u32,
    /// Ticks acted so far (the sampling step of the next act()).
    pub tick: u64,
}

/// # Safety
/// `agents` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_info(
    agents: *const PpAgents,
    out: *mut PpAgentsInfo,
) -> PpStatus {
    guard(|| {
        // SAFETY: the contract: `agents` is null (refused) or live, and (the module's rule) not used by another
        // thread during the call, so a shared borrow for the call is valid.
        let a = unsafe { agents.as_ref() }.ok_or_else(|| null("agents"))?;
        if out.is_null() {
            return Err(null("out"));
        }
        let g = &a.agents;
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        // SAFETY: `out` is non-null (checked above) and, by the contract, an aligned, writable `PpAgentsInfo`.
        unsafe {
            *out = PpAgentsInfo {
                obs_len: n(g.obs_len()),
                action_len: n(g.action_len()),
                mask_len: n(g.mask_len()),
                discrete: u32::from(g.is_discrete()),
                alive: n(g.len()),
                tick: g.tick(),
            }
        };
        Ok(())
    })
}

/// Sampled (`sample` non-zero) or deterministic actions from the next act() on.
///
/// # Safety
/// `agents` is live and not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_set_sampling(agents: *mut PpAgents, sample: i32) -> PpStatus {
    guard(|| {
        // SAFETY: the entry point's contract: `agents` is null or live and this thread's for the call.
        unsafe { agents_mut(agents) }?
            .agents
            .set_deterministic(sample == 0);
        Ok(())
    })
}

/// Free the agents (and their policy). Null is a no-op.
///
/// # Safety
/// `agents` came from `pp_agents_new` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_agents_free(agents: *mut PpAgents) {
    if !agents.is_null() {
        // SAFETY: the contract: a non-null `agents` is the `Box` `pp_agents_new` leaked, not freed before and not
        // used afterwards, so it is dropped exactly once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(agents) })));
    }
}
