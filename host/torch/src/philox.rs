//! Philox4x32-10 (SPEC.md "Seeded sampling") as libtorch int64 ops, so sampling can run on the device and be
//! captured in a CUDA graph. Bit-identical to `policyport_format::philox` (tested).
//!
//! libtorch has no uint32 multiply-high, so 32-bit words live in int64 tensors and the 32x32→64 product is
//! split at 16 bits: with a·M = y·2^16 + x (x = a·M_lo, y = a·M_hi, both < 2^48), hi = (y + (x>>16)) >> 16 and
//! lo = ((y + (x>>16)) & 0xFFFF) << 16 | (x & 0xFFFF): no intermediate exceeds 2^49. The two multiplications of
//! a round are done as one op on stacked [c0, c2] words.
//!
//! The round keys depend only on the seed, so the host computes all ten (k + r·W mod 2^32) and passes them in
//! the per-call `rng` input with the step words: the graph never recomputes them.

use tch::{Device, Kind, Tensor};

use super::TorchError;

const M0: i64 = 0xD251_1F53;
const M1: i64 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Layout of the per-call rng input: 10 round keys k0, 10 round keys k1, step_lo, step_hi.
pub(crate) const RNG_LEN: usize = 22;

/// The rng input for (seed, step).
pub(crate) fn rng_input(seed: u64, step: u64, out: &mut [i64; RNG_LEN]) {
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    for r in 0..10 {
        if r > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        out[r] = k0 as i64;
        out[10 + r] = k1 as i64;
    }
    out[20] = step as u32 as i64;
    out[21] = (step >> 32) as i64;
}

fn te(e: tch::TchError) -> TorchError {
    TorchError::Torch(e.to_string())
}

/// Constants of the device generator, made once at load.
pub(crate) struct DevicePhilox {
    m_lo: Tensor,
    m_hi: Tensor,
    /// Block indices 0..blocks as `[1, blocks]`.
    block_index: Tensor,
    words: i64,
}

impl DevicePhilox {
    /// A generator giving `words` words per row.
    pub(crate) fn new(words: usize, device: Device) -> Result<Self, TorchError> {
        let blocks = words.div_ceil(4).max(1) as i64;
        let col = |a: i64, b: i64| {
            Tensor::f_from_slice(&[a, b])
                .and_then(|t| t.f_reshape([2, 1, 1]))
                .and_then(|t| t.f_to_device(device))
                .map_err(te)
        };
        Ok(DevicePhilox {
            m_lo: col(M1 & 0xFFFF, M0 & 0xFFFF)?,
            m_hi: col(M1 >> 16, M0 >> 16)?,
            block_index: Tensor::f_arange(blocks, (Kind::Int64, device))
                .and_then(|t| t.f_reshape([1, blocks]))
                .map_err(te)?,
            words: words as i64,
        })
    }

    /// Words `[batch, words]` (int64 holding u32) for env ids `envs` (`[batch]` int64) and `rng` (see
    /// [`rng_input`], `[RNG_LEN]` int64 on the device).
    pub(crate) fn words(&self, envs: &Tensor, rng: &Tensor) -> Result<Tensor, TorchError> {
        let f = || -> Result<Tensor, tch::TchError> {
            let batch = envs.size()[0];
            let blocks = self.block_index.size()[1];
            let shape = [batch, blocks];
            let c0 = self.block_index.f_expand(shape, false)?;
            let c1 = envs.f_reshape([batch, 1])?.f_expand(shape, false)?;
            let c2 = rng
                .f_narrow(0, 20, 1)?
                .f_reshape([1, 1])?
                .f_expand(shape, false)?;
            let c3 = rng
                .f_narrow(0, 21, 1)?
                .f_reshape([1, 1])?
                .f_expand(shape, false)?;
            // Stacked so a round is a handful of ops: even = [c2, c0]... ordered so that flip(0) pairs the
            // multiplier of one lane with the xor partner of the other (see the round below).
            let mut even = Tensor::f_stack(&[&c2, &c0], 0)?; // [c2, c0] multiplied by [M1, M0]
            let mut odd = Tensor::f_stack(&[&c3, &c1], 0)?; // [c3, c1]
            for r in 0..10 {
                let x = even.f_mul(&self.m_lo)?;
                let y = even.f_mul(&self.m_hi)?;
                let t = y.f_add(&x.f_bitwise_right_shift_tensor_scalar(16)?)?;
                let hi = t.f_bitwise_right_shift_tensor_scalar(16)?;
                let lo = t
                    .f_bitwise_and(0xFFFF)?
                    .f_bitwise_left_shift_tensor_scalar(16)?
                    .f_bitwise_or_tensor(&x.f_bitwise_and(0xFFFF)?)?;
                // hi = [hi(M1·c2), hi(M0·c0)] = [hi1, hi0]; lo = [lo1, lo0].
                // c0' = hi1 ^ c1 ^ k0, c2' = hi0 ^ c3 ^ k1 → new even [c2', c0'] = [hi0^c3^k1, hi1^c1^k0]
                //   = flip(hi) ^ odd ^ [k1, k0]; c1' = lo1, c3' = lo0 → new odd [c3', c1'] = [lo0, lo1] = flip(lo).
                let keys =
                    Tensor::f_stack(&[rng.f_narrow(0, 10 + r, 1)?, rng.f_narrow(0, r, 1)?], 0)?
                        .f_reshape([2, 1, 1])?;
                even = hi
                    .f_flip([0])?
                    .f_bitwise_xor_tensor(&odd)?
                    .f_bitwise_xor_tensor(&keys)?;
                odd = lo.f_flip([0])?;
            }
            // Block words [c0, c1, c2, c3] = [even[1], odd[1], even[0], odd[0]].
            let block = Tensor::f_stack(
                &[even.f_get(1)?, odd.f_get(1)?, even.f_get(0)?, odd.f_get(0)?],
                2,
            )?; // [batch, blocks, 4]
            block
                .f_reshape([batch, blocks * 4])?
                .f_narrow(1, 0, self.words)
        };
        f().map_err(te)
    }
}

/// u01(w) = (w >> 8) · 2^-24, as f32 (exact).
pub(crate) fn u01(words: &Tensor) -> Result<Tensor, TorchError> {
    words
        .f_bitwise_right_shift_tensor_scalar(8)
        .and_then(|t| t.f_to_kind(Kind::Float))
        .and_then(|t| t.f_mul_scalar(1.0 / 16_777_216.0))
        .map_err(te)
}

/// u01_open_closed(w) = ((w >> 8) + 1) · 2^-24, as f32 (exact).
pub(crate) fn u01_open_closed(words: &Tensor) -> Result<Tensor, TorchError> {
    words
        .f_bitwise_right_shift_tensor_scalar(8)
        .and_then(|t| t.f_add_scalar(1))
        .and_then(|t| t.f_to_kind(Kind::Float))
        .and_then(|t| t.f_mul_scalar(1.0 / 16_777_216.0))
        .map_err(te)
}

#[cfg(test)]
mod tests {
    use super::*;
    use policyport_format::philox::Stream;

    #[test]
    fn device_words_equal_the_reference_stream() {
        let words = 11;
        let generator = DevicePhilox::new(words, Device::Cpu).unwrap();
        let envs_u32 = [0u32, 1, 7, u32::MAX, 123_456_789];
        for (seed, step) in [
            (0u64, 0u64),
            (7, 3),
            (u64::MAX, u64::MAX),
            (0x1_0000_0002, (7 << 32) | 9),
        ] {
            let mut rng = [0i64; RNG_LEN];
            rng_input(seed, step, &mut rng);
            let envs: Vec<i64> = envs_u32.iter().map(|e| *e as i64).collect();
            let got = generator
                .words(&Tensor::from_slice(&envs), &Tensor::from_slice(&rng))
                .unwrap();
            let got: Vec<i64> = Vec::<i64>::try_from(got.reshape([-1])).unwrap();
            for (row, e) in envs_u32.iter().enumerate() {
                let mut s = Stream::new(seed, *e, step);
                for i in 0..words {
                    assert_eq!(
                        got[row * words + i],
                        s.word(i as u32) as i64,
                        "seed {seed} step {step} env {e} word {i}"
                    );
                }
            }
        }
    }
}
