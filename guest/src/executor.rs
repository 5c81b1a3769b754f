//! The one trait every runtime implements: run the lowered graph of a [`CompiledPolicy`](crate::CompiledPolicy)
//! for one step.
//!
//! The split (tract's plan / state): an executor is immutable and shared by every session of a policy (its
//! weights exist once, whatever the number of threads); everything a step mutates — buffers, the device copy of
//! recurrent state — lives in the [`ExecScratch`] it made for one [`Session`](crate::Session). The session does
//! what is the same for every backend (the request check, preprocessing unless the executor does it, gathering
//! and scattering host-side state, sampling unless the executor does it, unpacking outputs); the executor says
//! which of those it takes over with its [`Placement`].
//!
//! Adding a backend = one `Executor` impl and one arm in `Backend`'s [`ExecutorBuilder`] impl (`backend.rs`); a
//! backend that cannot live in this crate (libtorch) implements [`ExecutorBuilder`] in its own crate and loads
//! through [`CompiledPolicy::with_builder`](crate::CompiledPolicy::with_builder): the session, its checks, state
//! model, sampling and golden verification are then the same code as for every other backend.

use std::any::Any;

use policyport_format::sampling::ActMode;
use policyport_format::{Artifact, ValidatedPlan};

use crate::backend::Backend;
use crate::error::{BackendError, PolicyError};

/// What an executor does on its device instead of the session doing it on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// Observations arrive raw (checked, as f32) and are preprocessed by the executor.
    pub preprocess: bool,
    /// Recurrent state lives with the executor (in its scratch) between steps; the session's host rows are not
    /// used for the step and are refreshed with [`Executor::read_state`] when asked for.
    pub state: bool,
    /// The executor samples: its rows are `[actions | finished params | value]` instead of the head's raw
    /// values followed by next states.
    pub sampling: bool,
    /// With `preprocess`: the executor takes the request's observations as they are ([`StepInput::raw`]),
    /// uint8 frames as bytes, and widens them itself; the session then neither copies nor widens them
    /// ([`StepInput::obs`] is empty).
    pub raw_observations: bool,
    /// With `sampling`: the executor writes the act's outputs itself ([`Executor::launch_outputs`]: actions,
    /// finished distribution parameters, value) instead of rows, and [`Executor::launch`] is not called. The
    /// session still checks them (finite, actions in range, sizes), draws on the host where the request has a
    /// mask or an epsilon, and makes them the session's outputs only when they pass. The sandbox does: its
    /// plugin returns outputs, and packing them into rows for the session to unpack again turned every discrete
    /// action into an f32 and back.
    pub outputs: bool,
}

/// One step's inputs, after the session's checks.
#[derive(Debug)]
pub struct StepInput<'a> {
    pub batch: usize,
    /// `batch x width` f32: preprocessed, or raw when [`Placement::preprocess`]; empty when
    /// [`Placement::raw_observations`] (see `raw`).
    pub obs: &'a [f32],
    /// The request's observations as the caller gave them (checked), for an executor whose placement has
    /// [`Placement::raw_observations`]; `None` otherwise.
    pub raw: Option<crate::Observations<'a>>,
    /// The env id of every row (distinct when the policy is recurrent).
    pub env_ids: &'a [u32],
    pub mode: ActMode,
    /// Host-state executors: per state tensor, the `batch x numel` rows gathered for this batch.
    pub states: &'a [Vec<f32>],
    /// Device-state executors: how many envs the session's state holds now (the device copy grows to match).
    pub num_envs: usize,
    /// The caller does not want the value estimate ([`crate::Request::skip_value`]): an executor may skip the
    /// nodes only it needs (the cpu backend does); the value's column of its rows must still be finite (any
    /// number: the session does not read it).
    pub skip_value: bool,
}

/// Per-session mutable data of one executor (downcast by the executor that made it).
pub type ExecScratch = Box<dyn Any + Send>;

/// How a backend's deferred rows can be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readback {
    /// [`Pending::wait`] may block for them (and [`Pending::wait_async`] awaits them).
    Blocking,
    /// Only [`Pending::wait_async`]: the device maps its buffers asynchronously (WebGPU in a browser, where a
    /// blocking read would trap the whole wasm instance). [`Pending::wait`] answers
    /// [`BackendError::NeedsAsync`].
    AsyncOnly,
}

/// The rows of one step, read back on completion.
pub type RowsFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<f32>, PolicyError>> + Send>>;

/// A step's rows that are still on a device (an executor's own type: a burn tensor, a GPU buffer), read once.
pub trait DeferredRows: Send {
    /// Whether [`DeferredRows::wait`] may be called.
    fn readback(&self) -> Readback;

    /// Block until the rows are on the host. Only called where [`DeferredRows::readback`] is
    /// [`Readback::Blocking`].
    fn wait(self: Box<Self>) -> Result<Vec<f32>, PolicyError>;

    /// The rows, without blocking.
    fn wait_async(self: Box<Self>) -> RowsFuture;
}

/// A launched step whose rows may still be on the device. [`Pending::wait`] blocks for them,
/// [`Pending::wait_async`] awaits them (the only way on WebGPU in a browser).
#[must_use]
pub enum Pending {
    /// The rows are already in the caller's buffer.
    Ready,
    /// Rows still on a device, read back once.
    Deferred(Box<dyn DeferredRows>),
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pending::Ready => f.write_str("Ready"),
            Pending::Deferred(d) => write!(f, "Deferred({:?})", d.readback()),
        }
    }
}

impl Pending {
    /// The rows into `rows`, blocking for a device's; a device that cannot block answers
    /// [`BackendError::NeedsAsync`] (use [`Pending::wait_async`]).
    pub fn wait(self, rows: &mut Vec<f32>) -> Result<(), PolicyError> {
        match self {
            Pending::Ready => Ok(()),
            Pending::Deferred(d) => {
                if d.readback() == Readback::AsyncOnly {
                    return Err(BackendError::NeedsAsync {
                        use_instead: "Session::act_async",
                    }
                    .into());
                }
                *rows = d.wait()?;
                Ok(())
            }
        }
    }

    /// The rows into `rows`, awaiting a device's.
    pub async fn wait_async(self, rows: &mut Vec<f32>) -> Result<(), PolicyError> {
        match self {
            Pending::Ready => Ok(()),
            Pending::Deferred(d) => {
                *rows = d.wait_async().await?;
                Ok(())
            }
        }
    }
}

/// Builds one backend's executors for an artifact: the step program a policy keeps, and one-off probe programs
/// (golden values that are not act() outputs). Kept by the [`CompiledPolicy`](crate::CompiledPolicy) for those
/// probes.
pub trait ExecutorBuilder: Send + Sync {
    fn backend(&self) -> Backend;

    /// The one lowering ([`crate::lower`]) of `art` for this backend. `readback: None`: the step program, whose
    /// rows are the head values (distribution values, value estimate) and the next recurrent states (or, with
    /// [`Placement::sampling`], actions, finished parameters and value). `Some(values)`: a program whose rows
    /// are just those values (placement all host-side: preprocessed observations in, host state rows in).
    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError>;
}

/// A lowered policy on one backend. Immutable: `&self` everywhere, `Send + Sync`.
pub trait Executor: Send + Sync {
    fn backend(&self) -> Backend;

    fn placement(&self) -> Placement {
        Placement::default()
    }

    /// Batch sizes [`CompiledPolicy`](crate::CompiledPolicy) acts at once while loading, so that the first real
    /// act() pays no setup: batch 1 by default; a GPU program also a batch large enough to build its tiled
    /// kernels' pipelines. (The policy caps these by observation size: see `CompiledPolicy::warm_up_batches`.)
    fn warm_up_batches(&self) -> &'static [usize] {
        &[1]
    }

    /// Bytes per row of an act() this executor uses beyond the plan's estimate ([`ValidatedPlan::memory`], which
    /// knows the graph but not the kernels): added to it when an act() is checked against
    /// `Limits::max_memory_bytes`. 0 by default; the cpu backend in bf16 reports its rounded-input buffer.
    fn extra_bytes_per_row(&self) -> u64 {
        0
    }

    /// Whether every allocation an act() makes on this executor can fail with a typed error
    /// ([`PolicyError::Allocation`], a libtorch error, the sandbox's memory cap) rather than abort the process.
    /// `false` (the default) for executors whose library allocates infallibly (burn's flex and wgpu backends): the
    /// policy then reserves the act's estimated memory once per new high-water mark before the act, and a failed
    /// reservation is `PolicyError::Allocation` instead of an abort inside the library.
    fn allocations_are_fallible(&self) -> bool {
        false
    }

    /// Numbers per env of each recurrent state input, in manifest order.
    fn state_sizes(&self) -> &[usize];

    /// Numbers per env in one row of the step's output (see [`Placement::sampling`]).
    fn row_width(&self) -> usize;

    /// Device dispatches one step issues (GPU executors), for reports.
    fn dispatches_per_act(&self) -> Option<usize> {
        None
    }

    /// The per-session data of a new session.
    fn new_scratch(&self) -> ExecScratch;

    /// Run one step: write `batch x row_width` numbers into `rows` (cleared first), or return them pending on
    /// the device.
    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError>;

    /// Run this session's steps on `threads` threads (the caller's and `threads - 1` workers the scratch owns);
    /// 1: on the caller's thread only (the default). Backends without intra-op threads accept 1 and refuse more.
    /// Run one step into `out` (an executor whose placement has [`Placement::outputs`]): `batch` rows of
    /// actions, finished distribution parameters and, unless [`StepInput::skip_value`], values; `out.batch` set.
    /// `out` is the session's spare outputs (last-but-one act's buffers, to be reused): it becomes the session's
    /// outputs only once its checks pass, so a failed step leaves the caller's outputs as they were.
    fn launch_outputs(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        out: &mut crate::ActOutputs,
    ) -> Result<(), PolicyError> {
        let _ = (scratch, step, out);
        Err(BackendError::Unsupported(
            "writing act() outputs directly (Placement::outputs) on this backend",
        )
        .into())
    }

    fn set_threads(&self, scratch: &mut ExecScratch, threads: usize) -> Result<(), PolicyError> {
        let _ = scratch;
        if threads > 1 {
            return Err(BackendError::Unsupported(
                "intra-op threads (Session::set_threads) on this backend: only the cpu backend has them",
            )
            .into());
        }
        Ok(())
    }

    /// The threads a step of this session uses (see [`Executor::set_threads`]).
    fn threads(&self, scratch: &mut ExecScratch) -> usize {
        let _ = scratch;
        1
    }

    /// How this session's steps use its threads (see [`crate::Session::set_thread_split`]); backends without
    /// intra-op threads have nothing to choose and keep nothing.
    fn set_thread_split(&self, scratch: &mut ExecScratch, mode: crate::ThreadSplit) {
        let _ = (scratch, mode);
    }

    /// The mode [`Executor::set_thread_split`] set ([`crate::ThreadSplit::Measured`] where it keeps none).
    fn thread_split(&self, scratch: &mut ExecScratch) -> crate::ThreadSplit {
        let _ = scratch;
        crate::ThreadSplit::default()
    }

    /// Wake this session's worker threads ahead of its next step (see [`crate::Session::wake_threads`]); none:
    /// nothing to do.
    fn wake_threads(&self, scratch: &mut ExecScratch) {
        let _ = scratch;
    }

    /// Device-state executors: zero the state rows of these envs (episode starts, resets).
    fn reset_state(&self, scratch: &mut ExecScratch, envs: &[u32]) -> Result<(), PolicyError> {
        let _ = (scratch, envs);
        Ok(())
    }

    /// Device-state executors: overwrite the state rows of `envs` (distinct, each below `num_envs`, the session's
    /// env count after growing) with `values[k]` (`envs.len() x numel_k` per state tensor). Host-state
    /// executors keep nothing: the session has written its host rows already. A device-state executor that does
    /// not implement it refuses (a silent no-op would leave the device's rows stale while the host's changed).
    fn write_state(
        &self,
        scratch: &mut ExecScratch,
        envs: &[u32],
        values: &[&[f32]],
        num_envs: usize,
    ) -> Result<(), PolicyError> {
        let _ = (scratch, envs, values, num_envs);
        if self.placement().state {
            return Err(BackendError::Unsupported(
                "writing recurrent state from the caller on this backend (its state lives on the device)",
            )
            .into());
        }
        Ok(())
    }

    /// Device-state executors: the device copy, `num_envs x numel` per state tensor, when it is newer than the
    /// session's host rows (None otherwise, and always on host-state executors).
    fn read_state(&self, scratch: &mut ExecScratch) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        let _ = scratch;
        Ok(None)
    }
}

/// Downcast a scratch to the type its executor made in [`Executor::new_scratch`]. A session only ever hands an
/// executor the scratch that executor made, so another type is a bug in the runtime, not a caller's error.
pub fn scratch_of<T: 'static>(scratch: &mut ExecScratch) -> &mut T {
    scratch
        .downcast_mut::<T>()
        .expect("a session's scratch comes from its own executor")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows that say how they can be read, and from which path they came.
    struct Rows(Readback);

    impl DeferredRows for Rows {
        fn readback(&self) -> Readback {
            self.0
        }
        fn wait(self: Box<Self>) -> Result<Vec<f32>, PolicyError> {
            Ok(vec![1.0])
        }
        fn wait_async(self: Box<Self>) -> RowsFuture {
            Box::pin(async { Ok(vec![2.0]) })
        }
    }

    fn ready<T>(f: impl std::future::Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("these rows are ready at once"),
        }
    }

    /// A device that cannot block (WebGPU in a browser) is never blocked on: `wait` is the typed NeedsAsync
    /// error naming the async call, `wait_async` reads the rows; a blocking device serves both.
    #[test]
    fn an_async_only_readback_is_never_blocked_on() {
        let mut rows = vec![];
        let e = Pending::Deferred(Box::new(Rows(Readback::AsyncOnly)))
            .wait(&mut rows)
            .unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::Backend(BackendError::NeedsAsync {
                    use_instead: "Session::act_async"
                })
            ),
            "{e:?}"
        );
        assert!(rows.is_empty());
        ready(Pending::Deferred(Box::new(Rows(Readback::AsyncOnly))).wait_async(&mut rows))
            .unwrap();
        assert_eq!(rows, [2.0]);
        Pending::Deferred(Box::new(Rows(Readback::Blocking)))
            .wait(&mut rows)
            .unwrap();
        assert_eq!(rows, [1.0]);
        rows = vec![5.0];
        Pending::Ready.wait(&mut rows).unwrap();
        assert_eq!(
            rows,
            [5.0],
            "ready rows are left as the executor wrote them"
        );
    }
}
