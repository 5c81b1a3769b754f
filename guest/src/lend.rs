//! Dense layers computed by someone else: the host-lent kernel of the sandboxed plugin.
//!
//! Why: inside a wasm sandbox the runtime's own kernels are SIMD128 (4 lanes) under the engine's bounds-checked
//! memory, 4-7x slower than the native AVX-512 kernels at batch ≥ 64. A host that trusts its own code (not the
//! guest's) can lend the guest a native dense layer: the guest offers each layer's weights once at load
//! ([`DenseLender::lend`]), the host copies and packs them natively, and at act() the guest asks the host to run
//! the layer on ranges of its own memory ([`DenseLender::run`]), which the host checks before touching. The guest
//! never gives the host code, only numbers; everything else (checks, preprocessing, state, sampling) stays in the
//! sandbox. A lender may decline any layer and refuse any call: the layer is then computed by the runtime's own
//! kernels, which are always packed too, so a refusal loses nothing.
//!
//! [`CpuWithLender`] is the `cpu` backend with a lender (the plugin builds its policies with one when its host
//! lends); [`DenseKernel`] is the runtime's own dense kernel for a host to lend (the wasmtime host uses it, so a
//! lent layer computes exactly what the native `cpu` backend computes).

use std::fmt;
use std::sync::Arc;

use crate::dense::PackedDense;
use crate::error::PolicyError;
use crate::executor::{Executor, ExecutorBuilder};
use crate::format::{Artifact, ValidatedPlan};
use crate::kernels;
use crate::{Activation, Backend};

/// Computes dense layers for the runtime (see the module docs).
pub trait DenseLender: Send + Sync {
    /// Offer one layer: `w` is `[n, k]` row-major (PyTorch's layout), `bias` `[n]`. `Some(id)` when the lender
    /// takes it (it keeps its own copy); `None` when it declines.
    fn lend(&self, w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Option<u32>;

    /// `y[m, n] = act(x[m, k] Wᵀ + b)` for a layer [`lend`](Self::lend) took (`x.len() == m·k`,
    /// `y.len() == m·n`). `false` when the lender did not compute it (the runtime then does).
    fn run(&self, id: u32, x: &[f32], y: &mut [f32], m: usize, act: Activation) -> bool;
}

/// A layer a lender took: every run goes to the lender first.
#[derive(Clone)]
pub(crate) struct Lent {
    pub(crate) lender: Arc<dyn DenseLender>,
    pub(crate) id: u32,
}

impl fmt::Debug for Lent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lent({})", self.id)
    }
}

/// The `cpu` backend whose dense layers (convolutions' GEMMs included) are offered to `lender` at load.
#[derive(Clone)]
pub struct CpuWithLender {
    lender: Arc<dyn DenseLender>,
}

impl CpuWithLender {
    pub fn new(lender: Arc<dyn DenseLender>) -> Self {
        CpuWithLender { lender }
    }
}

impl ExecutorBuilder for CpuWithLender {
    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError> {
        let head_and_states = crate::lower::step_readback(art, plan);
        let values = readback.unwrap_or(&head_and_states);
        Ok(Box::new(crate::cpu::CpuExecutor::with_lender(
            art,
            plan,
            values,
            Some(&self.lender),
            crate::Precision::F32,
        )))
    }
}

/// The runtime's dense kernel (`y = act(x Wᵀ + b)`, weights packed once for this CPU's widest vectors, bias and
/// activation fused): what a host lends a sandboxed guest.
#[derive(Debug, Clone)]
pub struct DenseKernel {
    packed: PackedDense,
}

/// Shapes that do not describe a dense layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a dense layer of {n} outputs × {k} inputs needs {want_w} weights and {n} biases; got {got_w} and {got_b:?}"
)]
pub struct DenseShapeError {
    pub n: usize,
    pub k: usize,
    pub want_w: usize,
    pub got_w: usize,
    pub got_b: Option<usize>,
}

impl DenseKernel {
    /// `w`: `[n, k]` row-major; `bias`: `[n]`. Both sizes are checked (`n`, `k` ≥ 1).
    pub fn new(
        w: &[f32],
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
    ) -> Result<Self, DenseShapeError> {
        let want_w = n.checked_mul(k).filter(|_| n > 0 && k > 0);
        if want_w != Some(w.len()) || bias.is_some_and(|b| b.len() != n) {
            return Err(DenseShapeError {
                n,
                k,
                want_w: want_w.unwrap_or(usize::MAX),
                got_w: w.len(),
                got_b: bias.map(<[f32]>::len),
            });
        }
        Ok(DenseKernel {
            packed: PackedDense::new(kernels::detect(), w, n, k, bias),
        })
    }

    /// Inputs per row.
    pub fn k(&self) -> usize {
        self.packed.k()
    }

    /// Outputs per row.
    pub fn n(&self) -> usize {
        self.packed.n()
    }

    /// `y[m, n] = act(x[m, k] Wᵀ + b)`; `None` (nothing written) unless `x` holds `m·k` and `y` `m·n` numbers.
    pub fn run(&self, x: &[f32], y: &mut [f32], m: usize, act: Activation) -> Option<()> {
        let (k, n) = (self.k(), self.n());
        if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(y.len()) {
            return None;
        }
        self.packed.run_own(x, y, m, act);
        Some(())
    }
}
