//! The conformance suite: one test binary, run against every backend this build has.
//!
//! - `parity`: every fixture compiled from its ONNX export; float outputs within the fixture's tolerance of
//!   PyTorch float64, seeded samples equal to the independent Python sampler's, on every backend.
//! - `fixtures`: the committed fixture files are exactly what tests/fixtures/generate.py declared.
//! - `artifact`: round trips, storage precisions, inspect snapshots (re-bless with POLICYPORT_BLESS=1).
//! - `frozen`: artifacts written by earlier format versions (tests/frozen) load and answer the same, everywhere.
//! - `bad_input`: the hostile-input corpus: every case a typed error, never a panic.
//! - `episodes`: the trained policies replay the PyTorch policy's evaluation episodes.
//! - `recurrent`: per-env recurrent state on every backend.
//! - `cleanrl`: CleanRL state dicts with `--layout` and spaces reproduce the agent everywhere; wrong layouts.
//! - `sb3`: Stable-Baselines3 archives written by SB3 compile alone and reproduce SB3 everywhere; hostile archives.
//! - `masks`: action masks (sb3-contrib MaskablePPO) and epsilon overrides on every backend: sb3-contrib's
//!   actions and log-probabilities, 10^5 draws with no forbidden action, typed refusals that change nothing.
//! - `capi`: the C ABI from Rust and from a C program built with the system compiler.
//! - `cpu_bf16`: the cpu backend's opt-in bf16 kernels: bf16 tolerance on every fixture, threads, typed refusal.
//! - `wasm`: the sandboxed plugin under wasmtime (parity, limits, hostile modules, cache, threads).
//! - `values`: `Request::skip_value` on every backend: the same actions, parameters and state without the value,
//!   the critic's own nodes skipped, a non-finite value left out no error.
//! - `gpu`: the wgpu backend's dispatch count, batch sizes 1 to 65536, the `auto` choice.
//! - `torch`: the libtorch executor (feature `tch`): parity on CPU in f32 / f16 / bf16, the guest's samples,
//!   bucket padding, device state; CUDA and CUDA graphs when a GPU is present (`POLICYPORT_REQUIRE_CUDA=1`
//!   makes their absence a failure).
//!
//! A check that runs on every backend is one test per backend (`per_backend!`): `parity::<check>::on_wgpu`, ...
//! so a failure names its backend and `cargo test -- ::on_wgpu` runs one backend's checks alone.

/// One `#[test]` per backend (issue 37): `per_backend!(check)` turns `fn check(backend: Backend)` into the tests
/// `check::on_cpu`, `check::on_flex`, `check::on_wgpu`, `check::on_torch`, `check::on_wasmtime`, so
/// `cargo test -- ::on_wgpu` runs the wgpu backend's checks alone and a failure names its backend. A backend this
/// build lacks is an ignored test with its reason (counted as skipped), never a pass.
macro_rules! per_backend {
    ($check:ident) => {
        backend_tests!($check: cpu, flex, wgpu, torch, wasmtime);
    };
}

/// [`per_backend!`] for a check of the runtime's built-in backends only (`CompiledPolicy::load`: cpu, flex, wgpu),
/// e.g. one that needs `load_with_limits`: the tests `check::on_cpu`, `check::on_flex`, `check::on_wgpu`. Torch and
/// wasmtime have no such test at all (not a passing one).
macro_rules! per_builtin_backend {
    ($check:ident) => {
        backend_tests!($check: cpu, flex, wgpu);
    };
}

/// The module of `check`'s tests, one per backend named.
macro_rules! backend_tests {
    ($check:ident: $($backend:ident),+) => {
        mod $check {
            $(backend_test!($check, $backend);)+
        }
    };
}

/// One backend's test of `check`: `on_<backend>`, ignored with its reason where the build lacks the backend.
macro_rules! backend_test {
    ($check:ident, cpu) => {
        #[test]
        fn on_cpu() {
            crate::on_backend(policyport::Backend::Cpu, super::$check)
        }
    };
    ($check:ident, flex) => {
        #[test]
        fn on_flex() {
            crate::on_backend(policyport::Backend::Flex, super::$check)
        }
    };
    ($check:ident, wgpu) => {
        #[test]
        #[cfg_attr(
            not(feature = "wgpu"),
            ignore = "built without the wgpu feature (policyport-conformance/wgpu)"
        )]
        fn on_wgpu() {
            crate::on_backend(policyport::Backend::Wgpu, super::$check)
        }
    };
    ($check:ident, torch) => {
        #[test]
        #[cfg_attr(
            not(feature = "tch"),
            ignore = "built without the tch feature (policyport-conformance/tch)"
        )]
        fn on_torch() {
            crate::on_backend(policyport::Backend::Torch, super::$check)
        }
    };
    ($check:ident, wasmtime) => {
        #[test]
        fn on_wasmtime() {
            crate::on_backend(policyport::Backend::Wasmtime, super::$check)
        }
    };
}

/// Run `check` on `backend`, which must be one this run tests (`policyport_conformance::backends()`): the reruns of
/// test.sh under POLICYPORT_CPU_BASELINE / _AVX2 / _SIMD128 (cpu only) and POLICYPORT_WASM_LEND (wasmtime only)
/// select their backend's tests by name; a test of another backend run there fails loudly instead of passing.
pub(crate) fn on_backend(backend: policyport::Backend, check: fn(policyport::Backend)) {
    let run = policyport_conformance::backends();
    assert!(
        run.contains(&backend),
        "this run tests {run:?} only (POLICYPORT_CPU_* / POLICYPORT_WASM_LEND): select its tests by name, e.g. -- ::on_cpu"
    );
    check(backend)
}

mod agents;
mod artifact;
mod bad_input;
mod bevy;
mod capi;
mod cleanrl;
mod cpu_bf16;
mod episodes;
mod fixtures;
mod frozen;
mod gpu;
mod masks;
mod onnx_backend;
mod parity;
mod preprocess;
mod recurrent;
mod refusals;
mod rllib;
mod sb3;
mod torch;
mod trainer_files;
mod values;
mod wasm;

/// Runs `f` beside a thread that spins on a core (as the rest of a loaded CI run would): the intra-op pool's workers
/// then wake late and are preempted, so the parts of a threaded act() vary in size from call to call. A buffer
/// sized by the part a thread happened to take (instead of the largest it can take) shows as an allocation in a
/// warm act() this way; unloaded it showed in 0 of many runs (see CONTRIBUTING, "A test that fails only under
/// load").
pub fn beside_a_busy_core<R>(f: impl FnOnce() -> R) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let r = f();
        stop.store(true, Ordering::Relaxed);
        r
    })
}

/// Allocations on the calling thread over acts `1..steps` of `session` with 3 intra-op threads used as `split`
/// says, after one warm-up act (`req(step)` is step's request), all of it beside a busy core: the zero-allocation
/// check of a threaded act() (parity.rs in f32, cpu_bf16.rs in bf16). A new session: its buffers sized by nothing
/// but this warm-up. `ThreadSplit::Measured` switches between the split and the caller alone from step to step
/// (its first probe of the caller alone at step 17): give it more than 20 steps.
pub fn warm_threaded_act_allocations<'a>(
    session: &mut policyport::Session,
    split: policyport::ThreadSplit,
    steps: u64,
    req: impl Fn(u64) -> policyport::Request<'a>,
) -> usize {
    session.set_threads(3).unwrap();
    session.set_thread_split(split);
    beside_a_busy_core(|| {
        session.act(&req(0)).unwrap();
        alloc_count::allocations_in(|| {
            for step in 1..steps {
                session.act(&req(step)).unwrap();
            }
        })
    })
}

/// Counts heap allocations per thread, so tests can assert a warm act() allocates nothing.
pub mod alloc_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<usize> = const { Cell::new(0) };
        /// Inside [`allocations_in`] with `POLICYPORT_TRACE_ALLOCS` set: print where each allocation came from.
        static TRACE: Cell<bool> = const { Cell::new(false) };
    }

    /// The backtrace of an allocation made while tracing (the capture allocates too: tracing is off meanwhile).
    fn trace() {
        if TRACE.with(|t| t.replace(false)) {
            eprintln!(
                "allocation on a thread that should not allocate:\n{}",
                std::backtrace::Backtrace::force_capture()
            );
            TRACE.with(|t| t.set(true));
        }
    }

    pub struct Counting;

    // SAFETY: forwards to the system allocator; only adds a thread-local counter (and, when tracing, a backtrace
    // printed with tracing off, so it does not recurse).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            COUNT.with(|c| c.set(c.get() + 1));
            trace();
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            COUNT.with(|c| c.set(c.get() + 1));
            trace();
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    /// Allocations `f` made on this thread. With `POLICYPORT_TRACE_ALLOCS=1` each one's backtrace goes to stderr:
    /// how the threaded act()'s one allocation in a loaded run was found (a convolution's chunk buffer).
    pub fn allocations_in(f: impl FnOnce()) -> usize {
        let tracing = std::env::var_os("POLICYPORT_TRACE_ALLOCS").is_some_and(|v| v == "1");
        let before = COUNT.with(|c| c.get());
        TRACE.with(|t| t.set(tracing));
        f();
        TRACE.with(|t| t.set(false));
        COUNT.with(|c| c.get()) - before
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;
}
