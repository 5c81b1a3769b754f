//! Dense layers with bf16 weights and inputs and f32 accumulation (`vdpbf16ps`, AVX512-BF16), the opt-in
//! [`Precision::Bf16`](crate::Precision) of the cpu backend.
//!
//! Why: `vdpbf16ps` multiplies 32 bf16 pairs and adds them into 16 f32 lanes per instruction, twice the
//! multiply-adds of `vfmadd231ps` on the same register width. Measured on a Zen 5 core (2026-12-03, 12
//! independent chains each): 492 GFLOP/s against 268 for f32 FMA. bf16 weights also halve the bytes a batch-1
//! call streams from L2. The cost is precision: bf16 keeps 8 mantissa bits, so the layer's inputs and weights are
//! rounded to ~3 significant digits (round to nearest even) before the products, which are then summed in f32.
//!
//! Layout: the same column panels as the f32 kernel ([`crate::dense`]), 32 outputs wide, but each 32-bit lane
//! holds a pair of consecutive k values of its column: panel `[k/2][32]` of `u32`, low half `w[c][2j]`, high half
//! `w[c][2j + 1]` (k padded to even with a zero weight). The input rows are rounded into the same pair layout once
//! per call (one `vcvtne2ps2bf16` per 32 numbers, into a per-thread buffer that stops growing once warm); a tile
//! of up to 12 rows × 32 columns then keeps 24 accumulators in registers and broadcasts one input pair per row and
//! step. The bias and activation are applied as in the f32 kernel.
//!
//! Two ways to compute the same products ([`DotBy`]): `vdpbf16ps` itself, or — on Intel CPUs — two f32 FMAs per
//! pair on the bf16 values widened to f32, in the order `vdpbf16ps` adds them (the odd element of the pair first,
//! then the even: Intel SDM, VDPBF16PS). Why: on an Intel Xeon with AVX512-BF16 and AMX (2026-12-03, a C
//! microbenchmark written up in CONTRIBUTING) `vdpbf16ps zmm` issued at 1.66 G/s against 6.6 G/s for
//! `vfmadd231ps zmm` — 106 against 211 GFLOP/s, half of f32's rate — so the dot kernel ran the benchmark MLP 40 %
//! *slower* than f32 at batch 64 and 1024 (118.7 / 1986 µs against 84.6 / 1431). Products of two bf16 values are
//! exact in f32, so the two FMAs give `vdpbf16ps`'s bits (tested on a CPU that has both; the only difference is
//! that a partial sum below 2^-126 is kept, where `vdpbf16ps` flushes it to zero). Denormal bf16 weights are
//! flushed at packing, as `vdpbf16ps` treats them as zero; the inputs are rounded by the same instruction either
//! way (`vcvtneps2bf16`, which flushes them).
//!
//! Layers of at most 16 outputs (the heads: logits, value) stay f32: they are a sliver of the work, and the
//! sampled actions and the value are where rounding would show most.

// Elsewhere than x86-64 the kernel does not exist: `available` is false, so nothing is packed or run in bf16.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

use crate::aligned::Aligned;
use crate::kernels::Act;
#[cfg(target_arch = "x86_64")]
use crate::kernels::{self, Isa};

/// Panel width of the bf16 kernel (two zmm of 16 f32 accumulators).
const NR: usize = 32;
/// Rows per tile (24 accumulators, 2 weight vectors and a broadcast of AVX-512's 32 registers).
const MR: usize = 12;
/// Rows per block: each panel is reused from L1 by every tile of a block (as in the f32 kernel).
const ROW_BLOCK: usize = 96;

/// Whether this CPU runs the bf16 kernel (AVX512-F and AVX512-BF16, and not capped below AVX-512).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernels::detect() == Isa::Avx512 && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How the bf16 products are computed (module docs): the result is the same bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DotBy {
    /// `vdpbf16ps`: AMD Zen 4 / 5 run it at twice f32's FMA rate.
    Vdpbf16ps,
    /// Two `vfmadd231ps` per pair on bf16 values widened to f32: Intel CPUs, where `vdpbf16ps` runs at half
    /// f32's rate.
    Fma,
}

/// This CPU's [`DotBy`]: FMA on Intel, `vdpbf16ps` elsewhere (AMD). By vendor ([`crate::cpu_is_intel`]), not by
/// a timing at load, so one machine always takes the same path.
pub(crate) fn dot_by() -> DotBy {
    if crate::cpu_is_intel() {
        DotBy::Fma
    } else {
        DotBy::Vdpbf16ps
    }
}

/// `f32` → `bf16` bits, rounding to nearest even; NaN stays NaN (quietened). Used for the weights at load; the
/// inputs are rounded by `vcvtne2ps2bf16`, which rounds the same way (it also flushes denormals to zero, and
/// `vdpbf16ps` treats denormal inputs as zero either way).
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The value `bf16_bits` rounds to, as an f32.
#[cfg(test)]
pub(crate) fn round_bf16(v: f32) -> f32 {
    f32::from_bits((bf16_bits(v) as u32) << 16)
}

/// A dense layer's weights packed for the bf16 kernel.
#[derive(Debug, Clone)]
pub(crate) struct Bf16Panels {
    /// How the products are computed: [`dot_by`] for this CPU, chosen once when packed (the tests set both).
    pub(crate) by: DotBy,
    /// `ceil(k / 2)`.
    k2: usize,
    /// `[panel][k2][NR]` pairs.
    /// Starts a cache line ([`Aligned`]): loaded a whole zmm at a time.
    pairs: Aligned<u32>,
}

impl Bf16Panels {
    /// `w`: `[n, k]` row-major.
    pub(crate) fn new(w: &[f32], n: usize, k: usize) -> Self {
        let k2 = k.div_ceil(2);
        let np = n.div_ceil(NR);
        let mut pairs = Aligned::<u32>::zeroed(np * k2 * NR);
        for p in 0..np {
            for j in 0..k2 {
                for c in 0..NR {
                    let col = p * NR + c;
                    if col >= n {
                        continue;
                    }
                    // Denormals flushed to a zero of their sign: `vdpbf16ps` reads them so, and the FMA path
                    // ([`DotBy::Fma`]) then gets the same products.
                    let daz = |b: u16| if b & 0x7f80 == 0 { b & 0x8000 } else { b };
                    let lo = daz(bf16_bits(w[col * k + 2 * j])) as u32;
                    let hi = if 2 * j + 1 < k {
                        daz(bf16_bits(w[col * k + 2 * j + 1])) as u32
                    } else {
                        0
                    };
                    pairs[(p * k2 + j) * NR + c] = lo | (hi << 16);
                }
            }
        }
        Bf16Panels {
            by: dot_by(),
            k2,
            pairs,
        }
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The input rows rounded to bf16 pairs (or, for [`DotBy::Fma`], to bf16 values widened back to f32 bits),
    /// per thread (the intra-op pool's workers each run their own rows).
    static INPUT_PAIRS: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Grow this thread's rounded-input buffer to what `bytes` of bf16 pairs need (twice that for [`DotBy::Fma`],
/// which widens each value back to 32 bits), so that no later part of a batch up to that size grows it. Why: the
/// intra-op pool hands out parts of varying size (a late worker leaves the caller larger ones), and the buffer
/// grew whenever a thread's part came larger than any before: an allocation inside a warm act(), the f32 form of
/// which `parity::intra_op_threads_give_the_single_thread_answers` caught in a convolution's buffer. A failed
/// reservation is left to the layer itself (the session's memory estimate counts these bytes already).
pub(crate) fn reserve_input(bytes: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        let words = usize::try_from(bytes.div_ceil(4)).unwrap_or(usize::MAX);
        let words = match dot_by() {
            DotBy::Fma => words.saturating_mul(2),
            DotBy::Vdpbf16ps => words,
        };
        INPUT_PAIRS.with_borrow_mut(|xp| {
            if xp.len() < words && xp.try_reserve_exact(words - xp.len()).is_ok() {
                xp.resize(words, 0);
            }
        });
    }
}

/// `y[m, n] = act(x[m, k] Wᵀ + b)` with bf16 products (see the module docs; `panels.by` says how). `bias` is
/// padded to whole panels.
///
/// # Panics
/// When [`available`] is false (the caller packs bf16 panels only then), or the slices are shorter than m, k, n
/// say.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    panels: &Bf16Panels,
    bias: &[f32],
    x: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    act: Act,
) {
    assert!(
        available(),
        "bf16 panels are packed only where the kernel runs"
    );
    assert!(x.len() >= m * k && y.len() >= m * n && bias.len() >= n.div_ceil(NR) * NR);
    assert_eq!(panels.k2, k.div_ceil(2));
    #[cfg(target_arch = "x86_64")]
    {
        INPUT_PAIRS.with_borrow_mut(|xp| {
            let (k2, by) = (panels.k2, panels.by);
            // A row is k2 pairs, or 2·k2 widened values.
            let row = if by == DotBy::Fma { 2 * k2 } else { k2 };
            if xp.len() < m * row {
                xp.resize(m * row, 0);
            }
            let xp = &mut xp[..m * row];
            // SAFETY: `available` (asserted above) saw AVX512-F and AVX512-BF16 on this CPU; `x[..m * k]` is m
            // rows of k (asserted), `xp` was sized here to m rows of k2 pairs (`Vdpbf16ps`) or 2·k2 widened values
            // (`Fma`), as `round_rows` / `widen_rows` write and `dense` reads; `y` (m·n) and `bias` (whole panels)
            // were asserted, `panels.k2` checked against k.
            unsafe {
                match by {
                    DotBy::Vdpbf16ps => {
                        x86::round_rows(&x[..m * k], k, xp);
                        x86::dense::<false>(xp, panels, bias, y, m, k2, n, act);
                    }
                    DotBy::Fma => {
                        x86::widen_rows(&x[..m * k], k, xp);
                        x86::dense::<true>(xp, panels, bias, y, m, k2, n, act);
                    }
                }
            }
        });
        if !crate::dense::act_in_store(Isa::Avx512, act) {
            kernels::bias_act(Isa::Avx512, act, &mut y[..m * n], None, n);
        }
    }
}

/// [`run`] with row `r` of the left matrix read in place from `x` as `seg` says ([`crate::dense::Segments`]): a
/// channels-last convolution without a patch copy. `x` is rounded to bf16 pairs whole, once, so every row start,
/// run length and run stride must be even (a pair never straddles two runs): the caller checks
/// (`Conv2d::reads_in_place`: an even channel count).
///
/// # Panics
/// When the kernel is not available, an offset or length is odd, a row's runs leave `x`, or the runs do not
/// cover k.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_rows(
    panels: &Bf16Panels,
    bias: &[f32],
    x: &[f32],
    rows: crate::dense::RowMap,
    seg: crate::dense::Segments,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    act: Act,
) {
    assert!(
        available(),
        "bf16 panels are packed only where the kernel runs"
    );
    assert!(seg.count >= 1 && seg.count * seg.len == k && seg.len % 2 == 0 && seg.stride % 2 == 0);
    assert!(y.len() >= m * n && bias.len() >= n.div_ceil(NR) * NR && panels.k2 == k / 2);
    assert!(
        rows.pixels >= 1 && rows.ow >= 1 && rows.even(),
        "odd row starts"
    );
    let span = (seg.count - 1) * seg.stride + seg.len;
    assert!(
        rows.bound(m)
            .and_then(|b| b.checked_add(span))
            .is_some_and(|end| end <= x.len()),
        "rows leave the input"
    );
    #[cfg(target_arch = "x86_64")]
    {
        INPUT_PAIRS.with_borrow_mut(|xp| {
            let pairs = x.len().div_ceil(2);
            if xp.len() < pairs {
                xp.resize(pairs, 0);
            }
            let half = crate::dense::Segments {
                count: seg.count,
                len: seg.len / 2,
                stride: seg.stride / 2,
            };
            // SAFETY: `available` saw AVX512-F and AVX512-BF16; `xp` holds x rounded (pairs, or for FMA the
            // widened values, two per pair), every row's runs (in pairs: offsets and lengths halved, all even
            // before) were checked to lie inside it above.
            unsafe {
                match panels.by {
                    DotBy::Vdpbf16ps => {
                        if !x.is_empty() {
                            x86::round_rows(x, x.len(), &mut xp[..pairs]);
                        }
                        x86::dense_rows::<false>(
                            &xp[..pairs],
                            rows.halved(),
                            half,
                            panels,
                            bias,
                            y,
                            m,
                            n,
                            act,
                        );
                    }
                    DotBy::Fma => {
                        if xp.len() < 2 * pairs {
                            xp.resize(2 * pairs, 0);
                        }
                        if !x.is_empty() {
                            x86::widen_rows(x, x.len(), &mut xp[..2 * pairs]);
                        }
                        x86::dense_rows::<true>(
                            &xp[..2 * pairs],
                            rows.halved(),
                            half,
                            panels,
                            bias,
                            y,
                            m,
                            n,
                            act,
                        );
                    }
                }
            }
        });
        if !crate::dense::act_in_store(Isa::Avx512, act) {
            kernels::bias_act(Isa::Avx512, act, &mut y[..m * n], None, n);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Act, Bf16Panels, MR, NR, ROW_BLOCK};

    /// `dense` over rows read in place ([`super::run_rows`]): `x` is the whole input in pairs (`FMA`: widened,
    /// two values per pair), row r's runs start at `row_start(r)` (in pairs).
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; every row's runs inside `x`; `y` m rows of n; `bias` whole panels.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dense_rows<const FMA: bool>(
        x: &[u32],
        row_map: crate::dense::RowMap,
        seg: crate::dense::Segments,
        panels: &Bf16Panels,
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        n: usize,
        act: Act,
    ) {
        let (k2, np) = (panels.k2, n.div_ceil(NR));
        let base = x.as_ptr();
        let mut starts = [0usize; ROW_BLOCK];
        let mut r0 = 0;
        while r0 < m {
            let block = (m - r0).min(ROW_BLOCK);
            row_map.fill(r0, &mut starts[..block]);
            for p in 0..np {
                let wp = &panels.pairs[p * k2 * NR..(p + 1) * k2 * NR];
                let b = &bias[p * NR..(p + 1) * NR];
                let mut r = r0;
                while r < r0 + block {
                    let rows = (r0 + block - r).min(MR);
                    let ys = &mut y[r * n..];
                    // SAFETY: the caller's contract (rows inside `x`), `wp` one panel, `ys` from row r on.
                    unsafe {
                        macro_rules! rows {
                            ($($r:literal)*) => {
                                match rows {
                                    $($r => {
                                        let ptrs: [*const u32; $r] = std::array::from_fn(|i| {
                                            base.add(starts[r - r0 + i] * if FMA { 2 } else { 1 })
                                        });
                                        rows_tile::<$r, FMA>(&ptrs, seg, wp, b, ys, n, p * NR, act)
                                    })*
                                    _ => unreachable!("1 to {MR} rows"),
                                }
                            };
                        }
                        rows!(1 2 3 4 5 6 7 8 9 10 11 12)
                    }
                    r += rows;
                }
            }
            r0 += block;
        }
    }

    /// `tile::<R, 1>` with each row's pairs read from `rows[i]` in `seg`'s runs.
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; as for `tile`, with the rows' runs inside their allocation.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_tile<const R: usize, const FMA: bool>(
        rows: &[*const u32; R],
        seg: crate::dense::Segments,
        w: &[u32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: Act,
    ) {
        // SAFETY: the caller's contract: AVX512-F and AVX512-BF16 on this CPU; the bias loads read one panel's 32
        // numbers; each step reads row i's pair (`FMA`: its two values) at an offset inside its runs, and 32
        // pairs of `w`, which holds k2 = seg.count · seg.len steps of NR; `store_avx512` gets its contract's `y`.
        unsafe {
            let b = |h: usize| _mm512_loadu_ps(bias.as_ptr().add(h * 16));
            let mut acc: [[[__m512; 2]; R]; 1] = [[[b(0), b(1)]; R]];
            let mut wj = w.as_ptr();
            let width = if FMA { 2 } else { 1 };
            for s in 0..seg.count {
                let off = s * seg.stride;
                for kk in 0..seg.len {
                    let at: [*const u32; R] =
                        std::array::from_fn(|i| rows[i].add((off + kk) * width));
                    pair_step::<R, FMA>(&mut acc[0], &at, wj);
                    wj = wj.add(NR);
                }
            }
            crate::dense::x86::store_avx512(&acc, y, n, c0, act);
        }
    }

    /// Each row of `x` (`k` floats) rounded to `ceil(k/2)` bf16 pairs in `out` (a zero high half when k is odd).
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; `out.len() == rows · ceil(k/2)` with `x.len() == rows · k`.
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
    pub(super) unsafe fn round_rows(x: &[f32], k: usize, out: &mut [u32]) {
        let k2 = k.div_ceil(2);
        debug_assert!(k > 0 && out.len() / k2 == x.len() / k);
        for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(k2)) {
            // SAFETY: every load and store is inside `row` / `dst` (the last, partial group masked).
            unsafe {
                let (src, d) = (row.as_ptr(), dst.as_mut_ptr() as *mut u16);
                let mut i = 0;
                while i + 32 <= k {
                    let lo = _mm512_loadu_ps(src.add(i));
                    let hi = _mm512_loadu_ps(src.add(i + 16));
                    let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                    _mm512_storeu_si512(d.add(i) as *mut __m512i, v);
                    i += 32;
                }
                while i < k {
                    let left = (k - i).min(16);
                    let mask = ((1u32 << left) - 1) as __mmask16;
                    let v = _mm512_maskz_loadu_ps(mask, src.add(i));
                    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
                    _mm256_mask_storeu_epi16(d.add(i) as *mut i16, mask, h);
                    i += left;
                }
                if k % 2 == 1 {
                    *d.add(k) = 0;
                }
            }
        }
    }

    /// Each row of `x` (`k` floats) rounded to bf16 as `round_rows` does (`vcvtneps2bf16`: to nearest even,
    /// denormals flushed) and widened back to f32, as bits, into `2·ceil(k/2)` values of `out` (a zero last one
    /// when k is odd): the inputs of the FMA path ([`super::DotBy::Fma`]).
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; `out.len() == rows · 2·ceil(k/2)` with `x.len() == rows · k`.
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw")]
    pub(super) unsafe fn widen_rows(x: &[f32], k: usize, out: &mut [u32]) {
        let kp = 2 * k.div_ceil(2);
        debug_assert!(k > 0 && out.len() / kp == x.len() / k);
        for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(kp)) {
            // SAFETY: every load and store is inside `row` / `dst` (the last, partial group masked).
            unsafe {
                let (src, d) = (row.as_ptr(), dst.as_mut_ptr());
                let mut i = 0;
                while i < k {
                    let left = (k - i).min(16);
                    let mask = ((1u32 << left) - 1) as __mmask16;
                    let v = _mm512_maskz_loadu_ps(mask, src.add(i));
                    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
                    let wide = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                    _mm512_mask_storeu_epi32(d.add(i) as *mut i32, mask, wide);
                    i += left;
                }
                if k % 2 == 1 {
                    *d.add(k) = 0;
                }
            }
        }
    }

    /// The row blocks and tiles of the f32 kernel ([`crate::dense`]) over bf16 pairs (`FMA`: `x` widened, two
    /// values per pair); `act` applied in the
    /// tiles' store where [`crate::dense::act_in_store`] (the caller's pass applies the others).
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; `x` holds m rows of k2 pairs (`FMA`: 2·k2 values), `y` m rows of n, `bias`
    /// whole panels.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn dense<const FMA: bool>(
        x: &[u32],
        panels: &Bf16Panels,
        bias: &[f32],
        y: &mut [f32],
        m: usize,
        k2: usize,
        n: usize,
        act: Act,
    ) {
        let np = n.div_ceil(NR);
        let w = &panels.pairs[..];
        // A row of `x`: k2 pairs, or their 2·k2 widened values.
        let xrow = if FMA { 2 * k2 } else { k2 };
        let mut r0 = 0;
        while r0 < m {
            let block = if m - r0 > 2 * MR {
                (m - r0).min(ROW_BLOCK)
            } else {
                (m - r0).min(MR)
            };
            let mut p = 0;
            while p < np {
                // One row has only two accumulator chains per panel: four panels at once, as in the f32 kernel.
                let group = if block == 1 && np - p >= 4 { 4 } else { 1 };
                let wp = &w[p * k2 * NR..(p + group) * k2 * NR];
                let b = &bias[p * NR..(p + group) * NR];
                let c0 = p * NR;
                let mut r = r0;
                while r < r0 + block {
                    let rows = (r0 + block - r).min(MR);
                    let xs = &x[r * xrow..(r + rows) * xrow];
                    let ys = &mut y[r * n..];
                    // SAFETY: the slices hold what `tile` reads and writes (rows of k2, panels of k2·NR, rows of
                    // n with the columns past n masked off).
                    unsafe {
                        macro_rules! rows {
                            ($($r:literal)*) => {
                                match (rows, group) {
                                    (1, 4) => tile::<1, 4, FMA>(xs, k2, wp, b, ys, n, c0, act),
                                    $(($r, _) => tile::<$r, 1, FMA>(xs, k2, wp, b, ys, n, c0, act),)*
                                    _ => unreachable!("1 to {MR} rows"),
                                }
                            };
                        }
                        rows!(1 2 3 4 5 6 7 8 9 10 11 12)
                    }
                    r += rows;
                }
                p += group;
            }
            r0 += block;
        }
    }

    /// `y[i·n + c0 + j·32 + c] = bias_j[c] + Σ pairs` for R rows and P panels; columns past n masked off.
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16; `x` holds R rows of k2 (`FMA`: 2·k2), `w` P panels of k2·32, `bias` P·32, `y`
    /// (R − 1)·n + min(n, c0 + P·32).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const P: usize, const FMA: bool>(
        x: &[u32],
        k2: usize,
        w: &[u32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: Act,
    ) {
        let width = if FMA { 2 } else { 1 };
        debug_assert!(x.len() >= R * k2 * width && w.len() >= P * k2 * NR && bias.len() >= P * NR);
        // SAFETY: the caller's contract: AVX512-F and AVX512-BF16 on this CPU; the bias loads stay in P·32, each
        // step reads row i < R's pair kk < k2 (`FMA`: two values) of `x` and 32 pairs of panel j < P of `w`;
        // `store_avx512` gets the `y` this function's contract gives.
        unsafe {
            let b = |j: usize, h: usize| _mm512_loadu_ps(bias.as_ptr().add(j * NR + h * 16));
            let mut acc: [[[__m512; 2]; R]; P] = std::array::from_fn(|j| [[b(j, 0), b(j, 1)]; R]);
            let (xp, wp) = (x.as_ptr(), w.as_ptr());
            for kk in 0..k2 {
                let at: [*const u32; R] = std::array::from_fn(|i| xp.add((i * k2 + kk) * width));
                for (j, aj) in acc.iter_mut().enumerate() {
                    pair_step::<R, FMA>(aj, &at, wp.add((j * k2 + kk) * NR));
                }
            }
            crate::dense::x86::store_avx512(&acc, y, n, c0, act);
        }
    }

    /// One pair step of R rows on one 32-wide panel: `at[i]` points at row i's pair (`FMA`: at its two widened
    /// values, even then odd), `wj` at the panel's 32 weight pairs. `vdpbf16ps`, or its two FMAs: the odd
    /// element's product first, then the even one's, each rounded once as `vdpbf16ps` does (the products of bf16
    /// values are exact in f32).
    ///
    /// # Safety
    /// AVX512-F and AVX512-BF16 (inlined into the tiles, which enable them); `at[i]` readable for 1 (`FMA`: 2)
    /// values, `wj` for 32.
    #[inline(always)]
    unsafe fn pair_step<const R: usize, const FMA: bool>(
        acc: &mut [[__m512; 2]; R],
        at: &[*const u32; R],
        wj: *const u32,
    ) {
        // SAFETY: the caller's contract: the ISA, `wj` readable for 32 pairs (two 16-lane loads), each `at[i]` for
        // one pair (`FMA`: two values); the transmutes are between 512-bit vector types of the same size.
        unsafe {
            let w0 = _mm512_loadu_si512(wj as *const __m512i);
            let w1 = _mm512_loadu_si512(wj.add(16) as *const __m512i);
            if FMA {
                let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
                // A pair lane holds the even element in its low half, the odd one in its high half.
                let odd = [w0, w1].map(|w| _mm512_castsi512_ps(_mm512_and_si512(w, high)));
                let even = [w0, w1].map(|w| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w)));
                // Row by row (two broadcasts live at a time: 24 accumulators, 4 weight vectors, 2 inputs).
                for i in 0..R {
                    let xo = _mm512_set1_ps(f32::from_bits(*at[i].add(1)));
                    let xe = _mm512_set1_ps(f32::from_bits(*at[i]));
                    acc[i][0] = _mm512_fmadd_ps(xo, odd[0], acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(xo, odd[1], acc[i][1]);
                    acc[i][0] = _mm512_fmadd_ps(xe, even[0], acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(xe, even[1], acc[i][1]);
                }
            } else {
                let (w0, w1): (__m512bh, __m512bh) =
                    (std::mem::transmute(w0), std::mem::transmute(w1));
                for i in 0..R {
                    let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(*at[i] as i32));
                    acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xv, w0);
                    acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xv, w1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: to even (1.0); 1 + 3·2^-8 rounds up to 1 + 2^-6.
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(round_bf16(-2.5), -2.5);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        // The largest finite f32 rounds to infinity in bf16, as the hardware does.
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
    }

    /// Regression (a warm threaded act grew a thread's rounded-input buffer whenever the pool gave it a part larger
    /// than any before): `reserve_input` for `rows` rows of the layer's own estimate
    /// (`PackedDense::bf16_bytes_per_row`, what the executor reserves per part) covers every run of up to `rows`
    /// rows, so nothing grows after it. Each case on a new thread: its buffer starts empty.
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(
        not(policyport_host_avx512bf16),
        ignore = "needs a CPU with AVX512-BF16 (guest/build.rs found none on this machine)"
    )]
    fn reserve_input_covers_every_part_up_to_its_rows() {
        for (k, n) in [(64usize, 256usize), (7, 130), (3136, 40), (1, 17)] {
            std::thread::spawn(move || {
                let rows = 40;
                let (x, w) = crate::dense::test_operands(rows, k, n);
                let mut dense = crate::dense::PackedDense::new(Isa::Avx512, &w, n, k, None);
                dense.set_precision(crate::Precision::Bf16);
                let per_row = dense.bf16_bytes_per_row();
                assert!(per_row > 0, "k{k} n{n}: not packed in bf16");
                reserve_input(rows as u64 * per_row);
                let reserved = INPUT_PAIRS.with_borrow(|xp| (xp.as_ptr(), xp.len()));
                for m in [1, 17, rows, 3] {
                    let mut y = vec![0.0; m * n];
                    dense.run(&x, &mut y, m, Act::Tanh);
                    let now = INPUT_PAIRS.with_borrow(|xp| (xp.as_ptr(), xp.len()));
                    assert_eq!(
                        now, reserved,
                        "k{k} n{n}: {m} rows grew the buffer reserved for {rows}"
                    );
                }
            })
            .join()
            .unwrap();
        }
    }

    /// The kernel computes exactly the bf16-rounded products summed in f32: against f64 sums of the rounded
    /// inputs and weights it is within f32 accumulation error, on every shape the blocking has a case for. And
    /// the FMA path (Intel's, [`DotBy::Fma`]) gives `vdpbf16ps`'s bits, also on inputs scaled across the
    /// exponent range: the same products, added in the same order with the same rounding (adding the even
    /// element first fails it: 100.16565 vs 100.165634; were a CPU to sum a pair before rounding, this fails
    /// there, and results would differ by vendor).
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(
        not(policyport_host_avx512bf16),
        ignore = "needs a CPU with AVX512-BF16 (guest/build.rs found none on this machine)"
    )]
    fn bf16_dense_matches_the_rounded_f64_sum() {
        assert!(
            available(),
            "build.rs saw AVX512-BF16 but the runtime does not use it (POLICYPORT_CPU_BASELINE set?)"
        );
        for (m, k, n) in [
            (1usize, 4usize, 20usize),
            (1, 64, 256),
            (1, 7, 130),
            (3, 37, 19),
            (7, 5, 33),
            (13, 64, 65),
            (203, 48, 70),
            (25, 9, 33),
            (30, 3136, 40),
            (12, 1, 17),
        ] {
            let (x, w) = crate::dense::test_operands(m, k, n);
            let b: Vec<f32> = (0..n.div_ceil(NR) * NR)
                .map(|i| i as f32 / 10.0 - 1.0)
                .collect();
            let mut panels = Bf16Panels::new(&w, n, k);
            let scaled: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, v)| v * [1.0, 1e-3, 37.0, -5e2][i % 4])
                .collect();
            for xs in [&x, &scaled] {
                for act in [Act::Identity, Act::Tanh] {
                    let mut run_with = |by| {
                        panels.by = by;
                        let mut y = vec![f32::NAN; m * n];
                        run(&panels, &b, xs, &mut y, m, k, n, act);
                        y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                    };
                    assert!(
                        run_with(DotBy::Vdpbf16ps) == run_with(DotBy::Fma),
                        "{act:?} m{m} k{k} n{n}: the FMA path's bits differ from vdpbf16ps's"
                    );
                }
            }
            for act in [Act::Identity, Act::Tanh] {
                for by in [DotBy::Vdpbf16ps, DotBy::Fma] {
                    let mut y = vec![f32::NAN; m * n];
                    panels.by = by;
                    run(&panels, &b, &x, &mut y, m, k, n, act);
                    for r in 0..m {
                        for j in 0..n {
                            let s = (0..k)
                                .map(|i| {
                                    round_bf16(x[r * k + i]) as f64
                                        * round_bf16(w[j * k + i]) as f64
                                })
                                .sum::<f64>()
                                + b[j] as f64;
                            let want = if act == Act::Tanh { s.tanh() } else { s };
                            let got = y[r * n + j] as f64;
                            let tol = 2e-6 * (1.0 + s.abs()) * (k as f64).sqrt();
                            assert!(
                                (got - want).abs() < tol,
                                "{by:?} {act:?} m{m} k{k} n{n} [{r},{j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
