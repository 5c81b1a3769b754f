//! policyport in the browser: the guest runtime as a wasm-bindgen package.
//!
//! ```js
//! import init, { Policy } from "./pkg/policyport_web.js";
//! await init();
//! const policy = await Policy.load(bytes, { backend: "auto", batch: 256 });
//! const { actions, value } = await policy.act(obs, { seed: 7, step: t });
//! ```
//!
//! Two bundles come from this crate: CPU-only (the native kernels compiled to wasm SIMD128; small) and, with the
//! `webgpu` feature, the full one (burn-wgpu on the browser's WebGPU with the WGSL kernels of `shaders/`). The
//! API is the same in both: asking the CPU bundle for `"webgpu"` is a typed error, and `"auto"` falls back to CPU.
//!
//! Why the shapes below:
//! - WebGPU cannot block, so loading (adapter request, pipeline warm-up) and act() are async. act() returns a
//!   Promise on every backend so callers never branch; `actSync` is there for CPU-only callers who want to skip
//!   a microtask per step.
//! - The policy lives behind `Rc<RefCell<…>>` because a JS caller may start a second act() before the first
//!   resolves; that gets a typed error ("busy") instead of a borrow panic. Nothing here panics on bad input:
//!   every failure is a JS `Error` whose `name` says which kind (`PolicyportArtifactError`, …).
//! - `std::time::Instant` does not exist on wasm32-unknown-unknown: timing (auto selection, first-act latency)
//!   uses `performance.now()`.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{
    Float32Array, Float64Array, Int32Array, Object, Promise, Reflect, Uint8Array, Uint32Array,
};
use policyport::{
    ActMode, ActOutputs, Backend, CompiledPolicy, EnvIds, ErrorKind, Observations, PolicyError,
    Request, Session,
};
use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** Which backend to run on. `auto` times every available backend at `batch` and keeps the fastest. */
export type BackendChoice = "auto" | "webgpu" | "cpu";

export interface LoadOptions {
  /** Default "auto". */
  backend?: BackendChoice;
  /** The batch size `auto` times at (default 1). */
  batch?: number;
  /** Most envs the recurrent state may hold (recurrent policies only; state grows on demand; default 65536). */
  numEnvs?: number;
  /** Threads of the cpu backend's act() (default 1). The threads bundle (pkg/cpu-threads) borrows `threads - 1`
   *  Web Workers started by `startThreads()`; other bundles refuse more than 1 (PolicyportBackendError). */
  threads?: number;
}

export interface ActOptions {
  /** "sample" (default) draws from the seeded stream (seed, env id, step); "deterministic" takes the mode. */
  mode?: "sample" | "deterministic";
  seed?: number | bigint;
  step?: number | bigint;
  /** Env id of row 0 (rows are envStart, envStart + 1, ...); default 0. Ignored when envIds is given. */
  envStart?: number;
  /** One env id per row. */
  envIds?: Uint32Array;
  /** Per row, non-zero when the env starts a new episode: its recurrent state is zeroed before this step. */
  episodeStarts?: Uint8Array;
  /** Discrete policies: `batch x distParamsLen` flags, one per logit or Q value, non-zero allowing the action
   *  (forbidden actions are never chosen; their distParams read -3.4028235e38). A component of a row allowing
   *  nothing is a PolicyportArgumentError. */
  actionMask?: Uint8Array;
  /** A Q-value policy's exploration rate for this call (sampled mode) instead of the artifact's. */
  epsilon?: number;
  /** false: no value estimate (`value` is null) — the same actions and distParams; the cpu backend skips the
   *  layers only the critic needs (for acting, not training). Default true. */
  value?: boolean;
  /** The observations' full shape, `[batch, ...observation shape]`: checked against the policy's (a
   *  PolicyportObservationError names both), so frames in another layout are not read silently. */
  shape?: number[];
}

export interface ActResult {
  batch: number;
  discrete: boolean;
  /** `batch x actionLen`: Int32Array for discrete / multi-discrete spaces, Float32Array for continuous ones. */
  actions: Int32Array | Float32Array;
  /** Value estimate per row, or null without a critic (or when the call passed `value: false`). */
  value: Float32Array | null;
  /** Distribution parameters per row (logits, or mean then log-std; Q values; a deterministic actor's output). */
  distParams: Float32Array;
}

export interface PolicyInfo {
  name: string;
  backend: "cpu" | "webgpu";
  /** How `auto` chose (the measured latencies), or null when a backend was asked for. */
  selection: string | null;
  formatVersion: [number, number];
  observation: unknown;
  action: unknown;
  obsLen: number;
  actionLen: number;
  distParamsLen: number;
  discrete: boolean;
  hasValue: boolean;
  recurrentStates: number;
  parameters: number;
  dispatchesPerAct: number | null;
  /** load() wall time, warm-up included (ms). */
  loadMs: number;
  /** The first act() after load (µs), null before it. */
  firstActUs: number | null;
  bundle: "cpu" | "cpu-threads" | "webgpu";
  simd128: boolean;
  /** Threads act() runs on (see LoadOptions.threads). */
  threads: number;
}

export interface GoldenResult {
  name: string;
  passed: boolean;
  sampledMismatches: number;
  deterministicMismatches: number;
  maxRelErr: number;
}
"#;

#[wasm_bindgen]
extern "C" {
    /// `performance.now()` in ms (window and workers).
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

// Static constructors (burn's stack registers IR dialects with `inventory` through pliron) run once, at
// instantiation. Without an export that calls `__wasm_call_ctors`, wasm-ld treats the module as a "command" and
// wraps *every* export in a constructor call: measured 0.25-1 ms added to each JS -> wasm call of the full bundle
// (a bool getter took 260 us). Calling it from the start function makes the module a "reactor": ctors run once.
#[cfg(target_family = "wasm")]
unsafe extern "C" {
    fn __wasm_call_ctors();
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

#[wasm_bindgen(start)]
fn start() {
    #[cfg(target_family = "wasm")]
    // SAFETY: called once, by wasm-bindgen's glue right after instantiation, before any other export runs.
    unsafe {
        __wasm_call_ctors();
    }
    // The bundles build with panic = "abort" (wasm32 cannot unwind on stable): a panic traps and leaves this
    // instance unusable. Nothing on the API should panic (hostile inputs are typed errors; issue 15's classes
    // were closed at their root), but if one does, say what and where on the console instead of a bare
    // "RuntimeError: unreachable".
    std::panic::set_hook(Box::new(|info| {
        console_error(&format!(
            "policyport panicked (a bug, please report it): {info}. This page's policyport instance is unusable \
             until the page is reloaded."
        ));
    }));
}

fn now_us() -> f64 {
    performance_now() * 1000.0
}

/// Which bundle this is: "webgpu" (full), "cpu", or "cpu-threads" (the CPU bundle with wasm threads).
#[wasm_bindgen]
pub fn bundle() -> String {
    if cfg!(feature = "webgpu") {
        "webgpu"
    } else if policyport::web_workers::COMPILED {
        "cpu-threads"
    } else {
        "cpu"
    }
    .into()
}

/// True when this bundle can run act() on several threads (built with wasm threads: `startThreads`).
#[wasm_bindgen(js_name = wasmThreads)]
pub fn wasm_threads() -> bool {
    policyport::web_workers::COMPILED
}

#[cfg(target_feature = "atomics")]
#[wasm_bindgen(module = "/src/threads.js")]
extern "C" {
    #[wasm_bindgen(js_name = spawnWorkers, catch)]
    fn spawn_workers(module: JsValue, memory: JsValue, n: u32) -> Result<Promise, JsValue>;
}

/// Start `n` Web Workers on this module's shared memory and lend them to the cpu backend (threads bundle only;
/// the page must be cross-origin isolated). Resolves to the number of idle workers once every new one is ready.
/// A policy loaded with `{ threads: t }` (or `setThreads(t)`) then borrows `t - 1` of them for itself. Start
/// them once: workers live as long as the page.
#[wasm_bindgen(js_name = startThreads)]
pub async fn start_threads(n: u32) -> Result<u32, JsValue> {
    if n as usize > policyport::MAX_THREADS {
        return Err(arg_error(format!(
            "{n} workers asked for; at most {}",
            policyport::MAX_THREADS
        )));
    }
    #[cfg(target_feature = "atomics")]
    {
        // The page not cross-origin isolated, a worker that failed to load the module: a typed error.
        let failed = |e: JsValue| {
            let message = e
                .dyn_ref::<js_sys::Error>()
                .map_or_else(|| format!("{e:?}"), |e| String::from(e.message()));
            error("PolicyportBackendError", ErrorKind::Backend, message)
        };
        // The page's clock, so that sessions with threads time their steps and split only where that is
        // faster (policyport::ThreadSplit::Measured; wasm32's std has no clock).
        policyport::web_workers::set_clock(performance_now);
        let started =
            spawn_workers(wasm_bindgen::module(), wasm_bindgen::memory(), n).map_err(failed)?;
        wasm_bindgen_futures::JsFuture::from(started)
            .await
            .map_err(failed)?;
        Ok(policyport::web_workers::idle_workers() as u32)
    }
    #[cfg(not(target_feature = "atomics"))]
    {
        Err(error(
            "PolicyportNotCompiledError",
            ErrorKind::Backend,
            format!(
                "the {} bundle has no wasm threads: load pkg/cpu-threads (built with +atomics) for startThreads",
                bundle()
            ),
        ))
    }
}

/// Web Workers started by `startThreads` that no policy holds now (0 in bundles without wasm threads).
#[wasm_bindgen(js_name = idleWorkers)]
pub fn idle_workers() -> u32 {
    policyport::web_workers::idle_workers() as u32
}

/// Internal (the threads bundle's workers, guest/web/src/threads.js): lend this worker's thread to the cpu
/// backend, call `ready()` (the worker tells the page), then serve jobs forever. One call, so a thread is never on
/// the idle list without serving it (a session that borrowed it would wait for its rows forever).
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = workerServe)]
pub fn worker_serve(ready: &js_sys::Function) -> Result<(), JsValue> {
    // The page's main thread cannot serve (it may not block, and it is the caller): lent, it would take a
    // session's rows and never run them. A worker has `importScripts` and no `document`.
    let global = js_sys::global();
    let has = |name: &str| {
        Reflect::get(&global, &name.into()).is_ok_and(|v| !v.is_undefined() && !v.is_null())
    };
    if has("document") || !has("importScripts") {
        return Err(error(
            "PolicyportBackendError",
            ErrorKind::Backend,
            "workerServe runs in a Web Worker only (startThreads starts them); the page's own thread \
             cannot serve a pool",
        ));
    }
    let mut ready_error = None;
    let served = policyport::web_workers::serve_worker(|| {
        ready
            .call0(&JsValue::UNDEFINED)
            .map_err(|e| ready_error = Some(e))
            .is_ok()
    });
    match served {
        Ok(never) => match never {},
        // The callback's own exception when it threw, else the typed error.
        Err(e) => Err(ready_error.unwrap_or_else(|| policy_error(&e.into()))),
    }
}

/// Internal: this worker's `workerServe` trapped; mark it gone so nothing waits for it.
#[cfg(target_feature = "atomics")]
#[wasm_bindgen(js_name = workerTrapped)]
pub fn worker_trapped() {
    policyport::web_workers::worker_trapped();
}

/// True when the CPU kernels were compiled for wasm SIMD128.
#[wasm_bindgen]
pub fn simd128() -> bool {
    cfg!(target_feature = "simd128")
}

/// The package version.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").into()
}

/// A JS `Error` whose `name` says the kind of failure.
/// A JS `Error` named `name` whose `kind` property is the core's [`ErrorKind`] name ("call", "state", ...): the
/// same word Python's exceptions carry and the same kind the C statuses and plugin codes map from.
fn error(name: &str, kind: ErrorKind, message: impl std::fmt::Display) -> JsValue {
    let e = js_sys::Error::new(&message.to_string());
    e.set_name(name);
    let _ = Reflect::set(&e, &key("kind"), &JsValue::from_str(kind.name()));
    e.into()
}

/// An optional `Uint8Array` option as per-row flags (non-zero = true): `episodeStarts`, `actionMask`.
fn flags_field(options: &JsValue, name: &'static str) -> Result<Option<Vec<bool>>, JsValue> {
    match field(options, name)? {
        None => Ok(None),
        Some(v) => {
            let bytes = v
                .dyn_ref::<Uint8Array>()
                .ok_or_else(|| arg_error(format!("{name} must be a Uint8Array (non-zero = true)")))?
                .to_vec();
            let mut flags = Vec::with_capacity(bytes.len());
            policyport::flags_into(&bytes, &mut flags);
            Ok(Some(flags))
        }
    }
}

fn policy_error(e: &PolicyError) -> JsValue {
    let kind = e.kind();
    let name = match (e, kind) {
        // Finer than its kind (backend), and named since before kinds existed.
        (PolicyError::NotCompiled { .. }, _) => "PolicyportNotCompiledError",
        (_, ErrorKind::Artifact) => "PolicyportArtifactError",
        (_, ErrorKind::Observation) => "PolicyportObservationError",
        (_, ErrorKind::Call) => "PolicyportArgumentError",
        (_, ErrorKind::State) => "PolicyportStateError",
        (_, ErrorKind::TooLarge) => "PolicyportMemoryError",
        (_, ErrorKind::NonFinite) => "PolicyportNonFiniteError",
        _ => "PolicyportBackendError",
    };
    error(name, kind, e)
}

/// Observations of a type act() does not read (the core's observation kind, as a NumPy array of strings is in
/// Python).
fn obs_error(message: impl std::fmt::Display) -> JsValue {
    error(
        "PolicyportObservationError",
        ErrorKind::Observation,
        message,
    )
}

fn arg_error(message: impl std::fmt::Display) -> JsValue {
    error("PolicyportArgumentError", ErrorKind::Call, message)
}

thread_local! {
    static KEYS: RefCell<Vec<(&'static str, JsValue)>> = const { RefCell::new(Vec::new()) };
}

/// A property name as a JS string, made once: act() reads and writes about ten properties per call, and
/// decoding each name from wasm memory again cost more than the act() of a small policy.
fn key(name: &'static str) -> JsValue {
    KEYS.with(|keys| {
        let mut keys = keys.borrow_mut();
        if let Some((_, v)) = keys.iter().find(|(n, _)| *n == name) {
            return v.clone();
        }
        let v = JsValue::from_str(name);
        keys.push((name, v.clone()));
        v
    })
}

/// `options[key]` when it is neither undefined nor null.
fn field(options: &JsValue, key_name: &'static str) -> Result<Option<JsValue>, JsValue> {
    if options.is_undefined() || options.is_null() {
        return Ok(None);
    }
    if !options.is_object() {
        return Err(arg_error("options must be an object"));
    }
    let v = Reflect::get(options, &key(key_name))?;
    Ok((!v.is_undefined() && !v.is_null()).then_some(v))
}

/// A non-negative integer option (number or bigint) up to `max`.
fn uint_field(options: &JsValue, key: &'static str, max: u64) -> Result<Option<u64>, JsValue> {
    let Some(v) = field(options, key)? else {
        return Ok(None);
    };
    let n = if v.is_bigint() {
        u64::try_from(js_sys::BigInt::from(v.clone()))
            .map_err(|_| arg_error(format!("{key} must be a non-negative integer below 2^64")))?
    } else if let Some(f) = v.as_f64() {
        if !(f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_991.0) {
            return Err(arg_error(format!(
                "{key} must be a non-negative safe integer, got {f}"
            )));
        }
        f as u64
    } else {
        return Err(arg_error(format!("{key} must be a number or a bigint")));
    };
    if n > max {
        return Err(arg_error(format!("{key} = {n} exceeds {max}")));
    }
    Ok(Some(n))
}

enum ObsBuf {
    F32(Vec<f32>),
    U8(Vec<u8>),
}

/// Everything act() needs, copied out of JS before any await (JS may reuse its arrays meanwhile).
struct ActArgs {
    obs: ObsBuf,
    batch: usize,
    mode: ActMode,
    env_start: u32,
    env_ids: Option<Vec<u32>>,
    episode_starts: Option<Vec<bool>>,
    action_mask: Option<Vec<bool>>,
    epsilon: Option<f32>,
    /// The caller's `value: false`.
    skip_value: bool,
}

impl ActArgs {
    fn request(&self) -> Request<'_> {
        let obs = match &self.obs {
            ObsBuf::F32(v) => Observations::F32(v),
            ObsBuf::U8(v) => Observations::U8(v),
        };
        let envs = match &self.env_ids {
            Some(ids) => EnvIds::List(ids),
            None => EnvIds::Range(self.env_start),
        };
        Request {
            obs,
            batch: self.batch,
            mode: self.mode,
            envs,
            episode_starts: self.episode_starts.as_deref(),
            action_mask: self.action_mask.as_deref(),
            epsilon: self.epsilon,
            skip_value: self.skip_value,
        }
    }
}

/// The runtime's session (state, outputs, scratch) plus what the page reports.
struct Inner {
    session: Session,
    obs_len: usize,
    load_ms: f64,
    first_act_us: Option<f64>,
    backend: &'static str,
}

impl Inner {
    fn parse(&self, obs: &JsValue, options: &JsValue) -> Result<ActArgs, JsValue> {
        let obs = if let Some(a) = obs.dyn_ref::<Float32Array>() {
            ObsBuf::F32(a.to_vec())
        } else if let Some(a) = obs.dyn_ref::<Uint8Array>() {
            ObsBuf::U8(a.to_vec())
        } else if let Some(a) = obs.dyn_ref::<Float64Array>() {
            ObsBuf::F32(a.to_vec().into_iter().map(|v| v as f32).collect())
        } else if js_sys::Array::is_array(obs) {
            let a = js_sys::Array::from(obs);
            let mut v = Vec::with_capacity(a.length() as usize);
            for x in a.iter() {
                v.push(
                    x.as_f64()
                        .ok_or_else(|| obs_error("observations must be numbers"))?
                        as f32,
                );
            }
            ObsBuf::F32(v)
        } else {
            return Err(obs_error(
                "observations must be a Float32Array, Uint8Array, Float64Array or an array of numbers",
            ));
        };
        let len = match &obs {
            ObsBuf::F32(v) => v.len(),
            ObsBuf::U8(v) => v.len(),
        };
        if len == 0 {
            // No rows is a batch of 0: the runtime's batch error (kind call), as every other API reports it.
            return Err(policy_error(&PolicyError::Batch {
                batch: 0,
                max: policyport::MAX_BATCH,
            }));
        }
        if len % self.obs_len != 0 {
            return Err(error(
                "PolicyportObservationError",
                ErrorKind::Observation,
                format!(
                    "{len} numbers are not a whole number of observations of {} numbers each",
                    self.obs_len
                ),
            ));
        }
        let mut batch = len / self.obs_len;
        // The caller's shape, when given ([batch, ...obs shape]), is checked in full: the same count of numbers
        // in another layout (channels-last frames for a channels-first policy) would be read wrong.
        if let Some(v) = field(options, "shape")? {
            let dims = js_sys::Array::from(&v)
                .iter()
                .map(|d| {
                    d.as_f64()
                        .filter(|d| d.fract() == 0.0 && *d >= 0.0 && *d <= u32::MAX as f64)
                        .map(|d| d as usize)
                        .ok_or_else(|| arg_error("shape must be an array of whole numbers"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let space = &self.session.policy().manifest().observation;
            batch = policyport::batch_of_shape(space, &dims)
                .map_err(|e| policy_error(&PolicyError::from(e)))?;
            if batch * self.obs_len != len {
                return Err(error(
                    "PolicyportObservationError",
                    ErrorKind::Observation,
                    format!("shape {dims:?} does not hold the {len} numbers given"),
                ));
            }
        }
        let sample = || -> Result<ActMode, JsValue> {
            Ok(ActMode::Sample {
                seed: uint_field(options, "seed", u64::MAX)?.unwrap_or(0),
                step: uint_field(options, "step", u64::MAX)?.unwrap_or(0),
            })
        };
        let mode = match field(options, "mode")? {
            None => sample()?,
            Some(m) => match m.as_string().as_deref() {
                Some("sample") => sample()?,
                Some("deterministic") => ActMode::Deterministic,
                _ => {
                    return Err(arg_error(format!(
                        "mode must be \"sample\" or \"deterministic\", got {m:?}"
                    )));
                }
            },
        };
        let env_start = uint_field(options, "envStart", u32::MAX as u64)?.unwrap_or(0) as u32;
        let env_ids = match field(options, "envIds")? {
            None => None,
            Some(v) => Some(
                v.dyn_ref::<Uint32Array>()
                    .ok_or_else(|| arg_error("envIds must be a Uint32Array"))?
                    .to_vec(),
            ),
        };
        let episode_starts = flags_field(options, "episodeStarts")?;
        let action_mask = flags_field(options, "actionMask")?;
        let epsilon = match field(options, "epsilon")? {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .ok_or_else(|| arg_error("epsilon must be a number"))? as f32,
            ),
        };
        let skip_value = match field(options, "value")? {
            None => false,
            Some(v) => !v
                .as_bool()
                .ok_or_else(|| arg_error("value must be true or false"))?,
        };
        Ok(ActArgs {
            obs,
            batch,
            mode,
            env_start,
            env_ids,
            episode_starts,
            action_mask,
            epsilon,
            skip_value,
        })
    }

    fn result(&self) -> Result<JsValue, JsValue> {
        let out: &ActOutputs = self.session.outputs();
        let r = Object::new();
        let discrete = out.continuous.is_empty() && !out.discrete.is_empty();
        let actions: JsValue = if discrete {
            let a: Vec<i32> = out.discrete.iter().map(|&d| d as i32).collect();
            Int32Array::from(&a[..]).into()
        } else {
            Float32Array::from(&out.continuous[..]).into()
        };
        Reflect::set(&r, &key("batch"), &(out.batch as u32).into())?;
        Reflect::set(&r, &key("discrete"), &discrete.into())?;
        Reflect::set(&r, &key("actions"), &actions)?;
        let value: JsValue = if out.value.is_empty() {
            JsValue::NULL
        } else {
            Float32Array::from(&out.value[..]).into()
        };
        Reflect::set(&r, &key("value"), &value)?;
        Reflect::set(
            &r,
            &key("distParams"),
            &Float32Array::from(&out.dist_params[..]).into(),
        )?;
        Ok(r.into())
    }

    /// The clock reading to time the first act() with; later acts skip the JS call.
    fn first_act_start(&self) -> Option<f64> {
        self.first_act_us.is_none().then(now_us)
    }

    fn note_first_act(&mut self, t0: Option<f64>) {
        if let Some(t0) = t0 {
            self.first_act_us = Some(now_us() - t0);
        }
    }
}

/// A loaded, validated policy bound to one backend (`cpu` = wasm SIMD128 kernels, `webgpu`).
#[wasm_bindgen]
pub struct Policy {
    inner: Rc<RefCell<Inner>>,
}

#[wasm_bindgen]
impl Policy {
    /// Read, checksum and validate a `.policy` artifact, set up the backend and warm it (so the first act() pays
    /// no pipeline compilation). Rejects with a typed Error on a bad artifact or an unavailable backend.
    pub async fn load(
        bytes: Vec<u8>,
        #[wasm_bindgen(unchecked_optional_param_type = "LoadOptions")] options: Option<Object>,
    ) -> Result<Policy, JsValue> {
        let options: JsValue = options.map_or(JsValue::UNDEFINED, JsValue::from);
        let t0 = performance_now();
        let backend = field(&options, "backend")?
            .map(|b| b.as_string().unwrap_or_default())
            .unwrap_or_else(|| "auto".into());
        let batch =
            uint_field(&options, "batch", policyport::MAX_BATCH as u64)?.unwrap_or(1) as usize;
        let max_envs = uint_field(&options, "numEnvs", 1 << 24)?
            .map_or(policyport::DEFAULT_MAX_ENVS, |n| n as usize);
        let policy = match backend.as_str() {
            "auto" => CompiledPolicy::load_auto_async(&bytes, batch.max(1), &now_us).await,
            "cpu" => CompiledPolicy::load_async(&bytes, Backend::Cpu).await,
            "webgpu" | "wgpu" => CompiledPolicy::load_async(&bytes, Backend::Wgpu).await,
            other => {
                return Err(arg_error(format!(
                    "backend must be \"auto\", \"webgpu\" or \"cpu\", got {other:?}"
                )));
            }
        }
        .map_err(|e| policy_error(&e))?;
        let info = policy.info();
        let backend = if info.backend == Backend::Wgpu {
            "webgpu"
        } else {
            "cpu"
        };
        let threads = uint_field(&options, "threads", policyport::MAX_THREADS as u64)?.unwrap_or(1);
        let mut session = policy.session();
        session.set_max_envs(max_envs);
        if threads > 1 {
            session
                .set_threads(threads as usize)
                .map_err(|e| policy_error(&e))?;
        }
        Ok(Policy {
            inner: Rc::new(RefCell::new(Inner {
                obs_len: info.obs_len.max(1),
                session,
                load_ms: performance_now() - t0,
                first_act_us: None,
                backend,
            })),
        })
    }

    /// One step for a batch of envs: `obs` holds `batch x obsLen` numbers (batch is inferred). Resolves to the
    /// actions (+ value, distribution parameters); recurrent state advances inside the policy.
    #[wasm_bindgen(unchecked_return_type = "Promise<ActResult>")]
    pub fn act(
        &self,
        #[wasm_bindgen(
            unchecked_param_type = "Float32Array | Uint8Array | Float64Array | number[]"
        )]
        obs: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ActOptions")] options: Option<Object>,
    ) -> Promise {
        let options: JsValue = options.map_or(JsValue::UNDEFINED, JsValue::from);
        let inner = self.inner.clone();
        let args = match inner.try_borrow() {
            Ok(i) => i.parse(&obs, &options),
            Err(_) => Err(busy()),
        };
        wasm_bindgen_futures::future_to_promise(async move {
            let args = args?;
            let mut guard = inner.try_borrow_mut().map_err(|_| busy())?;
            let i = &mut *guard;
            let t0 = i.first_act_start();
            #[allow(clippy::await_holding_refcell_ref)]
            // single-threaded; a second caller gets "busy"
            i.session
                .act_async(&args.request())
                .await
                .map_err(|e| policy_error(&e))?;
            i.note_first_act(t0);
            i.result()
        })
    }

    /// act() without a Promise, for the CPU backend (a WebGPU policy answers with a typed error: its readback
    /// is asynchronous).
    #[wasm_bindgen(js_name = actSync, unchecked_return_type = "ActResult")]
    pub fn act_sync(
        &self,
        #[wasm_bindgen(
            unchecked_param_type = "Float32Array | Uint8Array | Float64Array | number[]"
        )]
        obs: JsValue,
        #[wasm_bindgen(unchecked_optional_param_type = "ActOptions")] options: Option<Object>,
    ) -> Result<JsValue, JsValue> {
        let options: JsValue = options.map_or(JsValue::UNDEFINED, JsValue::from);
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        let i = &mut *guard;
        if i.backend != "cpu" {
            return Err(error(
                "PolicyportBackendError",
                ErrorKind::Backend,
                "actSync runs on the cpu backend only; await act() on webgpu",
            ));
        }
        let args = i.parse(&obs, &options)?;
        let t0 = i.first_act_start();
        i.session
            .act(&args.request())
            .map_err(|e| policy_error(&e))?;
        i.note_first_act(t0);
        i.result()
    }

    /// Run act() on `threads` threads (1: the calling thread only). The threads bundle borrows `threads - 1` Web
    /// Workers started by `startThreads()` and returns them when set back to 1 or freed; other bundles refuse
    /// more than 1.
    #[wasm_bindgen(js_name = setThreads)]
    pub fn set_threads(&self, threads: u32) -> Result<(), JsValue> {
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        guard
            .session
            .set_threads(threads.max(1) as usize)
            .map_err(|e| policy_error(&e))
    }

    /// How act() uses this policy's threads: "measured" (the default: a batch is split over the threads only
    /// while that measures faster than the calling thread alone, per batch size, so threads never slow act()
    /// down, also when the page's other work takes the cores) or "always" (every batch of at least 8 rows per
    /// thread: for tests and benchmarks of the split). Answers are the same either way.
    #[wasm_bindgen(js_name = setThreadSplit)]
    pub fn set_thread_split(&self, mode: &str) -> Result<(), JsValue> {
        let Some(mode) = policyport::ThreadSplit::from_name(mode) else {
            return Err(arg_error(format!(
                "thread split {mode:?}: \"measured\" or \"always\""
            )));
        };
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        guard.session.set_thread_split(mode);
        Ok(())
    }

    /// Zero the recurrent state of these envs (episode boundaries); a no-op for feed-forward policies.
    pub fn reset(&self, env_ids: Uint32Array) -> Result<(), JsValue> {
        let mut guard = self.inner.try_borrow_mut().map_err(|_| busy())?;
        guard
            .session
            .reset(&env_ids.to_vec())
            .map_err(|e| policy_error(&e))
    }

    /// What this policy is and how it runs.
    #[wasm_bindgen(unchecked_return_type = "PolicyInfo")]
    pub fn info(&self) -> Result<JsValue, JsValue> {
        let guard = self.inner.try_borrow().map_err(|_| busy())?;
        let info = guard.session.policy().info();
        let o = Object::new();
        let set = |k: &str, v: JsValue| Reflect::set(&o, &k.into(), &v).map(|_| ());
        set("name", info.name.as_str().into())?;
        set("backend", guard.backend.into())?;
        set(
            "selection",
            info.selection
                .as_ref()
                .map_or(JsValue::NULL, |s| JsValue::from(s.to_string())),
        )?;
        let fv = js_sys::Array::of2(&info.format_version.0.into(), &info.format_version.1.into());
        set("formatVersion", fv.into())?;
        set("observation", to_js(&info.observation)?)?;
        set("action", to_js(&info.action)?)?;
        set("obsLen", (info.obs_len as u32).into())?;
        set("actionLen", (info.action_len as u32).into())?;
        set("distParamsLen", (info.dist_params_len as u32).into())?;
        let discrete = !matches!(info.action, policyport::format::ActionSpace::Box { .. });
        set("discrete", discrete.into())?;
        set("hasValue", info.has_value.into())?;
        set("recurrentStates", (info.recurrent_states as u32).into())?;
        set("parameters", (info.parameters as f64).into())?;
        set(
            "dispatchesPerAct",
            info.dispatches_per_act
                .map_or(JsValue::NULL, |d| (d as u32).into()),
        )?;
        set("loadMs", guard.load_ms.into())?;
        set(
            "firstActUs",
            guard.first_act_us.map_or(JsValue::NULL, JsValue::from),
        )?;
        set("bundle", bundle().into())?;
        set("simd128", simd128().into())?;
        drop(guard);
        let threads = self
            .inner
            .try_borrow_mut()
            .map_err(|_| busy())?
            .session
            .threads();
        set("threads", (threads as u32).into())?;
        Ok(o.into())
    }

    /// Run the artifact's embedded golden cases (expected outputs from PyTorch in float64) on this backend.
    #[wasm_bindgen(unchecked_return_type = "Promise<GoldenResult[]>")]
    pub fn verify(&self) -> Promise {
        let inner = self.inner.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let policy = {
                let guard = inner.try_borrow_mut().map_err(|_| busy())?;
                guard.session.policy().clone()
            };
            let reports = policy.verify_async().await.map_err(|e| policy_error(&e))?;
            let arr = js_sys::Array::new();
            for r in reports {
                let o = Object::new();
                Reflect::set(&o, &"name".into(), &r.name.as_str().into())?;
                Reflect::set(&o, &"passed".into(), &r.passed.into())?;
                Reflect::set(
                    &o,
                    &"sampledMismatches".into(),
                    &(r.sampled_mismatches as u32).into(),
                )?;
                Reflect::set(
                    &o,
                    &"deterministicMismatches".into(),
                    &(r.deterministic_mismatches as u32).into(),
                )?;
                let worst = r
                    .values
                    .iter()
                    .map(|(_, e)| *e)
                    .chain([r.sampled_action_err, r.deterministic_action_err])
                    .fold(0.0f64, f64::max);
                Reflect::set(&o, &"maxRelErr".into(), &worst.into())?;
                arr.push(&o);
            }
            Ok(arr.into())
        })
    }
}

fn busy() -> JsValue {
    error(
        "PolicyportBusyError",
        ErrorKind::Call,
        "another call on this policy is in flight: await it first",
    )
}

fn to_js<T: serde::Serialize>(v: &T) -> Result<JsValue, JsValue> {
    let s = serde_json::to_string(v).map_err(|e| arg_error(e))?;
    js_sys::JSON::parse(&s)
}

/// `n` CartPole-v1, Pendulum-v1 or Catch envs stepped together (the demo's environments, the same Rust code as
/// the native demo, so trajectories match native runs bit for bit). Catch is a pixel game: its observations are
/// uint8 RGB frames `[16, 16, 3]`, the picture the page draws.
#[wasm_bindgen]
pub struct VecEnv {
    inner: policyport_envs::VecEnv,
    discrete: Vec<i64>,
}

#[wasm_bindgen]
impl VecEnv {
    /// `kind`: "cartpole", "pendulum" or "catch"; env `i` plays episodes `i, i + n, …` from reset stream `seed`.
    #[wasm_bindgen(constructor)]
    pub fn new(kind: &str, n: u32, seed: f64) -> Result<VecEnv, JsValue> {
        let kind: policyport_envs::EnvKind = kind.parse().map_err(arg_error)?;
        if n == 0 || n > 1 << 20 {
            return Err(arg_error(format!("{n} envs: want 1 ..= 2^20")));
        }
        if !(seed >= 0.0 && seed.fract() == 0.0 && seed <= 9_007_199_254_740_991.0) {
            return Err(arg_error("seed must be a non-negative safe integer"));
        }
        Ok(VecEnv {
            inner: policyport_envs::VecEnv::new(kind, n as usize, seed as u64),
            discrete: vec![],
        })
    }

    #[wasm_bindgen(getter)]
    pub fn length(&self) -> u32 {
        self.inner.len() as u32
    }

    #[wasm_bindgen(getter, js_name = obsLen)]
    pub fn obs_len(&self) -> u32 {
        self.inner.kind().obs_len() as u32
    }

    /// Ticks so far: the `step` to sample the next act() with.
    #[wasm_bindgen(getter)]
    pub fn ticks(&self) -> f64 {
        self.inner.ticks() as f64
    }

    /// Current observations, `length x obsLen` (a copy): a Float32Array, or a Uint8Array of frames for Catch.
    #[wasm_bindgen(unchecked_return_type = "Float32Array | Uint8Array")]
    pub fn observations(&self) -> JsValue {
        match self.inner.observations() {
            policyport_envs::EnvObs::F32(x) => Float32Array::from(x).into(),
            policyport_envs::EnvObs::U8(x) => Uint8Array::from(x).into(),
        }
    }

    /// Apply one action per env (Int32Array for CartPole and Catch, Float32Array for Pendulum, as act() returns them);
    /// returns the returns of the episodes that ended this tick (those envs were reset).
    pub fn step(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Int32Array | Float32Array")] actions: JsValue,
    ) -> Result<Float64Array, JsValue> {
        let report = if self.inner.kind().discrete() {
            let a = actions
                .dyn_ref::<Int32Array>()
                .ok_or_else(|| arg_error("this env takes an Int32Array of actions"))?;
            self.discrete.clear();
            self.discrete.extend(a.to_vec().into_iter().map(i64::from));
            self.inner.step(&self.discrete, &[])
        } else {
            let a = actions
                .dyn_ref::<Float32Array>()
                .ok_or_else(|| arg_error("Pendulum takes a Float32Array of torques"))?;
            self.inner.step(&[], &a.to_vec())
        }
        .map_err(arg_error)?;
        let r: Vec<f64> = report.finished.iter().map(|(_, r)| *r).collect();
        Ok(Float64Array::from(&r[..]))
    }

    /// Per env: the return so far in the current episode.
    #[wasm_bindgen(js_name = runningReturns)]
    pub fn running_returns(&self) -> Float64Array {
        Float64Array::from(self.inner.running_returns())
    }

    /// Per env: steps into the current episode.
    #[wasm_bindgen(js_name = episodeSteps)]
    pub fn episode_steps(&self) -> Uint32Array {
        Uint32Array::from(self.inner.episode_steps())
    }

    /// Number of finished episodes so far.
    #[wasm_bindgen(getter, js_name = episodesFinished)]
    pub fn episodes_finished(&self) -> u32 {
        self.inner.finished_returns().len() as u32
    }
}
