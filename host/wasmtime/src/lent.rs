//! The host-lent dense kernel (ABI.md, "Host-lent dense layers"): the two functions every instance imports.
//!
//! With [`WasmLimits::lend_dense`](crate::WasmLimits::lend_dense) on, `pp_host_lend_dense` copies a layer's
//! weights out of the guest's memory into a native [`DenseKernel`] (the runtime's own AVX-512 / AVX2 kernel,
//! packed for this CPU) and returns its id; `pp_host_dense` runs it on an input and an output range of the
//! guest's memory. Off, every offer is declined and the plugin computes every layer itself.
//!
//! What the guest controls here is numbers: pointers, sizes, an activation code. Each is checked before use — a
//! range must lie inside the memory, be 4-aligned and non-null, input and output must not overlap, the weights of
//! every layer together must fit the instance's memory cap (host memory a guest can make the host hold), at most
//! [`MAX_LAYERS`] layers — and anything else is a refusal code, never a host panic. A layer's work is bounded by
//! the memory's size but not small (rows × k × n multiply-adds), and the epoch deadline only interrupts guest
//! code: the host runs a layer in row blocks of about [`BLOCK_MACS`] multiply-adds and traps with the deadline's
//! `Interrupt` between blocks once the call's deadline has passed.

use std::ops::Range;
use std::time::{Duration, Instant};

use policyport::lend::DenseKernel;
use policyport_abi::host::{self, DenseRefusal};
use wasmtime::{Caller, Linker, Trap};

use crate::HostData;

/// Layers one instance may lend (a policy has tens; this bounds the host's bookkeeping).
pub(crate) const MAX_LAYERS: usize = 1 << 16;

/// Multiply-adds between deadline checks (~0.1-0.3 ms on one core): a hostile guest's huge layer overshoots its
/// deadline by at most one block.
pub(crate) const BLOCK_MACS: usize = 1 << 25;

/// The lent layers of one instance.
pub(crate) struct LentLayers {
    enabled: bool,
    layers: Vec<DenseKernel>,
    /// Bytes of weights and biases the host holds for them (against the instance's memory cap).
    bytes: usize,
    /// The current call's deadline (set by every call into the guest).
    pub(crate) deadline: Option<Instant>,
}

impl LentLayers {
    pub(crate) fn new(enabled: bool) -> Self {
        LentLayers {
            enabled,
            layers: vec![],
            bytes: 0,
            deadline: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.layers.len()
    }

    /// A call into the guest begins: lent layers must finish within `budget` from now. Without lending nothing
    /// is read (no clock on the plain act() path).
    pub(crate) fn start_call(&mut self, budget: Duration) {
        if self.enabled {
            self.deadline = Instant::now().checked_add(budget);
        }
    }
}

/// Whether an import is one of the two this host provides.
pub(crate) fn is_host_import(module: &str, name: &str) -> bool {
    module == host::MODULE && (name == host::LEND_DENSE || name == host::DENSE)
}

/// Define both imports (every instance gets them; they decline unless lending is on).
pub(crate) fn link(linker: &mut Linker<HostData>) -> wasmtime::Result<()> {
    linker.func_wrap(
        host::MODULE,
        host::LEND_DENSE,
        |mut caller: Caller<'_, HostData>, w: u32, n: u32, k: u32, bias: u32| -> i32 {
            lend(&mut caller, w, n, k, bias).unwrap_or(host::DECLINED)
        },
    )?;
    linker.func_wrap(
        host::MODULE,
        host::DENSE,
        |mut caller: Caller<'_, HostData>,
         id: i32,
         x: u32,
         m: u32,
         y: u32,
         act: u32,
         a: f32,
         b: f32|
         -> wasmtime::Result<i32> {
            Ok(match run(&mut caller, id, x, m, y, (act, a, b))? {
                Ok(()) => 0,
                Err(refusal) => refusal as i32,
            })
        },
    )?;
    Ok(())
}

/// The byte range of `count` f32s at guest offset `ptr`: non-null (unless empty), 4-aligned, inside `len` bytes.
fn f32_range(len: usize, ptr: u32, count: usize) -> Option<Range<usize>> {
    let start = ptr as usize;
    let end = start.checked_add(count.checked_mul(4)?)?;
    (count == 0 || (ptr != 0 && ptr.is_multiple_of(4) && end <= len)).then_some(start..end)
}

/// `pp_host_lend_dense`: the layer's id, or None (declined).
fn lend(caller: &mut Caller<'_, HostData>, w: u32, n: u32, k: u32, bias: u32) -> Option<i32> {
    let data = caller.data();
    // The guest's numbers are little-endian; this host reads them as its own.
    if !data.lent.enabled || cfg!(target_endian = "big") {
        return None;
    }
    let memory = data.memory?;
    let (n, k) = (n as usize, k as usize);
    let numel = n.checked_mul(k).filter(|_| n > 0 && k > 0)?;
    let bytes = numel.checked_add(n)?.checked_mul(4)?;
    if data.lent.layers.len() >= MAX_LAYERS || data.lent.bytes.checked_add(bytes)? > data.cap {
        return None;
    }
    let mem = memory.data(&*caller);
    let read = |ptr: u32, count: usize| -> Option<Vec<f32>> {
        let r = f32_range(mem.len(), ptr, count)?;
        Some(
            mem[r]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    };
    let weights = read(w, numel)?;
    let b = match bias {
        0 => None,
        p => Some(read(p, n)?),
    };
    let kernel = DenseKernel::new(&weights, n, k, b.as_deref()).ok()?;
    let lent = &mut caller.data_mut().lent;
    lent.bytes += bytes;
    lent.layers.push(kernel);
    i32::try_from(lent.layers.len() - 1).ok()
}

/// `pp_host_dense`: Ok(Ok) computed, Ok(Err) refused (the plugin computes the layer), Err a trap (the deadline).
fn run(
    caller: &mut Caller<'_, HostData>,
    id: i32,
    x: u32,
    m: u32,
    y: u32,
    (act, a, b): (u32, f32, f32),
) -> wasmtime::Result<Result<(), DenseRefusal>> {
    let Some(f) = host::decode_activation(act, a, b) else {
        return Ok(Err(DenseRefusal::Activation));
    };
    let Some(memory) = caller.data().memory else {
        return Ok(Err(DenseRefusal::Id));
    };
    let (mem, data) = memory.data_and_store_mut(&mut *caller);
    let Some(kernel) = usize::try_from(id)
        .ok()
        .and_then(|i| data.lent.layers.get(i))
    else {
        return Ok(Err(DenseRefusal::Id));
    };
    let (k, n, m) = (kernel.k(), kernel.n(), m as usize);
    let ranges = m
        .checked_mul(k)
        .zip(m.checked_mul(n))
        .and_then(|(xs, ys)| Some((f32_range(mem.len(), x, xs)?, f32_range(mem.len(), y, ys)?)));
    let Some((xr, yr)) = ranges else {
        return Ok(Err(DenseRefusal::Range));
    };
    let base = mem.as_mut_ptr();
    if (xr.start < yr.end && yr.start < xr.end) || base.align_offset(4) != 0 {
        return Ok(Err(DenseRefusal::Range));
    }
    if m == 0 {
        return Ok(Ok(()));
    }
    // SAFETY: both ranges lie inside the memory (checked), are disjoint (checked), and are 4-aligned in guest
    // offsets on a 4-aligned base (checked); f32 has no invalid bit patterns. Nothing else touches the memory
    // while this host function runs (the guest is suspended in the call).
    let (xs, ys) = unsafe {
        (
            std::slice::from_raw_parts(base.add(xr.start) as *const f32, m * k),
            std::slice::from_raw_parts_mut(base.add(yr.start) as *mut f32, m * n),
        )
    };
    let block = (BLOCK_MACS / (k * n).max(1)).max(1);
    let mut r0 = 0;
    while r0 < m {
        if data.lent.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Trap::Interrupt.into());
        }
        let r1 = m.min(r0 + block);
        if kernel
            .run(&xs[r0 * k..r1 * k], &mut ys[r0 * n..r1 * n], r1 - r0, f)
            .is_none()
        {
            return Ok(Err(DenseRefusal::Range));
        }
        r0 = r1;
    }
    Ok(Ok(()))
}
