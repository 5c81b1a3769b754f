//! Batch buckets for captured CUDA graphs: pure logic, compiled (and tested) with or without libtorch.
//!
//! A CUDA graph replays fixed shapes, so act() for `batch` envs runs the graph of the smallest bucket that holds
//! it, with the rows past `batch` padded. Padded rows read (and write) a scratch state row that belongs to no
//! env, so padding never touches a real env's recurrent state; their outputs are dropped. Batches larger than the
//! largest bucket run as several chunks of the largest bucket plus one padded tail.

/// The bucket sizes, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    sizes: Vec<usize>,
}

/// One piece of a batch: rows `start .. start + len` of the caller's batch run in the `bucket`-row graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub len: usize,
    pub bucket: usize,
}

impl BucketPlan {
    /// Powers of two 1, 2, 4, … up to `max_batch` rounded up to a power of two (so every batch up to
    /// `max_batch` pads by less than 2x).
    pub fn powers_of_two(max_batch: usize) -> Self {
        let top = max_batch.max(1).next_power_of_two();
        let sizes = std::iter::successors(Some(1usize), |s| (*s < top).then_some(s * 2)).collect();
        BucketPlan { sizes }
    }

    /// Explicit sizes (deduplicated and sorted; zeros dropped). None if nothing is left.
    pub fn from_sizes(sizes: &[usize]) -> Option<Self> {
        let mut v: Vec<usize> = sizes.iter().copied().filter(|s| *s > 0).collect();
        v.sort_unstable();
        v.dedup();
        (!v.is_empty()).then_some(BucketPlan { sizes: v })
    }

    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    pub fn largest(&self) -> usize {
        *self.sizes.last().expect("a plan has at least one bucket")
    }

    /// The smallest bucket holding `batch` rows, if any does.
    pub fn bucket_for(&self, batch: usize) -> Option<usize> {
        self.sizes.iter().copied().find(|s| *s >= batch)
    }

    /// Split a batch into graph runs: full chunks of the largest bucket, then the tail in its own bucket.
    pub fn chunks(&self, batch: usize) -> Vec<Chunk> {
        let big = self.largest();
        let mut out = Vec::with_capacity(batch / big + 1);
        let mut start = 0;
        while batch - start > big {
            out.push(Chunk {
                start,
                len: big,
                bucket: big,
            });
            start += big;
        }
        if batch > start {
            let len = batch - start;
            out.push(Chunk {
                start,
                len,
                bucket: self.bucket_for(len).expect("tail fits the largest bucket"),
            });
        }
        out
    }
}

/// The env-id column of one bucket run: the chunk's env ids, then the scratch row for every padded row.
pub fn padded_env_ids(
    ids: impl Iterator<Item = u32>,
    bucket: usize,
    scratch: u32,
    out: &mut Vec<i64>,
) {
    out.clear();
    out.extend(ids.map(|e| e as i64));
    debug_assert!(out.len() <= bucket);
    out.resize(bucket, scratch as i64);
}

/// Copy a chunk's observation rows into a bucket-sized buffer; padded rows are left as they are (any finite,
/// valid observation does: their outputs are dropped and their state row is scratch).
pub fn pad_rows<T: Copy>(src: &[T], row_len: usize, dst: &mut [T]) {
    dst[..src.len()].copy_from_slice(src);
    debug_assert_eq!(dst.len() % row_len.max(1), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_cover_max_batch() {
        let p = BucketPlan::powers_of_two(1000);
        assert_eq!(p.sizes(), &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
        assert_eq!(BucketPlan::powers_of_two(1).sizes(), &[1]);
        assert_eq!(BucketPlan::powers_of_two(0).sizes(), &[1]);
        assert_eq!(BucketPlan::powers_of_two(65536).largest(), 65536);
    }

    #[test]
    fn smallest_bucket_that_fits() {
        let p = BucketPlan::powers_of_two(64);
        assert_eq!(p.bucket_for(1), Some(1));
        assert_eq!(p.bucket_for(3), Some(4));
        assert_eq!(p.bucket_for(33), Some(64));
        assert_eq!(p.bucket_for(64), Some(64));
        assert_eq!(p.bucket_for(65), None);
        let q = BucketPlan::from_sizes(&[48, 0, 8, 8, 1]).unwrap();
        assert_eq!(q.sizes(), &[1, 8, 48]);
        assert_eq!(q.bucket_for(9), Some(48));
        assert!(BucketPlan::from_sizes(&[0]).is_none());
    }

    #[test]
    fn chunks_cover_every_row_once() {
        let p = BucketPlan::powers_of_two(16);
        for batch in 1..100 {
            let c = p.chunks(batch);
            let mut next = 0;
            for ch in &c {
                assert_eq!(ch.start, next);
                assert!(ch.len >= 1 && ch.len <= ch.bucket && ch.bucket <= 16);
                assert_eq!(Some(ch.bucket), p.bucket_for(ch.len));
                next += ch.len;
            }
            assert_eq!(next, batch);
            // Only the last chunk pads.
            assert!(c[..c.len() - 1].iter().all(|ch| ch.len == ch.bucket));
        }
        assert_eq!(
            p.chunks(37),
            vec![
                Chunk {
                    start: 0,
                    len: 16,
                    bucket: 16
                },
                Chunk {
                    start: 16,
                    len: 16,
                    bucket: 16
                },
                Chunk {
                    start: 32,
                    len: 5,
                    bucket: 8
                },
            ]
        );
    }

    #[test]
    fn padding_uses_the_scratch_row() {
        let mut ids = vec![];
        padded_env_ids([7u32, 3, 9].into_iter(), 8, 100, &mut ids);
        assert_eq!(ids, vec![7, 3, 9, 100, 100, 100, 100, 100]);
        let mut dst = vec![-1.0f32; 8 * 2];
        pad_rows(&[1.0, 2.0, 3.0, 4.0], 2, &mut dst);
        assert_eq!(&dst[..5], &[1.0, 2.0, 3.0, 4.0, -1.0]);
    }
}
