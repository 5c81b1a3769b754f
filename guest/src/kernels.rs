//! Native CPU kernels: vectorisable activations (fused into dense layers by `dense.rs`), softmax. Written once as plain
//! loops the compiler vectorises, then compiled per instruction set (AVX-512, AVX2+FMA, baseline) and picked at
//! run time, so one binary runs near the hardware floor on whatever CPU it lands on.
//!
//! Accuracy: exp is range-reduced (k·ln2 split hi/lo) with a degree-7 polynomial (≤ 6e-9 relative on the reduced
//! interval); tanh uses its odd Taylor series below |x| = 0.5 and 1 − 2/(e^{2|x|} + 1) above; erf is
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

#[inline(always)]
fn exp_f<const F: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to an integer that then sits in the low mantissa bits: rounding and the float→int
    // conversion without `as i32` (whose saturation semantics keep compilers from vectorising it).
    const MAGIC: f32 = 12_582_912.0;
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

#[inline(always)]
fn tanh_f<const F: bool>(x: f32) -> f32 {
    let a = x.abs();
    // Small |x|: odd Taylor series to x^15 (truncation < 1e-8 relative at 0.5).
    let z = a * a;
    let mut q = -929_569.0 / 638_512_875.0;
    for c in [
        21844.0 / 6_081_075.0,
        -1382.0 / 155_925.0,
        62.0 / 2835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
        1.0,
    ] {
        q = madd::<F>(q, z, c);
    }
    let small = a * q;
    let e = exp_f::<F>(2.0 * a.min(10.0));
    let large = 1.0 - 2.0 / (e + 1.0);
    let t = if a < 0.5 { small } else { large };
    t.copysign(x)
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
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

pub(crate) fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("POLICYPORT_CPU_BASELINE").is_none() {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2Fma;
            }
        }
    }
    Isa::Baseline
}

/// Compile a generic kernel once per instruction set and pick the version at run time.
macro_rules! multiversion {
    ($(#[$doc:meta])* $name:ident => $generic:ident ( $($arg:ident : $ty:ty),* )) => {
        $(#[$doc])*
        pub(crate) fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                #[inline(never)]
                unsafe fn avx512($($arg: $ty),*) { $generic::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[inline(never)]
                unsafe fn avx2($($arg: $ty),*) { $generic::<true>($($arg),*) }
                match isa {
                    // SAFETY: `detect` saw these features on this CPU.
                    Isa::Avx512 => unsafe { avx512($($arg),*) },
                    Isa::Avx2Fma => unsafe { avx2($($arg),*) },
                    Isa::Baseline => $generic::<false>($($arg),*),
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
    bias_act => bias_act_generic(f: Act, y: &mut [f32], bias: Option<&[f32]>, width: usize)
);

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
