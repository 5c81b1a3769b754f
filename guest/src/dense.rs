//! Dense layers on the CPU, `y = act(x Wᵀ + b)`, with the weights packed once at load.
//!
//! Why not a GEMM library: the weights never change, so they can be packed into the microkernel's layout at load
//! instead of on every call (which is what a general GEMM must do, allocating its packing buffers each time), and
//! the bias and activation can be applied while a tile is still in registers. Layout: column panels of `NR`
//! outputs (NR = one or two vector registers' worth for the ISA), each `[k][NR]` contiguous, zero-padded past `n`.
//! A tile is up to 6 batch rows (12 on AVX-512, whose 32 registers hold 24 accumulators) × one panel: the
//! accumulators stay in registers, each step loads NR weights and broadcasts one input per row. Batch 1 is the
//! same kernel with one row. Large batches go in blocks of 96 rows with the panels outside the tiles, so each
//! panel is reused from L1 by the whole block (measured on the benchmark MLP at batch 1024, 1 thread, Sapphire
//! Rapids: 1586 → 1373 µs, the mean of three alternating runs; batch 64 unchanged).

use std::sync::Arc;

use crate::aligned::AlignedF32;
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
use crate::kernels::madd_pub as madd;
use crate::kernels::{self, Act, Isa};
use crate::lend::{DenseLender, Lent};

/// Rows per tile: 6 rows × 2 vectors = 12 accumulators fit x86's 16 SIMD registers (AVX-512 has its own, wider
/// tiles). Under wasm it depends on the engine, and the browser bundle and the sandbox plugin are separate builds:
/// - Browsers (V8): 4 rows. LLVM's wasm backend does not model registers and emits a k step's R broadcasts
///   before its FMAs, so 6 rows are 12 accumulators + 6 broadcasts + 2 weight vectors, more than V8's 15
///   allocatable XMM registers; 4 rows are 14. Measured in Chromium 156 on Zen 5 (tests/scripts/web-bench.sh,
///   benchmark MLP, alternating runs): batch 64 520-534 → 425-440 µs, batch 1024 8401-9889 → 5434-5445.
/// - wasmtime (feature `cranelift-tiles`, the plugin): 6 rows. Cranelift keeps every accumulator on the stack
///   across the loop back-edge whatever the tile (the epoch-deadline check there is an out-of-line call, and SysV
///   has no callee-saved XMM registers: with epoch interruption off, the kernel's stack reloads drop from 80 to
///   11), so the tile that does more FMAs per reload wins: 4 rows measured +20 % at batch 64 and 1024.
#[cfg(not(all(target_arch = "wasm32", not(feature = "cranelift-tiles"))))]
const MR: usize = 6;
#[cfg(all(target_arch = "wasm32", not(feature = "cranelift-tiles")))]
const MR: usize = 4;

#[derive(Debug, Clone)]
pub(crate) struct PackedDense {
    isa: Isa,
    /// Panel width: `panel_width(isa)`, or 16 for a narrow layer on AVX-512 (one zmm per row, see `new`); 0
    /// when the layer is packed by output rows instead ([`DOT_MAX_N`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    nr: usize,
    k: usize,
    n: usize,
    /// Starts a cache line ([`AlignedF32`]): the kernels load it a whole vector at a time.
    panels: AlignedF32,
    /// Padded to a whole number of panels.
    bias: Vec<f32>,
    /// Taken by a lender ([`crate::lend`]): runs go there first, these panels compute what it refuses.
    lent: Option<Lent>,
    /// The weights packed for the bf16 kernel ([`crate::dense_bf16`]) when the layer runs in bf16 (then
    /// `panels` is empty: a layer holds one copy of its weights).
    bf16: Option<crate::dense_bf16::Bf16Panels>,
}

pub(crate) fn panel_width(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => 32,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => 16,
        Isa::Simd128 | Isa::Portable => 8,
    }
}

/// The widest layer `PackedDense` computes in a single panel (16 on AVX-512: one zmm per row, see `new`).
pub(crate) fn narrow_width(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => 16,
        other => panel_width(other),
    }
}

/// Layers of at most this many outputs run on AVX-512 and AVX2 as dot products along k (`x86::dot_avx512`,
/// `x86::dot_avx2`): the weights
/// packed by output, `[n][k rounded up to 16]`, each row's numbers read 16 at a time against every output's
/// weights, summed across lanes at the end. Why: a policy head (4 logits + 1 value joined, a lone value, a
/// critic's Q) in a 16-wide column panel uses 5 of the 16 lanes of every FMA, and at batch 1 all of its k
/// steps form one dependent chain (256 FMAs at 4 cycles each for the benchmark MLP's head, ~10 % of act() at
/// batch 1); as dots, batch 1 has n independent chains of k/16 steps and a tile of 4 rows uses every lane.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const DOT_MAX_N: usize = 8;

impl PackedDense {
    /// `w`: `[n, k]` row-major (PyTorch's layout); `bias`: `[n]`.
    pub(crate) fn new(isa: Isa, w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Self {
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx512 | Isa::Avx2Fma) && n <= DOT_MAX_N && n > 0 {
            let kp = k.div_ceil(16) * 16;
            let mut panels = AlignedF32::zeroed(n * kp);
            for (dst, src) in panels.chunks_exact_mut(kp).zip(w.chunks_exact(k.max(1))) {
                dst[..k].copy_from_slice(&src[..k]);
            }
            let mut b = vec![0.0f32; n];
            if let Some(bias) = bias {
                b.copy_from_slice(&bias[..n]);
            }
            return PackedDense {
                isa,
                nr: 0,
                k,
                n,
                panels,
                bias: b,
                lent: None,
                bf16: None,
            };
        }
        // A layer of at most 16 outputs (a policy head's few logits, a value; a 16-channel convolution) would fill
        // at most half of a 32-wide AVX-512 panel, which costs two FMAs per row and k step whatever the width
        // used: one 16-wide panel (one zmm per row) does it in one.
        let nr = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if n <= 16 => 16,
            _ => panel_width(isa),
        };
        let np = n.div_ceil(nr);
        let mut panels = AlignedF32::zeroed(np * k * nr);
        for p in 0..np {
            for kk in 0..k {
                for c in 0..nr {
                    let j = p * nr + c;
                    if j < n {
                        panels[(p * k + kk) * nr + c] = w[j * k + kk];
                    }
                }
            }
        }
        let mut b = vec![0.0f32; np * nr];
        if let Some(bias) = bias {
            b[..n].copy_from_slice(bias);
        }
        PackedDense {
            isa,
            nr,
            k,
            n,
            panels,
            bias: b,
            lent: None,
            bf16: None,
        }
    }

    /// This layer in `precision`: under [`Precision::Bf16`](crate::Precision) a layer of more than 16
    /// outputs (not a head: see [`crate::dense_bf16`]) is repacked for the bf16 kernel, once, at load. The caller
    /// checked [`crate::dense_bf16::available`].
    pub(crate) fn set_precision(&mut self, precision: crate::Precision) {
        if precision == crate::Precision::Bf16 && self.n > 16 && self.lent.is_none() {
            let w = self.unpacked();
            self.bf16 = Some(crate::dense_bf16::Bf16Panels::new(&w, self.n, self.k));
            self.panels = AlignedF32::default();
        }
    }

    /// The weights back in PyTorch's `[n, k]` layout.
    fn unpacked(&self) -> Vec<f32> {
        let (k, n, nr) = (self.k, self.n, self.nr);
        let mut w = vec![0.0f32; n * k];
        if nr == 0 {
            let kp = k.div_ceil(16) * 16;
            for (dst, src) in w
                .chunks_exact_mut(k.max(1))
                .zip(self.panels.chunks_exact(kp.max(1)))
            {
                dst.copy_from_slice(&src[..dst.len()]);
            }
            return w;
        }
        for (j, row) in w.chunks_exact_mut(k).enumerate() {
            let (p, c) = (j / nr, j % nr);
            for (kk, v) in row.iter_mut().enumerate() {
                *v = self.panels[(p * k + kk) * nr + c];
            }
        }
        w
    }

    pub(crate) fn k(&self) -> usize {
        self.k
    }

    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Offer this layer to `lender` (its weights unpacked back to `[n, k]`, the bias without padding); from then
    /// on [`run`](Self::run) asks the lender first if it took the layer.
    pub(crate) fn lend(&mut self, lender: &Arc<dyn DenseLender>) {
        if self.bf16.is_some() {
            // The lenders compute f32; a bf16 layer keeps its own precision (no lender offers bf16 today).
            return;
        }
        let (k, n) = (self.k, self.n);
        let w = self.unpacked();
        self.lent = lender.lend(&w, n, k, Some(&self.bias[..n])).map(|id| Lent {
            lender: lender.clone(),
            id,
        });
    }

    /// `y[m, n] = act(x[m, k] Wᵀ + b)`: by the lender when it took the layer and computes it, else here.
    pub(crate) fn run(&self, x: &[f32], y: &mut [f32], m: usize, act: Act) {
        if let Some(l) = &self.lent
            && l.lender
                .run(l.id, &x[..m * self.k], &mut y[..m * self.n], m, act)
        {
            return;
        }
        self.run_own(x, y, m, act);
    }

    /// [`run`](Self::run) on this runtime's own kernels.
    pub(crate) fn run_own(&self, x: &[f32], y: &mut [f32], m: usize, act: Act) {
        assert!(x.len() >= m * self.k && y.len() >= m * self.n);
        if let Some(bf16) = &self.bf16 {
            crate::dense_bf16::run(bf16, &self.bias, x, y, m, self.k, self.n, act);
            return;
        }
        let (k, n, p, b) = (self.k, self.n, &self.panels[..], &self.bias[..]);
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `detect` saw these features on this CPU; the weights were packed by output, k padded to 16.
            Isa::Avx512 if self.nr == 0 => unsafe { x86::dot_avx512(x, p, b, y, m, k, n, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above (AVX2 + FMA).
            Isa::Avx2Fma if self.nr == 0 => unsafe { x86::dot_avx2(x, p, b, y, m, k, n, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `detect` saw these features on this CPU, and the panels were packed for this width.
            Isa::Avx512 if self.nr == 16 => unsafe { dense_avx512_16(x, p, b, y, m, k, n, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx512 => unsafe { dense_avx512(x, p, b, y, m, k, n, act) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2Fma => unsafe { dense_avx2(x, p, b, y, m, k, n, act) },
            Isa::Simd128 => dense_simd128(kernels::simd128_fma(), x, p, b, y, m, k, n, act),
            Isa::Portable => {
                dense_generic::<8, false, false>(Isa::Portable, x, p, b, y, m, k, n, act)
            }
        }
    }
}

/// Where the rows of an implicit GEMM's left matrix are: row `r` is `count` runs of `len` numbers, the runs
/// `stride` apart, from [`RowMap::start`]`(r)` (a channels-last convolution without padding: one run of `KW·C` per
/// kernel row, `W·C` apart, from the output pixel's top-left input pixel). `count · len == k`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segments {
    pub(crate) count: usize,
    pub(crate) len: usize,
    pub(crate) stride: usize,
}

/// Where row `r` of an implicit GEMM starts in its input: output pixel `r % pixels` of env `r / pixels`, the
/// pixels `ow` to an output row; env `b`, output row `oy`, column `ox` start at `b·env_stride + oy·row_stride +
/// ox·col_stride`. Why a struct and not a closure (the first version): the drivers called the closure once per
/// row to check bounds and once per row and panel for the tile pointers, two divisions and two remainders each
/// (~3 % of NatureCNN's act() at batch 64); now a block's starts are walked once, incrementally, and the bounds
/// are one check against [`bound`](Self::bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowMap {
    pub(crate) pixels: usize,
    pub(crate) ow: usize,
    pub(crate) env_stride: usize,
    pub(crate) row_stride: usize,
    pub(crate) col_stride: usize,
}

impl RowMap {
    /// Row r's start (the definition the walk in [`fill`](Self::fill) follows; the tests hold it to it).
    #[cfg(test)]
    pub(crate) fn start(&self, r: usize) -> usize {
        let (b, pix) = (r / self.pixels, r % self.pixels);
        b * self.env_stride + (pix / self.ow) * self.row_stride + (pix % self.ow) * self.col_stride
    }

    /// An upper bound of the starts of rows 0..m (each term at its largest; `None` when it overflows): every row
    /// then lies inside an input of `bound + span` numbers.
    pub(crate) fn bound(&self, m: usize) -> Option<usize> {
        if m == 0 {
            return Some(0);
        }
        let rows_in_env = (m - 1).min(self.pixels - 1);
        ((m - 1) / self.pixels)
            .checked_mul(self.env_stride)?
            .checked_add((rows_in_env / self.ow).checked_mul(self.row_stride)?)?
            .checked_add(
                (self.ow - 1)
                    .min(rows_in_env)
                    .checked_mul(self.col_stride)?,
            )
    }

    /// The starts of rows r0, r0 + 1, … into `out`, walking pixel by pixel (no division past the first row).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn fill(&self, r0: usize, out: &mut [usize]) {
        let (mut b, pix) = (r0 / self.pixels, r0 % self.pixels);
        let (mut oy, mut ox) = (pix / self.ow, pix % self.ow);
        let mut left_in_env = self.pixels - pix;
        for o in out {
            *o = b * self.env_stride + oy * self.row_stride + ox * self.col_stride;
            left_in_env -= 1;
            ox += 1;
            if left_in_env == 0 {
                (b, oy, ox, left_in_env) = (b + 1, 0, 0, self.pixels);
            } else if ox == self.ow {
                (oy, ox) = (oy + 1, 0);
            }
        }
    }

    /// The same rows in pairs of numbers (bf16): every stride halved (all even: the caller checked).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn halved(self) -> RowMap {
        RowMap {
            env_stride: self.env_stride / 2,
            row_stride: self.row_stride / 2,
            col_stride: self.col_stride / 2,
            ..self
        }
    }

    /// Whether every start is even (every stride is).
    pub(crate) fn even(&self) -> bool {
        self.env_stride % 2 == 0 && self.row_stride % 2 == 0 && self.col_stride % 2 == 0
    }
}

impl PackedDense {
    /// Whether [`run_rows`](Self::run_rows) can run this layer: on this runtime's AVX-512 or AVX2 kernels (f32,
    /// or bf16 with even row starts and runs: [`rows_must_be_even`](Self::rows_must_be_even)), not lent.
    pub(crate) fn runs_rows(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            // Not the dot layout (`DOT_MAX_N`): a convolution that narrow takes the patch path.
            matches!(self.isa, Isa::Avx512 | Isa::Avx2Fma) && self.lent.is_none() && self.nr != 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Bytes of rounded input ([`crate::dense_bf16`]'s per-thread pair buffer) one row of this layer needs: 0 in
    /// f32.
    pub(crate) fn bf16_bytes_per_row(&self) -> u64 {
        if self.bf16.is_some() {
            4 * self.k.div_ceil(2) as u64
        } else {
            0
        }
    }

    /// Whether [`run_rows`](Self::run_rows) needs every row start, run length and run stride even (bf16 reads
    /// the input as pairs).
    pub(crate) fn rows_must_be_even(&self) -> bool {
        self.bf16.is_some()
    }

    /// `y[m, n] = act(A Wᵀ + b)` with row `r` of A read in place from `x` at `rows.start(r)` as `seg` says
    /// ([`RowMap`], [`Segments`]) — a
    /// convolution without its im2col copy. Why: on NatureCNN at batch 64 the patch copies (each output pixel's
    /// receptive field written out, 400 × 256 floats per env for the first layer, then read back by the GEMM)
    /// were ~17 % of act() in memory traffic, not in call overhead (explicit vector copies measured the same as
    /// `memmove`); the tile can broadcast straight from the input instead. Only where
    /// [`runs_rows`](Self::runs_rows).
    ///
    /// # Panics
    /// When a row's runs may leave `x`, the runs do not cover k, or `y` is shorter than m·n.
    pub(crate) fn run_rows(
        &self,
        x: &[f32],
        rows: RowMap,
        seg: Segments,
        y: &mut [f32],
        m: usize,
        act: Act,
    ) {
        assert!(
            self.runs_rows(),
            "run_rows needs the AVX-512 or AVX2 kernels"
        );
        if m == 0 {
            return;
        }
        if let Some(bf16) = &self.bf16 {
            let (k, n) = (self.k, self.n);
            crate::dense_bf16::run_rows(bf16, &self.bias, x, rows, seg, y, m, k, n, act);
            return;
        }
        assert!(seg.count >= 1 && seg.count * seg.len == self.k && y.len() >= m * self.n);
        assert!(rows.pixels >= 1 && rows.ow >= 1);
        let span = (seg.count - 1) * seg.stride + seg.len;
        assert!(
            rows.bound(m)
                .and_then(|b| b.checked_add(span))
                .is_some_and(|end| end <= x.len()),
            "rows leave the input"
        );
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the ISA's features were detected (`runs_rows`); every row's runs were checked to lie inside
            // `x`, and the panels were packed `nr` wide for this ISA.
            unsafe {
                match (self.isa, self.nr) {
                    (Isa::Avx2Fma, _) => x86::rows_avx2::<2>(self, x, rows, seg, y, m, act),
                    (_, 16) => x86::rows_avx512::<1>(self, x, rows, seg, y, m, act),
                    _ => x86::rows_avx512::<2>(self, x, rows, seg, y, m, act),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (x, rows, y, act);
            unreachable!("runs_rows is false here")
        }
    }
}

/// `dense_generic` compiled for one x86 instruction set: `$name` runs it on panels `$nr` wide (`$wide`: 32
/// vector registers, so 12-row tiles) with FMA.
macro_rules! x86_dense {
    ($(#[$doc:meta])* $name:ident, $features:literal, $isa:expr, $nr:literal, $wide:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the features this function enables (its `target_feature`): `dense_generic` runs this ISA's
        /// tiles, which assume them. Nothing else: every slice is bounds-checked there, and `tile` asserts the
        /// lengths its kernels read and write.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            x: &[f32],
            p: &[f32],
            b: &[f32],
            y: &mut [f32],
            m: usize,
            k: usize,
            n: usize,
            act: Act,
        ) {
            dense_generic::<$nr, true, $wide>($isa, x, p, b, y, m, k, n, act)
        }
    };
}

x86_dense!(
    /// The 128-bit tile with FMA (`v128::Fma128`): x86 CPUs with FMA3 under `POLICYPORT_CPU_SIMD128`.
    dense_sse_fma, "fma", Isa::Simd128, 8, false
);

/// The 128-bit kernels ([`v128`]) on panels 8 wide: 12-row tiles on aarch64 (32 NEON registers: 24
/// accumulators), `MR` rows elsewhere (16 XMM registers: 12); `fma` (x86 only, `kernels::simd128_fma` said
/// so) fuses the multiply-adds, which SSE2 alone cannot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_simd128(
    fma: bool,
    x: &[f32],
    p: &[f32],
    b: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    act: Act,
) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: the caller saw FMA on this CPU.
        unsafe { dense_sse_fma(x, p, b, y, m, k, n, act) };
        return;
    }
    let _ = fma;
    dense_generic::<8, false, { cfg!(target_arch = "aarch64") }>(
        Isa::Simd128,
        x,
        p,
        b,
        y,
        m,
        k,
        n,
        act,
    )
}

x86_dense!(dense_avx512, "avx512f,avx2,fma", Isa::Avx512, 32, true);
x86_dense!(
    /// AVX-512 on 16-wide panels (layers of at most 16 outputs): one zmm per row.
    dense_avx512_16, "avx512f,avx2,fma", Isa::Avx512, 16, true
);
x86_dense!(dense_avx2, "avx2,fma", Isa::Avx2Fma, 16, false);

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dense_generic<const NR: usize, const F: bool, const WIDE: bool>(
    isa: Isa,
    x: &[f32],
    panels: &[f32],
    bias: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    act: Act,
) {
    // Rows per tile (`WIDE`: AVX-512): AVX-512 has 32 vector registers, so 12 rows × 2 vectors = 24 accumulators
    // fit with the two weight vectors and a broadcast (12 with a 16-wide panel), halving the weight loads per FMA against 6 rows; x86 AVX2 and SIMD128
    // have 16 (6 rows: 12 accumulators).
    let mr = if WIDE { 12 } else { MR };
    // Row blocks outside. A block's inputs stay in L1/L2 while every panel passes once; with few rows (small
    // batches) a block is one tile and the panels stream from L2 per tile. With many rows, each panel (k·NR
    // floats: 32 KB for k = 256 on AVX-512) is instead reused by every tile of a block of up to `ROW_BLOCK` rows
    // while it sits in L1, so the weights cross L2→L1 once per block rather than once per tile; the block's
    // outputs are complete, still in L2, for one activation pass.
    const ROW_BLOCK: usize = 96;
    let np = panels.len() / (k * NR);
    let mut r0 = 0;
    while r0 < m {
        let block = if m - r0 > 2 * mr {
            (m - r0).min(ROW_BLOCK)
        } else {
            (m - r0).min(mr)
        };
        let mut p = 0;
        while p < np {
            // A single row has only NR/lanes accumulator chains per panel: latency-bound. Up to four panels at
            // once give it up to four times the independent chains (batch 1 is the common case in game loops);
            // two rows, two panels. Each output's sum is the same in any grouping (bias, then k in order), so a
            // row's answer does not depend on the batch it came in. Measured (Zen 5): a 64-wide layer (two
            // panels) at batch 1 ran one panel at a time before, its 2 chains each waiting out the FMA latency —
            // the CartPole MLP took 0.46 us on AVX-512 against 0.40 on the AVX2 kernels (four 16-wide panels,
            // grouped).
            let group = match block {
                1 => (np - p).min(4),
                2 => (np - p).min(2),
                // (Three rows by two panels of two vectors: 12 accumulators, within AVX-512's 32 registers, not
                // AVX2's 16.)
                3 if WIDE => (np - p).min(2),
                _ => 1,
            };
            let c0 = p * NR;
            let panel = &panels[p * k * NR..(p + group) * k * NR];
            let b = &bias[c0..c0 + group * NR];
            let mut r = r0;
            while r < r0 + block {
                let rows = (r0 + block - r).min(mr);
                let xs = &x[r * k..(r + rows) * k];
                let ys = &mut y[r * n..(r + rows) * n];
                match (rows, group) {
                    (1, 4) => tile::<1, 4, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (1, 3) => tile::<1, 3, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (1, 2) => tile::<1, 2, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (2, 2) => tile::<2, 2, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (3, 2) if WIDE => tile::<3, 2, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (12, _) if WIDE => tile::<12, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (11, _) if WIDE => tile::<11, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (10, _) if WIDE => tile::<10, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (9, _) if WIDE => tile::<9, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (8, _) if WIDE => tile::<8, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (7, _) if WIDE => tile::<7, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (6, _) => tile::<6, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (5, _) => tile::<5, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (4, _) => tile::<4, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (3, _) => tile::<3, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    (2, _) => tile::<2, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                    _ => tile::<1, 1, NR, F>(isa, xs, k, panel, b, ys, n, c0, act),
                }
                r += rows;
            }
            p += group;
        }
        if !act_in_store(isa, act) {
            kernels::bias_act(isa, act, &mut y[r0 * n..(r0 + block) * n], None, n);
        }
        r0 += block;
    }
}

/// Whether `isa`'s tiles apply `act` to their accumulators before they store them (AVX-512 and AVX2: Identity,
/// ReLU and tanh, in `x86::store_avx512` / `x86::store_avx2`; the 128-bit tile in `v128::activate`), so that
/// the layer needs no activation pass over its output. Why: the pass
/// read the whole block back from L2 and wrote it again — with tanh on the benchmark MLP, ~11 % of act() at
/// batch 1024 before tanh was made cheap enough (`kernels::tanh_lanes_avx512`) to run in the tile.
pub(crate) fn act_in_store(isa: Isa, act: Act) -> bool {
    match isa {
        Isa::Portable => act == Act::Identity,
        _ => matches!(act, Act::Identity | Act::Relu | Act::Tanh),
    }
}

/// `R` rows × `P` consecutive panels: accumulate (bias included) and store the valid columns into `y`, with `act`
/// applied where [`act_in_store`] (else the caller's pass applies it).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<const R: usize, const P: usize, const NR: usize, const F: bool>(
    isa: Isa,
    x: &[f32],
    k: usize,
    panels: &[f32],
    bias: &[f32],
    y: &mut [f32],
    n: usize,
    c0: usize,
    act: Act,
) {
    assert!(
        x.len() >= R * k
            && panels.len() >= P * k * NR
            && bias.len() >= P * NR
            && c0 < n
            && y.len() >= (R - 1) * n + n.min(c0 + P * NR)
    );
    // The x86 kernels store their accumulators straight into `y` (row stride n, the columns past n masked off).
    let _ = act;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if NR == 16 => {
            // SAFETY: `isa` came from `detect`, which saw AVX-512F and FMA on this CPU (the `x86_dense!` callers
            // run in code compiled for them); NR = 16 = 16·V with V = 1; the lengths `accumulate_avx512` needs (x
            // R·k, panels P·k·NR, bias P·NR, y up to column c0 + P·NR of row R − 1) were asserted above.
            return unsafe { x86::accumulate_avx512::<R, P, 1>(x, k, panels, bias, y, n, c0, act) };
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: as above, with NR = 32 = 16·2: the only `x86_dense!` instances given `Isa::Avx512` use NR
            // 16 (the arm above) or 32 (`panel_width`).
            return unsafe { x86::accumulate_avx512::<R, P, 2>(x, k, panels, bias, y, n, c0, act) };
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => {
            // SAFETY: `detect` saw AVX2 and FMA on this CPU; NR = 16, the width `accumulate_avx2` reads (the only
            // `x86_dense!` instance given `Isa::Avx2Fma`, `dense_avx2`, uses 16); the lengths were asserted above.
            return unsafe { x86::accumulate_avx2::<R, P>(x, k, panels, bias, y, n, c0, act) };
        }
        _ => {}
    }
    // acc[j][i]: panel j, row i. The 128-bit kernel overwrites it (bias included); the portable one accumulates
    // onto it.
    let mut acc = [[[0.0f32; NR]; R]; P];
    for (j, a) in acc.iter_mut().enumerate() {
        *a = [bias[j * NR..(j + 1) * NR].try_into().unwrap(); R];
    }
    match isa {
        Isa::Simd128 => {
            assert_eq!(NR, 8, "the 128-bit tile is two vectors wide");
            let out = acc.as_flattened_mut().as_flattened_mut();
            // SAFETY: the lengths asserted above; SSE2, NEON and SIMD128 are part of their targets, and `F` on
            // x86 means the caller saw FMA (`dense_sse_fma`).
            #[cfg(policyport_v128)]
            unsafe {
                #[cfg(target_arch = "x86_64")]
                if F {
                    v128::outputs::<v128::Fma128, R, P>(x, k, panels, bias, out, act)
                } else {
                    v128::outputs::<v128::Plain, R, P>(x, k, panels, bias, out, act)
                }
                #[cfg(not(target_arch = "x86_64"))]
                v128::outputs::<v128::Plain, R, P>(x, k, panels, bias, out, act);
            }
            #[cfg(not(policyport_v128))]
            {
                let _ = out;
                unreachable!("kernels::detect never picks Simd128 here");
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx2Fma => unreachable!("stored by their kernels above"),
        // Never picked in a SIMD128 wasm build (`kernels::detect`), and not compiled there: 10 KB of the
        // browser bundle and the plugin.
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Portable => unreachable!("kernels::detect picks Simd128 in a SIMD128 build"),
        #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
        Isa::Portable => {
            let rows: [&[f32]; R] = std::array::from_fn(|i| &x[i * k..(i + 1) * k]);
            for (j, panel) in panels.chunks_exact(k * NR).take(P).enumerate() {
                for (kk, w) in panel.chunks_exact(NR).enumerate() {
                    let w: &[f32; NR] = w.try_into().unwrap();
                    for i in 0..R {
                        let xv = rows[i][kk];
                        for c in 0..NR {
                            acc[j][i][c] = madd::<F>(xv, w[c], acc[j][i][c]);
                        }
                    }
                }
            }
        }
    }
    for j in 0..P {
        let cj = c0 + j * NR;
        let width = NR.min(n - cj);
        for i in 0..R {
            y[i * n + cj..i * n + cj + width].copy_from_slice(&acc[j][i][..width]);
        }
    }
}

/// The 128-bit tile, written once for every four-lane vector type ([`Lanes4`](v128::Lanes4)): SSE2 and SSE
/// with FMA on x86-64, NEON on aarch64, SIMD128 in wasm (which wasmtime and browsers lower to SSE/AVX). NR = 8:
/// two vectors per row and panel. Why one generic body: the three ISAs' tiles are the same loop over the same
/// packing, and the x86 one is the native kernel of the sandbox plugin's width (the comparison bench.sh prints).
pub(crate) mod v128 {
    /// Four f32 lanes and the four operations the tile needs.
    pub(crate) trait Lanes4: Copy {
        /// # Safety
        /// `p` valid for reading 4 floats; the ISA available.
        unsafe fn load(p: *const f32) -> Self;
        /// `*p` in every lane.
        ///
        /// # Safety
        /// `p` valid for reading; the ISA available.
        unsafe fn splat(p: *const f32) -> Self;
        /// # Safety
        /// `p` valid for writing 4 floats; the ISA available.
        unsafe fn store(self, p: *mut f32);
        /// `a·b + c`, fused where the type is.
        ///
        /// # Safety
        /// The ISA available.
        unsafe fn madd(a: Self, b: Self, c: Self) -> Self;
        /// `v` in every lane.
        ///
        /// # Safety
        /// The ISA available.
        unsafe fn set(v: f32) -> Self;
        /// # Safety
        /// The ISA available.
        unsafe fn mul(a: Self, b: Self) -> Self;
        /// # Safety
        /// The ISA available.
        unsafe fn div(a: Self, b: Self) -> Self;
        /// x clamped to [−c, c] lane by lane, a NaN kept NaN.
        ///
        /// # Safety
        /// The ISA available.
        unsafe fn clamp(x: Self, c: f32) -> Self;
        /// `max(v, 0)` with a NaN lane → 0, as the activation pass's ReLU (`f32::max`).
        ///
        /// # Safety
        /// The ISA available.
        unsafe fn relu(v: Self) -> Self;
    }

    /// tanh on four lanes: the 13/6 rational of `kernels::tanh_lanes_avx512` (within 3.5e-7 of f64; ±0, tiny
    /// and subnormal x come back exactly, NaN stays NaN), with a division.
    ///
    /// # Safety
    /// `V`'s ISA available.
    #[inline(always)]
    pub(crate) unsafe fn tanh_lanes<V: Lanes4>(x: V) -> V {
        use crate::kernels::{TANH_CLAMP, TANH_P, TANH_Q};
        // SAFETY: the caller's contract.
        unsafe {
            let x = V::clamp(x, TANH_CLAMP);
            let x2 = V::mul(x, x);
            let mut p = V::set(TANH_P[0]);
            for c in &TANH_P[1..] {
                p = V::madd(p, x2, V::set(*c));
            }
            let mut d = V::set(TANH_Q[0]);
            for c in &TANH_Q[1..] {
                d = V::madd(d, x2, V::set(*c));
            }
            V::div(V::mul(p, x), d)
        }
    }

    /// `act` on `out` in place, 4 lanes at a time, where [`super::act_in_store`] (ReLU, tanh; identity is
    /// nothing): the tile's outputs while they are still in L1, instead of a pass over the block after it. Why:
    /// the pass (the portable tanh, one value at a time) was 14 % of act() on the SSE kernels at batch 64.
    ///
    /// # Safety
    /// `out.len()` a multiple of 4; `V`'s ISA available.
    #[inline(always)]
    pub(super) unsafe fn activate<V: Lanes4>(out: &mut [f32], act: super::Act) {
        // SAFETY: every chunk is 4 floats inside `out`; the ISA by the caller's contract.
        unsafe {
            match act {
                super::Act::Relu => {
                    for c in out.chunks_exact_mut(4) {
                        V::relu(V::load(c.as_ptr())).store(c.as_mut_ptr());
                    }
                }
                super::Act::Tanh => {
                    for c in out.chunks_exact_mut(4) {
                        tanh_lanes(V::load(c.as_ptr())).store(c.as_mut_ptr());
                    }
                }
                _ => {}
            }
        }
    }

    /// The tile's outputs, `act` applied where [`super::act_in_store`]: [`accumulate`] then [`activate`].
    ///
    /// # Safety
    /// As for [`accumulate`].
    #[inline(always)]
    pub(super) unsafe fn outputs<V: Lanes4, const R: usize, const P: usize>(
        x: &[f32],
        k: usize,
        panels: &[f32],
        bias: &[f32],
        out: &mut [f32],
        act: super::Act,
    ) {
        // SAFETY: the caller's contract; `out` is P·R·8 floats, a multiple of 4.
        unsafe {
            accumulate::<V, R, P>(x, k, panels, bias, out);
            activate::<V>(out, act);
        }
    }

    /// `out[(j·R + i)·8 ..][..8] = bias_j + Σ_kk x[i][kk] · panel_j[kk]` for R rows and P panels (NR = 8).
    ///
    /// # Safety
    /// `x` holds R rows of k, `panels` P panels of k·8, `bias` P·8, `out` P·R·8; `V`'s ISA available.
    #[inline(always)]
    pub(super) unsafe fn accumulate<V: Lanes4, const R: usize, const P: usize>(
        x: &[f32],
        k: usize,
        panels: &[f32],
        bias: &[f32],
        out: &mut [f32],
    ) {
        debug_assert!(
            x.len() >= R * k
                && panels.len() >= P * k * 8
                && bias.len() >= P * 8
                && out.len() >= P * R * 8
        );
        // SAFETY: the caller's contract.
        unsafe {
            let b = |j: usize, h: usize| V::load(bias.as_ptr().add(j * 8 + h * 4));
            let mut acc: [[[V; 2]; R]; P] = std::array::from_fn(|j| [[b(j, 0), b(j, 1)]; R]);
            let (xp, wp) = (x.as_ptr(), panels.as_ptr());
            for kk in 0..k {
                // Broadcast from memory: `v128.load32_splat` is one `vbroadcastss` in V8, where a scalar load
                // then `f32x4.splat` is a load, a move and a shuffle; `ld1r` on NEON.
                let xv: [V; R] = std::array::from_fn(|i| V::splat(xp.add(i * k + kk)));
                for (j, aj) in acc.iter_mut().enumerate() {
                    let w = wp.add(j * k * 8 + kk * 8);
                    let (w0, w1) = (V::load(w), V::load(w.add(4)));
                    for i in 0..R {
                        aj[i][0] = V::madd(xv[i], w0, aj[i][0]);
                        aj[i][1] = V::madd(xv[i], w1, aj[i][1]);
                    }
                }
            }
            for j in 0..P {
                for i in 0..R {
                    let o = out.as_mut_ptr().add((j * R + i) * 8);
                    acc[j][i][0].store(o);
                    acc[j][i][1].store(o.add(4));
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) use x86::{Fma128, Plain};
    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        /// SSE registers; `FMA`: multiply-adds fused by FMA3 (only inside code compiled for FMA:
        /// `dense_sse_fma`), else multiplied then added (SSE2, part of x86-64 itself).
        #[derive(Clone, Copy)]
        pub(crate) struct Sse<const FMA: bool>(__m128);

        /// SSE2 alone.
        pub(crate) type Plain = Sse<false>;
        /// SSE with FMA3.
        pub(crate) type Fma128 = Sse<true>;

        impl<const FMA: bool> super::Lanes4 for Sse<FMA> {
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                Sse(unsafe { _mm_loadu_ps(p) })
            }
            #[inline(always)]
            unsafe fn splat(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                Sse(unsafe { _mm_load1_ps(p) })
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                // SAFETY: the caller's contract.
                unsafe { _mm_storeu_ps(p, self.0) }
            }
            #[inline(always)]
            unsafe fn madd(a: Self, b: Self, c: Self) -> Self {
                if FMA {
                    // SAFETY: the caller's contract: compiled for (and run on) a CPU with FMA.
                    Sse(unsafe { fmadd(a.0, b.0, c.0) })
                } else {
                    // SAFETY: SSE is part of x86-64.
                    Sse(unsafe { _mm_add_ps(c.0, _mm_mul_ps(a.0, b.0)) })
                }
            }
            #[inline(always)]
            unsafe fn set(v: f32) -> Self {
                // SAFETY: SSE is part of x86-64 (register operations only, no memory).
                Sse(unsafe { _mm_set1_ps(v) })
            }
            #[inline(always)]
            unsafe fn mul(a: Self, b: Self) -> Self {
                // SAFETY: SSE is part of x86-64 (register operations only).
                Sse(unsafe { _mm_mul_ps(a.0, b.0) })
            }
            #[inline(always)]
            unsafe fn div(a: Self, b: Self) -> Self {
                // SAFETY: SSE is part of x86-64 (register operations only).
                Sse(unsafe { _mm_div_ps(a.0, b.0) })
            }
            #[inline(always)]
            unsafe fn clamp(x: Self, c: f32) -> Self {
                // maxps/minps return their second operand when either is NaN: x last keeps a NaN.
                // SAFETY: SSE is part of x86-64 (register operations only).
                unsafe { Sse(_mm_min_ps(_mm_set1_ps(c), _mm_max_ps(_mm_set1_ps(-c), x.0))) }
            }
            #[inline(always)]
            unsafe fn relu(v: Self) -> Self {
                // The second operand (0) when v is NaN.
                // SAFETY: SSE is part of x86-64 (register operations only).
                Sse(unsafe { _mm_max_ps(v.0, _mm_setzero_ps()) })
            }
        }

        /// `a·b + c` fused; inlined into its FMA-compiled caller.
        #[inline]
        #[target_feature(enable = "fma")]
        fn fmadd(a: __m128, b: __m128, c: __m128) -> __m128 {
            _mm_fmadd_ps(a, b, c)
        }
    }

    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    pub(crate) use self::neon::Plain;
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    mod neon {
        use std::arch::aarch64::*;

        /// NEON (part of aarch64 itself): `fmla`, always fused.
        pub(crate) type Plain = float32x4_t;

        impl super::Lanes4 for float32x4_t {
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                unsafe { vld1q_f32(p) }
            }
            #[inline(always)]
            unsafe fn splat(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                unsafe { vld1q_dup_f32(p) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                // SAFETY: the caller's contract.
                unsafe { vst1q_f32(p, self) }
            }
            #[inline(always)]
            unsafe fn madd(a: Self, b: Self, c: Self) -> Self {
                // SAFETY: NEON is part of the target (the module's cfg).
                unsafe { vfmaq_f32(c, a, b) }
            }
            #[inline(always)]
            unsafe fn set(v: f32) -> Self {
                // SAFETY: NEON is part of the target (the module's cfg); register operations only.
                unsafe { vdupq_n_f32(v) }
            }
            #[inline(always)]
            unsafe fn mul(a: Self, b: Self) -> Self {
                // SAFETY: NEON is part of the target (the module's cfg); register operations only.
                unsafe { vmulq_f32(a, b) }
            }
            #[inline(always)]
            unsafe fn div(a: Self, b: Self) -> Self {
                // SAFETY: NEON is part of the target (the module's cfg); register operations only.
                unsafe { vdivq_f32(a, b) }
            }
            #[inline(always)]
            unsafe fn clamp(x: Self, c: f32) -> Self {
                // fmin/fmax return NaN when either operand is NaN.
                // SAFETY: NEON is part of the target (the module's cfg); register operations only.
                unsafe { vminq_f32(vdupq_n_f32(c), vmaxq_f32(vdupq_n_f32(-c), x)) }
            }
            #[inline(always)]
            unsafe fn relu(v: Self) -> Self {
                // fmaxnm: the number when the other operand is NaN.
                // SAFETY: NEON is part of the target (the module's cfg); register operations only.
                unsafe { vmaxnmq_f32(v, vdupq_n_f32(0.0)) }
            }
        }
    }

    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    pub(crate) use self::wasm::Plain;
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    mod wasm {
        use std::arch::wasm32::*;

        /// SIMD128; with relaxed-SIMD the engine may fuse the multiply-add (FMA on x86 with FMA), so the result
        /// may differ in the last bit between hosts — within the suite's tolerances, and deterministic on any
        /// one host.
        pub(crate) type Plain = v128;

        impl super::Lanes4 for v128 {
            #[inline(always)]
            unsafe fn load(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                unsafe { v128_load(p as *const v128) }
            }
            #[inline(always)]
            unsafe fn splat(p: *const f32) -> Self {
                // SAFETY: the caller's contract.
                unsafe { v128_load32_splat(p as *const u32) }
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut f32) {
                // SAFETY: the caller's contract.
                unsafe { v128_store(p as *mut v128, self) }
            }
            #[inline(always)]
            unsafe fn madd(a: Self, b: Self, c: Self) -> Self {
                #[cfg(target_feature = "relaxed-simd")]
                {
                    f32x4_relaxed_madd(a, b, c)
                }
                #[cfg(not(target_feature = "relaxed-simd"))]
                {
                    f32x4_add(c, f32x4_mul(a, b))
                }
            }
            #[inline(always)]
            unsafe fn set(v: f32) -> Self {
                f32x4_splat(v)
            }
            #[inline(always)]
            unsafe fn mul(a: Self, b: Self) -> Self {
                f32x4_mul(a, b)
            }
            #[inline(always)]
            unsafe fn div(a: Self, b: Self) -> Self {
                f32x4_div(a, b)
            }
            #[inline(always)]
            unsafe fn clamp(x: Self, c: f32) -> Self {
                // f32x4.min/max return NaN when either operand is NaN.
                f32x4_min(f32x4_splat(c), f32x4_max(f32x4_splat(-c), x))
            }
            #[inline(always)]
            unsafe fn relu(v: Self) -> Self {
                // pmax(0, v) = 0 < v ? v : 0, so a NaN lane gives 0.
                f32x4_pmax(f32x4_splat(0.0), v)
            }
        }
    }
}

/// The register-blocked inner loops in intrinsics: written generically, the compiler keeps some accumulators in
/// memory (it vectorises the lane loop only after scalar replacement has given up on the array).
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// `y[i·n + c0 + j·NR + c] = bias_j[c] + Σ_kk x[i][kk] · panel_j[kk][c]` for R rows, P panels and the columns
    /// below n, NR = 16·V (V zmm per row and panel: 2 for the 32-wide panels, 1 for layers of at most 16
    /// outputs); partial vectors are masked stores; `act` applied as `store_avx512` does.
    ///
    /// # Safety
    /// AVX-512F; `x` holds R rows of k, `panels` P panels of k·NR, `bias` P·NR, `y` (R − 1)·n + min(n, c0 + P·NR).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate_avx512<const R: usize, const P: usize, const V: usize>(
        x: &[f32],
        k: usize,
        panels: &[f32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        // SAFETY: the caller's contract: AVX-512F on this CPU; the bias loads read P·NR numbers of `bias`, the
        // broadcasts rows i < R of k in `x`, the weight loads P panels of k·NR in `panels` (NR = 16·V, each
        // load 16 in bounds), and `store_avx512` gets its own contract's `y`.
        unsafe {
            let nr = 16 * V;
            let b = |j: usize, h: usize| _mm512_loadu_ps(bias.as_ptr().add(j * nr + h * 16));
            let mut acc: [[[__m512; V]; R]; P] =
                std::array::from_fn(|j| [std::array::from_fn(|h| b(j, h)); R]);
            let (xp, wp) = (x.as_ptr(), panels.as_ptr());
            for kk in 0..k {
                let xv: [__m512; R] = std::array::from_fn(|i| _mm512_set1_ps(*xp.add(i * k + kk)));
                for (j, aj) in acc.iter_mut().enumerate() {
                    let w = wp.add(j * k * nr + kk * nr);
                    let wv: [__m512; V] = std::array::from_fn(|h| _mm512_loadu_ps(w.add(h * 16)));
                    for i in 0..R {
                        for h in 0..V {
                            aj[i][h] = _mm512_fmadd_ps(xv[i], wv[h], aj[i][h]);
                        }
                    }
                }
            }
            store_avx512(&acc, y, n, c0, act);
        }
    }

    /// `$name`: the driver of the dot-product kernels ([`super::DOT_MAX_N`]) on one instruction set — `$tile`
    /// computes R rows (R per output count N from the table: R·N accumulators, R row vectors and a weight
    /// vector within the ISA's registers), then single rows; the activation, if any, in one pass after.
    macro_rules! dot_driver {
        ($(#[$doc:meta])* $name:ident, $features:literal, $isa:expr, $tile:ident, [$($n:literal => $r:literal),*]) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// The CPU has the features this function enables (its `target_feature`). The lengths are asserted:
            /// `w` holds n·kp (kp = k rounded up to 16), `bias` n, `x` m·k, `y` m·n, with 1 ≤ n ≤ `DOT_MAX_N`.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn $name(
                x: &[f32],
                w: &[f32],
                bias: &[f32],
                y: &mut [f32],
                m: usize,
                k: usize,
                n: usize,
                act: super::Act,
            ) {
                assert!(
                    (1..=super::DOT_MAX_N).contains(&n)
                        && w.len() >= n * k.div_ceil(16) * 16
                        && bias.len() >= n
                        && x.len() >= m * k
                        && y.len() >= m * n
                );
                match n {
                    $($n => {
                        let mut r = 0;
                        while r + $r <= m {
                            // SAFETY: rows r..r + R < m of x and y; the asserted lengths.
                            unsafe { $tile::<$r, $n>(x, w, bias, y, r, k) };
                            r += $r;
                        }
                        while r < m {
                            // SAFETY: as above, one row.
                            unsafe { $tile::<1, $n>(x, w, bias, y, r, k) };
                            r += 1;
                        }
                    })*
                    _ => unreachable!("asserted above"),
                }
                if act != super::Act::Identity {
                    crate::kernels::bias_act($isa, act, &mut y[..m * n], None, n);
                }
            }
        };
    }

    dot_driver!(
        /// `y[m, n] = act(x[m, k] Wᵀ + b)` with W packed by output rows of `kp = k` rounded up to 16 (zeros past
        /// k): see [`super::DOT_MAX_N`]. Tiles of 4 rows (3 from 7 outputs on: within 32 registers); the rows'
        /// last partial group of 16 is a masked load (never past the row, and no NaN from what follows it).
        /// AVX-512F.
        dot_avx512, "avx512f,avx2,fma", super::Isa::Avx512, dot_tile,
        [1 => 4, 2 => 4, 3 => 4, 4 => 4, 5 => 4, 6 => 4, 7 => 3, 8 => 3]
    );
    dot_driver!(
        /// `dot_avx512` on AVX2 (16 YMM registers: R = 4, 3, 2 or 1 as N grows); the last partial group of 8 is
        /// a masked load. AVX2 + FMA.
        dot_avx2, "avx2,fma", super::Isa::Avx2Fma, dot_tile_avx2,
        [1 => 4, 2 => 4, 3 => 3, 4 => 2, 5 => 2, 6 => 1, 7 => 1, 8 => 1]
    );

    // Out of line, one register allocation per (R, N). The first version (inlined into the driver, lane sums by
    // `_mm512_reduce_add_ps`) spilled its accumulators; the measured cause was the sums (see `sum_lanes`).
    /// Rows r..r + R of `dot_avx512`, without the activation.
    ///
    /// # Safety
    /// AVX-512F; as for `dot_avx512`, with r + R ≤ m.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline(never)]
    unsafe fn dot_tile<const R: usize, const N: usize>(
        x: &[f32],
        w: &[f32],
        bias: &[f32],
        y: &mut [f32],
        r: usize,
        k: usize,
    ) {
        let kp = k.div_ceil(16) * 16;
        // SAFETY: the caller's contract: every full group of 16 lies inside row r + i (< m) of x, the last one
        // is masked to the row's end; the weights are padded to kp.
        unsafe {
            let rows: [*const f32; R] = std::array::from_fn(|i| x.as_ptr().add((r + i) * k));
            let wp: [*const f32; N] = std::array::from_fn(|j| w.as_ptr().add(j * kp));
            let mut acc: [[__m512; N]; R] = [[_mm512_setzero_ps(); N]; R];
            let mut c = 0;
            while c < k {
                // All lanes but in the last, partial group (a masked load costs what a plain one does).
                let mask = if k - c >= 16 {
                    u16::MAX
                } else {
                    ((1u32 << (k - c)) - 1) as u16
                };
                let xv: [__m512; R] =
                    std::array::from_fn(|i| _mm512_maskz_loadu_ps(mask, rows[i].add(c)));
                for j in 0..N {
                    let wv = _mm512_loadu_ps(wp[j].add(c));
                    for i in 0..R {
                        acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
                c += 16;
            }
            let yp = y.as_mut_ptr().add(r * N);
            for i in 0..R {
                for j in 0..N {
                    *yp.add(i * N + j) = bias[j] + sum_lanes(acc[i][j]);
                }
            }
        }
    }

    /// Rows r..r + R of `dot_avx2`, without the activation.
    ///
    /// # Safety
    /// AVX2 + FMA; as for `dot_avx2`, with r + R ≤ m.
    #[target_feature(enable = "avx2,fma")]
    #[inline(never)]
    unsafe fn dot_tile_avx2<const R: usize, const N: usize>(
        x: &[f32],
        w: &[f32],
        bias: &[f32],
        y: &mut [f32],
        r: usize,
        k: usize,
    ) {
        let kp = k.div_ceil(16) * 16;
        // SAFETY: the caller's contract: every full group of 8 lies inside row r + i (< m) of x, the last one is
        // masked to the row's end; the weights are padded to kp.
        unsafe {
            let rows: [*const f32; R] = std::array::from_fn(|i| x.as_ptr().add((r + i) * k));
            let wp: [*const f32; N] = std::array::from_fn(|j| w.as_ptr().add(j * kp));
            let mut acc: [[__m256; N]; R] = [[_mm256_setzero_ps(); N]; R];
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mut c = 0;
            while c < k {
                // Lanes below the row's end have their sign bit set: the ones maskload reads.
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((k - c).min(8) as i32), lane);
                let xv: [__m256; R] =
                    std::array::from_fn(|i| _mm256_maskload_ps(rows[i].add(c), mask));
                for j in 0..N {
                    let wv = _mm256_loadu_ps(wp[j].add(c));
                    for i in 0..R {
                        acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
                    }
                }
                c += 8;
            }
            let yp = y.as_mut_ptr().add(r * N);
            for i in 0..R {
                for j in 0..N {
                    let v = acc[i][j];
                    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                    *yp.add(i * N + j) = bias[j] + _mm_cvtss_f32(s);
                }
            }
        }
    }

    /// The sum of v's 16 lanes in 512-bit operations only. Why not `_mm512_reduce_add_ps`: it narrows to ymm and
    /// xmm instructions, which without AVX512-VL reach only registers 0-15, so `dot_tile`'s accumulators had to
    /// live there and spilled to the stack in the loop.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum_lanes(v: __m512) -> f32 {
        let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
        let v = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
        let v = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
        _mm512_cvtss_f32(v)
    }

    /// `act(acc[j][i][h])` to `y[i·n + c0 + j·16V + h·16 ..]`, the columns from n on masked off; `act` is
    /// applied here when it is one of [`super::act_in_store`]'s (ReLU as `max(v, 0)`, NaN → 0 like the
    /// activation pass; tanh by `tanh_lanes_avx512`), and left to the caller's pass otherwise.
    ///
    /// # Safety
    /// AVX-512F with AVX2 and FMA (what `kernels::detect` requires for `Isa::Avx512`; `tanh_registers` enables
    /// them); `y` holds (R − 1)·n + min(n, c0 + P·16V).
    #[inline(always)]
    pub(crate) unsafe fn store_avx512<const R: usize, const P: usize, const V: usize>(
        acc: &[[[__m512; V]; R]; P],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        let mut acc = *acc;
        let flat = acc.as_flattened_mut().as_flattened_mut();
        match act {
            super::Act::Relu => flat.iter_mut().for_each(|v| {
                // SAFETY: AVX-512F by the caller's contract; register operations only.
                *v = unsafe { _mm512_max_ps(*v, _mm512_setzero_ps()) }
            }),
            // SAFETY: AVX-512F, AVX2 and FMA by the caller's contract.
            super::Act::Tanh => unsafe { tanh_registers(flat) },
            _ => {}
        }
        let nr = 16 * V;
        let yp = y.as_mut_ptr();
        for j in 0..P {
            for h in 0..V {
                let col = c0 + j * nr + h * 16;
                if col >= n {
                    break;
                }
                let valid = n - col;
                for i in 0..R {
                    // SAFETY: row i < R and column col + 16 (or the masked part of it) ≤ n: inside `y` by the
                    // caller's contract.
                    unsafe {
                        let o = yp.add(i * n + col);
                        let v = acc[j][i][h];
                        if valid >= 16 {
                            _mm512_storeu_ps(o, v);
                        } else {
                            _mm512_mask_storeu_ps(o, ((1u32 << valid) - 1) as __mmask16, v);
                        }
                    }
                }
            }
        }
    }

    /// tanh on a tile's accumulators, in a function of its own (its dozen constants loaded once per tile, after
    /// the tile's loops). Regression: the first fused version applied the activation inside the store loop
    /// through a closure, and LLVM then kept the implicit-GEMM tile's 24 accumulators in stack memory, stored on
    /// every run of its outer loop — NatureCNN (ReLU) at batch 64 ran 2.2x slower (6.2 → 13.6 ms) while the MLP
    /// got faster; `store_avx512` now activates a copy of the accumulators before it stores them.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline(never)]
    fn tanh_registers(v: &mut [__m512]) {
        for x in v {
            *x = crate::kernels::tanh_lanes_avx512(*x);
        }
    }

    /// `tanh_registers` for AVX2 tiles.
    #[target_feature(enable = "avx2,fma")]
    #[inline(never)]
    fn tanh_registers_avx2(v: &mut [__m256]) {
        for x in v {
            *x = crate::kernels::tanh_lanes_avx2(*x);
        }
    }

    /// One panel × R rows of an implicit GEMM: row i's numbers are `seg.count` runs of `seg.len` from `rows[i]`,
    /// `seg.stride` apart (see [`super::Segments`]); the panel's k steps follow the runs in order.
    ///
    /// # Safety
    /// AVX-512F; every row's runs inside its allocation; `panel` k·16V; `bias` 16V; `y` as for `store_avx512`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_tile<const R: usize, const V: usize>(
        rows: &[*const f32; R],
        seg: super::Segments,
        panel: &[f32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        let nr = 16 * V;
        // SAFETY: the caller's contract.
        unsafe {
            let mut acc: [[[__m512; V]; R]; 1] =
                [[std::array::from_fn(|h| _mm512_loadu_ps(bias.as_ptr().add(h * 16))); R]];
            let mut w = panel.as_ptr();
            for s in 0..seg.count {
                let off = s * seg.stride;
                for kk in 0..seg.len {
                    let xv: [__m512; R] =
                        std::array::from_fn(|i| _mm512_set1_ps(*rows[i].add(off + kk)));
                    let wv: [__m512; V] = std::array::from_fn(|h| _mm512_loadu_ps(w.add(h * 16)));
                    for i in 0..R {
                        for h in 0..V {
                            acc[0][i][h] = _mm512_fmadd_ps(xv[i], wv[h], acc[0][i][h]);
                        }
                    }
                    w = w.add(nr);
                }
            }
            store_avx512(&acc, y, n, c0, act);
        }
    }

    /// `$name`: the row blocks, panels and tiles of `dense_generic` for [`PackedDense::run_rows`](super::PackedDense)
    /// on one instruction set (`$tile` computes one tile of up to `$mr` rows, `$nr` columns).
    macro_rules! rows_driver {
        ($(#[$doc:meta])* $name:ident, $features:literal, $isa:expr, $mr:literal, $nr:expr, $tile:ident, [$($r:literal)*]) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// The CPU has the features this function enables (its `target_feature`); every row's runs lie inside
            /// `x` (`run_rows` checks `row_map.bound(m)` plus the runs' span) and cover k (`seg.count · seg.len ==
            /// d.k`); `y` holds m·n. (Which panel width `d` was packed in decides only the result: its panels and
            /// bias are sliced with bounds checks.)
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const V: usize>(
                d: &super::PackedDense,
                x: &[f32],
                row_map: super::RowMap,
                seg: super::Segments,
                y: &mut [f32],
                m: usize,
                act: super::Act,
            ) {
                const ROW_BLOCK: usize = 96;
                let mut starts = [0usize; ROW_BLOCK];
                let (k, n, nr) = (d.k, d.n, $nr);
                let np = n.div_ceil(nr);
                let base = x.as_ptr();
                let mut r0 = 0;
                while r0 < m {
                    let block = (m - r0).min(ROW_BLOCK);
                    row_map.fill(r0, &mut starts[..block]);
                    for p in 0..np {
                        let panel = &d.panels[p * k * nr..(p + 1) * k * nr];
                        let bias = &d.bias[p * nr..(p + 1) * nr];
                        let mut r = r0;
                        while r < r0 + block {
                            let rows = (r0 + block - r).min($mr);
                            let ys = &mut y[r * n..];
                            // SAFETY: row starts inside `x` with their runs (checked by run_rows); the rest as
                            // for the tile function.
                            unsafe {
                                match rows {
                                    $($r => {
                                        let ptrs: [*const f32; $r] =
                                            std::array::from_fn(|i| base.add(starts[r - r0 + i]));
                                        $tile::<$r, V>(&ptrs, seg, panel, bias, ys, n, p * nr, act)
                                    })*
                                    _ => unreachable!("1 to {} rows", $mr),
                                }
                            }
                            r += rows;
                        }
                    }
                    if !super::act_in_store($isa, act) {
                        crate::kernels::bias_act($isa, act, &mut y[r0 * n..(r0 + block) * n], None, n);
                    }
                    r0 += block;
                }
            }
        };
    }

    rows_driver!(
        /// AVX-512F, panels 16·V wide (V zmm per row).
        rows_avx512, "avx512f,avx2,fma", super::Isa::Avx512, 12, 16 * V, rows_tile,
        [1 2 3 4 5 6 7 8 9 10 11 12]
    );
    rows_driver!(
        /// AVX2 + FMA, panels 16 wide (two ymm per row; V = 2).
        rows_avx2, "avx2,fma", super::Isa::Avx2Fma, 6, 16, rows_tile_avx2,
        [1 2 3 4 5 6]
    );

    /// `rows_tile` on AVX2: R rows × one 16-wide panel in two ymm per row (V is always 2 here).
    ///
    /// # Safety
    /// AVX2 + FMA; as for `rows_tile` with 16-wide panels.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_tile_avx2<const R: usize, const V: usize>(
        rows: &[*const f32; R],
        seg: super::Segments,
        panel: &[f32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            let b = |h: usize| _mm256_loadu_ps(bias.as_ptr().add(h * 8));
            let mut acc: [[[__m256; 2]; R]; 1] = [[[b(0), b(1)]; R]];
            let mut w = panel.as_ptr();
            for s in 0..seg.count {
                let off = s * seg.stride;
                for kk in 0..seg.len {
                    let xv: [__m256; R] =
                        std::array::from_fn(|i| _mm256_set1_ps(*rows[i].add(off + kk)));
                    let (w0, w1) = (_mm256_loadu_ps(w), _mm256_loadu_ps(w.add(8)));
                    for i in 0..R {
                        acc[0][i][0] = _mm256_fmadd_ps(xv[i], w0, acc[0][i][0]);
                        acc[0][i][1] = _mm256_fmadd_ps(xv[i], w1, acc[0][i][1]);
                    }
                    w = w.add(16);
                }
            }
            store_avx2(&acc, y, n, c0, act);
        }
    }

    /// The same with NR = 16 (two ymm per row and panel).
    ///
    /// # Safety
    /// AVX2 + FMA; the slice lengths as for `accumulate_avx512`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate_avx2<const R: usize, const P: usize>(
        x: &[f32],
        k: usize,
        panels: &[f32],
        bias: &[f32],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        // SAFETY: the caller's contract: AVX2 and FMA on this CPU; the bias loads read P·16 numbers of `bias`,
        // the broadcasts rows i < R of k in `x`, the weight loads P panels of k·16 in `panels` (each load 8 in
        // bounds), and `store_avx2` gets its own contract's `y`.
        unsafe {
            let b = |j: usize, h: usize| _mm256_loadu_ps(bias.as_ptr().add(j * 16 + h * 8));
            let mut acc: [[[__m256; 2]; R]; P] = std::array::from_fn(|j| [[b(j, 0), b(j, 1)]; R]);
            let (xp, wp) = (x.as_ptr(), panels.as_ptr());
            for kk in 0..k {
                let xv: [__m256; R] = std::array::from_fn(|i| _mm256_set1_ps(*xp.add(i * k + kk)));
                for (j, aj) in acc.iter_mut().enumerate() {
                    let w = wp.add(j * k * 16 + kk * 16);
                    let (w0, w1) = (_mm256_loadu_ps(w), _mm256_loadu_ps(w.add(8)));
                    for i in 0..R {
                        aj[i][0] = _mm256_fmadd_ps(xv[i], w0, aj[i][0]);
                        aj[i][1] = _mm256_fmadd_ps(xv[i], w1, aj[i][1]);
                    }
                }
            }
            store_avx2(&acc, y, n, c0, act);
        }
    }

    /// `act(acc[j][i][h])` to `y[i·n + c0 + j·16 + h·8 ..]`, the columns from n on masked off; `act` applied
    /// as in `store_avx512` (ReLU as `max(v, 0)`, tanh by `kernels::tanh_lanes_avx2` in a function of its own,
    /// others left to the caller's pass).
    ///
    /// # Safety
    /// AVX2 and FMA (`tanh_registers_avx2` enables both); `y` holds (R − 1)·n + min(n, c0 + P·16).
    #[inline(always)]
    unsafe fn store_avx2<const R: usize, const P: usize>(
        acc: &[[[__m256; 2]; R]; P],
        y: &mut [f32],
        n: usize,
        c0: usize,
        act: super::Act,
    ) {
        let mut acc = *acc;
        let flat = acc.as_flattened_mut().as_flattened_mut();
        match act {
            super::Act::Relu => flat.iter_mut().for_each(|v| {
                // SAFETY: AVX2 by the caller's contract; register operations only.
                *v = unsafe { _mm256_max_ps(*v, _mm256_setzero_ps()) }
            }),
            // SAFETY: AVX2 and FMA by the caller's contract.
            super::Act::Tanh => unsafe { tanh_registers_avx2(flat) },
            _ => {}
        }
        // SAFETY: inside `y` by the caller's contract.
        unsafe {
            let yp = y.as_mut_ptr();
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for j in 0..P {
                for h in 0..2 {
                    let col = c0 + j * 16 + h * 8;
                    if col >= n {
                        break;
                    }
                    let valid = n - col;
                    // Lanes below `valid` have their sign bit set: the ones maskstore writes.
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid.min(8) as i32), lane);
                    for i in 0..R {
                        let o = yp.add(i * n + col);
                        if valid >= 8 {
                            _mm256_storeu_ps(o, acc[j][i][h]);
                        } else {
                            _mm256_maskstore_ps(o, mask, acc[j][i][h]);
                        }
                    }
                }
            }
        }
    }
}

/// Deterministic test inputs `x[m, k]` in [-1, 1] and weights `w[n, k]` in [-1, 1] (the f32 and bf16 kernels'
/// tests share them).
#[cfg(test)]
pub(crate) fn test_operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..m * k)
        .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let w = (0..n * k)
        .map(|i| ((i * 104_729) % 97) as f32 / 48.0 - 1.0)
        .collect();
    (x, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_map_walk_matches_its_definition_and_bound_covers_every_row() {
        for (pixels, ow) in [(1, 1), (400, 20), (81, 9), (49, 7), (6, 4), (5, 5)] {
            let map = RowMap {
                pixels,
                ow,
                env_stride: 7057,
                row_stride: 113,
                col_stride: 3,
            };
            for m in [1, 2, pixels, pixels + 1, 3 * pixels, 3 * pixels - 1, 200] {
                for r0 in [0, 1, pixels - 1, pixels, m.saturating_sub(5)] {
                    let len = (m - r0.min(m)).min(96);
                    let mut got = vec![0; len];
                    map.fill(r0, &mut got);
                    let want: Vec<usize> = (r0..r0 + len).map(|r| map.start(r)).collect();
                    assert_eq!(got, want, "pixels {pixels} ow {ow} r0 {r0}");
                }
                let most = (0..m).map(|r| map.start(r)).max().unwrap();
                let bound = map.bound(m).unwrap();
                assert!(bound >= most, "pixels {pixels} ow {ow} m {m}");
                // Whole envs of whole output rows: the bound is the last row's start, not looser.
                if m % pixels == 0 && pixels % ow == 0 {
                    assert_eq!(bound, most);
                }
            }
        }
        let huge = RowMap {
            pixels: 4,
            ow: 2,
            env_stride: usize::MAX / 2,
            row_stride: 1,
            col_stride: 1,
        };
        assert_eq!(huge.bound(12), None, "overflow is refused, not wrapped");
    }

    /// The 128-bit tanh (`v128::tanh_lanes`) on every lane type this machine runs, against f64, with the special
    /// values the activation pass keeps: ±0, tiny and subnormal x exactly, NaN as NaN, saturation; and ReLU's
    /// NaN → 0.
    #[test]
    fn v128_tanh_and_relu_match_f64_and_keep_special_values() {
        use v128::Lanes4;
        fn check<V: Lanes4>(what: &str) {
            let rel = |a: f32, b: f64| (a as f64 - b).abs() / b.abs().max(1e-30);
            let (mut worst, mut x) = (0.0f64, -30.0f32);
            let lanes = |xs: [f32; 4]| {
                let mut ys = [0.0f32; 4];
                // SAFETY: the caller runs only lane types this CPU has; 4 floats each way.
                unsafe { v128::tanh_lanes(V::load(xs.as_ptr())).store(ys.as_mut_ptr()) };
                ys
            };
            while x < 30.0 {
                let xs: [f32; 4] = std::array::from_fn(|i| x + i as f32 * 0.000_37);
                for (x, y) in xs.iter().zip(lanes(xs)) {
                    worst = worst.max(rel(y, (*x as f64).tanh()));
                }
                x += 4.0 * 0.000_37;
            }
            assert!(worst < 4e-7, "{what} tanh {worst:e}");
            let ys = lanes([0.0, -0.0, 1e-30, -1e-40]);
            assert_eq!(
                ys.map(f32::to_bits),
                [0.0f32, -0.0, 1e-30, -1e-40].map(f32::to_bits),
                "{what}"
            );
            let ys = lanes([f32::NAN, 9.0, -1e9, f32::INFINITY]);
            assert!(ys[0].is_nan(), "{what}");
            assert!(
                (ys[1] - 1.0).abs() <= 2e-7 && (ys[2] + 1.0).abs() <= 2e-7,
                "{what} {ys:?}"
            );
            assert!((ys[3] - 1.0).abs() <= 2e-7, "{what} {ys:?}");
            let mut r = [f32::NAN, -2.0, 3.0, -0.0];
            // SAFETY: as above.
            unsafe { V::relu(V::load(r.as_ptr())).store(r.as_mut_ptr()) };
            assert_eq!(r[..3], [0.0, 0.0, 3.0], "{what}");
            assert_eq!(r[3], 0.0, "{what}");
        }
        #[cfg(target_arch = "x86_64")]
        {
            check::<v128::Plain>("sse2");
            if kernels::simd128_fma() {
                check::<v128::Fma128>("sse+fma");
            }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        check::<v128::Plain>("neon");
    }

    #[test]
    fn packed_dense_matches_f64_on_every_isa_and_shape() {
        let isas = kernels::available();
        for (m, k, n) in [
            (1, 4, 2),
            (1, 64, 256),
            (3, 37, 19),
            (7, 5, 33),
            (13, 64, 65),
            (64, 256, 5),
            // Several 96-row blocks with a ragged last one, 12-row AVX-512 tiles and their remainders.
            (203, 48, 70),
            (25, 9, 33),
            (30, 20, 16),
            // Dot products (at most DOT_MAX_N outputs on AVX-512): 4- and 3-row tiles with single-row
            // remainders, k below, at and past a multiple of 16 (the masked last group).
            (11, 17, 3),
            (6, 31, 8),
            (7, 16, 7),
            (1, 300, 1),
            (9, 5, 6),
            // Small batches with their panels grouped (one row: up to four panels at once; two rows, and on
            // AVX-512 three: two), ragged last panels among them.
            (2, 64, 64),
            (2, 20, 70),
            (3, 64, 100),
            (1, 30, 40),
            (1, 16, 96),
            (1, 12, 200),
        ] {
            let (x, w) = test_operands(m, k, n);
            let b: Vec<f32> = (0..n).map(|i| i as f32 / 10.0 - 1.0).collect();
            for act in [Act::Identity, Act::Tanh, Act::Relu] {
                let want: Vec<f64> = (0..m * n)
                    .map(|idx| {
                        let (r, j) = (idx / n, idx % n);
                        let s = (0..k)
                            .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                            .sum::<f64>()
                            + b[j] as f64;
                        match act {
                            Act::Tanh => s.tanh(),
                            Act::Relu => s.max(0.0),
                            _ => s,
                        }
                    })
                    .collect();
                let check = |y: &[f32], what: &str| {
                    for i in 0..m * n {
                        let tol = 1e-5 * (1.0 + want[i].abs()) * (k as f64).sqrt();
                        assert!(
                            (y[i] as f64 - want[i]).abs() < tol,
                            "{what} {act:?} m{m} k{k} n{n} [{i}]: {} vs {}",
                            y[i],
                            want[i]
                        );
                    }
                };
                for &isa in &isas {
                    let d = PackedDense::new(isa, &w, n, k, Some(&b));
                    let mut y = vec![f32::NAN; m * n];
                    d.run(&x, &mut y, m, act);
                    check(&y, &format!("{isa:?}"));
                }
                // Both x86 128-bit tiles, whichever one `simd128_fma` picks on this CPU: SSE2's multiply-add
                // and (where the CPU has it) FMA3's.
                #[cfg(target_arch = "x86_64")]
                for fma in [false, true]
                    .into_iter()
                    .filter(|f| !f || kernels::simd128_fma())
                {
                    let d = PackedDense::new(Isa::Simd128, &w, n, k, Some(&b));
                    let mut y = vec![f32::NAN; m * n];
                    dense_simd128(fma, &x, &d.panels, &d.bias, &mut y, m, k, n, act);
                    check(&y, &format!("Simd128 fma {fma}"));
                }
            }
        }
    }

    /// Regression for the grouped panels of small batches (rows 1-3 take up to four panels at once): a row's
    /// outputs are the same bits whatever batch it comes in, alone, in twos and threes, or among 14 rows (each
    /// output is the bias plus its k products in order, whatever the tile), on every ISA of this CPU.
    #[test]
    fn a_rows_outputs_do_not_depend_on_its_batch() {
        for (k, n) in [
            (4, 64),
            (64, 64),
            (64, 256),
            (20, 70),
            (37, 19),
            (9, 6),
            (30, 40),
        ] {
            let m = 14;
            let (x, w) = test_operands(m, k, n);
            let b: Vec<f32> = (0..n).map(|i| i as f32 / 7.0 - 1.0).collect();
            for &isa in &kernels::available() {
                let d = PackedDense::new(isa, &w, n, k, Some(&b));
                for act in [Act::Identity, Act::Tanh] {
                    let run = |rows: std::ops::Range<usize>| {
                        let mut y = vec![f32::NAN; rows.len() * n];
                        d.run(&x[rows.start * k..rows.end * k], &mut y, rows.len(), act);
                        y.into_iter().map(f32::to_bits).collect::<Vec<u32>>()
                    };
                    let all = run(0..m);
                    for chunk in [1, 2, 3, 5] {
                        for r0 in (0..m).step_by(chunk) {
                            let rows = r0..(r0 + chunk).min(m);
                            assert_eq!(
                                run(rows.clone()),
                                all[rows.start * n..rows.end * n],
                                "{isa:?} {act:?} k{k} n{n}: rows {rows:?} alone vs among {m}"
                            );
                        }
                    }
                }
            }
        }
    }
}
