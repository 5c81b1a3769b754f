//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the policyport
//! sampling stream built on it. Counter-based: any backend can compute word i of the stream for (seed, env, step)
//! without state, so CPU, WGSL, CUDA and wasm draw bit-identical random words.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// One Philox4x32-10 block: 10 rounds over the 128-bit counter with the 64-bit key.
#[inline]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = ctr;
    let [mut k0, mut k1] = key;
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let p0 = (M0 as u64) * (c0 as u64);
        let p1 = (M1 as u64) * (c2 as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// The random words for one (seed, env, step): word i is element i % 4 of block
/// `philox4x32_10([i / 4, env, step_lo, step_hi], [seed_lo, seed_hi])`.
#[derive(Debug, Clone)]
pub struct Stream {
    key: [u32; 2],
    env: u32,
    step: u64,
    block_index: u32,
    block: [u32; 4],
}

impl Stream {
    pub fn new(seed: u64, env: u32, step: u64) -> Self {
        let key = [seed as u32, (seed >> 32) as u32];
        let block = philox4x32_10([0, env, step as u32, (step >> 32) as u32], key);
        Self::with_first_block(seed, env, step, block)
    }

    /// The stream whose block 0, `philox4x32_10([0, env, step_lo, step_hi], [seed_lo, seed_hi])`, the caller
    /// computed already (for many envs at once: [`first_blocks`]). A wrong `block` gives a wrong stream, never
    /// an unsafe one.
    pub fn with_first_block(seed: u64, env: u32, step: u64, block: [u32; 4]) -> Self {
        Stream {
            key: [seed as u32, (seed >> 32) as u32],
            env,
            step,
            block_index: 0,
            block,
        }
    }

    /// Word `i` of the stream (blocks are computed on demand and the last one is cached).
    #[inline]
    pub fn word(&mut self, i: u32) -> u32 {
        let b = i / 4;
        if b != self.block_index {
            self.block = philox4x32_10(
                [b, self.env, self.step as u32, (self.step >> 32) as u32],
                self.key,
            );
            self.block_index = b;
        }
        self.block[(i % 4) as usize]
    }
}

/// Block 0 of the stream (seed, env, step) for each of `envs`, into `out` (cleared first): `out[i]` is
/// `Stream::new(seed, envs[i], step)`'s first block, bit for bit.
///
/// Eight streams at a time with AVX2 where the CPU has it (the ten rounds' 32×32→64 products as `vpmuludq`),
/// one at a time elsewhere. Why: a sampled act() computed block 0 row by row inside its per-row draw (~4 % of
/// CartPole's act() at 1 000 rows; 15 µs per 1 000 streams one at a time, ~3 µs eight at a time on Zen 3).
pub fn first_blocks(seed: u64, step: u64, envs: &[u32], out: &mut Vec<[u32; 4]>) {
    out.clear();
    out.reserve(envs.len());
    let key = [seed as u32, (seed >> 32) as u32];
    #[allow(unused_mut)]
    let mut rest = envs;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        let whole = envs.chunks_exact(8);
        rest = whole.remainder();
        for chunk in whole {
            if let Ok(lanes) = <&[u32; 8]>::try_from(chunk) {
                // SAFETY: AVX2 was detected just above.
                out.extend(unsafe { x86::first_blocks_8(key, step, lanes) });
            }
        }
    }
    out.extend(
        rest.iter()
            .map(|e| philox4x32_10([0, *e, step as u32, (step >> 32) as u32], key)),
    );
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{M0, M1, W0, W1};

    /// The 32×32→64 products of eight lanes by `m`: (high halves, low halves), lane for lane.
    #[target_feature(enable = "avx2")]
    fn mul_hi_lo(x: __m256i, m: __m256i) -> (__m256i, __m256i) {
        // vpmuludq multiplies the even 32-bit lanes (0, 2, 4, 6) into 64-bit products; the odd ones are shifted
        // down to be multiplied the same way.
        let even = _mm256_mul_epu32(x, m);
        let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), m);
        let hi = _mm256_blend_epi32::<0b1010_1010>(_mm256_srli_epi64::<32>(even), odd);
        let lo = _mm256_blend_epi32::<0b1010_1010>(even, _mm256_slli_epi64::<32>(odd));
        (hi, lo)
    }

    /// Block 0 of eight streams (seed = `key`, `step`, one env per lane): `philox4x32_10` lane by lane.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn first_blocks_8(
        key: [u32; 2],
        step: u64,
        envs: &[u32; 8],
    ) -> [[u32; 4]; 8] {
        let splat = |v: u32| _mm256_set1_epi32(v as i32);
        let [e0, e1, e2, e3, e4, e5, e6, e7] = envs.map(|e| e as i32);
        let mut c0 = _mm256_setzero_si256();
        let mut c1 = _mm256_setr_epi32(e0, e1, e2, e3, e4, e5, e6, e7);
        let mut c2 = splat(step as u32);
        let mut c3 = splat((step >> 32) as u32);
        let (m0, m1) = (splat(M0), splat(M1));
        let [mut k0, mut k1] = key;
        for round in 0..10 {
            if round > 0 {
                k0 = k0.wrapping_add(W0);
                k1 = k1.wrapping_add(W1);
            }
            let (hi0, lo0) = mul_hi_lo(c0, m0);
            let (hi1, lo1) = mul_hi_lo(c2, m1);
            (c0, c1, c2, c3) = (
                _mm256_xor_si256(_mm256_xor_si256(hi1, c1), splat(k0)),
                lo1,
                _mm256_xor_si256(_mm256_xor_si256(hi0, c3), splat(k1)),
                lo0,
            );
        }
        // SAFETY: an __m256i is 32 bytes of plain integers, as is a [u32; 8]; every bit pattern is valid for both.
        let [w0, w1, w2, w3] =
            [c0, c1, c2, c3].map(|v| unsafe { std::mem::transmute::<__m256i, [u32; 8]>(v) });
        std::array::from_fn(|i| [w0[i], w1[i], w2[i], w3[i]])
    }
}

/// Uniform in [0, 1) from the top 24 bits (exact in f32).
#[inline]
pub fn u01(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Uniform in (0, 1] from the top 24 bits (exact in f32): safe to take the log of.
#[inline]
pub fn u01_open_closed(w: u32) -> f32 {
    ((w >> 8) + 1) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `first_blocks` is `Stream::new`'s block 0 for every env, in any count (whole and partial lanes of 8).
    #[test]
    fn first_blocks_are_each_streams_block_zero() {
        let mut out = vec![[7u32; 4]; 3];
        for n in [0usize, 1, 7, 8, 9, 23, 64] {
            let envs: Vec<u32> = (0..n as u32)
                .map(|i| i.wrapping_mul(2_654_435_761) ^ 5)
                .collect();
            for (seed, step) in [
                (0u64, 0u64),
                (42, 7),
                (u64::MAX, u64::MAX),
                (1 << 40, 1 << 33),
            ] {
                first_blocks(seed, step, &envs, &mut out);
                assert_eq!(out.len(), n);
                for (e, b) in envs.iter().zip(&out) {
                    let mut s = Stream::new(seed, *e, step);
                    assert_eq!(
                        *b,
                        [s.word(0), s.word(1), s.word(2), s.word(3)],
                        "env {e} seed {seed}"
                    );
                }
            }
        }
    }

    /// Known-answer vectors from Random123's kat_vectors (philox4x32_10).
    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
        );
        assert_eq!(
            philox4x32_10(
                [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
                [0xA4093822, 0x299F31D0]
            ),
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
        );
    }

    #[test]
    fn stream_words_follow_blocks() {
        let mut s = Stream::new(0x1_0000_0002, 5, (7 << 32) | 9);
        let b1 = philox4x32_10([1, 5, 9, 7], [2, 1]);
        assert_eq!(s.word(6), b1[2]);
        let b0 = philox4x32_10([0, 5, 9, 7], [2, 1]);
        assert_eq!(s.word(3), b0[3]);
    }

    #[test]
    fn uniforms_are_in_range() {
        assert_eq!(u01(0), 0.0);
        assert!(u01(u32::MAX) < 1.0);
        assert!(u01_open_closed(0) > 0.0);
        assert_eq!(u01_open_closed(u32::MAX), 1.0);
    }
}
