//! Web Workers lent to the cpu backend's intra-op threads, for the browser bundle built with wasm threads
//! (`+atomics`, shared memory: `web/pkg/cpu-threads`). std cannot spawn threads on wasm32-unknown-unknown, so
//! the page does: it starts Web Workers that instantiate the same module on the same memory, and each lends its
//! thread here with [`serve_worker`], which does not return.
//! [`Session::set_threads`](crate::Session::set_threads)`(n)` then borrows `n - 1` idle workers for that session
//! (a typed error when fewer are idle) and gives them back when the session drops its threads.
//!
//! The same functions exist in every build (the API does not change with the build): without wasm threads they
//! answer [`BackendError::Threads`] and [`idle_workers`] is 0. The browser glue (`startThreads` in
//! guest/web) is the only intended caller.

use crate::error::BackendError;

/// True when this build borrows Web Workers for its threads (wasm32 with shared memory).
pub const COMPILED: bool = cfg!(policyport_wasm_threads);

#[cfg(not(policyport_wasm_threads))]
fn not_compiled() -> BackendError {
    BackendError::Threads(
        "this build has no wasm threads (the browser bundle built with +atomics and shared memory lends Web \
         Workers; native builds start their own threads)"
            .into(),
    )
}

/// Lend the calling thread (a Web Worker on this module's shared memory) to the cpu backend: it goes on the idle
/// list, `ready()` runs (the worker tells the page; `false`: it could not, and the thread is taken off the list
/// again), then it runs the jobs of whichever session borrows it, forever (parked while idle). One call, so no
/// thread is ever on the idle list without serving it. Returns only with an error: lent already, `ready` failed,
/// or no wasm threads in this build.
pub fn serve_worker(
    ready: impl FnOnce() -> bool,
) -> Result<std::convert::Infallible, BackendError> {
    #[cfg(policyport_wasm_threads)]
    {
        crate::pool::web::serve_worker(ready)
    }
    #[cfg(not(policyport_wasm_threads))]
    {
        let _ = ready;
        Err(not_compiled())
    }
}

/// Lend the cpu backend a clock, in ms (the page's `performance.now()`, on every thread that calls act()), so that
/// [`ThreadSplit::Measured`](crate::ThreadSplit::Measured) can time its steps: wasm32-unknown-unknown's std has
/// none, and without one a session with threads splits every step big enough, however it measures. The first
/// clock lent stays; a no-op off wasm (native builds use the OS's clock).
pub fn set_clock(ms: fn() -> f64) {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = crate::thread_split::CLOCK.set(ms);
    }
    #[cfg(not(target_arch = "wasm32"))]
    let _ = ms;
}

/// The worker's [`serve_worker`] trapped (a panic aborts in wasm, which the page sees as an exception in that
/// worker): called by the page on that worker's thread, it marks the worker gone, so the session waiting for its
/// rows gets a typed error instead of waiting forever, and no session borrows it again.
pub fn worker_trapped() {
    #[cfg(policyport_wasm_threads)]
    crate::pool::web::worker_trapped();
}

/// Lent workers no session holds now.
pub fn idle_workers() -> usize {
    #[cfg(policyport_wasm_threads)]
    {
        crate::pool::web::idle_workers()
    }
    #[cfg(not(policyport_wasm_threads))]
    {
        0
    }
}
