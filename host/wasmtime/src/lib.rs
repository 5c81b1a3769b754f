//! The sandboxed runtime: the policyport plugin (`guest/plugin`, ABI of guest/plugin/ABI.md) under wasmtime.
//!
//! A [`WasmRuntime`] holds the engine, the compiled module (from a `.cwasm` cache when one fits this engine) and
//! a 1 ms epoch ticker; it is shared (`Arc`) across threads. [`load`] gives a `policyport::CompiledPolicy` on
//! `Backend::Wasmtime`: the same `Session` API as every native backend (request checks, state model, outputs),
//! each session running in its own instance of the plugin — its own store, memory cap and per-call deadline
//! ([`WasmLimits`]). Traps, deadlines and memory-cap hits are typed (`PolicyError::Sandbox`, kind
//! `ErrorKind::Sandbox`); after one the session's instance is not trusted again and the session refuses every
//! later call (make a new session). The instance itself (`WasmPolicy`, this crate's) is private: there is one
//! policy API.

//!
//! Built only with the cargo feature `wasmtime` (default; it brings wasmtime and cranelift). Without it every type here
//! still exists and [`WasmRuntime::new`] returns [`WasmError::NotCompiled`] (the lean demo build uses that).

use std::path::Path;
use std::sync::Arc;
#[cfg(feature = "wasmtime")]
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

#[cfg_attr(not(feature = "wasmtime"), allow(unused_imports))]
use policyport::{
    ActMode, ActOutputs, EnvIds, ErrorKind, HeadControlError, Observations, PolicyError, Request,
    SandboxError,
};
use thiserror::Error;
#[cfg(feature = "wasmtime")]
use wasmtime::{
    Config, Engine, Instance, Linker, Memory, Module, ResourceLimiter, Store, Trap, TypedFunc,
};

mod executor;
#[cfg(feature = "wasmtime")]
mod lent;
pub use executor::load;

/// The plugin ABI version this host speaks (the one definition: `policyport_abi`).
pub use policyport_abi::ABI_VERSION;
use policyport_abi::ErrorCode;
#[cfg(feature = "wasmtime")]
use policyport_abi::{ObsDType, PluginInfo, export};

#[derive(Debug, Error)]
pub enum WasmError {
    #[error("wasm module rejected: {0}")]
    Module(String),
    #[error("plugin is missing export '{0}' (not a policyport plugin?)")]
    MissingExport(&'static str),
    #[error("plugin speaks ABI version {found}, this host speaks {expected}")]
    AbiVersion { found: u32, expected: u32 },
    #[error(
        "plugin imports {0:?}; a policyport plugin imports only the host-lent dense kernel (policyport_host::pp_host_lend_dense, pp_host_dense)"
    )]
    Imports(Vec<String>),
    #[error("plugin call '{call}' passed its deadline of {deadline_ms} ms")]
    Deadline {
        call: &'static str,
        deadline_ms: u64,
    },
    #[error("plugin tried to grow its memory past the cap of {cap_bytes} bytes")]
    MemoryCap { cap_bytes: usize },
    #[error("plugin trapped in '{call}': {message}")]
    Trap { call: &'static str, message: String },
    #[error("plugin error in '{call}' ({}): {message}", code.description())]
    Guest {
        call: &'static str,
        code: ErrorCode,
        message: String,
    },
    #[error("plugin returned {code} from '{call}', which is no ABI error code (a broken plugin)")]
    UnknownCode { call: &'static str, code: i32 },
    #[error("plugin's pp_info word {index} is {value}, not 0 or 1 (a broken plugin)")]
    BadInfo { index: usize, value: u32 },
    #[error(
        "plugin's pp_alloc returned {len} bytes at {ptr}, outside its {memory_bytes}-byte memory or not 16-aligned \
         (a broken plugin)"
    )]
    BadAllocation {
        ptr: u32,
        len: u32,
        memory_bytes: usize,
    },
    #[error("bad call: {0}")]
    Call(String),
    #[error("module cache: {0}")]
    Cache(String),
    #[error(
        "this build has no wasm sandbox (policyport-wasmtime built without its `wasmtime` feature)"
    )]
    NotCompiled,
    /// Refused on the host before the sandbox was involved ([`load`]: the artifact; the runtime's typed error).
    #[error(transparent)]
    Policy(policyport::PolicyError),
}

impl WasmError {
    /// Its [`ErrorKind`]: the kind of the [`PolicyError`] it becomes (`From`), the one classification every
    /// boundary maps (the C ABI's status, C#'s exception).
    pub fn kind(&self) -> ErrorKind {
        match self {
            WasmError::Guest { code, .. } => guest_kind(*code).unwrap_or(ErrorKind::Sandbox),
            WasmError::Policy(p) => p.kind(),
            WasmError::Call(_) => ErrorKind::Call,
            // A build without the sandbox (the C ABI's native-only library): PP_STATUS_SANDBOX, as documented.
            _ => ErrorKind::Sandbox,
        }
    }
}

/// The kind of a plugin's refusal: its ABI code's, and the plugin's allocator running out under its cap is over
/// the memory limit. `None` for the handle code (the host's handle unknown to the plugin: a broken plugin).
fn guest_kind(code: ErrorCode) -> Option<ErrorKind> {
    match code {
        ErrorCode::Memory => Some(ErrorKind::TooLarge),
        c => ErrorKind::from_code(c.code()),
    }
}

/// The runtime's error for what the sandbox did: a plugin's refusal keeps its kind, the sandbox's own failures
/// are `SandboxError`s of kind `ErrorKind::Sandbox`, a refusal of the host's own checks is the runtime's error
/// it carries.
impl From<WasmError> for PolicyError {
    fn from(e: WasmError) -> Self {
        let message = e.to_string();
        PolicyError::Sandbox(match e {
            WasmError::Policy(p) => return p,
            WasmError::Guest {
                call,
                code,
                message,
            } => match guest_kind(code) {
                Some(kind) => SandboxError::Refused {
                    kind,
                    call,
                    message,
                },
                None => SandboxError::Broken(format!("'{call}': {message}")),
            },
            WasmError::Call(message) => SandboxError::Refused {
                kind: ErrorKind::Call,
                call: "host",
                message,
            },
            WasmError::Deadline { call, deadline_ms } => {
                SandboxError::Deadline { call, deadline_ms }
            }
            WasmError::MemoryCap { cap_bytes } => SandboxError::MemoryCap { cap_bytes },
            WasmError::Trap { call, message } => SandboxError::Trap { call, message },
            WasmError::UnknownCode { .. }
            | WasmError::BadInfo { .. }
            | WasmError::BadAllocation { .. } => SandboxError::Broken(message),
            WasmError::Module(_)
            | WasmError::MissingExport(_)
            | WasmError::AbiVersion { .. }
            | WasmError::Imports(_)
            | WasmError::Cache(_)
            | WasmError::NotCompiled => SandboxError::Plugin(message),
        })
    }
}

/// Limits applied to every instance.
#[derive(Debug, Clone, Copy)]
pub struct WasmLimits {
    /// Linear memory cap in bytes.
    pub memory_bytes: usize,
    /// Wall-clock budget of one call (load, act, ...), enforced by epoch interruption at 1 ms granularity (and
    /// between row blocks of a host-lent layer).
    pub deadline: Duration,
    /// Lend the guest this host's native dense kernel (ABI.md, "Host-lent dense layers"): the plugin offers each
    /// dense layer and convolution GEMM at load, the host copies and packs the weights (counted against
    /// `memory_bytes`) and computes those layers natively on ranges of the guest's memory it checks first. The
    /// guest gives the host numbers, never code; everything else stays in the sandbox. Off by default (the
    /// guest computes everything itself): it trades the sandbox's SIMD128 kernels for native ones, and the
    /// host's kernel code then runs on the guest's data.
    pub lend_dense: bool,
}

impl Default for WasmLimits {
    fn default() -> Self {
        WasmLimits {
            memory_bytes: 256 << 20,
            deadline: Duration::from_millis(1000),
            lend_dense: false,
        }
    }
}

/// Engine + compiled plugin + epoch ticker, shared by every policy [`load`]ed on it and each of their sessions'
/// instances.
#[cfg(feature = "wasmtime")]
pub struct WasmRuntime {
    engine: Engine,
    module: Module,
    stop: Arc<AtomicBool>,
    /// Whether the module came from a precompiled cache file.
    pub from_cache: bool,
    /// Instances of the plugin that loaded a policy, and the dense layers they lent the host (counters for
    /// reports and tests: [`WasmRuntime::instances`], [`WasmRuntime::lent_layers`]).
    instances: AtomicUsize,
    lent_layers: AtomicUsize,
}

#[cfg(feature = "wasmtime")]
impl Drop for WasmRuntime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(feature = "wasmtime")]
fn engine() -> Result<Engine, WasmError> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    // One linear memory per instance: the memory cap (`HostData`'s limiter) is per memory, so several memories would
    // multiply it. The limiter also caps memories, tables and instances per store.
    config.wasm_multi_memory(false);
    Engine::new(&config).map_err(|e| WasmError::Module(format!("{e:#}")))
}

#[cfg(feature = "wasmtime")]
impl WasmRuntime {
    /// Compile a plugin (`.wasm` bytes, or WAT text).
    pub fn new(wasm: &[u8]) -> Result<Arc<Self>, WasmError> {
        let engine = engine()?;
        let module = Module::new(&engine, wasm).map_err(|e| WasmError::Module(format!("{e:#}")))?;
        Self::finish(engine, module, false)
    }

    /// Like [`new`](Self::new) through a cache of precompiled modules in `dir`.
    ///
    /// A precompiled module is native code that wasmtime maps and runs without checking it, so the cache is
    /// trusted only as far as the directory is: `dir` must be a real directory (not a symlink) owned by this
    /// user and closed to everyone else (mode `0700`; created so when missing), or this is a typed
    /// [`WasmError::Cache`] and nothing is read from it. Entries are content-addressed: the file name is the
    /// SHA-256 of wasmtime's engine compatibility hash (version, target, flags) and the plugin bytes, so a
    /// different plugin or engine never meets another's entry. An entry is written to a fresh temporary file
    /// (`create_new`, mode `0600`), synced, and renamed into place: a crash leaves no torn file under a valid
    /// name. An entry that is not a regular file of this user, or that wasmtime refuses, is recompiled.
    /// (Before: `<plugin>.cwasm` next to the plugin, keyed by a 64-bit non-cryptographic hash of public inputs,
    /// written in place — anyone who could write that directory ran native code in the host.)
    /// Not available on non-Unix hosts (no ownership check): a typed error there; use [`new`](Self::new).
    pub fn with_cache_dir(wasm: &[u8], dir: &Path) -> Result<Arc<Self>, WasmError> {
        let engine = engine()?;
        private_dir(dir)?;
        let key = cache_key(&engine, wasm);
        let entry = dir.join(format!("{key}.cwasm"));
        if trusted_entry(&entry) {
            // SAFETY: a regular file in a directory only this user can write, named by the SHA-256 of the engine's
            // compatibility hash and these plugin bytes, written by this function (temp file + rename);
            // `deserialize_file` still checks its header and refuses an incompatible file.
            if let Ok(module) = unsafe { Module::deserialize_file(&engine, &entry) } {
                return Self::finish(engine, module, true);
            }
        }
        let bytes = engine
            .precompile_module(wasm)
            .map_err(|e| WasmError::Module(format!("{e:#}")))?;
        write_entry(dir, &entry, &bytes)?;
        // SAFETY: bytes we just produced with this engine.
        let module = unsafe { Module::deserialize(&engine, &bytes) }
            .map_err(|e| WasmError::Module(format!("{e:#}")))?;
        Self::finish(engine, module, false)
    }

    fn finish(engine: Engine, module: Module, from_cache: bool) -> Result<Arc<Self>, WasmError> {
        // The plugin may import the host-lent dense kernel's two functions (every instance gets them; they
        // decline unless `lend_dense` is on) and nothing else.
        let foreign: Vec<String> = module
            .imports()
            .filter(|i| !lent::is_host_import(i.module(), i.name()))
            .map(|i| format!("{}::{}", i.module(), i.name()))
            .collect();
        if !foreign.is_empty() {
            return Err(WasmError::Imports(foreign));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("policyport-epoch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    e.increment_epoch();
                }
            })
            .map_err(|e| WasmError::Module(format!("epoch thread: {e}")))?;
        Ok(Arc::new(WasmRuntime {
            engine,
            module,
            stop,
            from_cache,
            instances: AtomicUsize::new(0),
            lent_layers: AtomicUsize::new(0),
        }))
    }

    /// Instances of the plugin that have loaded a policy on this runtime so far (one per session that acted,
    /// plus each policy's warm-up at [`load`]).
    pub fn instances(&self) -> usize {
        self.instances.load(Ordering::Relaxed)
    }

    /// Dense layers those instances lent the host so far ([`WasmLimits::lend_dense`]; 0 when off, or when the
    /// plugin declined every layer).
    pub fn lent_layers(&self) -> usize {
        self.lent_layers.load(Ordering::Relaxed)
    }
}

/// What a store holds for the host: the memory cap (and whether the guest hit it), the guest's memory (for the
/// host-lent kernel's range checks) and the lent layers.
#[cfg(feature = "wasmtime")]
struct HostData {
    cap: usize,
    denied: bool,
    memory: Option<Memory>,
    lent: lent::LentLayers,
}

#[cfg(feature = "wasmtime")]
impl ResourceLimiter for HostData {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.denied = true;
            return Ok(false);
        }
        Ok(true)
    }
    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 16)
    }
    // Per store (one plugin instance): the plugin has one memory, one table, one instance. wasmtime's
    // defaults (10 000 each) let a module hold many memories of `cap` bytes each, or 10^4 tables.
    fn instances(&self) -> usize {
        1
    }
    fn memories(&self) -> usize {
        1
    }
    fn tables(&self) -> usize {
        4
    }
}

#[cfg(feature = "wasmtime")]
struct Exports {
    alloc: TypedFunc<u32, u32>,
    free: TypedFunc<(u32, u32), ()>,
    load: TypedFunc<(u32, u32), i32>,
    info: TypedFunc<(i32, u32), i32>,
    act_masked: TypedFunc<policyport_abi::ActMaskedParams, i32>,
    reset: TypedFunc<(i32, u32, u32), i32>,
    state: TypedFunc<(i32, u32, u32, u32), i32>,
    last_error: TypedFunc<(u32, u32), u32>,
}

/// What a plugin-loaded policy is (from `pp_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WasmInfo {
    pub obs_len: usize,
    pub action_len: usize,
    pub dist_params_len: usize,
    pub has_value: bool,
    pub discrete: bool,
    pub recurrent_states: usize,
    pub u8_obs: bool,
}

/// A request's head controls as `pp_act_masked` takes them (format 1.4).
#[cfg(feature = "wasmtime")]
#[derive(Debug, Clone, Copy, Default)]
struct HeadControls<'a> {
    mask: Option<&'a [bool]>,
    epsilon: Option<f32>,
}

/// What a request asks of `pp_act_masked` beyond observations, ids and mode.
#[cfg(feature = "wasmtime")]
#[derive(Debug, Clone, Copy, Default)]
struct ActControls<'a> {
    head: HeadControls<'a>,
    /// [`Request::skip_value`]: the value buffer is passed as null.
    skip_value: bool,
}

/// One sandboxed instance with one loaded policy: a session's, behind the plugin executor (`executor.rs`).
#[cfg(feature = "wasmtime")]
pub(crate) struct WasmPolicy {
    /// Keeps the engine and its epoch ticker alive as long as this instance: the deadline of every call depends
    /// on the ticker, and dropping the caller's `WasmRuntime` used to stop it (a looping plugin then hung the
    /// host; regression test `the_deadline_outlives_the_runtime_handle`).
    _runtime: Arc<WasmRuntime>,
    store: Store<HostData>,
    memory: Memory,
    x: Exports,
    handle: i32,
    info: WasmInfo,
    limits: WasmLimits,
    /// Guest buffer (ptr, bytes) holding obs, env ids, actions, value, dist for the current batch capacity.
    buf: Option<(u32, u32)>,
    capacity: usize,
}

#[cfg(feature = "wasmtime")]
impl WasmPolicy {
    /// Instantiate the plugin and load an artifact into it.
    pub fn load(
        rt: &Arc<WasmRuntime>,
        artifact: &[u8],
        limits: WasmLimits,
    ) -> Result<Self, WasmError> {
        let mut store = Store::new(
            &rt.engine,
            HostData {
                cap: limits.memory_bytes,
                denied: false,
                memory: None,
                lent: lent::LentLayers::new(limits.lend_dense),
            },
        );
        store.limiter(|l| l as &mut dyn ResourceLimiter);
        store.set_epoch_deadline(deadline_ticks(limits));
        store.epoch_deadline_trap();
        store.data_mut().lent.start_call(limits.deadline);
        let mut linker = Linker::new(&rt.engine);
        lent::link(&mut linker).map_err(|e| WasmError::Module(format!("{e:#}")))?;
        let instance: Instance = linker
            .instantiate(&mut store, &rt.module)
            .map_err(|e| classify(e, &store, "instantiate", limits))?;
        let memory = instance
            .get_memory(&mut store, export::MEMORY)
            .ok_or(WasmError::MissingExport(export::MEMORY))?;
        store.data_mut().memory = Some(memory);
        macro_rules! func {
            ($name:expr) => {
                instance
                    .get_typed_func(&mut store, $name)
                    .map_err(|_| WasmError::MissingExport($name))?
            };
        }
        let version: TypedFunc<(), u32> = func!(export::ABI_VERSION);
        let found = version
            .call(&mut store, ())
            .map_err(|e| classify(e, &store, "pp_abi_version", limits))?;
        if found != ABI_VERSION {
            return Err(WasmError::AbiVersion {
                found,
                expected: ABI_VERSION,
            });
        }
        let x = Exports {
            alloc: func!(export::ALLOC),
            free: func!(export::FREE),
            load: func!(export::LOAD),
            info: func!(export::INFO),
            act_masked: func!(export::ACT_MASKED),
            reset: func!(export::RESET),
            state: func!(export::STATE),
            last_error: func!(export::LAST_ERROR),
        };
        let mut p = WasmPolicy {
            _runtime: rt.clone(),
            store,
            memory,
            x,
            handle: -1,
            info: WasmInfo {
                obs_len: 0,
                action_len: 0,
                dist_params_len: 0,
                has_value: false,
                discrete: true,
                recurrent_states: 0,
                u8_obs: false,
            },
            limits,
            buf: None,
            capacity: 0,
        };
        let len = u32::try_from(artifact.len())
            .map_err(|_| WasmError::Call("artifact over 4 GiB".into()))?;
        let ptr = p.call("pp_alloc", |s, x| x.alloc.call(s, len))?;
        if ptr == 0 {
            return Err(WasmError::MemoryCap {
                cap_bytes: limits.memory_bytes,
            });
        }
        p.memory
            .write(&mut p.store, ptr as usize, artifact)
            .map_err(|e| WasmError::Call(e.to_string()))?;
        let handle = p.call("pp_load", |s, x| x.load.call(s, (ptr, len)))?;
        p.call("pp_free", |s, x| x.free.call(s, (ptr, len)))?;
        p.handle = p.check("pp_load", handle)?;
        const INFO_BYTES: u32 = policyport_abi::INFO_WORDS as u32 * 4;
        let out = p.call("pp_alloc", |s, x| x.alloc.call(s, INFO_BYTES))?;
        let rc = p.call("pp_info", |s, x| x.info.call(s, (handle, out)))?;
        p.check("pp_info", rc)?;
        let mut raw = [0u8; INFO_BYTES as usize];
        p.memory
            .read(&p.store, out as usize, &mut raw)
            .map_err(|e| WasmError::Call(e.to_string()))?;
        p.call("pp_free", |s, x| x.free.call(s, (out, INFO_BYTES)))?;
        let info = PluginInfo::from_le_bytes(raw).map_err(|b| WasmError::BadInfo {
            index: b.index,
            value: b.value,
        })?;
        p.info = WasmInfo {
            obs_len: info.obs_len as usize,
            action_len: info.action_len as usize,
            dist_params_len: info.dist_params_len as usize,
            has_value: info.has_value,
            discrete: info.discrete,
            recurrent_states: info.recurrent_states as usize,
            u8_obs: info.u8_obs,
        };
        rt.instances.fetch_add(1, Ordering::Relaxed);
        rt.lent_layers
            .fetch_add(p.store.data().lent.len(), Ordering::Relaxed);
        Ok(p)
    }

    pub fn info(&self) -> WasmInfo {
        self.info
    }

    fn call<R>(
        &mut self,
        name: &'static str,
        f: impl FnOnce(&mut Store<HostData>, &Exports) -> wasmtime::Result<R>,
    ) -> Result<R, WasmError> {
        self.store.set_epoch_deadline(deadline_ticks(self.limits));
        self.store.data_mut().lent.start_call(self.limits.deadline);
        f(&mut self.store, &self.x).map_err(|e| classify(e, &self.store, name, self.limits))
    }

    fn check(&mut self, call: &'static str, rc: i32) -> Result<i32, WasmError> {
        if rc >= 0 {
            return Ok(rc);
        }
        let n = self
            .call("pp_last_error", |s, x| x.last_error.call(s, (0, 0)))?
            .min(4096);
        let p = self.call("pp_alloc", |s, x| x.alloc.call(s, n.max(1)))?;
        let _ = self.call("pp_last_error", |s, x| x.last_error.call(s, (p, n)))?;
        let mut msg = vec![0u8; n as usize];
        let _ = self.memory.read(&self.store, p as usize, &mut msg);
        let _ = self.call("pp_free", |s, x| x.free.call(s, (p, n)));
        let message = String::from_utf8_lossy(&msg).into_owned();
        Err(match ErrorCode::from_code(rc) {
            Some(code) => WasmError::Guest {
                call,
                code,
                message,
            },
            None => WasmError::UnknownCode { call, code: rc },
        })
    }

    /// Layout of the batch buffer for `cap` rows: obs | env ids | actions | value | dist (each 16-aligned).
    /// Offsets of the regions of one guest buffer for `cap` rows: observations, env ids, actions, values,
    /// distribution parameters, episode-start flags, and the end.
    /// Offsets in the shared buffer: obs, env ids, actions, value, dist, episode starts, action mask (one byte
    /// per dist param: only discrete policies take masks), and the end.
    fn layout(&self, cap: usize) -> [usize; 8] {
        let a = |x: usize| x.div_ceil(16) * 16;
        let i = &self.info;
        let obs = a(cap * i.obs_len.max(8) * 4);
        let ids = a(cap * 4);
        let act = a(cap * i.action_len.max(1) * 4);
        let val = a(cap * 4);
        let dist = a(cap * i.dist_params_len.max(1) * 4);
        let starts = a(cap);
        let mask = if i.discrete {
            a(cap * i.dist_params_len)
        } else {
            0
        };
        let before_starts = obs + ids + act + val + dist;
        [
            0,
            obs,
            obs + ids,
            obs + ids + act,
            obs + ids + act + val,
            before_starts,
            before_starts + starts,
            before_starts + starts + mask,
        ]
    }

    fn ensure_capacity(&mut self, batch: usize) -> Result<(), WasmError> {
        if batch <= self.capacity && self.buf.is_some() {
            return Ok(());
        }
        let cap = batch.max(self.capacity * 2).max(1);
        let total = u32::try_from(self.layout(cap)[7].max(64))
            .map_err(|_| WasmError::Call(format!("batch {batch} too large")))?;
        if let Some((p, l)) = self.buf.take() {
            self.call("pp_free", |s, x| x.free.call(s, (p, l)))?;
        }
        let p = self.call("pp_alloc", |s, x| x.alloc.call(s, total))?;
        if p == 0 {
            return Err(WasmError::MemoryCap {
                cap_bytes: self.limits.memory_bytes,
            });
        }
        // The host slices guest memory at this buffer directly (the outputs are read from it): a broken or
        // hostile plugin returning a buffer outside its memory, or misaligned, must be a typed error, not a
        // slice panic in the host. Checked once: wasm memory never shrinks, so a buffer inside stays inside.
        let end = p as usize + total as usize;
        if p % 16 != 0 || end > self.memory.data_size(&self.store) {
            return Err(WasmError::BadAllocation {
                ptr: p,
                len: total,
                memory_bytes: self.memory.data_size(&self.store),
            });
        }
        self.buf = Some((p, total));
        self.capacity = cap;
        Ok(())
    }

    /// act() with observations copied into the guest (f32 or u8), outputs read back into `out`. The same
    /// [`Request`] as the native [`policyport::Session::act`] (env ids, episode starts), checked in the guest by the
    /// same code.
    pub fn act(&mut self, req: &Request<'_>, out: &mut ActOutputs) -> Result<(), WasmError> {
        let (obs, batch, mode, envs) = (req.obs, req.batch, req.mode, req.envs);
        let n = match obs {
            Observations::F32(x) => x.len(),
            Observations::U8(x) => x.len(),
        };
        let want = batch.checked_mul(self.info.obs_len).ok_or_else(|| {
            WasmError::Call(format!("batch {batch} overflows the observation size"))
        })?;
        if n != want {
            // The runtime's own error (kind Observation), as the native Session reports it.
            return Err(WasmError::Policy(
                policyport::ObservationError::Length {
                    expected: want,
                    found: n,
                    batch,
                    per_env: self.info.obs_len,
                }
                .into(),
            ));
        }
        self.ensure_capacity(batch.max(1))?;
        let (ptr, _) = self.buf.unwrap();
        let dtype = match obs {
            Observations::F32(x) => {
                // SAFETY: the bytes of a live `&[f32]`: same address and extent (x.len() · 4 bytes), every byte
                // initialised (f32 has no padding), u8 needs no alignment, and the borrow of `x` outlives `bytes`.
                let bytes: &[u8] =
                    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) };
                self.memory
                    .write(&mut self.store, ptr as usize, bytes)
                    .map_err(|e| WasmError::Call(e.to_string()))?;
                ObsDType::F32
            }
            Observations::U8(x) => {
                self.memory
                    .write(&mut self.store, ptr as usize, x)
                    .map_err(|e| WasmError::Call(e.to_string()))?;
                ObsDType::U8
            }
        };
        let controls = HeadControls {
            mask: req.action_mask,
            epsilon: req.epsilon,
        };
        let controls = ActControls {
            head: controls,
            skip_value: req.skip_value,
        };
        self.run(batch, dtype, mode, envs, req.episode_starts, controls, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        batch: usize,
        dtype: ObsDType,
        mode: ActMode,
        envs: EnvIds<'_>,
        episode_starts: Option<&[bool]>,
        controls: ActControls<'_>,
        out: &mut ActOutputs,
    ) -> Result<(), WasmError> {
        let ActControls {
            head: controls,
            skip_value,
        } = controls;
        let (ptr, _) = self.buf.unwrap();
        let l = self.layout(self.capacity);
        let at = |i: usize| ptr + l[i] as u32;
        let mask_ptr = match controls.mask {
            None => 0u32,
            Some(flags) => {
                // The reserved region holds batch x dist params bytes of a discrete policy; anything else is
                // refused here, before it is written (the guest checks the same again).
                let want = batch * self.info.dist_params_len;
                if !self.info.discrete {
                    return Err(WasmError::Policy(HeadControlError::MaskOnContinuous.into()));
                }
                if flags.len() != want {
                    return Err(WasmError::Policy(
                        HeadControlError::MaskLength {
                            found: flags.len(),
                            batch,
                            per_row: self.info.dist_params_len,
                        }
                        .into(),
                    ));
                }
                let start = at(6) as usize;
                let mem = self.memory.data_mut(&mut self.store);
                for (dst, f) in mem[start..start + want].iter_mut().zip(flags) {
                    *dst = *f as u8;
                }
                at(6)
            }
        };
        let starts_ptr = match episode_starts {
            None => 0u32,
            Some(flags) => {
                if flags.len() != batch {
                    return Err(WasmError::Policy(
                        policyport::StateError::EpisodeStarts {
                            found: flags.len(),
                            batch,
                        }
                        .into(),
                    ));
                }
                // Straight into the region the layout reserved (cap >= batch bytes; checked inside memory when
                // the buffer was allocated): no host-side copy per call.
                let start = at(5) as usize;
                let mem = self.memory.data_mut(&mut self.store);
                for (dst, f) in mem[start..start + batch].iter_mut().zip(flags) {
                    *dst = *f as u8;
                }
                at(5)
            }
        };
        let (ids_ptr, env_offset) = match envs {
            EnvIds::Range(start) => (0u32, start),
            EnvIds::List(ids) => {
                if ids.len() != batch {
                    return Err(WasmError::Policy(
                        policyport::EnvIdError::Count {
                            found: ids.len(),
                            batch,
                        }
                        .into(),
                    ));
                }
                // SAFETY: the bytes of a live `&[u32]`: same address and extent (ids.len() · 4 bytes), every byte
                // initialised (no padding), u8 needs no alignment, and the borrow of `ids` outlives `bytes`.
                let bytes: &[u8] =
                    unsafe { std::slice::from_raw_parts(ids.as_ptr() as *const u8, ids.len() * 4) };
                self.memory
                    .write(&mut self.store, at(1) as usize, bytes)
                    .map_err(|e| WasmError::Call(e.to_string()))?;
                (at(1), 0)
            }
        };
        let (m, seed, step) = match mode {
            ActMode::Deterministic => (policyport_abi::Mode::Deterministic, 0u64, 0u64),
            ActMode::Sample { seed, step } => (policyport_abi::Mode::Sample, seed, step),
        };
        let h = self.handle;
        // Always pp_act_masked (ABI 6): with no mask (0) and no epsilon (NaN) it is pp_act.
        let args: policyport_abi::ActMaskedParams = (
            h,
            at(0),
            dtype as u32,
            batch as u32,
            ids_ptr,
            env_offset,
            m as u32,
            seed,
            step,
            at(2),
            // A null value buffer: the plugin leaves the value out (and skips the layers only it needs).
            if skip_value { 0 } else { at(3) },
            at(4),
            starts_ptr,
            mask_ptr,
            controls.epsilon.unwrap_or(f32::NAN),
        );
        let rc = self.call("pp_act_masked", |s, x| x.act_masked.call(s, args))?;
        self.check("pp_act_masked", rc)?;
        // Read the outputs straight from linear memory.
        // Read the outputs straight from linear memory into the caller's buffers (reused: no allocation once they
        // have grown to the batch).
        let i = self.info;
        let mem = self.memory.data(&self.store);
        let f32s = |dst: &mut Vec<f32>, off: u32, n: usize| {
            dst.clear();
            dst.extend(
                mem[off as usize..off as usize + n * 4]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        };
        out.batch = batch;
        let k = batch * i.action_len;
        out.discrete.clear();
        out.continuous.clear();
        if i.discrete {
            out.discrete.extend(
                mem[at(2) as usize..at(2) as usize + k * 4]
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
            );
        } else {
            f32s(&mut out.continuous, at(2), k);
        }
        match i.has_value && !skip_value {
            true => f32s(&mut out.value, at(3), batch),
            false => out.value.clear(),
        }
        f32s(&mut out.dist_params, at(4), batch * i.dist_params_len);
        Ok(())
    }

    /// Zero the recurrent state of these envs.
    pub fn reset(&mut self, envs: &[u32]) -> Result<(), WasmError> {
        self.ensure_capacity(envs.len().max(1))?;
        let (ptr, _) = self.buf.unwrap();
        let at = ptr + self.layout(self.capacity)[1] as u32;
        // SAFETY: the bytes of a live `&[u32]`: same address and extent (envs.len() · 4 bytes), every byte
        // initialised (no padding), u8 needs no alignment, and the borrow of `envs` outlives `bytes`.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(envs.as_ptr() as *const u8, envs.len() * 4) };
        self.memory
            .write(&mut self.store, at as usize, bytes)
            .map_err(|e| WasmError::Call(e.to_string()))?;
        let (h, n) = (self.handle, envs.len() as u32);
        let rc = self.call("pp_reset", |s, x| x.reset.call(s, (h, at, n)))?;
        self.check("pp_reset", rc).map(|_| ())
    }

    /// Recurrent state tensor `k` of every env the guest holds, env-major (`envs x numel`; empty before any
    /// recurrent step). A size the guest reports that does not fit its own memory is a typed error.
    pub fn state(&mut self, k: usize) -> Result<Vec<f32>, WasmError> {
        let h = self.handle;
        let k = u32::try_from(k).map_err(|_| WasmError::Call(format!("state tensor {k}")))?;
        let rc = self.call("pp_state", |s, x| x.state.call(s, (h, k, 0, 0)))?;
        let total = self.check("pp_state", rc)? as usize;
        if total == 0 {
            return Ok(vec![]);
        }
        let mem_bytes = self.memory.data_size(&self.store);
        let len = u32::try_from(total * 4)
            .ok()
            .filter(|l| (*l as usize) < mem_bytes)
            .ok_or_else(|| {
                WasmError::Call(format!(
                    "the plugin reports {total} state numbers, more than its memory holds"
                ))
            })?;
        let p = self.call("pp_alloc", |s, x| x.alloc.call(s, len))?;
        if p == 0 {
            return Err(WasmError::MemoryCap {
                cap_bytes: self.limits.memory_bytes,
            });
        }
        let read = (|| {
            let end = p as usize + len as usize;
            if p % 4 != 0 || end > self.memory.data_size(&self.store) {
                return Err(WasmError::BadAllocation {
                    ptr: p,
                    len,
                    memory_bytes: self.memory.data_size(&self.store),
                });
            }
            let rc = self.call("pp_state", |s, x| x.state.call(s, (h, k, p, total as u32)))?;
            self.check("pp_state", rc)?;
            let mem = self.memory.data(&self.store);
            Ok(mem[p as usize..end]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect())
        })();
        self.call("pp_free", |s, x| x.free.call(s, (p, len)))?;
        read
    }
}

#[cfg(feature = "wasmtime")]
fn deadline_ticks(l: WasmLimits) -> u64 {
    // Clamped: `as u64` truncated a huge Duration, and `+ 1` overflowed at u64::MAX.
    u64::try_from(l.deadline.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, u64::MAX / 2)
        + 1
}

/// The cache file name: SHA-256 (hex) of a domain tag, wasmtime's engine compatibility hash and the plugin.
#[cfg(feature = "wasmtime")]
fn cache_key(engine: &Engine, wasm: &[u8]) -> String {
    use sha2::Digest;
    use std::hash::{Hash, Hasher};
    /// Feeds what `Hash` writes into SHA-256 (the compatibility hash is only exposed as `impl Hash`).
    struct Sha(sha2::Sha256);
    impl Hasher for Sha {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            0
        }
    }
    let mut h = Sha(sha2::Sha256::new());
    h.write(b"policyport precompiled plugin v1\0");
    engine.precompile_compatibility_hash().hash(&mut h);
    h.write(&(wasm.len() as u64).to_le_bytes());
    h.write(wasm);
    h.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(all(feature = "wasmtime", unix))]
fn private_dir(dir: &Path) -> Result<(), WasmError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let fail = |why: String| WasmError::Cache(format!("{}: {why}", dir.display()));
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail(e.to_string()))?;
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| fail(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(fail(format!(
            "not a private directory (a {} owned by uid {}, mode {:o}; need a directory of uid {me}, mode 0700): \
             precompiled modules are native code, refusing to read or write them there",
            if m.file_type().is_symlink() {
                "symlink"
            } else if m.is_dir() {
                "directory"
            } else {
                "file"
            },
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

#[cfg(all(feature = "wasmtime", not(unix)))]
fn private_dir(dir: &Path) -> Result<(), WasmError> {
    Err(WasmError::Cache(format!(
        "{}: the precompiled-module cache needs a Unix host (it checks the directory's owner and mode)",
        dir.display()
    )))
}

/// A regular file (not a symlink) of this user that nobody else can write.
#[cfg(all(feature = "wasmtime", unix))]
fn trusted_entry(entry: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(entry)
        .is_ok_and(|m| m.file_type().is_file() && m.uid() == me && m.mode() & 0o022 == 0)
}

#[cfg(all(feature = "wasmtime", not(unix)))]
fn trusted_entry(_: &Path) -> bool {
    false
}

/// Write a cache entry atomically: a fresh temporary file (never an existing one, never through a symlink),
/// synced, then renamed over the entry's name.
#[cfg(feature = "wasmtime")]
fn write_entry(dir: &Path, entry: &Path, bytes: &[u8]) -> Result<(), WasmError> {
    use std::io::Write;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".tmp-{}-{nanos}.cwasm", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let result = opts
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, entry));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        WasmError::Cache(format!("{}: {e}", entry.display()))
    })
}

#[cfg(feature = "wasmtime")]
fn classify(
    e: wasmtime::Error,
    store: &Store<HostData>,
    call: &'static str,
    limits: WasmLimits,
) -> WasmError {
    if store.data().denied {
        return WasmError::MemoryCap {
            cap_bytes: store.data().cap,
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => WasmError::Deadline {
            call,
            deadline_ms: u64::try_from(limits.deadline.as_millis()).unwrap_or(u64::MAX),
        },
        _ => WasmError::Trap {
            call,
            message: format!("{e:#}"),
        },
    }
}

/// The same API without wasmtime (feature `wasmtime` off): nothing can be loaded, every entry point says so.
#[cfg(not(feature = "wasmtime"))]
mod compiled_out {
    use super::*;

    /// Uninhabited without the `wasmtime` feature: [`WasmRuntime::new`] never returns one.
    pub struct WasmRuntime {
        pub from_cache: bool,
        never: std::convert::Infallible,
    }

    impl WasmRuntime {
        pub fn new(_wasm: &[u8]) -> Result<Arc<Self>, WasmError> {
            Err(WasmError::NotCompiled)
        }

        pub fn with_cache_dir(_wasm: &[u8], _dir: &Path) -> Result<Arc<Self>, WasmError> {
            Err(WasmError::NotCompiled)
        }

        pub fn instances(&self) -> usize {
            match self.never {}
        }

        pub fn lent_layers(&self) -> usize {
            match self.never {}
        }
    }

    /// Uninhabited without the `wasmtime` feature.
    pub(crate) struct WasmPolicy {
        never: std::convert::Infallible,
    }

    impl WasmPolicy {
        pub fn load(
            rt: &Arc<WasmRuntime>,
            _artifact: &[u8],
            _limits: WasmLimits,
        ) -> Result<Self, WasmError> {
            match rt.never {}
        }

        pub fn info(&self) -> WasmInfo {
            match self.never {}
        }

        pub fn act(&mut self, _req: &Request<'_>, _out: &mut ActOutputs) -> Result<(), WasmError> {
            match self.never {}
        }

        pub fn reset(&mut self, _envs: &[u32]) -> Result<(), WasmError> {
            match self.never {}
        }

        pub fn state(&mut self, _k: usize) -> Result<Vec<f32>, WasmError> {
            match self.never {}
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn wasm_compiled_out_is_a_typed_error() {
            assert!(matches!(
                super::WasmRuntime::new(b"\0asm"),
                Err(super::WasmError::NotCompiled)
            ));
            // Every constructor of the real runtime exists here too (this one was still named `with_cache`
            // after the real one became `with_cache_dir`: a caller built without wasmtime failed to compile).
            assert!(matches!(
                super::WasmRuntime::with_cache_dir(b"\0asm", std::path::Path::new(".")),
                Err(super::WasmError::NotCompiled)
            ));
        }
    }
}
#[cfg(not(feature = "wasmtime"))]
pub(crate) use compiled_out::WasmPolicy;
#[cfg(not(feature = "wasmtime"))]
pub use compiled_out::WasmRuntime;
