//! Turning distribution parameters into actions, exactly as SPEC.md ("Seeded sampling") defines it. Every
//! backend that samples on the host side calls [`HeadPlan::act_row`](crate::head::HeadPlan::act_row), built on
//! these primitives; device samplers (WGSL, CUDA) implement the same text and are tested against it.

use crate::philox::{Stream, u01, u01_open_closed};

/// How act() chooses actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActMode {
    /// argmax / mean (squashed and rescaled for a squashed Gaussian).
    Deterministic,
    /// A draw from the stream (seed, env, step) of every env row.
    Sample { seed: u64, step: u64 },
}

/// Inverse CDF on unnormalised weights: the first i with e_0 + … + e_i > u · Σe, where e_i = exp(l_i − max l).
/// Accumulated in f32, left to right. Falls back to the last index if rounding leaves no such i.
#[inline]
pub fn categorical(logits: &[f32], u: f32) -> usize {
    // Up to eight actions (CartPole's two, most games' few: every discrete head but large ones) with the length
    // a constant: the exps and the sums stay in registers, in straight-line code. The same values in the same
    // order as the general path below, so the same draw bit for bit.
    let fixed = match logits.len() {
        1 => categorical_fixed::<1>(logits, u),
        2 => categorical_fixed::<2>(logits, u),
        3 => categorical_fixed::<3>(logits, u),
        4 => categorical_fixed::<4>(logits, u),
        5 => categorical_fixed::<5>(logits, u),
        6 => categorical_fixed::<6>(logits, u),
        7 => categorical_fixed::<7>(logits, u),
        8 => categorical_fixed::<8>(logits, u),
        _ => None,
    };
    if let Some(i) = fixed {
        return i;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Each e_i computed once where it fits a small buffer (every policy head seen so far: a few to a few dozen
    // actions); the same values and the same left-to-right sums as computing them twice, so the same draw bit
    // for bit. Why: `expf` twice per logit was ~1.5 % of the benchmark MLP's act() at batch 64.
    const SMALL: usize = 64;
    if logits.len() <= SMALL {
        let mut e = [0.0f32; SMALL];
        for (e, l) in e.iter_mut().zip(logits) {
            *e = (l - max).exp();
        }
        return draw(&e[..logits.len()], u);
    }
    let total: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let t = u * total;
    let mut acc = 0.0f32;
    for (i, l) in logits.iter().enumerate() {
        acc += (l - max).exp();
        if acc > t {
            return i;
        }
    }
    logits.len() - 1
}

/// [`categorical`] on exactly N logits (None for another length).
#[inline(always)]
fn categorical_fixed<const N: usize>(logits: &[f32], u: f32) -> Option<usize> {
    let l = <&[f32; N]>::try_from(logits).ok()?;
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // exp(0) is exactly 1: the largest logit's term without a call (half of a two-action head's).
    let e: [f32; N] = std::array::from_fn(|i| if l[i] == max { 1.0 } else { (l[i] - max).exp() });
    Some(draw(&e, u))
}

/// The index drawn by `u` from unnormalised probabilities `e` (the first whose running sum passes `u` times the
/// total; the last one if rounding leaves the sum short).
///
/// Counted without a branch on the draw: the running sums never decrease (each `e_i >= 0`, and rounding a sum
/// with a non-negative term never goes below it), so the first index whose sum passes `t` is the number of sums
/// that do not, and that count past the end is the fall-back's `len - 1` after the `min`. The same index bit
/// for bit; why: an early exit on a random draw is a mispredicted branch about every other row of a sampled
/// policy (~15 % of CartPole's act() at 1 000 rows was this loop).
#[inline(always)]
fn draw(e: &[f32], u: f32) -> usize {
    let t = u * e.iter().sum::<f32>();
    let mut acc = 0.0f32;
    let mut below = 0usize;
    for v in e {
        acc += v;
        below += usize::from(acc <= t);
    }
    below.min(e.len() - 1)
}

/// Index of the first maximum.
#[inline]
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if *l > logits[best] {
            best = i;
        }
    }
    best
}

/// [`categorical`] restricted to the actions `mask` allows (all of them for `None`): a forbidden logit counts
/// as exp(−huge) = 0, exactly as sb3-contrib's masked logits do, so the draw equals [`categorical`] over the
/// logits with every forbidden one set to [`crate::head::MASKED_LOGIT`]; the fall-back when rounding leaves no
/// index is the last *allowed* one (the plain sampler's `n − 1` could be forbidden). `mask` has one allowed
/// action at least (the request check).
#[inline]
pub fn categorical_masked(logits: &[f32], mask: Option<&[bool]>, u: f32) -> usize {
    let Some(mask) = mask else {
        return categorical(logits, u);
    };
    let max = logits
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m)
        .map(|(l, _)| *l)
        .fold(f32::NEG_INFINITY, f32::max);
    let e = |i: usize| {
        if mask[i] {
            (logits[i] - max).exp()
        } else {
            0.0
        }
    };
    let total: f32 = (0..logits.len()).map(e).sum();
    let t = u * total;
    let mut acc = 0.0f32;
    for i in 0..logits.len() {
        // (A forbidden entry adds 0, so the sum first passes t at an allowed one.)
        acc += e(i);
        if acc > t {
            return i;
        }
    }
    mask.iter().rposition(|m| *m).unwrap_or(logits.len() - 1)
}

/// [`argmax`] among the allowed actions: the first allowed index of the largest allowed value.
#[inline]
pub fn argmax_masked(values: &[f32], mask: Option<&[bool]>) -> usize {
    let Some(mask) = mask else {
        return argmax(values);
    };
    let mut best: Option<usize> = None;
    for (i, v) in values.iter().enumerate() {
        if mask[i] && best.is_none_or(|b| *v > values[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

/// A uniformly random action from one Philox word (SPEC.md §4, epsilon-greedy): `floor(w · c / 2³²)` with `c`
/// the number of allowed actions (`n` without a mask), exact in integers (no rounding of a float product), and
/// the result is the index of the allowed action with that rank.
#[inline]
pub fn uniform_index(w: u32, mask: Option<&[bool]>, n: usize) -> usize {
    let count = mask.map_or(n, |m| m.iter().filter(|f| **f).count());
    let rank = ((w as u64 * count as u64) >> 32) as usize;
    match mask {
        None => rank,
        Some(m) => m
            .iter()
            .enumerate()
            .filter(|(_, f)| **f)
            .nth(rank)
            .map_or(0, |(i, _)| i),
    }
}

/// Standard normal for action element d: Box–Muller (cosine branch) on words 2d and 2d+1.
#[inline]
pub fn standard_normal(stream: &mut Stream, d: u32) -> f32 {
    let u1 = u01_open_closed(stream.word(2 * d));
    let u2 = u01(stream.word(2 * d + 1));
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

#[inline]
pub(crate) fn clamp_range(v: f32, range: Option<(f32, f32)>) -> f32 {
    match range {
        Some((lo, hi)) => v.clamp(lo, hi),
        None => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first index whose running sum passes `u · Σe` (the last when none does): SPEC.md's text, with the early
    /// exit `draw` counts its way around.
    fn draw_early_exit(e: &[f32], u: f32) -> usize {
        let t = u * e.iter().sum::<f32>();
        let mut acc = 0.0f32;
        for (i, v) in e.iter().enumerate() {
            acc += v;
            if acc > t {
                return i;
            }
        }
        e.len() - 1
    }

    /// Regression for the branch-free `draw`: the same index as the early exit on every kind of weight vector
    /// (zeros, ties, tiny terms lost to rounding, u at 0 and just under 1, sums that stop short of `t`).
    #[test]
    fn branch_free_draw_matches_the_early_exit() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..200_000 {
            let n = 1 + (next() % 8) as usize;
            let e: Vec<f32> = (0..n)
                .map(|_| match next() % 6 {
                    0 => 0.0,
                    1 => 1.0,
                    2 => 1e-30,
                    3 => f32::from_bits((next() % 0x3F80_0000) as u32),
                    _ => (next() % 1000) as f32 / 999.0,
                })
                .collect();
            let u = match next() % 5 {
                0 => 0.0,
                1 => 1.0 - 1.0 / 16_777_216.0,
                _ => u01(next() as u32),
            };
            assert_eq!(
                draw(&e, u),
                draw_early_exit(&e, u),
                "case {case}: {e:?} u {u}"
            );
        }
    }

    #[test]
    fn categorical_inverse_cdf_edges() {
        let logits = [0.0f32, 0.0, 0.0, 0.0];
        assert_eq!(categorical(&logits, 0.0), 0);
        assert_eq!(categorical(&logits, 0.24), 0);
        assert_eq!(categorical(&logits, 0.26), 1);
        assert_eq!(categorical(&logits, 0.999), 3);
        // A dominant logit takes (almost) all the mass.
        assert_eq!(categorical(&[-100.0, 100.0, -100.0], 0.5), 1);
    }

    #[test]
    fn categorical_with_its_exps_cached_draws_what_the_two_pass_definition_draws() {
        // The definition as written before the cache (each e_i computed in both passes).
        fn two_pass(logits: &[f32], u: f32) -> usize {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = logits.iter().map(|l| (l - max).exp()).sum();
            let mut acc = 0.0f32;
            for (i, l) in logits.iter().enumerate() {
                acc += (l - max).exp();
                if acc > u * total {
                    return i;
                }
            }
            logits.len() - 1
        }
        for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 18, 63, 64, 65, 200] {
            for step in 0..500u64 {
                let mut s = Stream::new(7, n as u32, step);
                let logits: Vec<f32> = (0..n)
                    .map(|i| (u01(s.word(i as u32 + 1)) - 0.5) * 12.0)
                    .collect();
                let u = u01(s.word(0));
                assert_eq!(
                    categorical(&logits, u),
                    two_pass(&logits, u),
                    "n {n} step {step}"
                );
            }
        }
        // u at the top of its range still returns the last index, through either path.
        assert_eq!(categorical(&[0.0; 3], 0.999_999_94), 2);
        assert_eq!(categorical(&[0.0; 100], 0.999_999_94), 99);
    }

    #[test]
    fn categorical_frequencies_match_probabilities() {
        let logits = [0.5f32, -1.0, 2.0];
        let e: Vec<f64> = logits.iter().map(|l| (*l as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut counts = [0usize; 3];
        let n = 200_000u64;
        for step in 0..n {
            let mut s = Stream::new(99, 0, step);
            counts[categorical(&logits, u01(s.word(0)))] += 1;
        }
        for i in 0..3 {
            let freq = counts[i] as f64 / n as f64;
            assert!(
                (freq - e[i] / z).abs() < 0.005,
                "class {i}: {freq} vs {}",
                e[i] / z
            );
        }
    }

    #[test]
    fn normal_moments() {
        let n = 200_000u64;
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for step in 0..n {
            let mut s = Stream::new(3, 1, step);
            let z = standard_normal(&mut s, 0) as f64;
            sum += z;
            sq += z * z;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.01,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn argmax_takes_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }
}
