//! The runtime's typed errors: enums all the way down, so callers (the plugin's error codes, the C ABI's
//! statuses, the browser's error names) match on kinds, never on message text.

use policyport_format::FormatError;
pub use policyport_format::HeadControlError;
use thiserror::Error;

use crate::backend::Backend;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum PolicyError {
    /// The artifact was refused (container, manifest, weights or validation).
    #[error("invalid artifact: {0}")]
    Artifact(#[from] FormatError),
    #[error("bad observations: {0}")]
    Observation(#[from] ObservationError),
    #[error("batch size {batch} is not supported (1 ..= {max})")]
    Batch { batch: usize, max: usize },
    #[error(
        "an act() of {batch} rows with state for {envs} envs needs about {bytes} bytes, over this policy's \
         memory limit of {limit} (Limits::max_memory_bytes; CompiledPolicy::load_with_limits)"
    )]
    Memory {
        batch: usize,
        envs: usize,
        bytes: u64,
        limit: u64,
    },
    /// An allocation sized by the plan and the request failed (the machine, or `ulimit -v`, has less memory than
    /// the policy's budget allows): refused, nothing changed, where an infallible allocation would have aborted
    /// the process.
    #[error(
        "could not allocate {bytes} bytes for {what} (the machine's memory is exhausted; lower the batch, the env \
         count or Limits::max_memory_bytes)"
    )]
    Allocation { what: &'static str, bytes: u64 },
    #[error(
        "the policy computed a non-finite {what} for env row {row} (value {value}): its weights or inputs \
         overflow float32. On executors that keep recurrent state on the device that state has advanced; start \
         the env's episode again"
    )]
    NonFiniteOutput {
        row: usize,
        what: &'static str,
        value: f32,
    },
    #[error("env ids: {0}")]
    EnvIds(#[from] EnvIdError),
    /// The request's action mask or epsilon does not fit the policy's head.
    #[error("{0}")]
    HeadControl(#[from] HeadControlError),
    #[error("recurrent state: {0}")]
    State(#[from] StateError),
    /// The backend failed (no adapter, device lost, readback error). The policy stays usable when the cause is
    /// transient.
    #[error("backend error: {0}")]
    Backend(#[from] BackendError),
    /// Like candle: the API stays the same when a backend is compiled out.
    #[error(
        "policyport was not compiled with the {} backend (enable the cargo feature `{feature}`)",
        backend.name()
    )]
    NotCompiled {
        backend: Backend,
        feature: &'static str,
    },
    /// The sandbox the policy runs in (the wasm plugin under wasmtime: `policyport-wasmtime`) refused the call
    /// from inside, or failed itself (deadline, memory cap, trap, a plugin that breaks its ABI).
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
}

/// What went wrong inside the sandbox a policy runs in (`Backend::Wasmtime`). The plugin's own refusals keep the
/// kind a native session would report ([`SandboxError::Refused`]); the sandbox's own failures are
/// [`ErrorKind::Sandbox`]. After a deadline, memory-cap hit or trap the session's instance is not trusted again
/// (its state may be torn): every later call of that session is [`SandboxError::Poisoned`]; make a new session.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SandboxError {
    /// The plugin's runtime refused the call, with the kind of the refusal (the plugin ABI's error code).
    #[error("refused in the sandbox ({kind}) by '{call}': {message}")]
    Refused {
        kind: ErrorKind,
        call: &'static str,
        message: String,
    },
    /// A call ran past the policy's per-call deadline (`WasmLimits::deadline`).
    #[error("plugin call '{call}' passed its deadline of {deadline_ms} ms")]
    Deadline {
        call: &'static str,
        deadline_ms: u64,
    },
    /// The plugin tried to grow its memory past the cap (`WasmLimits::memory_bytes`), or its allocator ran out
    /// under it.
    #[error("plugin tried to grow its memory past the cap of {cap_bytes} bytes")]
    MemoryCap { cap_bytes: usize },
    #[error("plugin trapped in '{call}': {message}")]
    Trap { call: &'static str, message: String },
    /// The plugin broke its ABI (an unknown result code, an info word out of range, a buffer outside its memory,
    /// a description of the policy other than the host's reading): a broken or hostile plugin.
    #[error("broken plugin: {0}")]
    Broken(String),
    /// The plugin could not be instantiated: not a policyport plugin of this ABI version (missing exports,
    /// foreign imports), or the engine refused it.
    #[error("plugin: {0}")]
    Plugin(String),
    /// An earlier deadline, memory-cap hit or trap of this session (the message) left its instance untrusted.
    #[error("this session's sandboxed instance failed earlier ({0}); make a new session")]
    Poisoned(String),
}

impl SandboxError {
    /// [`ErrorKind::Sandbox`], except for the plugin's own refusals, which keep their kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SandboxError::Refused { kind, .. } => *kind,
            _ => ErrorKind::Sandbox,
        }
    }

    /// Whether the instance that raised it must not be used again (its memory or state may be torn).
    pub fn poisons_the_instance(&self) -> bool {
        matches!(
            self,
            SandboxError::Deadline { .. }
                | SandboxError::MemoryCap { .. }
                | SandboxError::Trap { .. }
        )
    }
}

/// What kind of refusal a [`PolicyError`] is: the one classification every boundary maps from — the C ABI's
/// statuses, the plugin's error codes, the browser's error names, Python's exception classes — so they cannot
/// disagree about the same refused call (they did: a wrong-length episode-starts argument was a bad call in C and
/// the plugin but a state error in JS and Python). Each boundary maps the kind once; the finer variant under it is
/// for the message and for callers who match on it.
///
/// Stable: a kind's [`code`](ErrorKind::code) and [`name`](ErrorKind::name) never change meaning. New kinds may be
/// added, so a `match` outside this crate needs a wildcard arm.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The artifact was refused: container, manifest, weights, validation, limits, format version.
    Artifact,
    /// The observations: wrong length, shape or dtype, a NaN or infinity, a discrete value out of range.
    Observation,
    /// The call's other arguments do not fit: batch size, env ids, episode-start flags, action mask or epsilon.
    Call,
    /// A recurrent-state operation: an env or tensor out of range, values of the wrong size or not finite.
    State,
    /// The backend failed or cannot do what was asked, including a backend this build was not compiled with.
    Backend,
    /// Over the policy's memory limit, or an allocation the machine could not make: refused before anything
    /// changed.
    TooLarge,
    /// The policy computed NaN or infinity.
    NonFinite,
    /// The sandbox the policy runs in failed (deadline, memory cap, trap, a broken plugin, an instance poisoned
    /// by one of these): the policy's inputs were not at fault. Never reported from inside a plugin.
    Sandbox,
}

impl ErrorKind {
    /// Every kind, in code order.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Artifact,
        ErrorKind::Observation,
        ErrorKind::Call,
        ErrorKind::State,
        ErrorKind::Backend,
        ErrorKind::TooLarge,
        ErrorKind::NonFinite,
        ErrorKind::Sandbox,
    ];

    /// A negative number, the same as the wasm plugin ABI's error code of this kind (`policyport_abi::ErrorCode`;
    /// that ABI's codes -6 and -7 are the plugin's handle table and allocator, not kinds of a policy error).
    /// [`ErrorKind::Sandbox`] is -10, a code no plugin returns (a plugin cannot report its own trap).
    pub const fn code(self) -> i32 {
        match self {
            ErrorKind::Artifact => -1,
            ErrorKind::Observation => -2,
            ErrorKind::Call => -3,
            ErrorKind::State => -4,
            ErrorKind::Backend => -5,
            ErrorKind::TooLarge => -8,
            ErrorKind::NonFinite => -9,
            ErrorKind::Sandbox => -10,
        }
    }

    /// A lower-case word: what the browser's errors and Python's exceptions carry as `kind`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Artifact => "artifact",
            ErrorKind::Observation => "observation",
            ErrorKind::Call => "call",
            ErrorKind::State => "state",
            ErrorKind::Backend => "backend",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::NonFinite => "non_finite",
            ErrorKind::Sandbox => "sandbox",
        }
    }

    /// The kind of a [`code`](ErrorKind::code); `None` for a number that is no kind's.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PolicyError {
    /// This error's [`ErrorKind`]: what every boundary reports it as.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PolicyError::Artifact(_) => ErrorKind::Artifact,
            PolicyError::Observation(_) => ErrorKind::Observation,
            // A wrong number of episode-start flags is a malformed call, like a wrong number of env ids; every
            // other state error is about the state itself.
            PolicyError::Batch { .. }
            | PolicyError::EnvIds(_)
            | PolicyError::HeadControl(_)
            | PolicyError::State(StateError::EpisodeStarts { .. }) => ErrorKind::Call,
            PolicyError::State(_) => ErrorKind::State,
            PolicyError::Backend(_) | PolicyError::NotCompiled { .. } => ErrorKind::Backend,
            PolicyError::Memory { .. } | PolicyError::Allocation { .. } => ErrorKind::TooLarge,
            PolicyError::NonFiniteOutput { .. } => ErrorKind::NonFinite,
            PolicyError::Sandbox(e) => e.kind(),
        }
    }
}

/// The env ids of one request are unusable.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EnvIdError {
    #[error("range {start} + {batch} overflows u32")]
    RangeOverflow { start: u32, batch: usize },
    #[error("{found} ids for a batch of {batch}")]
    Count { found: usize, batch: usize },
    /// With per-env recurrent state two rows of one env would read the same state and race to write the next.
    #[error("env {env} appears twice in one batch of a recurrent policy")]
    Duplicate { env: u32 },
    /// A recurrent session holds state for envs below its limit (memory is allocated per env id).
    #[error("env {env} is beyond this session's limit of {limit} envs (Session::set_max_envs)")]
    BeyondLimit { env: u32, limit: usize },
}

/// A recurrent-state operation was refused.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum StateError {
    #[error("env {env} out of range (state holds {num_envs} envs)")]
    EnvOutOfRange { env: u32, num_envs: usize },
    #[error("state tensor {index} does not exist (the policy has {count})")]
    NoSuchTensor { index: usize, count: usize },
    #[error("{found} episode-start flags for a batch of {batch}")]
    EpisodeStarts { found: usize, batch: usize },
    /// [`Session::write_state`](crate::Session::write_state): values for another number of state tensors.
    #[error("{found} state tensors given, the policy has {count}")]
    TensorCount { found: usize, count: usize },
    /// [`Session::write_state`](crate::Session::write_state): a tensor's values are not `envs x numel`.
    #[error("state tensor {index}: {found} values given, {envs} envs x {numel} expected")]
    Values {
        index: usize,
        found: usize,
        envs: usize,
        numel: usize,
    },
    /// [`Session::write_state`](crate::Session::write_state): a NaN or infinite state value would poison every
    /// later step of the env.
    #[error("state tensor {index}: value {value} for env {env} is not finite")]
    NonFinite { index: usize, env: u32, value: f32 },
    /// A feed-forward policy has no state to write.
    #[error("the policy is not recurrent: it has no state to write")]
    NotRecurrent,
}

/// A backend could not do what was asked.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// No wgpu / WebGPU adapter (no GPU and no software Vulkan such as Mesa lavapipe).
    #[error("no usable wgpu adapter: {0}")]
    NoAdapter(String),
    /// Reading results back from the device failed.
    #[error("readback: {0}")]
    Readback(String),
    /// The device runtime raised an error running a step (libtorch, CUDA); the message is the runtime's.
    #[error("device: {0}")]
    Device(String),
    /// WebGPU in a browser cannot block: this call has an async form that must be used instead.
    #[error("WebGPU cannot block in a browser: use {use_instead}")]
    NeedsAsync { use_instead: &'static str },
    /// A value the device program cannot produce on this path (e.g. a blocking golden probe on WebGPU).
    #[error("{0}")]
    Unsupported(&'static str),
    /// The intra-op threads of [`Session::set_threads`](crate::Session::set_threads) could not be started (no
    /// threads on this platform, or the OS refused), or one of them failed a step.
    #[error("threads: {0}")]
    Threads(String),
    /// The requested kernels need an instruction-set extension this CPU lacks (or that POLICYPORT_CPU_BASELINE /
    /// POLICYPORT_CPU_SIMD128 / POLICYPORT_CPU_AVX2 turned off); the default configuration runs everywhere.
    #[error(
        "{wanted} needs the CPU feature {feature}, which this CPU lacks (or POLICYPORT_CPU_BASELINE / POLICYPORT_CPU_SIMD128 / POLICYPORT_CPU_AVX2 is set)"
    )]
    MissingCpuFeature {
        wanted: &'static str,
        feature: &'static str,
    },
    /// The backend's executor lives in another crate (libtorch: `policyport-torch`), which loads policies on it.
    #[error("the {} backend is built by another crate: load with {load_with}", backend.name())]
    BuiltElsewhere {
        backend: Backend,
        load_with: &'static str,
    },
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ObservationError {
    #[error("expected {expected} numbers ({batch} envs x {per_env}), got {found}")]
    Length {
        expected: usize,
        found: usize,
        batch: usize,
        per_env: usize,
    },
    #[error("non-finite value {value} at env {env}, element {element}")]
    NonFinite {
        env: usize,
        element: usize,
        value: f32,
    },
    #[error("discrete observation {value} at env {env} is not an integer in 0..{n}")]
    Discrete { env: usize, value: f32, n: usize },
    /// The caller's array carries a shape (a `.npy` header, a NumPy array, the JS API's `shape`) that is not
    /// `[batch, *the policy's observation shape]`: the same count of numbers in another layout (channels-last
    /// frames for a channels-first policy, say) would be read wrong, so it is refused.
    #[error(
        "observations of shape {found:?}; this policy takes [batch, {}] ({layout})",
        expected.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    )]
    Shape {
        found: Vec<usize>,
        expected: Vec<usize>,
        layout: &'static str,
    },
    #[error("this policy takes {expected} observations, got {found}")]
    DType {
        expected: &'static str,
        found: &'static str,
    },
}

/// `v` resized to `len` (new elements `fill`), its growth allocated fallibly: [`PolicyError::Allocation`] instead of
/// an abort when the memory is not there. Every buffer sized by the plan or the request grows through this.
pub(crate) fn try_resize<T: Clone>(
    v: &mut Vec<T>,
    len: usize,
    fill: T,
    what: &'static str,
) -> Result<(), PolicyError> {
    if len > v.capacity() {
        v.try_reserve_exact(len - v.len())
            .map_err(|_| PolicyError::Allocation {
                what,
                bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
            })?;
    }
    v.resize(len, fill);
    Ok(())
}

/// Capacity for `len` elements in `v`, allocated fallibly; its contents are untouched (for outputs that must stay
/// as they were if a later step of the call fails).
pub(crate) fn try_reserve_len<T>(
    v: &mut Vec<T>,
    len: usize,
    what: &'static str,
) -> Result<(), PolicyError> {
    v.try_reserve(len.saturating_sub(v.len()))
        .map_err(|_| PolicyError::Allocation {
            what,
            bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36: buffers sized by the plan and the request were grown with `resize`, which aborts the process
    /// when the memory is not there ("memory allocation failed"). They grow through these helpers now: a typed
    /// error, and the vector as it was. (A length past what any allocator can give fails the same way on every
    /// machine; a merely large one depends on the machine and is not allocated in a test.)
    #[test]
    fn error_kinds_have_distinct_codes_and_names_that_round_trip() {
        let mut codes: Vec<i32> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), ErrorKind::ALL.len());
        for k in ErrorKind::ALL {
            assert!(k.code() < 0);
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
            assert_eq!(
                ErrorKind::ALL
                    .iter()
                    .filter(|o| o.name() == k.name())
                    .count(),
                1
            );
        }
        assert_eq!(ErrorKind::from_code(-6), None);
        assert_eq!(
            PolicyError::State(StateError::EpisodeStarts { found: 1, batch: 2 }).kind(),
            ErrorKind::Call
        );
        assert_eq!(
            PolicyError::State(StateError::NotRecurrent).kind(),
            ErrorKind::State
        );
    }

    #[test]
    fn an_allocation_the_machine_cannot_make_is_a_typed_error_not_an_abort() {
        let mut v = vec![1.0f32, 2.0];
        let e = try_resize(&mut v, usize::MAX / 2, 0.0, "the policy's activations").unwrap_err();
        assert!(
            matches!(e, PolicyError::Allocation { what: "the policy's activations", bytes } if bytes > 1 << 60),
            "{e}"
        );
        assert_eq!(v, [1.0, 2.0]);
        assert!(try_reserve_len(&mut v, usize::MAX / 2, "the act's outputs").is_err());
        assert_eq!(v, [1.0, 2.0]);
        try_resize(&mut v, 4, 0.5, "x").unwrap();
        assert_eq!(v, [1.0, 2.0, 0.5, 0.5]);
    }
}
