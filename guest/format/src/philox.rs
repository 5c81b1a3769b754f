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
        Stream {
            key,
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
