//! The native CPU executor: the lowered graph run by hand-written kernels ([`crate::dense`],
//! [`crate::kernels`]) over per-session buffers allocated once per batch size. Dense layers are fused with their
//! bias and the activation the lowering fused into them, with weights packed at load for the CPU's vector width,
//! so an MLP step is one pass per layer. The program (packed weights) is immutable and shared by every session;
//! a session's [`CpuScratch`] holds the buffers. No allocation once warm.

use std::sync::{Arc, Mutex};

use policyport_format::{Artifact, Op, ValidatedPlan};

use crate::backend::Backend;
use crate::conv::{Conv2d, ConvInput, MaxPool2d, layer_norm};
use crate::dense::PackedDense;
use crate::error::{PolicyError, try_resize};
use crate::executor::{ExecScratch, Executor, Pending, StepInput, scratch_of};
use crate::kernels::{self, Act, Isa};
use crate::lend::DenseLender;
use crate::lower::{
    act_of, affine_group, expand_affine, lower, needed_without_readback, transpose_index,
};
use crate::pool::{RowPool, Split};
use crate::thread_split::{Choice, SplitChooser, ThreadSplit, now_ns};

#[derive(Debug, Clone)]
enum Instr {
    Dense {
        x: usize,
        dense: PackedDense,
        act: Act,
        out: usize,
    },
    /// Two narrow dense layers on the same input with the same activation (a policy head's logits and the value
    /// head: 4 + 1 outputs) as one: each alone fills a 16-wide panel with mostly padding, so both in one panel
    /// halve their cost. The joint rows go to a scratch buffer, then `outs[0]` takes the first `n` columns and
    /// `outs[1]` the rest.
    DenseSplit {
        x: usize,
        dense: PackedDense,
        act: Act,
        outs: [(usize, usize); 2],
    },
    Act {
        x: usize,
        f: Act,
        out: usize,
    },
    Softmax {
        x: usize,
        last: usize,
        log: bool,
        out: usize,
    },
    Add {
        a: usize,
        b: usize,
        out: usize,
    },
    Mul {
        a: usize,
        b: usize,
        out: usize,
    },
    Affine {
        x: usize,
        scale: Option<Vec<f32>>,
        shift: Option<Vec<f32>>,
        group: usize,
        out: usize,
    },
    Concat {
        xs: Vec<(usize, usize)>,
        out: usize,
    },
    Slice {
        x: usize,
        last: usize,
        start: usize,
        len: usize,
        out: usize,
    },
    Copy {
        x: usize,
        out: usize,
    },
    Conv {
        x: usize,
        conv: Box<Conv2d>,
        act: Act,
        out: usize,
    },
    MaxPool {
        x: usize,
        pool: MaxPool2d,
        out: usize,
    },
    LayerNorm {
        x: usize,
        last: usize,
        scale: Option<Vec<f32>>,
        bias: Option<Vec<f32>>,
        epsilon: f32,
        out: usize,
    },
    /// `y[i] = x[index[i]]` per env (Transpose).
    Gather {
        x: usize,
        index: Vec<u32>,
        out: usize,
    },
}

/// What a step that skips the value runs in place of one instruction ([`CpuExecutor::without_value`]).
#[derive(Debug, Clone)]
enum WithoutValue {
    Run,
    Skip,
    Instead(Instr),
}

/// The program's instructions and the replacements its steps without the value run (each packed dense layer
/// among them gets the program's precision and lender).
fn every_instr<'a>(
    instrs: &'a mut [Instr],
    without_value: &'a mut [WithoutValue],
) -> impl Iterator<Item = &'a mut Instr> {
    instrs
        .iter_mut()
        .chain(without_value.iter_mut().filter_map(|w| match w {
            WithoutValue::Instead(i) => Some(i),
            _ => None,
        }))
}

#[derive(Debug, Clone)]
pub(crate) struct CpuExecutor {
    isa: Isa,
    instrs: Vec<Instr>,
    /// Per instruction, what a step that does not want the value ([`StepInput::skip_value`]) runs instead: the
    /// instruction, nothing (it computes only the value: a PPO critic's own layers), or, for a DenseSplit with
    /// one half only the value needs (a PPO actor's and critic's first layers on the same observation), the
    /// other half's dense layer alone.
    without_value: Vec<WithoutValue>,
    /// The readback entry of the value estimate when it is nothing else's: a step that skips the value writes
    /// zeros there (its slot holds whatever an earlier step left).
    value_readback: Option<usize>,
    slot_numel: Vec<usize>,
    /// The widest `DenseSplit` joint row (`n1 + n2`), 0 without one: the split scratch per row.
    split_width: usize,
    /// The largest patch and result buffers a convolution uses ([`crate::conv::Conv2d::scratch_max`]), any batch.
    conv_scratch: (usize, usize),
    obs_slot: usize,
    state_slots: Vec<(usize, usize)>,
    state_sizes: Vec<usize>,
    readback: Vec<(usize, usize)>,
    row_width: usize,
    /// [`Executor::extra_bytes_per_row`]: the largest bf16 pair buffer a layer needs per row (0 in f32).
    bf16_bytes_per_row: u64,
    /// Rows a thread runs through the whole program at a time ([`BLOCK_BYTES`]).
    block_rows: usize,
}

/// One thread's buffers: one per value slot, grown to the largest part of a batch seen.
#[derive(Default)]
struct Bufs {
    bufs: Vec<Vec<f32>>,
    /// Convolution: one env's patch matrix and GEMM result (see [`crate::conv`]).
    patches: Vec<f32>,
    result: Vec<f32>,
    /// The joint rows of a [`Instr::DenseSplit`].
    split: Vec<f32>,
}

/// One session's data: the caller thread's buffers, and with [`Session::set_threads`](crate::Session::set_threads)
/// the session's workers and theirs.
pub(crate) struct CpuScratch {
    main: Bufs,
    threads: Option<Threads>,
    /// Whether a step splits over the threads: the mode ([`crate::Session::set_thread_split`], kept when the
    /// threads change) and the measured time of both ways (see [`crate::thread_split`]; started afresh with new
    /// threads).
    chooser: SplitChooser,
}

struct Threads {
    pool: RowPool,
    /// Time the caller spent waking the workers ahead of the next step ([`Executor::wake_threads`]), in ns:
    /// counted into that step's time if it splits.
    wake_ns: u64,
    /// Worker `i`'s buffers at `i - 1` (each locked only by its own part: never contended).
    bufs: Vec<Mutex<Bufs>>,
}

/// Fewest batch rows worth a thread of their own: below this the hand-off costs more than the rows (measured on
/// the benchmark MLP, see the README's thread table).
const MIN_ROWS_PER_THREAD: usize = 8;

/// Fewest rows in a part of a split step, unless the batch gives a thread fewer (four AVX-512 dense tiles).
const PART_MIN_ROWS: usize = 48;

/// The activation bytes (every value slot of a row, the DenseSplit scratch) of the rows a thread runs through the
/// whole program at a time. Why blocks: layer by layer over a big batch, each layer writes its whole output before
/// the next reads it back, and past L2 that traffic goes to L3 or memory: CartPole's 64-64 MLP at 10 000 rows
/// keeps ~5 MB of activations. Run in blocks that fit L2, each block passes every layer while its activations
/// stay there (and the buffers are a block, not the batch). Measured (Zen 5, 1 MB L2, tick_bench with other
/// work between acts as in a game): CartPole at 10 000 agents 1 033 -> 844 µs per act with 256 KB blocks (831
/// with 512 KB), and the Bevy plugin's action pass after the act 54 -> 24 µs (the game's components were no
/// longer evicted by the activations); warm back-to-back acts 1-3 % faster at 1 024-10 000 rows, unchanged at 64.
/// 256 KB: half of the smallest L2 of the x86 cores tuned for (Zen 2/3, 512 KB).
const BLOCK_BYTES: usize = 256 * 1024;

/// Fewest rows in a block: the dense kernels' own row block (8 AVX-512 or 16 AVX2 tiles), so that a wide
/// network's blocks still reuse each weight panel as a whole batch would.
const BLOCK_MIN_ROWS: usize = 96;

/// The step's output rows, shared by the parts: each part writes only its own disjoint row range.
#[derive(Clone, Copy)]
struct RowsPtr(*mut f32);
// SAFETY: the pointer is only turned into slices through `slice`, whose contract makes them disjoint (each part
// of `launch` writes its own row range), and `launch` waits for every part before `rows` is touched again.
unsafe impl Send for RowsPtr {}
// SAFETY: shared by reference with the pool's workers only to be copied out (`Copy`); as for `Send`, the
// slices made from it never overlap and do not outlive `launch`'s `pool.run`.
unsafe impl Sync for RowsPtr {}

impl RowsPtr {
    /// # Safety
    /// `start + len` numbers exist behind the pointer, live for `'a`, and no other live slice overlaps these.
    unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [f32] {
        // SAFETY: the caller's contract: `start..start + len` lies inside one live allocation of f32s (so `add`
        // stays in bounds and the slice is valid and aligned), and nothing else aliases it for `'a`.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

impl CpuExecutor {
    pub(crate) fn new(art: &Artifact, plan: &ValidatedPlan, readback_values: &[&str]) -> Self {
        Self::with_lender(art, plan, readback_values, None, crate::Precision::F32)
    }

    /// [`new`](Self::new), every dense layer and convolution GEMM offered to `lender` ([`crate::lend`]), and in
    /// `precision` (the caller checked that this CPU has its kernel).
    pub(crate) fn with_lender(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        lender: Option<&Arc<dyn DenseLender>>,
        precision: crate::Precision,
    ) -> Self {
        let low = lower(art, plan, readback_values);
        let isa = kernels::detect();
        let partner = narrow_dense_pairs(art, &low.nodes, crate::dense::narrow_width(isa));
        let (channels_last, absorbed, nhwc_out) = channels_last_convs(art, &low);
        // The value estimate's readback entry (step programs of a policy with a critic), and the nodes only it
        // needs. A probe program reading values other than the value estimate has none.
        let value_readback = plan.head.value.as_deref().and_then(|v| {
            let i = readback_values.iter().position(|r| *r == v)?;
            let slot = low.readback[i].0;
            let shared = low
                .readback
                .iter()
                .enumerate()
                .any(|(j, (s, _))| j != i && *s == slot);
            (!shared).then_some(i)
        });
        let needed = match value_readback {
            Some(i) => needed_without_readback(&low, i),
            None => vec![true; low.nodes.len()],
        };
        let mut instrs = vec![];
        // The node(s) of each instruction, filled as the loop below pushes them (node `i`, and a DenseSplit's
        // partner).
        let mut instr_nodes: Vec<(usize, Option<usize>)> = vec![];
        let mut pushed_nodes = (0, None);
        for (i, n) in low.nodes.iter().enumerate() {
            instr_nodes.resize(instrs.len(), pushed_nodes);
            pushed_nodes = match partner[i] {
                Pair::First(j) => (i, Some(j)),
                _ => (i, None),
            };
            if absorbed[i] {
                continue;
            }
            let (ins, out, last) = (&n.ins, n.out, n.in_last[0]);
            match partner[i] {
                Pair::Second => continue,
                Pair::First(j) => {
                    let (a, b) = (dense_weights(art, n), dense_weights(art, &low.nodes[j]));
                    let k = a.1;
                    let w: Vec<f32> = a.0.iter().chain(b.0).copied().collect();
                    let bias: Vec<f32> = a.3.iter().chain(&b.3).copied().collect();
                    instrs.push(Instr::DenseSplit {
                        x: ins[0],
                        dense: PackedDense::new(isa, &w, a.2 + b.2, k, Some(&bias)),
                        act: n.act,
                        outs: [(out, a.2), (low.nodes[j].out, b.2)],
                    });
                    continue;
                }
                Pair::None => {}
            }
            instrs.push(match n.op {
                Op::Dense { .. } => dense_instr(art, isa, n),
                Op::Softmax => Instr::Softmax {
                    x: ins[0],
                    last,
                    log: false,
                    out,
                },
                Op::LogSoftmax => Instr::Softmax {
                    x: ins[0],
                    last,
                    log: true,
                    out,
                },
                Op::Add => Instr::Add {
                    a: ins[0],
                    b: ins[1],
                    out,
                },
                Op::Mul => Instr::Mul {
                    a: ins[0],
                    b: ins[1],
                    out,
                },
                Op::Affine { scale, shift } => {
                    let group = affine_group(art, scale, shift, low.slot_numel[ins[0]], last);
                    let e = |t: &Option<String>| {
                        t.as_ref()
                            .map(|t| expand_affine(&art.tensors[t].data, group))
                    };
                    Instr::Affine {
                        x: ins[0],
                        scale: e(scale),
                        shift: e(shift),
                        group,
                        out,
                    }
                }
                Op::Concat => Instr::Concat {
                    xs: ins.iter().copied().zip(n.in_last.iter().copied()).collect(),
                    out,
                },
                Op::Slice { start, len } => Instr::Slice {
                    x: ins[0],
                    last,
                    start: *start,
                    len: *len,
                    out,
                },
                Op::Flatten | Op::Reshape { .. } => Instr::Copy { x: ins[0], out },
                Op::Transpose { perm } => Instr::Gather {
                    x: ins[0],
                    index: transpose_index(&n.in_shapes[0], perm),
                    out,
                },
                Op::Conv2d {
                    weight,
                    bias,
                    stride,
                    padding,
                    dilation,
                    groups,
                } => {
                    let t = &art.tensors[weight];
                    let (x, layout) =
                        channels_last[i].unwrap_or((ins[0], ConvInput::ChannelsFirst));
                    let conv = Conv2d::new(
                        isa,
                        &t.data,
                        &t.shape,
                        bias.as_ref().map(|b| &art.tensors[b].data[..]),
                        &n.in_shapes[0],
                        &n.out_shape,
                        *stride,
                        *padding,
                        *dilation,
                        *groups,
                        layout,
                    );
                    Instr::Conv {
                        x,
                        conv: Box::new(if nhwc_out[i] {
                            conv.with_channels_last_output()
                        } else {
                            conv
                        }),
                        act: n.act,
                        out,
                    }
                }
                Op::MaxPool2d {
                    kernel,
                    stride,
                    padding,
                    dilation,
                } => {
                    let (i, o) = (&n.in_shapes[0], &n.out_shape);
                    Instr::MaxPool {
                        x: ins[0],
                        pool: MaxPool2d {
                            c: i[0],
                            h: i[1],
                            w: i[2],
                            k: *kernel,
                            stride: *stride,
                            pad: [padding[0], padding[1]],
                            dilation: *dilation,
                            oh: o[1],
                            ow: o[2],
                        },
                        out,
                    }
                }
                Op::LayerNorm {
                    scale,
                    bias,
                    epsilon,
                } => Instr::LayerNorm {
                    x: ins[0],
                    last,
                    scale: scale.as_ref().map(|t| art.tensors[t].data.clone()),
                    bias: bias.as_ref().map(|t| art.tensors[t].data.clone()),
                    epsilon: *epsilon,
                    out,
                },
                other => Instr::Act {
                    x: ins[0],
                    f: act_of(other).expect("remaining ops are activations"),
                    out,
                },
            });
        }
        instr_nodes.resize(instrs.len(), pushed_nodes);
        let dense_of = |i: usize| dense_instr(art, isa, &low.nodes[i]);
        let mut without_value: Vec<WithoutValue> = instr_nodes
            .iter()
            .map(
                |&(i, partner)| match (needed[i], partner.map(|j| (j, needed[j]))) {
                    (true, None | Some((_, true))) => WithoutValue::Run,
                    (false, None | Some((_, false))) => WithoutValue::Skip,
                    (true, Some((_, false))) => WithoutValue::Instead(dense_of(i)),
                    (false, Some((j, true))) => WithoutValue::Instead(dense_of(j)),
                },
            )
            .collect();
        // Precision first: a bf16 layer is not lent (the lenders compute f32).
        for instr in every_instr(&mut instrs, &mut without_value) {
            match instr {
                Instr::Dense { dense, .. } | Instr::DenseSplit { dense, .. } => {
                    dense.set_precision(precision)
                }
                Instr::Conv { conv, .. } => conv.set_precision(precision),
                _ => {}
            }
        }
        if let Some(lender) = lender {
            for instr in every_instr(&mut instrs, &mut without_value) {
                match instr {
                    Instr::Dense { dense, .. } | Instr::DenseSplit { dense, .. } => {
                        dense.lend(lender)
                    }
                    Instr::Conv { conv, .. } => conv.lend(lender),
                    _ => {}
                }
            }
        }
        let bf16_bytes_per_row = every_instr(&mut instrs, &mut without_value)
            .map(|i| match i {
                Instr::Dense { dense, .. } | Instr::DenseSplit { dense, .. } => {
                    dense.bf16_bytes_per_row()
                }
                Instr::Conv { conv, .. } => conv.bf16_bytes_per_env(),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        // The convolutions' patch and result buffers at their largest, whatever the batch (after precision and
        // lending, which decide each one's path): reserved with the activations, so no part grows them.
        let conv_scratch = every_instr(&mut instrs, &mut without_value)
            .filter_map(|i| match i {
                Instr::Conv { conv, .. } => Some(conv.scratch_max()),
                _ => None,
            })
            .fold((0, 0), |(p, r), (cp, cr)| (p.max(cp), r.max(cr)));
        // The widest joint row of a DenseSplit (its scratch per row), found once here, not per act().
        let split_width = instrs
            .iter()
            .filter_map(|i| match i {
                Instr::DenseSplit {
                    outs: [(_, n1), (_, n2)],
                    ..
                } => Some(n1 + n2),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let bytes_per_row = (low.slot_numel.iter().sum::<usize>() + split_width)
            .saturating_mul(std::mem::size_of::<f32>())
            .max(1);
        let block_rows = (BLOCK_BYTES / bytes_per_row / BLOCK_MIN_ROWS).max(1) * BLOCK_MIN_ROWS;
        CpuExecutor {
            block_rows,
            bf16_bytes_per_row,
            isa,
            split_width,
            conv_scratch,
            instrs,
            without_value,
            value_readback,
            slot_numel: low.slot_numel,
            obs_slot: low.obs_slot,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            state_slots: low.state_slots,
            row_width: low.readback.iter().map(|(_, n)| n).sum(),
            readback: low.readback,
        }
    }

    /// `b`'s activation buffers grown for a part of `rows` rows before [`CpuExecutor::run`] (which then only
    /// writes within them): fallibly, so a plan whose activations the machine cannot hold is
    /// [`PolicyError::Allocation`], not an abort.
    fn reserve(&self, b: &mut Bufs, rows: usize) -> Result<(), PolicyError> {
        if b.bufs.len() != self.slot_numel.len() {
            b.bufs.resize(self.slot_numel.len(), vec![]);
        }
        for (buf, n) in b.bufs.iter_mut().zip(&self.slot_numel) {
            let len = rows.saturating_mul(*n);
            if buf.len() < len {
                try_resize(buf, len, 0.0, "the policy's activations")?;
            }
        }
        let split = rows.saturating_mul(self.split_width);
        if b.split.len() < split {
            try_resize(&mut b.split, split, 0.0, "the policy's activations")?;
        }
        let (patches, result) = self.conv_scratch;
        if b.patches.len() < patches {
            try_resize(&mut b.patches, patches, 0.0, "a convolution's patches")?;
        }
        if b.result.len() < result {
            try_resize(&mut b.result, result, 0.0, "a convolution's result")?;
        }
        Ok(())
    }

    /// Rows `r0 .. r0 + rows` of a step of `total` rows, [`CpuExecutor::run`] a block of at most `block_rows`
    /// rows at a time (see [`BLOCK_BYTES`]); `out` holds the part's rows (`rows x row_width`). A row's result
    /// does not depend on the rows run beside it (the threads' parts rely on that too): blocks change no number.
    #[allow(clippy::too_many_arguments)]
    fn run_blocks(
        &self,
        scratch: &mut Bufs,
        r0: usize,
        rows: usize,
        total: usize,
        obs: &[f32],
        states: &[Vec<f32>],
        skip_value: bool,
        out: &mut [f32],
    ) {
        // By row index, not `chunks_mut` of the output: a plan reads back no number per row only if hostile, and
        // a chunk size of 0 would panic.
        let width = self.row_width;
        let mut first = 0;
        while first < rows {
            let n = self.block_rows.min(rows - first);
            let part = &mut out[first * width..(first + n) * width];
            self.run(scratch, r0 + first, n, total, obs, states, skip_value, part);
            first += n;
        }
    }

    /// The rows of `b`'s buffers for a part of `rows` rows: a block at most.
    fn block_of(&self, rows: usize) -> usize {
        rows.min(self.block_rows)
    }

    /// One step for rows `r0 .. r0 + batch` of a step of `total` rows (`obs`, `states`: the whole step's); the
    /// readback values concatenated per row go to `out` (`batch x row_width`).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        scratch: &mut Bufs,
        r0: usize,
        batch: usize,
        total: usize,
        obs: &[f32],
        states: &[Vec<f32>],
        skip_value: bool,
        out: &mut [f32],
    ) {
        let Bufs {
            bufs,
            patches,
            result,
            split,
        } = scratch;
        if bufs.len() != self.slot_numel.len() {
            bufs.resize(self.slot_numel.len(), vec![]);
        }
        for (buf, n) in bufs.iter_mut().zip(&self.slot_numel) {
            if buf.len() < batch * n {
                buf.resize(batch * n, 0.0);
            }
        }
        // The observation is read where it is (the session's buffer), not copied into its slot: NatureCNN's
        // frames are 28 224 numbers per env.
        let obs_width = obs.len() / total.max(1);
        let obs = &obs[r0 * obs_width..(r0 + batch) * obs_width];
        let obs_slot = self.obs_slot;
        for ((slot, n), data) in self.state_slots.iter().zip(states) {
            bufs[*slot][..batch * n].copy_from_slice(&data[r0 * n..(r0 + batch) * n]);
        }
        let isa = self.isa;
        for (instr, without_value) in self.instrs.iter().zip(&self.without_value) {
            let instr = match (skip_value, without_value) {
                (false, _) | (true, WithoutValue::Run) => instr,
                (true, WithoutValue::Skip) => continue,
                (true, WithoutValue::Instead(other)) => other,
            };
            if let Instr::DenseSplit {
                x,
                dense,
                act,
                outs: [(o1, n1), (o2, n2)],
            } = instr
            {
                let (n1, n2) = (*n1, *n2);
                if split.len() < batch * (n1 + n2) {
                    split.resize(batch * (n1 + n2), 0.0);
                }
                let tmp = &mut split[..batch * (n1 + n2)];
                let x = &slot_values(bufs, obs, obs_slot, *x)[..batch * self.slot_numel[*x]];
                dense.run(x, tmp, batch, *act);
                for (r, row) in tmp.chunks_exact(n1 + n2).enumerate() {
                    bufs[*o1][r * n1..(r + 1) * n1].copy_from_slice(&row[..n1]);
                    bufs[*o2][r * n2..(r + 1) * n2].copy_from_slice(&row[n1..]);
                }
                continue;
            }
            let out_slot = match instr {
                Instr::DenseSplit { .. } => unreachable!("handled above"),
                Instr::Dense { out, .. }
                | Instr::Act { out, .. }
                | Instr::Softmax { out, .. }
                | Instr::Add { out, .. }
                | Instr::Mul { out, .. }
                | Instr::Affine { out, .. }
                | Instr::Concat { out, .. }
                | Instr::Slice { out, .. }
                | Instr::Copy { out, .. }
                | Instr::Conv { out, .. }
                | Instr::MaxPool { out, .. }
                | Instr::LayerNorm { out, .. }
                | Instr::Gather { out, .. } => *out,
            };
            // Take the output buffer out so inputs can be borrowed alongside it (values are SSA: never the same).
            let mut y_buf = std::mem::take(&mut bufs[out_slot]);
            let y = &mut y_buf[..batch * self.slot_numel[out_slot]];
            let input =
                |s: usize| &slot_values(bufs, obs, obs_slot, s)[..batch * self.slot_numel[s]];
            match instr {
                Instr::DenseSplit { .. } => {}
                Instr::Dense { x, dense, act, .. } => dense.run(input(*x), y, batch, *act),
                Instr::Act { x, f, .. } => {
                    y.copy_from_slice(input(*x));
                    kernels::bias_act(isa, *f, y, None, 1);
                }
                Instr::Softmax { x, last, log, .. } => {
                    y.copy_from_slice(input(*x));
                    kernels::softmax(y, *last, *log);
                }
                Instr::Add { a, b, .. } => {
                    for ((o, p), q) in y.iter_mut().zip(input(*a)).zip(input(*b)) {
                        *o = p + q;
                    }
                }
                Instr::Mul { a, b, .. } => {
                    for ((o, p), q) in y.iter_mut().zip(input(*a)).zip(input(*b)) {
                        *o = p * q;
                    }
                }
                Instr::Affine {
                    x,
                    scale,
                    shift,
                    group,
                    ..
                } => {
                    let (sc, sh) = (scale.as_deref(), shift.as_deref());
                    if *group == 1 {
                        // One scale and shift for every element (uint8 frames / 255): one flat loop the
                        // compiler vectorises (per-group chunks of one element cost 12 % of NatureCNN's act()).
                        let (a, b) = (sc.map_or(1.0, |s| s[0]), sh.map_or(0.0, |s| s[0]));
                        for (o, v) in y.iter_mut().zip(input(*x)) {
                            *o = v * a + b;
                        }
                    } else {
                        let rows = y
                            .chunks_exact_mut(*group)
                            .zip(input(*x).chunks_exact(*group));
                        match (sc, sh) {
                            (Some(a), Some(b)) => rows.for_each(|(yg, xg)| {
                                for (((o, v), s), t) in yg.iter_mut().zip(xg).zip(a).zip(b) {
                                    *o = v * s + t;
                                }
                            }),
                            (Some(a), None) => rows.for_each(|(yg, xg)| {
                                for ((o, v), s) in yg.iter_mut().zip(xg).zip(a) {
                                    *o = v * s;
                                }
                            }),
                            (None, Some(b)) => rows.for_each(|(yg, xg)| {
                                for ((o, v), t) in yg.iter_mut().zip(xg).zip(b) {
                                    *o = v + t;
                                }
                            }),
                            (None, None) => rows.for_each(|(yg, xg)| yg.copy_from_slice(xg)),
                        }
                    }
                }
                Instr::Concat { xs, .. } => {
                    let groups = y.len() / xs.iter().map(|(_, l)| l).sum::<usize>();
                    let mut o = 0;
                    for g in 0..groups {
                        for (s, l) in xs {
                            y[o..o + l].copy_from_slice(&input(*s)[g * l..(g + 1) * l]);
                            o += l;
                        }
                    }
                }
                Instr::Slice {
                    x,
                    last,
                    start,
                    len,
                    ..
                } => {
                    for (yg, xg) in y.chunks_exact_mut(*len).zip(input(*x).chunks_exact(*last)) {
                        yg.copy_from_slice(&xg[*start..start + len]);
                    }
                }
                Instr::Copy { x, .. } => y.copy_from_slice(input(*x)),
                Instr::Conv { x, conv, act, .. } => {
                    conv.run(input(*x), y, batch, *act, patches, result)
                }
                Instr::MaxPool { x, pool, .. } => pool.run(input(*x), y, batch),
                Instr::LayerNorm {
                    x,
                    last,
                    scale,
                    bias,
                    epsilon,
                    ..
                } => layer_norm(
                    input(*x),
                    y,
                    *last,
                    scale.as_deref(),
                    bias.as_deref(),
                    *epsilon,
                ),
                Instr::Gather { x, index, .. } => {
                    for (yr, xr) in y
                        .chunks_exact_mut(index.len())
                        .zip(input(*x).chunks_exact(index.len()))
                    {
                        for (o, &i) in yr.iter_mut().zip(index) {
                            *o = xr[i as usize];
                        }
                    }
                }
            }
            bufs[out_slot] = y_buf;
        }
        let skipped = self.value_readback.filter(|_| skip_value);
        let mut o = 0;
        for r in 0..batch {
            for (i, (slot, n)) in self.readback.iter().enumerate() {
                if skipped == Some(i) {
                    out[o..o + n].fill(0.0);
                } else {
                    let v = slot_values(bufs, obs, obs_slot, *slot);
                    out[o..o + n].copy_from_slice(&v[r * n..(r + 1) * n]);
                }
                o += n;
            }
        }
    }
}

impl Executor for CpuExecutor {
    /// Every buffer sized by the plan or the request grows through `try_resize` / `try_reserve_len`.
    fn allocations_are_fallible(&self) -> bool {
        true
    }

    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        self.row_width
    }

    fn extra_bytes_per_row(&self) -> u64 {
        self.bf16_bytes_per_row
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(CpuScratch {
            main: Bufs::default(),
            threads: None,
            chooser: SplitChooser::new(ThreadSplit::default()),
        })
    }

    fn set_threads(&self, scratch: &mut ExecScratch, threads: usize) -> Result<(), PolicyError> {
        let s = scratch_of::<CpuScratch>(scratch);
        if threads <= 1 {
            s.threads = None;
        } else if s.threads.as_ref().map(|t| t.pool.threads()) != Some(threads) {
            // The old workers (if any) are joined before the new ones start.
            s.threads = None;
            s.chooser = SplitChooser::new(s.chooser.mode());
            s.threads = Some(Threads {
                pool: RowPool::new(threads - 1)?,
                wake_ns: 0,
                bufs: (1..threads).map(|_| Mutex::new(Bufs::default())).collect(),
            });
        }
        Ok(())
    }

    fn threads(&self, scratch: &mut ExecScratch) -> usize {
        scratch_of::<CpuScratch>(scratch)
            .threads
            .as_ref()
            .map_or(1, |t| t.pool.threads())
    }

    fn set_thread_split(&self, scratch: &mut ExecScratch, mode: ThreadSplit) {
        scratch_of::<CpuScratch>(scratch).chooser.set_mode(mode);
    }

    fn thread_split(&self, scratch: &mut ExecScratch) -> ThreadSplit {
        scratch_of::<CpuScratch>(scratch).chooser.mode()
    }

    fn wake_threads(&self, scratch: &mut ExecScratch) {
        // Not when the next step will run on the caller alone: a woken worker spins ~60 µs, on a core that other
        // work may need (that is when a split measures slower).
        let s = scratch_of::<CpuScratch>(scratch);
        if let Some(t) = &mut s.threads
            && s.chooser.next_splits()
        {
            // What the wake costs the caller (a system call per sleeping worker) is part of the split step's
            // cost: added to its time (`launch`), or the chooser would see the split cheaper than it is (measured
            // in Bevy with a game frame between ticks: 100 agents 1.1 µs slower on 2 threads than on one).
            let start = now_ns();
            t.pool.wake();
            if let (Some(start), Some(end)) = (start, now_ns()) {
                t.wake_ns = t.wake_ns.saturating_add(end.saturating_sub(start));
            }
        }
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let s = scratch_of::<CpuScratch>(scratch);
        let (batch, width) = (step.batch, self.row_width);
        rows.clear();
        try_resize(
            rows,
            batch.saturating_mul(width),
            0.0,
            "the act's output rows",
        )?;
        let threads = s.threads.as_ref().map_or(1, |t| {
            t.pool.threads().min(batch / MIN_ROWS_PER_THREAD).max(1)
        });
        // A step big enough to split splits only while that measures faster than the caller alone (or always, if
        // the session says so): see `thread_split`. Timed from here to the last row, both ways.
        let start = if threads > 1 { now_ns() } else { None };
        let measured = start.is_some() && s.chooser.mode() == ThreadSplit::Measured;
        let choice = (threads > 1).then(|| s.chooser.choose(batch, start.is_some()));
        let record = |s: &mut CpuScratch| {
            if let (Some(t), Some(choice), Some(start)) = (&mut s.threads, choice, start)
                && let Some(end) = now_ns()
            {
                // The wake belongs to this step only: a step that did not split drops it (kept, it would be
                // charged to some later split step of any batch size).
                let wake = std::mem::take(&mut t.wake_ns);
                let wake = if choice.split { wake } else { 0 };
                s.chooser.record(
                    choice,
                    batch,
                    end.saturating_sub(start).saturating_add(wake),
                );
            }
        };
        let (
            Some(Threads { pool, bufs, .. }),
            Some(Choice {
                split: true,
                linger,
                ..
            }),
        ) = (&mut s.threads, choice)
        else {
            self.reserve(&mut s.main, self.block_of(batch))?;
            self.run_blocks(
                &mut s.main,
                0,
                batch,
                batch,
                step.obs,
                step.states,
                step.skip_value,
                rows,
            );
            record(s);
            return Ok(Pending::Ready);
        };
        // Parts of the batch that the threads take in turn, shrinking as rows run out (`RowPool::run`: a worker
        // that wakes late takes what is left), none under PART_MIN_ROWS unless a thread's share is smaller (a
        // part runs the whole program: its per-layer costs are paid per part), large ones in whole 12-row tiles
        // (the AVX-512 dense tile).
        let split = Split {
            rows: batch,
            threads,
            min: PART_MIN_ROWS.min(batch / threads),
            align: 12,
        };
        let per = split.largest();
        // Measured, the caller may run the whole batch alone at a later step of this size (a probe, or the split
        // measuring slower): its buffers are sized for the whole batch now (a block of it, as the way without the
        // split runs), not for the largest part, so that a warm act() allocates nothing whichever way it goes.
        // Rows of each one's buffers: a block of what it may run.
        let caller_block = self.block_of(if measured { batch } else { per });
        let part_block = self.block_of(per);
        self.reserve(&mut s.main, caller_block)?;
        for b in bufs.iter().take(threads - 1) {
            self.reserve(&mut lock(b), part_block)?;
        }
        let main = Mutex::new(&mut s.main);
        let out = RowsPtr(rows.as_mut_ptr());
        // Each thread's bf16 input buffer is a thread-local of dense_bf16.rs, sized for the largest part at once
        // (a no-op once it is; see `dense_bf16::reserve_input`): the caller's here, before any part (a caller whose
        // warm-up parts all went to workers would otherwise grow its own in a later act), a worker's at each part
        // it takes. (A worker that took no part yet still grows its own at its first: once, on that thread, not
        // the caller's; the buffer belongs in `Bufs`, reserved with the rest, once the dense kernels take their
        // scratch from the executor.)
        let bf16_bytes = (part_block as u64).saturating_mul(self.bf16_bytes_per_row);
        if bf16_bytes > 0 {
            crate::dense_bf16::reserve_input(
                (caller_block as u64).saturating_mul(self.bf16_bytes_per_row),
            );
        }
        // The workers spin for the next step after this one (a split, most likely), except after the last step of
        // a probe of the split (the caller alone is in use): then they sleep at once, leaving the core to others.
        pool.run(split, linger, &|thread, part| {
            let (r0, r1) = (part.start, part.end);
            if bf16_bytes > 0 && thread > 0 {
                crate::dense_bf16::reserve_input(bf16_bytes);
            }
            // SAFETY: `rows` holds `batch x width` numbers and outlives the job (`pool.run` returns after every
            // part); the parts' row ranges are disjoint.
            let out = unsafe { out.slice(r0 * width, (r1 - r0) * width) };
            // The caller (thread 0) runs its parts with the session's own buffers, worker t with its own.
            let (mut caller, mut worker);
            let b: &mut Bufs = if thread == 0 {
                caller = lock(&main);
                &mut caller
            } else {
                worker = lock(&bufs[thread - 1]);
                &mut worker
            };
            self.run_blocks(
                b,
                r0,
                r1 - r0,
                batch,
                step.obs,
                step.states,
                step.skip_value,
                out,
            );
        })?;
        record(s);
        Ok(Pending::Ready)
    }
}

/// The values of slot `s` for this part's rows: the observation where it is, any other slot from its buffer.
fn slot_values<'a>(bufs: &'a [Vec<f32>], obs: &'a [f32], obs_slot: usize, s: usize) -> &'a [f32] {
    if s == obs_slot { obs } else { &bufs[s] }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A part that panicked poisoned its buffers' lock; their contents are scratch, rewritten by the next step.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which lowered nodes [`Instr::DenseSplit`] joins.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pair {
    None,
    /// Joined with the later node at this index (whose output this one's instruction also writes).
    First(usize),
    Second,
}

/// Pairs of dense nodes on the same input value with the same activation whose outputs together fit one narrow
/// panel (`width`). Moving the second node's work up to the first is sound because values are SSA: its input
/// exists there already, and nothing reads its output before its own position. Linear in the graph: narrow dense
/// nodes are grouped by input, and each is matched among the next few of its group only (a policy's heads are
/// two or three; a hostile graph of 100k nodes on one input must not cost 10^10 comparisons).
fn narrow_dense_pairs(
    art: &Artifact,
    nodes: &[crate::lower::LoweredNode<'_>],
    width: usize,
) -> Vec<Pair> {
    const LOOK_AHEAD: usize = 4;
    let outputs = |n: &crate::lower::LoweredNode<'_>| match n.op {
        Op::Dense { weight, .. } => Some(art.tensors[weight].shape[0]).filter(|&o| o < width),
        _ => None,
    };
    let mut by_input: std::collections::HashMap<usize, Vec<(usize, usize)>> = Default::default();
    for (i, n) in nodes.iter().enumerate() {
        if let Some(o) = outputs(n) {
            by_input.entry(n.ins[0]).or_default().push((i, o));
        }
    }
    let mut pair = vec![Pair::None; nodes.len()];
    for group in by_input.values() {
        for (a, &(i, ni)) in group.iter().enumerate() {
            if pair[i] != Pair::None {
                continue;
            }
            let partner = group[a + 1..].iter().take(LOOK_AHEAD).find(|&&(j, nj)| {
                pair[j] == Pair::None && nodes[j].act == nodes[i].act && ni + nj <= width
            });
            if let Some(&(j, _)) = partner {
                pair[i] = Pair::First(j);
                pair[j] = Pair::Second;
            }
        }
    }
    pair
}

/// A dense node alone (fused activation, its own output slot): the instruction of an unpaired dense node, and a
/// DenseSplit half that a step without the value runs alone.
fn dense_instr(art: &Artifact, isa: Isa, n: &crate::lower::LoweredNode<'_>) -> Instr {
    let Op::Dense { weight, bias } = n.op else {
        unreachable!("called for dense nodes only")
    };
    let t = &art.tensors[weight];
    let b = bias.as_ref().map(|b| &art.tensors[b].data[..]);
    Instr::Dense {
        x: n.ins[0],
        dense: PackedDense::new(isa, &t.data, t.shape[0], t.shape[1], b),
        act: n.act,
        out: n.out,
    }
}

/// A dense node's weights `[n, k]`, k, n and bias (zeros when it has none).
fn dense_weights<'a>(
    art: &'a Artifact,
    n: &crate::lower::LoweredNode<'_>,
) -> (&'a [f32], usize, usize, Vec<f32>) {
    let Op::Dense { weight, bias } = n.op else {
        unreachable!("narrow_dense_pairs pairs dense nodes only")
    };
    let t = &art.tensors[weight];
    let b = bias
        .as_ref()
        .map_or_else(|| vec![0.0; t.shape[0]], |b| art.tensors[b].data.clone());
    (&t.data, t.shape[1], t.shape[0], b)
}

/// Convolutions that read a channels-last observation directly: a one-group Conv2d whose input is the model's
/// own `[H, W, C]` → `[C, H, W]` transpose (perm `[2, 0, 1]`), possibly with a one-number affine (`/255`) before or
/// after it, each value read by nothing else. The transpose (a gather over every pixel) and the affine pass are
/// then not run: the convolution gathers its patches from the `[H, W, C]` value (contiguous kernel rows) with the
/// affine folded into its weights. This is how SB3, CleanRL and RLlib pixel policies arrive (frames from the env
/// are channels-last). Returns, per node, the convolution's input slot and layout, which nodes it absorbed, and
/// which convolutions write channels-last for their readers.
#[allow(clippy::type_complexity)]
fn channels_last_convs(
    art: &Artifact,
    low: &crate::lower::Lowered<'_>,
) -> (Vec<Option<(usize, ConvInput)>>, Vec<bool>, Vec<bool>) {
    let nodes = &low.nodes;
    let mut producer = vec![usize::MAX; low.slot_numel.len()];
    for (i, n) in nodes.iter().enumerate() {
        producer[n.out] = i;
    }
    let mut is_read_back = vec![false; low.slot_numel.len()];
    for (r, _) in &low.readback {
        is_read_back[*r] = true;
    }
    let read_back = |s: usize| is_read_back[s];
    // Each slot's reading nodes, found once (a per-node scan of every node would be quadratic in the graph,
    // which a hostile artifact can make 100k nodes long).
    let mut readers_of: Vec<Vec<usize>> = vec![vec![]; low.slot_numel.len()];
    for (j, n) in nodes.iter().enumerate() {
        for &s in &n.ins {
            if readers_of[s].last() != Some(&j) {
                readers_of[s].push(j);
            }
        }
    }
    let only_for_next =
        |s: usize| producer[s] != usize::MAX && low.readers[s] == 1 && !read_back(s);
    let scalar = |t: &Option<String>, none: f32| match t {
        None => Some(none),
        Some(t) if art.tensors[t].data.len() == 1 => Some(art.tensors[t].data[0]),
        Some(_) => None,
    };
    let mut layout = vec![None; nodes.len()];
    let mut absorbed = vec![false; nodes.len()];
    let one_group_conv =
        |n: &crate::lower::LoweredNode<'_>| matches!(n.op, Op::Conv2d { groups: 1, .. });
    // A one-group convolution whose every reader is a one-group convolution writes channels-last (its GEMM's
    // own `[OH·OW, O]` rows: no scatter) and they read it so (kernel rows of KW·C contiguous numbers instead of
    // C runs of KW): NatureCNN's second and third layers.
    let mut nhwc_out = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let readers = &readers_of[n.out];
        if one_group_conv(n)
            && !read_back(n.out)
            && !readers.is_empty()
            && readers.len() == low.readers[n.out]
            && readers
                .iter()
                .all(|&j| one_group_conv(&nodes[j]) && nodes[j].ins[0] == n.out)
        {
            nhwc_out[i] = true;
            for &j in readers {
                layout[j] = Some((
                    n.out,
                    ConvInput::ChannelsLast {
                        scale: 1.0,
                        shift: 0.0,
                    },
                ));
            }
        }
    }
    for (j, n) in nodes.iter().enumerate() {
        if layout[j].is_some() {
            continue;
        }
        let Op::Conv2d {
            groups: 1, padding, ..
        } = n.op
        else {
            continue;
        };
        let (mut s, mut chain) = (n.ins[0], vec![]);
        let (mut transposed, mut affine) = (false, None);
        while chain.len() < 2 && only_for_next(s) {
            let p = &nodes[producer[s]];
            match p.op {
                Op::Transpose { perm }
                    if !transposed && perm[..] == [2, 0, 1] && p.in_shapes[0].len() == 3 =>
                {
                    transposed = true;
                }
                Op::Affine { scale, shift } if affine.is_none() => {
                    match (scalar(scale, 1.0), scalar(shift, 0.0)) {
                        (Some(a), Some(b)) => affine = Some((a, b)),
                        _ => break,
                    }
                }
                _ => break,
            }
            chain.push(producer[s]);
            s = p.ins[0];
        }
        let (scale, shift) = affine.unwrap_or((1.0, 0.0));
        // A shift folded into the bias would also be added where the kernel reads padding (zeros after the
        // shift in the graph): only without padding.
        if !transposed || (shift != 0.0 && padding.iter().any(|p| *p != 0)) {
            continue;
        }
        for c in chain {
            absorbed[c] = true;
        }
        layout[j] = Some((s, ConvInput::ChannelsLast { scale, shift }));
    }
    (layout, absorbed, nhwc_out)
}
