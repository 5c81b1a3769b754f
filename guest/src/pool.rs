//! The opt-in intra-op pool of the cpu backend: a session's act() split by batch rows over `threads` threads
//! (the caller's plus `threads - 1` workers the session owns).
//!
//! Why rows: every instruction of a lowered program works row by row (a dense layer's rows, a convolution's envs,
//! a recurrent cell's envs), so a part of the batch runs the whole program on its own buffers with one hand-off
//! and one join per act(), not one per layer. Why our own pool and not rayon: act() at batch 64 takes ~80 µs on
//! one core, so the hand-off must cost a few µs; a worker spins for a short while after each job (back-to-back
//! act() calls, a sampling loop, find it awake) and then parks, so an idle session costs no CPU. Each worker
//! belongs to one session (a session is one caller's, `!Sync`): sessions never queue behind each other.
//!
//! Failure model: a worker that panics (a bug: the kernels assert their bounds) is caught, its job reported as
//! failed, and the caller gets a typed error rather than a hang; the caller always waits for every posted part
//! before returning or unwinding, so the borrowed job never outlives the call.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::error::BackendError;

/// How long a worker (and a caller waiting for one) spins before it parks. Long enough to bridge the gap between
/// back-to-back act() calls (session checks and sampling take a few µs), short enough that an idle session is idle.
const SPIN: Duration = Duration::from_micros(60);

/// A job as the workers see it: the caller's closure with its lifetime erased. Sound because the caller waits
/// for every worker to finish it before the closure's borrow ends (see [`RowPool::run`]).
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the closure behind the pointer is `Sync`; it is only called while the caller keeps it alive.
unsafe impl Send for JobPtr {}

struct Slot {
    /// Number of the last job posted to this worker (0: none yet).
    posted: AtomicU64,
    /// Number of the last job this worker finished.
    done: AtomicU64,
    /// The job and the thread to wake when it is done.
    job: Mutex<Option<(JobPtr, Thread)>>,
    panicked: AtomicBool,
    exit: AtomicBool,
}

struct Worker {
    slot: Arc<Slot>,
    thread: Option<JoinHandle<()>>,
}

pub(crate) struct RowPool {
    workers: Vec<Worker>,
    jobs: u64,
}

impl std::fmt::Debug for RowPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RowPool({} workers)", self.workers.len())
    }
}

impl RowPool {
    /// `workers` threads besides the caller's. A platform without threads (wasm32 in a browser or a wasm host)
    /// gives a typed error.
    pub(crate) fn new(workers: usize) -> Result<RowPool, BackendError> {
        let mut pool = RowPool {
            workers: Vec::with_capacity(workers),
            jobs: 0,
        };
        for w in 0..workers {
            let slot = Arc::new(Slot {
                posted: AtomicU64::new(0),
                done: AtomicU64::new(0),
                job: Mutex::new(None),
                panicked: AtomicBool::new(false),
                exit: AtomicBool::new(false),
            });
            let for_thread = slot.clone();
            let thread = std::thread::Builder::new()
                .name(format!("policyport-cpu-{}", w + 1))
                .spawn(move || worker_loop(&for_thread, w + 1))
                .map_err(|e| BackendError::Threads(e.to_string()))?;
            pool.workers.push(Worker {
                slot,
                thread: Some(thread),
            });
        }
        Ok(pool)
    }

    /// Threads a job can use: the workers and the caller.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `job(0)` on the calling thread and `job(i)` on worker `i` for `i` in `1..parts`, and return when all are done. A part
    /// that panicked on a worker is a typed error (the caller's own part panicking unwinds as usual, after the
    /// workers finished).
    pub(crate) fn run(
        &mut self,
        parts: usize,
        job: &(dyn Fn(usize) + Sync),
    ) -> Result<(), BackendError> {
        let parts = parts.clamp(1, self.threads());
        self.jobs += 1;
        let number = self.jobs;
        // SAFETY: only the lifetime is erased; `Join` below waits for every posted part before `job`'s borrow
        // can end, on return and on unwind.
        let ptr = JobPtr(unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(job)
        });
        let me = std::thread::current();
        for worker in &self.workers[..parts - 1] {
            *lock(&worker.slot.job) = Some((ptr, me.clone()));
            worker.slot.posted.store(number, Ordering::Release);
            if let Some(t) = &worker.thread {
                t.thread().unpark();
            }
        }
        let join = Join {
            workers: &self.workers[..parts - 1],
            number,
        };
        job(0);
        drop(join);
        for worker in &self.workers[..parts - 1] {
            if worker.slot.panicked.swap(false, Ordering::AcqRel) {
                return Err(BackendError::Threads(
                    "a worker thread panicked running its rows (a bug in policyport: please report it)".into(),
                ));
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The lock only guards a plain value set and read whole: a poisoned one holds a valid value.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for the posted parts when dropped (also while unwinding from the caller's own part).
struct Join<'a> {
    workers: &'a [Worker],
    number: u64,
}

impl Drop for Join<'_> {
    fn drop(&mut self) {
        for w in self.workers {
            wait_until(|| w.slot.done.load(Ordering::Acquire) >= self.number);
        }
    }
}

/// Spin for [`SPIN`], then park until `ready` (unparks may be early or spurious: always re-checked).
fn wait_until(ready: impl Fn() -> bool) {
    let start = Instant::now();
    let mut spins = 0u32;
    while !ready() {
        if spins < 64 || start.elapsed() < SPIN {
            spins = spins.wrapping_add(1);
            std::hint::spin_loop();
        } else {
            // Whoever makes `ready` true unparks this thread afterwards; a token left from before returns at once.
            std::thread::park();
        }
    }
}

/// Worker `part`'s loop: it always runs `job(part)`.
fn worker_loop(slot: &Slot, part: usize) {
    let mut seen = 0;
    loop {
        wait_until(|| {
            slot.exit.load(Ordering::Acquire) || slot.posted.load(Ordering::Acquire) != seen
        });
        if slot.exit.load(Ordering::Acquire) {
            return;
        }
        seen = slot.posted.load(Ordering::Acquire);
        let job = lock(&slot.job).clone();
        if let Some((JobPtr(f), caller)) = job {
            // SAFETY: the caller posted `f` for job `seen` and waits until `done` reaches it.
            let ok = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(part) })).is_ok();
            if !ok {
                slot.panicked.store(true, Ordering::Release);
            }
            slot.done.store(seen, Ordering::Release);
            caller.unpark();
        } else {
            slot.done.store(seen, Ordering::Release);
        }
    }
}

impl Drop for RowPool {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            worker.slot.exit.store(true, Ordering::Release);
            if let Some(t) = worker.thread.take() {
                t.thread().unpark();
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once_per_job() {
        let mut pool = RowPool::new(3).unwrap();
        let hits: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..1000 {
            pool.run(4, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
        pool.run(2, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        let counts: Vec<usize> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [1001, 1001, 1000, 1000]);
    }

    #[test]
    fn a_panicking_worker_is_a_typed_error_not_a_hang() {
        let mut pool = RowPool::new(1).unwrap();
        let r = pool.run(2, &|i| {
            if i == 1 {
                panic!("worker part");
            }
        });
        assert!(matches!(r, Err(BackendError::Threads(_))));
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(2, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn idle_workers_park_and_wake() {
        let mut pool = RowPool::new(1).unwrap();
        let n = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(5));
            pool.run(2, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
        assert_eq!(n.load(Ordering::Relaxed), 6);
    }
}
