//! Native CPU kernels: vectorisable activations (fused into dense layers by `dense.rs`), softmax. Written once as plain
//! loops the compiler vectorises, then compiled per instruction set (AVX-512, AVX2+FMA, baseline) and picked at
//! run time, so one binary runs near the hardware floor on whatever CPU it lands on.
//!
//! Accuracy: exp is range-reduced (k·ln2 split hi/lo) with a degree-7 polynomial (≤ 6e-9 relative on the reduced
//! interval); tanh is m / (m + 2) with m = expm1(2|x|) (on AVX-512 a 13/6 rational without a division instead,
//! `tanh_lanes_avx512`, also applied in the dense tiles' store); erf is
//! Abramowitz–Stegun 7.1.26 (1.5e-7 absolute). All well inside the suite's 1e-5 tolerance, and tested against f64.

/// The activations (one enum for every executor and the WGSL kernels: `policyport_shaders::Activation`).
pub(crate) use policyport_shaders::Activation as Act;

/// `a * b + c`, fused where the instruction set has FMA (`F`), plain otherwise: `mul_add` without hardware FMA is
/// a slow libm call (baseline x86-64, wasm).
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
#[inline(always)]
pub(crate) fn madd_pub<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    madd::<F>(a, b, c)
}

#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_f::<false>(x)
}

/// The range reduction of `exp_f`, `expm1_2abs` and `tanh_avx512`: x = k·ln2 + r with ln2 split in a high part
/// exact in few bits and a low correction.
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding 1.5·2^23 rounds to an integer that then sits in the low mantissa bits: rounding and the float→int
/// conversion without `as i32` (whose saturation semantics keep compilers from vectorising it).
const MAGIC: f32 = 12_582_912.0;

#[inline(always)]
fn exp_f<const F: bool>(x: f32) -> f32 {
    // k stays in [-126, 127]: 2^k is a normal float built directly from its exponent bits.
    let x = x.clamp(-87.3, 88.3);
    let kf = x * LOG2E + MAGIC;
    let k = kf - MAGIC;
    let r = madd::<F>(-k, LN2_LO, madd::<F>(-k, LN2_HI, x));
    // exp(r), |r| <= ln2/2: Taylor to degree 7 in Horner form.
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = madd::<F>(p, r, c);
    }
    let ki = kf.to_bits().wrapping_sub(MAGIC.to_bits());
    p * f32::from_bits(ki.wrapping_add(127) << 23)
}

#[cfg(test)]
pub(crate) fn tanh(x: f32) -> f32 {
    tanh_f::<false>(x)
}

/// tanh(x) = sign(x) · m / (m + 2) with m = expm1(2|x|), |x| clamped at 9 (tanh(9) rounds to 1 in f32).
/// expm1 is range-reduced like `exp_f` (2|x| = k·ln2 + r) and rebuilt as 2^k·expm1(r) + (2^k − 1): both terms are
/// ≥ 0 for k ≥ 1 and exact for k = 0, so there is no cancellation near 0 (tanh(x) → x) — which is why the old
/// form 1 − 2/(e^{2|x|} + 1) needed a second, Taylor branch there. One polynomial and one division per value:
/// ~20 operations instead of ~35 (measured: the activation pass of the benchmark MLP at batch 1024).
#[inline(always)]
fn tanh_f<const F: bool>(x: f32) -> f32 {
    let m = expm1_2abs::<F>(x);
    (m / (m + 2.0)).copysign(x)
}

/// expm1(2·min(|x|, 9)), accurate to a few ulps relative (see `tanh_f`).
#[inline(always)]
fn expm1_2abs<const F: bool>(x: f32) -> f32 {
    let t = 2.0 * x.abs().min(9.0);
    let kf = t * LOG2E + MAGIC;
    let k = kf - MAGIC;
    let r = madd::<F>(-k, LN2_LO, madd::<F>(-k, LN2_HI, t));
    // expm1(r) = r·(1 + r/2 + r²/6 + … + r⁶/7!), |r| ≤ ln2/2: truncation < 2e-8 relative.
    let mut q = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0] {
        q = madd::<F>(q, r, c);
    }
    let p = r * q;
    let ki = kf.to_bits().wrapping_sub(MAGIC.to_bits());
    let s = f32::from_bits(ki.wrapping_add(127) << 23);
    madd::<F>(s, p, s - 1.0)
}

/// tanh on 16 lanes with AVX-512, no division: the odd rational minimax approximation of degrees 13 / 6 that
/// Eigen, XLA and onnxruntime's MLAS use (x clamped to ±7.905, tanh(x) ≈ x·P(x²) / Q(x²)), its coefficients divided
/// by Q's constant term so that P starts at exactly 1 (tiny and subnormal x come back unchanged, where the
/// unscaled form lost them to underflow, and near 0 it is exact to the rounding of x·1); the quotient from
/// `vrcp14ps` (2^-14 relative) refined by one Newton step on the quotient, q − r·(d·q − p). Within 3.5e-7
/// relative of f64 (the test sweeps [-30, 30]). Why not the m / (m + 2), m = expm1(2|x|) form of `tanh_f`:
/// ~17 vector operations instead of ~26 — on the benchmark MLP at batch 1024 tanh was ~11 % of act() — and it
/// has no range reduction, so it is cheap enough to run on a dense tile's accumulators before they are stored
/// (`dense::x86::store_avx512`). NaN stays NaN (the clamps return their second operand, x, on NaN).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) fn tanh_lanes_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_min_ps(
        _mm512_set1_ps(TANH_CLAMP),
        _mm512_max_ps(_mm512_set1_ps(-TANH_CLAMP), x),
    );
    let x2 = _mm512_mul_ps(x, x);
    let mut p = _mm512_set1_ps(TANH_P[0]);
    for c in &TANH_P[1..] {
        p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(*c));
    }
    let p = _mm512_mul_ps(p, x);
    let mut d = _mm512_set1_ps(TANH_Q[0]);
    for c in &TANH_Q[1..] {
        d = _mm512_fmadd_ps(d, x2, _mm512_set1_ps(*c));
    }
    let rcp = _mm512_rcp14_ps(d);
    let q0 = _mm512_mul_ps(p, rcp);
    // q0 − r·(d·q0 − p) rather than q0 + r·(p − d·q0): the same step, but x = −0 stays −0 (−0 − r·(+0)).
    _mm512_fnmadd_ps(rcp, _mm512_fmsub_ps(d, q0, p), q0)
}

/// `tanh_lanes_avx512` on 8 lanes for AVX2 tiles (`dense::x86::store_avx2`): the same rational, with a division
/// (`vrcpps` has 12 bits only: after one Newton step its error would add to the approximation's 3.4e-7 against
/// the 4e-7 the test holds it to; 12 divisions per 6-row tile are a few % of the tile's k loop).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn tanh_lanes_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let x = _mm256_min_ps(
        _mm256_set1_ps(TANH_CLAMP),
        _mm256_max_ps(_mm256_set1_ps(-TANH_CLAMP), x),
    );
    let x2 = _mm256_mul_ps(x, x);
    let mut p = _mm256_set1_ps(TANH_P[0]);
    for c in &TANH_P[1..] {
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(*c));
    }
    let mut d = _mm256_set1_ps(TANH_Q[0]);
    for c in &TANH_Q[1..] {
        d = _mm256_fmadd_ps(d, x2, _mm256_set1_ps(*c));
    }
    _mm256_div_ps(_mm256_mul_ps(p, x), d)
}

/// Where `tanh_lanes_avx512` stops following x (XLA's bound): tanh(7.9053) is 1 − 2.7e-7 and P/Q there
/// 1 − 1.8e-7 (3 ulps under 1), so every larger |x| gets that value, within the tolerance of exact ±1.
pub(crate) const TANH_CLAMP: f32 = 7.905_311_1;
/// `tanh_lanes_avx512`'s (and `dense::v128::tanh_lanes`') numerator P(x²) (highest power first; the constant term 1), then its denominator.
const TANH_Q0: f64 = 4.893_525_185_543_85e-3;
pub(crate) const TANH_P: [f32; 7] = [
    (-2.760_768_477_423_55e-16 / TANH_Q0) as f32,
    (2.000_187_904_824_77e-13 / TANH_Q0) as f32,
    (-8.604_671_522_137_35e-11 / TANH_Q0) as f32,
    (5.122_297_090_371_14e-8 / TANH_Q0) as f32,
    (1.485_722_357_179_79e-5 / TANH_Q0) as f32,
    (6.372_619_288_754_36e-4 / TANH_Q0) as f32,
    1.0,
];
pub(crate) const TANH_Q: [f32; 4] = [
    (1.198_258_394_667_02e-6 / TANH_Q0) as f32,
    (1.185_347_056_866_54e-4 / TANH_Q0) as f32,
    (2.268_434_632_439_00e-3 / TANH_Q0) as f32,
    1.0,
];

/// `tanh_lanes_avx512` over a slice.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA (what [`detect`] returns [`Isa::Avx512`] for).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn tanh_avx512(y: &mut [f32]) {
    use std::arch::x86_64::*;
    let lanes = tanh_lanes_avx512;
    let mut chunks = y.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: 16 floats; the caller's CPU has AVX-512F (`detect`).
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            _mm512_storeu_ps(c.as_mut_ptr(), lanes(v));
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mask: __mmask16 = (1u32 << rest.len()).wrapping_sub(1) as __mmask16;
        // SAFETY: the masked lanes are exactly the `rest.len()` floats of the tail.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, rest.as_ptr());
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, lanes(v));
        }
    }
}

#[cfg(test)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    sigmoid_f::<false>(x)
}

#[inline(always)]
fn sigmoid_f<const F: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp_f::<F>(-x))
}

#[cfg(test)]
pub(crate) fn erf(x: f32) -> f32 {
    erf_f::<false>(x)
}

#[inline(always)]
fn erf_f<const F: bool>(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / madd::<F>(0.327_591_1, a, 1.0);
    let mut p = 1.061_405_4;
    for c in [-1.453_152_1, 1.421_413_7, -0.284_496_74, 0.254_829_6] {
        p = madd::<F>(p, t, c);
    }
    let y = 1.0 - t * p * exp_f::<F>(-a * a);
    y.copysign(x)
}

#[inline(always)]
fn act1<const F: bool>(f: Act, v: f32) -> f32 {
    match f {
        Act::Identity => v,
        Act::Relu => v.max(0.0),
        Act::Tanh => tanh_f::<F>(v),
        Act::Sigmoid => sigmoid_f::<F>(v),
        Act::Silu => v * sigmoid_f::<F>(v),
        Act::Elu(a) => {
            if v > 0.0 {
                v
            } else {
                a * (exp_f::<F>(v) - 1.0)
            }
        }
        Act::LeakyRelu(a) => {
            if v > 0.0 {
                v
            } else {
                a * v
            }
        }
        Act::Gelu => 0.5 * v * (1.0 + erf_f::<F>(v * std::f32::consts::FRAC_1_SQRT_2)),
        Act::GeluTanh => 0.5 * v * (1.0 + tanh_f::<F>(0.797_884_6 * (v + 0.044_715 * v * v * v))),
        Act::Erf => erf_f::<F>(v),
        Act::Exp => exp_f::<F>(v),
        Act::Clip(lo, hi) => v.max(lo).min(hi),
    }
}

/// `y[r, :] = act(y[r, :] + bias)` for every row (bias optional).
#[inline(always)]
fn bias_act_generic<const F: bool>(f: Act, y: &mut [f32], bias: Option<&[f32]>, width: usize) {
    // One loop per activation so each is a straight vectorisable loop.
    macro_rules! each {
        ($f:expr) => {
            match bias {
                Some(b) => {
                    for row in y.chunks_exact_mut(width) {
                        for (v, b) in row.iter_mut().zip(b) {
                            *v = act1::<F>($f, *v + *b);
                        }
                    }
                }
                None => {
                    for v in y.iter_mut() {
                        *v = act1::<F>($f, *v);
                    }
                }
            }
        };
    }
    match f {
        Act::Identity => each!(Act::Identity),
        Act::Relu => each!(Act::Relu),
        Act::Tanh => each!(Act::Tanh),
        Act::Sigmoid => each!(Act::Sigmoid),
        Act::Silu => each!(Act::Silu),
        Act::Gelu => each!(Act::Gelu),
        Act::GeluTanh => each!(Act::GeluTanh),
        Act::Erf => each!(Act::Erf),
        Act::Elu(a) => each!(Act::Elu(a)),
        Act::LeakyRelu(a) => each!(Act::LeakyRelu(a)),
        Act::Exp => each!(Act::Exp),
        Act::Clip(lo, hi) => each!(Act::Clip(lo, hi)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust loops, vectorised by the compiler where it can: architectures without a kernel of their own,
    /// and `POLICYPORT_CPU_BASELINE` (kept as the reference the vector kernels are tested against).
    Portable,
    /// 128-bit vectors, one tile written once for all three (`dense::v128`): SSE2 on x86-64 (with FMA where the
    /// CPU has it: `simd128_fma`), NEON on aarch64 (Apple silicon, Graviton, Ampere), SIMD128 in wasm.
    Simd128,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The widest instruction set this CPU has, capped by `POLICYPORT_CPU_BASELINE` (the portable kernels),
/// `POLICYPORT_CPU_SIMD128` (the 128-bit ones: SSE on x86-64) or `POLICYPORT_CPU_AVX2` (at most AVX2 + FMA):
/// test.sh reruns the conformance suite under each, so every kernel family passes the whole suite on one
/// AVX-512 machine (and aarch64's NEON runs under qemu: test.sh's aarch64 step).
pub(crate) fn detect() -> Isa {
    if std::env::var_os("POLICYPORT_CPU_BASELINE").is_some() {
        return Isa::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("POLICYPORT_CPU_SIMD128").is_none() {
            if std::env::var_os("POLICYPORT_CPU_AVX2").is_none()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2Fma;
            }
        }
        // SSE2 is part of x86-64 itself.
        Isa::Simd128
    }
    // NEON is part of aarch64 itself (the target's default features), SIMD128 of the wasm builds.
    #[cfg(all(policyport_v128, not(target_arch = "x86_64")))]
    {
        Isa::Simd128
    }
    #[cfg(not(policyport_v128))]
    {
        Isa::Portable
    }
}

/// Every instruction set this CPU runs, narrowest first (for tests that hold each kernel family to the same
/// reference): not capped by the environment variables.
#[cfg(test)]
pub(crate) fn available() -> Vec<Isa> {
    #[allow(unused_mut)]
    let mut isas = vec![Isa::Portable];
    #[cfg(policyport_v128)]
    isas.push(Isa::Simd128);
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            isas.push(Isa::Avx2Fma);
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            isas.push(Isa::Avx512);
        }
    }
    isas
}

/// What [`crate::cpu_kernels`] calls `isa` on this machine.
pub(crate) fn name(isa: Isa) -> &'static str {
    match isa {
        Isa::Portable => "portable",
        Isa::Simd128 if simd128_fma() => "sse+fma",
        #[cfg(target_arch = "x86_64")]
        Isa::Simd128 => "sse2",
        #[cfg(target_arch = "aarch64")]
        Isa::Simd128 => "neon",
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        Isa::Simd128 => "simd128",
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => "avx2+fma",
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => "avx512",
    }
}

/// Whether the x86 128-bit tile fuses its multiply-adds (FMA3: every x86 CPU with AVX2, and AMD's Piledriver
/// family without it); without FMA it multiplies then adds (SSE2). Also what the sandbox's SIMD128 code gets
/// from wasmtime on the same CPU (relaxed-SIMD madd is an FMA there), which makes `POLICYPORT_CPU_SIMD128` the
/// same-width native baseline the plugin is compared with. False off x86 (NEON's `fmla` and relaxed-SIMD fuse
/// in their own lane types).
pub(crate) fn simd128_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Compile a generic kernel once per instruction set and pick the version at run time.
macro_rules! multiversion {
    ($(#[$doc:meta])* $name:ident => $generic:ident ( $($arg:ident : $ty:ty),* )) => {
        $(#[$doc])*
        pub(crate) fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU has AVX-512F, AVX2 and FMA.
                #[target_feature(enable = "avx512f,avx2,fma")]
                #[inline(never)]
                unsafe fn avx512($($arg: $ty),*) { $generic::<true>($($arg),*) }
                /// # Safety
                /// The CPU has AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                #[inline(never)]
                unsafe fn avx2($($arg: $ty),*) { $generic::<true>($($arg),*) }
                match isa {
                    // SAFETY: `isa` came from `detect`, which returns `Avx512` only where this CPU has AVX-512F
                    // and FMA (and so AVX2).
                    Isa::Avx512 => unsafe { avx512($($arg),*) },
                    // SAFETY: `detect` returns `Avx2Fma` only where this CPU has AVX2 and FMA.
                    Isa::Avx2Fma => unsafe { avx2($($arg),*) },
                    Isa::Simd128 | Isa::Portable => $generic::<false>($($arg),*),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = isa;
                $generic::<false>($($arg),*)
            }
        }
    };
}

multiversion!(
    /// `y = act(y + bias)` row by row.
    bias_act_any => bias_act_generic(f: Act, y: &mut [f32], bias: Option<&[f32]>, width: usize)
);

/// `y = act(y + bias)` row by row: tanh on AVX-512 by `tanh_avx512`, the rest by the generic kernels.
pub(crate) fn bias_act(isa: Isa, f: Act, y: &mut [f32], bias: Option<&[f32]>, width: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && f == Act::Tanh && bias.is_none() {
        // SAFETY: `detect` saw AVX-512F on this CPU.
        unsafe { tanh_avx512(y) };
        return;
    }
    bias_act_any(isa, f, y, bias, width)
}

/// Softmax / log-softmax over each group of `last` values, in place.
pub(crate) fn softmax(y: &mut [f32], last: usize, log: bool) {
    for g in y.chunks_exact_mut(last) {
        let m = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut z = 0.0f32;
        for v in g.iter() {
            z += exp(*v - m);
        }
        if log {
            let lz = z.ln();
            g.iter_mut().for_each(|v| *v = *v - m - lz);
        } else {
            let inv = 1.0 / z;
            g.iter_mut().for_each(|v| *v = exp(*v - m) * inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f32, b: f64) -> f64 {
        (a as f64 - b).abs() / b.abs().max(1e-30)
    }

    #[test]
    fn exp_tanh_sigmoid_erf_against_f64() {
        let mut worst = [0.0f64; 4];
        let mut x = -30.0f32;
        while x < 30.0 {
            let xd = x as f64;
            if xd > -80.0 {
                worst[0] = worst[0].max(rel(exp(x), xd.exp()));
            }
            worst[1] = worst[1].max(rel(tanh(x), xd.tanh()));
            worst[2] = worst[2].max(rel(sigmoid(x), 1.0 / (1.0 + (-xd).exp())));
            worst[3] = worst[3].max((erf(x) as f64 - libm_erf(xd)).abs());
            x += 0.000_37;
        }
        assert!(worst[0] < 4e-7, "exp {worst:?}");
        assert!(worst[1] < 4e-7, "tanh {worst:?}");
        assert!(worst[2] < 4e-7, "sigmoid {worst:?}");
        assert!(worst[3] < 1e-6, "erf {worst:?}"); // A&S 7.1.26: 1.5e-7 exact, plus f32 rounding
        #[cfg(target_arch = "x86_64")]
        if detect() == Isa::Avx512 {
            let (mut xs, mut x) = (vec![], -30.0f32);
            while x < 30.0 {
                xs.push(x);
                x += 0.000_37;
            }
            // Odd lengths: the masked tail too; tiny and subnormal inputs keep their value and sign.
            xs.extend([0.0, -0.0, 1e-30, -1e-30, 9.0, 9.5, -1e9]);
            let mut ys = xs.clone();
            // SAFETY: detected above.
            unsafe { tanh_avx512(&mut ys) };
            let worst = xs
                .iter()
                .zip(&ys)
                .map(|(x, y)| rel(*y, (*x as f64).tanh()))
                .fold(0.0f64, f64::max);
            assert!(worst < 4e-7, "tanh_avx512 {worst:e}");
            assert_eq!(ys[ys.len() - 7].to_bits(), 0.0f32.to_bits());
            assert_eq!(ys[ys.len() - 6].to_bits(), (-0.0f32).to_bits());
            assert_eq!(ys[ys.len() - 4], -1e-30);
            // Saturated: within 2e-7 of −1 (P/Q stays 3 ulps under 1 at the clamp).
            assert!(
                (ys[ys.len() - 1] + 1.0).abs() <= 2e-7,
                "{}",
                ys[ys.len() - 1]
            );
        }
        #[cfg(target_arch = "x86_64")]
        if matches!(detect(), Isa::Avx512 | Isa::Avx2Fma) {
            use std::arch::x86_64::*;
            let (mut worst, mut x) = (0.0f64, -30.0f32);
            let mut check = |xs: [f32; 8]| {
                let mut ys = [0.0f32; 8];
                // SAFETY: `detect` saw AVX2 + FMA (AVX-512 CPUs have them too).
                unsafe {
                    _mm256_storeu_ps(
                        ys.as_mut_ptr(),
                        tanh_lanes_avx2(_mm256_loadu_ps(xs.as_ptr())),
                    )
                };
                for (x, y) in xs.iter().zip(ys) {
                    worst = worst.max(rel(y, (*x as f64).tanh()));
                }
                ys
            };
            while x < 30.0 {
                check(std::array::from_fn(|i| x + i as f32 * 0.000_37));
                x += 8.0 * 0.000_37;
            }
            let ys = check([0.0, -0.0, 1e-30, -1e-30, 9.0, -1e9, 1e-45, f32::NAN]);
            assert_eq!((ys[0].to_bits(), ys[1].to_bits()), (0, (-0.0f32).to_bits()));
            assert_eq!((ys[2], ys[3]), (1e-30, -1e-30));
            assert!(ys[7].is_nan());
            assert!(worst < 4e-7, "tanh_lanes_avx2 {worst:e}");
        }
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(-1e-30), -1e-30);
        assert!(exp(100.0).is_finite() && exp(-100.0) >= 0.0);
    }

    /// erf in f64 (series / continued fraction), for the test only.
    fn libm_erf(x: f64) -> f64 {
        let ax = x.abs();
        if ax < 3.0 {
            let (mut term, mut sum, mut n) = (ax, ax, 0.0f64);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -ax * ax / n;
                sum += term / (2.0 * n + 1.0);
            }
            return x.signum() * sum * 2.0 / std::f64::consts::PI.sqrt();
        }
        let mut f = ax;
        for k in (1..=80).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        x.signum() * (1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f)
    }
}
