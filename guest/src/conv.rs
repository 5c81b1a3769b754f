//! Convolution, pooling and layer normalisation on the CPU.
//!
//! Convolution is lowered to the dense kernel ([`crate::dense`]): for one env, the receptive field of every
//! output pixel is gathered into a row (im2col, `[OH·OW, C/g·KH·KW]` per group, in the weight's own `(c, ky, kx)`
//! order), and the packed GEMM with the bias and the fused activation computes `[OH·OW, O/g]`, which is scattered
//! back to PyTorch's channels-first `[O, OH, OW]`. Why im2col and not a direct loop: the GEMM is where the
//! register tiling and the SIMD widths already live, the weights are packed once at load, and the patch matrix of
//! one env (NatureCNN's first layer: 400 × 256 floats, 400 KB) stays cache-sized, so the gather costs a small
//! fraction of the multiply-adds. The patch and result buffers belong to the session (no allocation once warm).

use crate::dense::{PackedDense, RowMap, Segments};
use crate::kernels::{Act, Isa};

#[derive(Debug, Clone)]
pub(crate) struct Conv2d {
    /// One packed GEMM per group: `[O/g, C/g·KH·KW]`.
    groups: Vec<PackedDense>,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    /// top, left (the bottom/right padding only shows in the output size).
    pad: [usize; 2],
    dilation: [usize; 2],
    oh: usize,
    ow: usize,
    /// The input is channels-last `[H, W, C]` (an observation before the model's own NHWC → NCHW transpose,
    /// which this convolution then absorbs): patch rows are in `(ky, kx, c)` order, so each kernel row is one
    /// contiguous run of `KW·C` numbers, and the weights were permuted to match at load.
    nhwc: bool,
    /// Write channels-last `[OH, OW, O]` (the GEMM's own row order, no scatter) for a reader that is itself a
    /// channels-last convolution. One group.
    out_nhwc: bool,
}

/// How a convolution reads its input (see [`Conv2d::nhwc`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ConvInput {
    /// `[C, H, W]`, as the graph says.
    ChannelsFirst,
    /// `[H, W, C]`, scaled then shifted by one number each (`x·scale + shift`, an observation's `/255`)
    /// before the convolution: folded into its weights and bias (the caller checked that no padding is read
    /// when `shift` is not 0).
    ChannelsLast { scale: f32, shift: f32 },
}

impl Conv2d {
    /// `weight`: `[O, C/g, KH, KW]`; `input`: `[C, H, W]`; `out`: `[O, OH, OW]` (validated). `ChannelsLast` needs
    /// one group.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        isa: Isa,
        weight: &[f32],
        wshape: &[usize],
        bias: Option<&[f32]>,
        input: &[usize],
        out: &[usize],
        stride: [usize; 2],
        padding: [usize; 4],
        dilation: [usize; 2],
        groups: usize,
        layout: ConvInput,
    ) -> Self {
        let (o, cg, kh, kw) = (wshape[0], wshape[1], wshape[2], wshape[3]);
        let og = o / groups;
        let kdim = cg * kh * kw;
        let groups = match layout {
            ConvInput::ChannelsFirst => (0..groups)
                .map(|g| {
                    PackedDense::new(
                        isa,
                        &weight[g * og * kdim..(g + 1) * og * kdim],
                        og,
                        kdim,
                        bias.map(|b| &b[g * og..(g + 1) * og]),
                    )
                })
                .collect(),
            ConvInput::ChannelsLast { scale, shift } => {
                assert_eq!(groups, 1, "channels-last convolutions have one group");
                // w'[o][(ky·KW + kx)·C + c] = scale · w[o][c][ky][kx]; b'[o] = b[o] + shift · Σ w[o].
                let mut w = vec![0.0f32; o * kdim];
                let mut b: Vec<f32> = bias.map_or_else(|| vec![0.0; o], <[f32]>::to_vec);
                for oc in 0..o {
                    let mut sum = 0.0f64;
                    for c in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let v = weight[((oc * cg + c) * kh + ky) * kw + kx];
                                w[oc * kdim + (ky * kw + kx) * cg + c] = v * scale;
                                sum += v as f64;
                            }
                        }
                    }
                    b[oc] += (shift as f64 * sum) as f32;
                }
                vec![PackedDense::new(isa, &w, o, kdim, Some(&b))]
            }
        };
        Conv2d {
            groups,
            c: input[0],
            h: input[1],
            w: input[2],
            o,
            k: [kh, kw],
            stride,
            pad: [padding[0], padding[1]],
            dilation,
            oh: out[1],
            ow: out[2],
            nhwc: layout != ConvInput::ChannelsFirst,
            out_nhwc: false,
        }
    }

    /// Offer every group's GEMM to `lender` ([`crate::lend`]).
    pub(crate) fn lend(&mut self, lender: &std::sync::Arc<dyn crate::lend::DenseLender>) {
        for g in &mut self.groups {
            g.lend(lender);
        }
    }

    /// This convolution's GEMMs in `precision` ([`PackedDense::set_precision`]) — except one that reads its input
    /// in place in f32 but could not in bf16 (an odd channel count: bf16 reads the input as pairs), which stays
    /// f32: measured on NatureCNN at batch 64 (2026-12-03), im2col + bf16 was slower than the in-place f32 GEMM
    /// (8.2 vs 6.8 ms).
    pub(crate) fn set_precision(&mut self, precision: crate::Precision) {
        if self.reads_in_place() && self.c % 2 == 1 {
            return;
        }
        for g in &mut self.groups {
            g.set_precision(precision);
        }
    }

    /// Write the output channels-last (see [`Conv2d::out_nhwc`]); one group only.
    pub(crate) fn with_channels_last_output(mut self) -> Self {
        assert_eq!(self.groups.len(), 1, "channels-last output needs one group");
        self.out_nhwc = true;
        self
    }

    /// Floats of session scratch one env needs: the patch matrix and the GEMM result of one group.
    pub(crate) fn scratch_len(&self) -> (usize, usize) {
        let g = self.groups.len();
        let p = self.oh * self.ow;
        (p * (self.c / g) * self.k[0] * self.k[1], p * (self.o / g))
    }

    /// Floats of the patch and result buffers [`run`](Self::run) uses at most, whatever the batch: the executor
    /// reserves them before a threaded act, so a thread's first large part does not grow them mid-call. Why it
    /// matters: the threads take parts of varying size (a late worker leaves the caller bigger ones), and the
    /// channels-first chunk below once sized `result` by the part, so a warm threaded act allocated whenever a
    /// part came bigger than any before (caught by `parity::intra_op_threads_give_the_single_thread_answers` on
    /// `dict_obs`, 1 allocation in 5 of 12 loaded runs).
    pub(crate) fn scratch_max(&self) -> (usize, usize) {
        let (plen, rlen) = self.scratch_len();
        if self.reads_in_place() {
            if self.out_nhwc {
                (0, 0)
            } else {
                (0, self.chunk_envs_max() * self.oh * self.ow * self.o)
            }
        } else {
            // The im2col path sizes both whatever the output layout (its result buffer is unused when the GEMM
            // writes channels-last rows straight into the output, but sized all the same: what `run` grows is
            // what must be reserved; a 0 here let the SIMD128 kernels' NatureCNN allocate in a loaded run).
            (plen, rlen)
        }
    }

    /// Envs per channels-first chunk on the in-place path: as many as one env's patches and result would hold
    /// (the scratch the memory estimate counts, validate.rs), at least one.
    fn chunk_envs_max(&self) -> usize {
        let (plen, rlen) = self.scratch_len();
        ((plen + rlen) / (self.oh * self.ow * self.o).max(1)).max(1)
    }

    pub(crate) fn run(
        &self,
        x: &[f32],
        y: &mut [f32],
        batch: usize,
        act: Act,
        patches: &mut Vec<f32>,
        result: &mut Vec<f32>,
    ) {
        let (plen, rlen) = self.scratch_len();
        let (c, h, w) = (self.c, self.h, self.w);
        let g = self.groups.len();
        let (cg, og) = (c / g, self.o / g);
        let p = self.oh * self.ow;
        let kdim = cg * self.k[0] * self.k[1];
        if self.reads_in_place() {
            // The whole batch as one implicit GEMM (rows = every env's output pixels, read from the input in
            // place: no patch matrix), so the 96-row blocks reuse each weight panel across envs too.
            let gemm = &self.groups[0];
            let plane = h * w * c;
            let rows = RowMap {
                pixels: p,
                ow: self.ow,
                env_stride: plane,
                row_stride: self.stride[0] * w * c,
                col_stride: self.stride[1] * c,
            };
            let seg = Segments {
                count: self.k[0],
                len: self.k[1] * c,
                stride: w * c,
            };
            let x = &x[..batch * plane];
            if self.out_nhwc {
                gemm.run_rows(x, rows, seg, &mut y[..batch * p * self.o], batch * p, act);
                return;
            }
            // Channels-first output: GEMM rows of `chunk` envs at a time, then scattered. The chunk keeps this
            // buffer within the scratch the memory estimate counts for a convolution (validate.rs: one env's
            // patches and result; the patch buffer itself is not used on this path).
            let env_out = p * self.o;
            let chunk_max = self.chunk_envs_max();
            let chunk = chunk_max.min(batch.max(1));
            // Sized for the largest chunk, not this batch's (see `scratch_max`): a smaller part first must not
            // leave a later, larger one to grow it.
            if result.len() < chunk_max * env_out {
                result.resize(chunk_max * env_out, 0.0);
            }
            let mut b0 = 0;
            while b0 < batch {
                let envs = chunk.min(batch - b0);
                // The chunk's envs only (the bf16 kernel rounds what it is given, whole); they start at an env,
                // so the same row map applies.
                let xc = &x[b0 * plane..(b0 + envs) * plane];
                let out = &mut result[..envs * env_out];
                gemm.run_rows(xc, rows, seg, out, envs * p, act);
                for (rb, yb) in out
                    .chunks_exact(env_out)
                    .zip(y[b0 * env_out..].chunks_exact_mut(env_out))
                {
                    for (oc, yrow) in yb.chunks_exact_mut(p).enumerate() {
                        for (pix, v) in yrow.iter_mut().enumerate() {
                            *v = rb[pix * self.o + oc];
                        }
                    }
                }
                b0 += envs;
            }
            return;
        }
        if patches.len() < plen {
            patches.resize(plen, 0.0);
        }
        if result.len() < rlen {
            result.resize(rlen, 0.0);
        }
        for b in 0..batch {
            let xb = &x[b * c * h * w..(b + 1) * c * h * w];
            let yb = &mut y[b * self.o * p..(b + 1) * self.o * p];
            for (gi, gemm) in self.groups.iter().enumerate() {
                let patches = &mut patches[..p * kdim];
                if self.nhwc {
                    self.im2col_nhwc(xb, patches);
                } else {
                    self.im2col(&xb[gi * cg * h * w..(gi + 1) * cg * h * w], cg, patches);
                }
                if self.out_nhwc {
                    gemm.run(patches, yb, p, act);
                    continue;
                }
                let result = &mut result[..p * og];
                gemm.run(patches, result, p, act);
                // [P, O/g] -> channels-first rows of y.
                for (oc, yrow) in yb[gi * og * p..(gi + 1) * og * p]
                    .chunks_exact_mut(p)
                    .enumerate()
                {
                    for (pix, v) in yrow.iter_mut().enumerate() {
                        *v = result[pix * og + oc];
                    }
                }
            }
        }
    }

    /// Bytes of bf16 pair buffer one env of this convolution needs (0 in f32): its whole input when read in place
    /// (rounded once), else its patch matrix (counted per env, though it is one env's at a time: an upper bound).
    pub(crate) fn bf16_bytes_per_env(&self) -> u64 {
        let g = &self.groups[0];
        if g.bf16_bytes_per_row() == 0 {
            0
        } else if self.reads_in_place() {
            2 * (self.c * self.h * self.w) as u64 + 4
        } else {
            (self.oh * self.ow) as u64 * g.bf16_bytes_per_row()
        }
    }

    /// Whether [`run`](Self::run) reads the input in place ([`PackedDense::run_rows`]) instead of copying
    /// patches: channels-last input (each kernel row one run of KW·C numbers), one group, no padding, no dilation,
    /// every window inside the input, and the GEMM on the AVX-512 f32 kernel (not lent, not bf16).
    fn reads_in_place(&self) -> bool {
        self.nhwc
            && self.groups.len() == 1
            && self.pad == [0, 0]
            && self.dilation == [1, 1]
            && self.oh >= 1
            && self.ow >= 1
            && (self.oh - 1) * self.stride[0] + self.k[0] <= self.h
            && (self.ow - 1) * self.stride[1] + self.k[1] <= self.w
            && self.groups[0].runs_rows()
            && (self.c % 2 == 0 || !self.groups[0].rows_must_be_even())
    }

    /// Row `oy·OW + ox` of `patches` = the input values under the kernel at that output pixel, zero where the
    /// kernel overhangs the input (the padding).
    fn im2col(&self, x: &[f32], cg: usize, patches: &mut [f32]) {
        let (h, w) = (self.h as isize, self.w as isize);
        let [kh, kw] = self.k;
        let kdim = cg * kh * kw;
        for oy in 0..self.oh {
            for ox in 0..self.ow {
                let row = &mut patches[(oy * self.ow + ox) * kdim..][..kdim];
                let y0 = (oy * self.stride[0]) as isize - self.pad[0] as isize;
                let x0 = (ox * self.stride[1]) as isize - self.pad[1] as isize;
                let mut i = 0;
                for ch in 0..cg {
                    let plane = &x[ch * self.h * self.w..(ch + 1) * self.h * self.w];
                    for ky in 0..kh {
                        let iy = y0 + (ky * self.dilation[0]) as isize;
                        if iy < 0 || iy >= h {
                            row[i..i + kw].fill(0.0);
                            i += kw;
                            continue;
                        }
                        let line = &plane[iy as usize * self.w..(iy as usize + 1) * self.w];
                        if self.dilation[1] == 1 && x0 >= 0 && x0 + kw as isize <= w {
                            copy_run(&mut row[i..i + kw], &line[x0 as usize..x0 as usize + kw]);
                            i += kw;
                            continue;
                        }
                        for kx in 0..kw {
                            let ix = x0 + (kx * self.dilation[1]) as isize;
                            row[i] = if ix < 0 || ix >= w {
                                0.0
                            } else {
                                line[ix as usize]
                            };
                            i += 1;
                        }
                    }
                }
            }
        }
    }

    /// `im2col` of a channels-last `[H, W, C]` input: row `oy·OW + ox` in `(ky, kx, c)` order, so a kernel row
    /// inside the input is one run of `KW·C` numbers (NatureCNN's first layer: 32, where channels-first gives
    /// four runs of 8).
    fn im2col_nhwc(&self, x: &[f32], patches: &mut [f32]) {
        let (h, w, c) = (self.h as isize, self.w as isize, self.c);
        let [kh, kw] = self.k;
        let kdim = c * kh * kw;
        let run = kw * c;
        for oy in 0..self.oh {
            for ox in 0..self.ow {
                let row = &mut patches[(oy * self.ow + ox) * kdim..][..kdim];
                let y0 = (oy * self.stride[0]) as isize - self.pad[0] as isize;
                let x0 = (ox * self.stride[1]) as isize - self.pad[1] as isize;
                for ky in 0..kh {
                    let dst = &mut row[ky * run..(ky + 1) * run];
                    let iy = y0 + (ky * self.dilation[0]) as isize;
                    if iy < 0 || iy >= h {
                        dst.fill(0.0);
                        continue;
                    }
                    let line = &x[iy as usize * self.w * c..(iy as usize + 1) * self.w * c];
                    if self.dilation[1] == 1 && x0 >= 0 && x0 + kw as isize <= w {
                        let start = x0 as usize * c;
                        dst.copy_from_slice(&line[start..start + run]);
                        continue;
                    }
                    for kx in 0..kw {
                        let ix = x0 + (kx * self.dilation[1]) as isize;
                        let d = &mut dst[kx * c..(kx + 1) * c];
                        if ix < 0 || ix >= w {
                            d.fill(0.0);
                        } else {
                            d.copy_from_slice(&line[ix as usize * c..(ix as usize + 1) * c]);
                        }
                    }
                }
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for the short runs of a kernel row (NatureCNN: 8, 4 and 3 floats): with the length
/// known in each arm the copy is a few vector moves, where the general `copy_from_slice` is a `memmove` call per
/// run — 22 % of NatureCNN's act() at batch 64 went to those calls.
#[inline(always)]
fn copy_run(dst: &mut [f32], src: &[f32]) {
    macro_rules! fixed {
        ($($n:literal)*) => {
            match src.len() {
                $($n => {
                    let s: &[f32; $n] = src.try_into().unwrap();
                    let d: &mut [f32; $n] = dst.try_into().unwrap();
                    *d = *s;
                })*
                _ => dst.copy_from_slice(src),
            }
        };
    }
    fixed!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// 2-D max pooling geometry of one node (`[C, H, W]` → `[C, OH, OW]`).
#[derive(Debug, Clone)]
pub(crate) struct MaxPool2d {
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) k: [usize; 2],
    pub(crate) stride: [usize; 2],
    /// top, left.
    pub(crate) pad: [usize; 2],
    pub(crate) dilation: [usize; 2],
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

impl MaxPool2d {
    /// The maximum over the window's positions inside the input (validation proved every window has one).
    pub(crate) fn run(&self, x: &[f32], y: &mut [f32], batch: usize) {
        let (h, w) = (self.h as isize, self.w as isize);
        let plane_in = self.h * self.w;
        let plane_out = self.oh * self.ow;
        for (xp, yp) in x
            .chunks_exact(plane_in)
            .zip(y.chunks_exact_mut(plane_out))
            .take(batch * self.c)
        {
            for oy in 0..self.oh {
                let y0 = (oy * self.stride[0]) as isize - self.pad[0] as isize;
                for ox in 0..self.ow {
                    let x0 = (ox * self.stride[1]) as isize - self.pad[1] as isize;
                    let mut m = f32::NEG_INFINITY;
                    for ky in 0..self.k[0] {
                        let iy = y0 + (ky * self.dilation[0]) as isize;
                        if iy < 0 || iy >= h {
                            continue;
                        }
                        for kx in 0..self.k[1] {
                            let ix = x0 + (kx * self.dilation[1]) as isize;
                            if ix >= 0 && ix < w {
                                let v = xp[iy as usize * self.w + ix as usize];
                                // NaN propagates, as in PyTorch.
                                if v > m || v.is_nan() {
                                    m = v;
                                }
                            }
                        }
                    }
                    yp[oy * self.ow + ox] = m;
                }
            }
        }
    }
}

/// Layer normalisation over groups of `last` values: two passes (mean, then the centred variance) in f32.
pub(crate) fn layer_norm(
    x: &[f32],
    y: &mut [f32],
    last: usize,
    scale: Option<&[f32]>,
    bias: Option<&[f32]>,
    epsilon: f32,
) {
    let inv_n = 1.0 / last as f32;
    for (xg, yg) in x.chunks_exact(last).zip(y.chunks_exact_mut(last)) {
        let mean = xg.iter().sum::<f32>() * inv_n;
        let var = xg.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() * inv_n;
        let r = 1.0 / (var + epsilon).sqrt();
        for (i, (o, v)) in yg.iter_mut().zip(xg).enumerate() {
            *o = (v - mean) * r * scale.map_or(1.0, |s| s[i]) + bias.map_or(0.0, |b| b[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    /// Direct convolution in f64, straight from the definition, for the tests.
    #[allow(clippy::too_many_arguments)]
    fn conv_ref(
        x: &[f32],
        wt: &[f32],
        ws: [usize; 4],
        b: &[f32],
        [c, h, w]: [usize; 3],
        stride: [usize; 2],
        pad: [usize; 4],
        dil: [usize; 2],
        groups: usize,
        [oh, ow]: [usize; 2],
    ) -> Vec<f64> {
        let (o, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
        let og = o / groups;
        let mut y = vec![0.0f64; o * oh * ow];
        for oc in 0..o {
            let g = oc / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b[oc] as f64;
                    for ci in 0..cg {
                        let ch = g * cg + ci;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * stride[0] + ky * dil[0]) as isize - pad[0] as isize;
                                let ix = (ox * stride[1] + kx * dil[1]) as isize - pad[1] as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                    acc += x[ch * h * w + iy as usize * w + ix as usize] as f64
                                        * wt[((oc * cg + ci) * kh + ky) * kw + kx] as f64;
                                }
                            }
                        }
                    }
                    y[(oc * oh + oy) * ow + ox] = acc;
                }
            }
        }
        let _ = c;
        y
    }

    fn lcg(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// An unpadded, undilated, one-group convolution of `input` (`[C, H, W]`) by weights of shape `ws` with
    /// seeded weights and bias (returned too), and its output height and width.
    fn unpadded(
        isa: Isa,
        input: [usize; 3],
        ws: [usize; 4],
        stride: [usize; 2],
        layout: ConvInput,
        seed: u32,
    ) -> (Conv2d, Vec<f32>, Vec<f32>, usize, usize) {
        let oh = (input[1] - ws[2]) / stride[0] + 1;
        let ow = (input[2] - ws[3]) / stride[1] + 1;
        let wt = lcg(ws.iter().product(), seed);
        let b = lcg(ws[0], seed + 100);
        let conv = Conv2d::new(
            isa,
            &wt,
            &ws,
            Some(&b),
            &input,
            &[ws[0], oh, ow],
            stride,
            [0; 4],
            [1, 1],
            1,
            layout,
        );
        (conv, wt, b, oh, ow)
    }

    /// Strides, asymmetric padding, dilation and groups against the definition, on every instruction set here.
    #[test]
    fn conv2d_matches_the_definition() {
        let cases: &[(
            [usize; 3],
            [usize; 4],
            [usize; 2],
            [usize; 4],
            [usize; 2],
            usize,
        )] = &[
            ([4, 12, 12], [8, 4, 8, 8], [4, 4], [0, 0, 0, 0], [1, 1], 1),
            ([3, 9, 7], [6, 1, 3, 3], [1, 2], [1, 0, 2, 1], [1, 1], 3),
            ([2, 10, 10], [5, 2, 3, 2], [2, 1], [1, 1, 1, 1], [2, 3], 1),
            ([16, 5, 5], [32, 16, 1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
            // Read in place when channels-last (no padding): 3 envs × 196 pixels = 588 rows (six 96-row blocks,
            // a ragged last tile), 40 outputs (two 32-wide panels, the second ragged), odd run length 12.
            ([3, 30, 30], [40, 3, 4, 4], [2, 2], [0, 0, 0, 0], [1, 1], 1),
            // A stride that leaves the input's last column unread.
            ([2, 11, 11], [24, 2, 3, 3], [3, 4], [0, 0, 0, 0], [1, 1], 1),
        ];
        // Every kernel family this CPU runs (detect() would pick only the widest).
        for isa in kernels::available() {
            for (ci, &(input, ws, stride, pad, dil, groups)) in cases.iter().enumerate() {
                let oh = (input[1] + pad[0] + pad[2] - dil[0] * (ws[2] - 1) - 1) / stride[0] + 1;
                let ow = (input[2] + pad[1] + pad[3] - dil[1] * (ws[3] - 1) - 1) / stride[1] + 1;
                let batch = 3;
                let x = lcg(batch * input.iter().product::<usize>(), 1 + ci as u32);
                let wt = lcg(ws.iter().product(), 100 + ci as u32);
                let b = lcg(ws[0], 200 + ci as u32);
                let n_in: usize = input.iter().product();
                // Channels-first as given; channels-last (one group) from the `[H, W, C]` transpose of the raw
                // input `(x - shift) / scale`, with the affine folded in (a shift only without padding).
                let mut layouts = vec![ConvInput::ChannelsFirst];
                if groups == 1 {
                    let shift = if pad.iter().all(|p| *p == 0) {
                        0.25
                    } else {
                        0.0
                    };
                    layouts.push(ConvInput::ChannelsLast { scale: 0.5, shift });
                }
                for layout in layouts {
                    let [c, h, w] = input;
                    let xin: Vec<f32> = match layout {
                        ConvInput::ChannelsFirst => x.clone(),
                        ConvInput::ChannelsLast { scale, shift } => (0..batch * n_in)
                            .map(|i| {
                                let (bi, r) = (i / n_in, i % n_in);
                                let (yy, xx, ch) = (r / (w * c), r / c % w, r % c);
                                (x[bi * n_in + (ch * h + yy) * w + xx] - shift) / scale
                            })
                            .collect(),
                    };
                    let conv = Conv2d::new(
                        isa,
                        &wt,
                        &ws,
                        Some(&b),
                        &input,
                        &[ws[0], oh, ow],
                        stride,
                        pad,
                        dil,
                        groups,
                        layout,
                    );
                    let n_out = ws[0] * oh * ow;
                    let mut y = vec![f32::NAN; batch * n_out];
                    let (mut p, mut r) = (vec![], vec![]);
                    conv.run(&xin, &mut y, batch, Act::Relu, &mut p, &mut r);
                    for bi in 0..batch {
                        let want = conv_ref(
                            &x[bi * n_in..(bi + 1) * n_in],
                            &wt,
                            ws,
                            &b,
                            input,
                            stride,
                            pad,
                            dil,
                            groups,
                            [oh, ow],
                        );
                        for (i, (g, w)) in y[bi * n_out..(bi + 1) * n_out]
                            .iter()
                            .zip(&want)
                            .enumerate()
                        {
                            let w = w.max(0.0);
                            assert!(
                                (*g as f64 - w).abs() < 1e-5,
                                "{isa:?} {layout:?} case {ci} env {bi} element {i}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Regression (a warm threaded act allocated on `dict_obs`: a thread's one-env part sized the channels-first
    /// chunk buffer, a later larger part grew it): the first run sizes the buffers for every batch, within
    /// [`Conv2d::scratch_max`] (what the executor reserves), on either path (im2col; read in place, channels-first
    /// chunks).
    #[test]
    fn scratch_max_covers_every_batch() {
        for isa in kernels::available() {
            for (ci, (input, ws, stride)) in [
                (
                    [3usize, 30usize, 30usize],
                    [40usize, 3usize, 4usize, 4usize],
                    [2usize, 2usize],
                ),
                ([2, 11, 11], [24, 2, 3, 3], [3, 4]),
                ([16, 5, 5], [32, 16, 1, 1], [1, 1]),
            ]
            .into_iter()
            .enumerate()
            {
                for layout in [
                    ConvInput::ChannelsFirst,
                    ConvInput::ChannelsLast {
                        scale: 1.0,
                        shift: 0.0,
                    },
                ] {
                    let (conv, _, _, oh, ow) =
                        unpadded(isa, input, ws, stride, layout, 7 + ci as u32);
                    // Both output layouts (channels-last rows straight from the GEMM, or scattered channels-first).
                    for conv in [conv.clone(), conv.with_channels_last_output()] {
                        // From empty buffers: the first run (one env) sizes them for every batch after it, within
                        // `scratch_max`; later, larger runs move nothing.
                        let (sp, sr) = conv.scratch_max();
                        let (mut p, mut r) = (vec![], vec![]);
                        let mut first = None;
                        let n_in: usize = input.iter().product();
                        for batch in [1, 2, 9, 3, 40] {
                            let x = lcg(batch * n_in, 9);
                            let mut y = vec![0.0; batch * ws[0] * oh * ow];
                            conv.run(&x, &mut y, batch, Act::Relu, &mut p, &mut r);
                            let now = (p.len(), r.len(), p.as_ptr(), r.as_ptr());
                            assert!(
                                now.0 <= sp && now.1 <= sr && *first.get_or_insert(now) == now,
                                "{isa:?} {layout:?} nhwc out {} case {ci} batch {batch}: buffers ({}, {}) after {first:?}, \
                             scratch_max ({sp}, {sr})",
                                conv.out_nhwc,
                                now.0,
                                now.1
                            );
                        }
                    }
                }
            }
        }
    }

    /// The bf16 convolution read in place (even channel counts) computes the definition on bf16-rounded inputs
    /// and weights, summed in f32: exact but for the summation order, across blocks, tiles, ragged panels and
    /// envs. (x86-64 only: the bf16 kernels are AVX512-BF16's.)
    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(
        not(policyport_host_avx512bf16),
        ignore = "needs a CPU with AVX512-BF16 (guest/build.rs found none on this machine)"
    )]
    fn bf16_conv_read_in_place_matches_the_rounded_definition() {
        use crate::dense_bf16::round_bf16;
        for (ci, &(input, ws, stride)) in [
            (
                [4usize, 84usize, 84usize],
                [32usize, 4usize, 8usize, 8usize],
                [4usize, 4usize],
            ),
            ([32, 9, 9], [64, 32, 3, 3], [1, 1]),
            ([2, 30, 30], [40, 2, 4, 4], [2, 2]),
        ]
        .iter()
        .enumerate()
        {
            let [c, h, w] = input;
            let batch = 3;
            let n_in = c * h * w;
            let x = lcg(batch * n_in, 11 + ci as u32);
            let layout = ConvInput::ChannelsLast {
                scale: 1.0,
                shift: 0.0,
            };
            let (mut conv, wt, b, oh, ow) =
                unpadded(Isa::Avx512, input, ws, stride, layout, 111 + ci as u32);
            conv.set_precision(crate::Precision::Bf16);
            assert!(conv.reads_in_place() && conv.groups[0].rows_must_be_even());
            // The channels-last input and the channels-first reference both from the rounded values.
            let xr: Vec<f32> = x.iter().map(|v| round_bf16(*v)).collect();
            let wr: Vec<f32> = wt.iter().map(|v| round_bf16(*v)).collect();
            let nhwc: Vec<f32> = (0..batch * n_in)
                .map(|i| {
                    let (bi, r) = (i / n_in, i % n_in);
                    let (yy, xx, ch) = (r / (w * c), r / c % w, r % c);
                    x[bi * n_in + (ch * h + yy) * w + xx]
                })
                .collect();
            let n_out = ws[0] * oh * ow;
            let mut y = vec![f32::NAN; batch * n_out];
            conv.run(
                &nhwc,
                &mut y,
                batch,
                Act::Identity,
                &mut vec![],
                &mut vec![],
            );
            for bi in 0..batch {
                let want = conv_ref(
                    &xr[bi * n_in..(bi + 1) * n_in],
                    &wr,
                    ws,
                    &b,
                    input,
                    stride,
                    [0; 4],
                    [1, 1],
                    1,
                    [oh, ow],
                );
                let kdim = (ws[1] * ws[2] * ws[3]) as f64;
                for (i, (g, wv)) in y[bi * n_out..(bi + 1) * n_out]
                    .iter()
                    .zip(&want)
                    .enumerate()
                {
                    assert!(
                        (*g as f64 - wv).abs() < 2e-6 * (1.0 + wv.abs()) * kdim.sqrt(),
                        "case {ci} env {bi} element {i}: {g} vs {wv}"
                    );
                }
            }
        }
    }

    #[test]
    fn max_pool_ignores_padding_and_layer_norm_centres() {
        // 1 channel 3x3, kernel 3 stride 2 pad 1 (IMPALA's pool): windows at the border see only the input.
        let x: Vec<f32> = (1..=9).map(|v| -(v as f32)).collect();
        let pool = MaxPool2d {
            c: 1,
            h: 3,
            w: 3,
            k: [3, 3],
            stride: [2, 2],
            pad: [1, 1],
            dilation: [1, 1],
            oh: 2,
            ow: 2,
        };
        let mut y = vec![0.0; 4];
        pool.run(&x, &mut y, 1);
        assert_eq!(y, vec![-1.0, -2.0, -4.0, -5.0]);
        let mut z = vec![0.0; 4];
        layer_norm(
            &[1.0, 2.0, 3.0, 4.0],
            &mut z,
            4,
            Some(&[1.0, 1.0, 2.0, 2.0]),
            None,
            0.0,
        );
        let s = (1.25f32).sqrt();
        assert!(
            (z[0] + 1.5 / s).abs() < 1e-6 && (z[3] - 3.0 / s).abs() < 1e-6,
            "{z:?}"
        );
    }
}
