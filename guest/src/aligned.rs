//! Weight storage that starts on a 64-byte boundary: a cache line, and the width of one AVX-512 load.
//!
//! Why: a dense layer's packed panels are read by the kernels one vector at a time (16 floats per zmm, 8 per ymm)
//! at offsets that are whole vectors from the panels' start. In a `Vec<f32>` that start is wherever the allocator
//! put it (glibc: 16 bytes past a line or 48, varying with the process's earlier allocations), and then every
//! vector load of the panels touches two cache lines. At batch 1 the act streams its weights from L2, and there
//! it showed: the benchmark MLP (64-256-256) at batch 1 on Zen 5, three alternating `policyport bench` rounds
//! each, 1.95-1.97 µs with the panels where the allocator put them, 1.84-1.89 µs aligned (batch 64 and 1 024,
//! compute-bound, unchanged; NatureCNN within noise, no slower).

use std::ops::{Deref, DerefMut};

/// One cache line of 4-byte words; only its alignment matters.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line<T>([T; 16]);

/// `len` values of a 4-byte type (`f32` panels, `u32` bf16 pairs), zeroed at first, whose first one starts a cache
/// line; reads and writes as a `[T]`.
#[derive(Clone)]
pub(crate) struct Aligned<T: Copy + Default> {
    lines: Vec<Line<T>>,
    len: usize,
}

pub(crate) type AlignedF32 = Aligned<f32>;

impl<T: Copy + Default> Aligned<T> {
    pub(crate) fn zeroed(len: usize) -> Self {
        // A line is 16 values of 4 bytes with no padding: what `deref` relies on (checked at compile time).
        const { assert!(std::mem::size_of::<T>() == 4 && std::mem::size_of::<Line<T>>() == 64) };
        Aligned {
            lines: vec![Line([T::default(); 16]); len.div_ceil(16)],
            len,
        }
    }
}

impl<T: Copy + Default> Default for Aligned<T> {
    fn default() -> Self {
        Self::zeroed(0)
    }
}

impl<T: Copy + Default> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds `len.div_ceil(16)` lines of 16 initialised values each, contiguous (`Line` is
        // `repr(C)`, 64 bytes, no padding: asserted in `zeroed`, the only constructor), so its first `len`
        // values are in bounds; an empty Vec's pointer is dangling but non-null and aligned, which a zero-length
        // slice allows.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Copy + Default> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, through the unique borrow of `lines`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Copy + Default> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aligned").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_starts_a_cache_line_and_holds_exactly_its_values() {
        for len in [0, 1, 15, 16, 17, 4096, 4097] {
            let mut a = AlignedF32::zeroed(len);
            let mut u = Aligned::<u32>::zeroed(len);
            assert_eq!((a.len(), u.len()), (len, len));
            assert_eq!(a.as_ptr() as usize % 64, 0, "len {len}");
            assert_eq!(u.as_ptr() as usize % 64, 0, "len {len}");
            assert!(a.iter().all(|v| *v == 0.0) && u.iter().all(|v| *v == 0));
            for (i, (v, w)) in a.iter_mut().zip(u.iter_mut()).enumerate() {
                *v = i as f32;
                *w = i as u32;
            }
            let (b, c) = (a.clone(), u.clone());
            assert_eq!(b.as_ptr() as usize % 64, 0);
            assert!(b.iter().enumerate().all(|(i, v)| *v == i as f32));
            assert!(c.iter().enumerate().all(|(i, v)| *v == i as u32));
        }
    }
}
