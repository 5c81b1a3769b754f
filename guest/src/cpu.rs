//! The native CPU executor: the lowered graph run by hand-written kernels ([`crate::dense`],
//! [`crate::kernels`]) over per-session buffers allocated once per batch size. Dense layers are fused with their
//! bias and the activation the lowering fused into them, with weights packed at load for the CPU's vector width,
//! so an MLP step is one pass per layer. The program (packed weights) is immutable and shared by every session;
//! a session's [`CpuScratch`] holds the buffers. No allocation once warm.

use policyport_format::{Artifact, Op, ValidatedPlan};

use crate::backend::Backend;
use crate::conv::{Conv2d, MaxPool2d, layer_norm};
use crate::dense::PackedDense;
use crate::error::PolicyError;
use crate::executor::{ExecScratch, Executor, Pending, StepInput, scratch_of};
use crate::kernels::{self, Act, Isa};
use crate::lower::{act_of, affine_group, expand_affine, lower, transpose_index};

#[derive(Debug, Clone)]
enum Instr {
    Dense {
        x: usize,
        dense: PackedDense,
        act: Act,
        out: usize,
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

#[derive(Debug, Clone)]
pub(crate) struct CpuProgram {
    isa: Isa,
    instrs: Vec<Instr>,
    slot_numel: Vec<usize>,
    obs_slot: usize,
    state_slots: Vec<(usize, usize)>,
    state_sizes: Vec<usize>,
    readback: Vec<(usize, usize)>,
    row_width: usize,
}

/// One session's buffers: one per value slot, grown to the largest batch seen.
pub(crate) struct CpuScratch {
    bufs: Vec<Vec<f32>>,
    /// Convolution: one env's patch matrix and GEMM result (see [`crate::conv`]).
    patches: Vec<f32>,
    result: Vec<f32>,
}

impl CpuProgram {
    pub(crate) fn new(art: &Artifact, plan: &ValidatedPlan, readback_values: &[&str]) -> Self {
        let low = lower(art, plan, readback_values);
        let isa = kernels::detect();
        let mut instrs = vec![];
        for n in &low.nodes {
            let (ins, out, last) = (&n.ins, n.out, n.in_last[0]);
            instrs.push(match n.op {
                Op::Dense { weight, bias } => {
                    let t = &art.tensors[weight];
                    let b = bias.as_ref().map(|b| &art.tensors[b].data[..]);
                    Instr::Dense {
                        x: ins[0],
                        dense: PackedDense::new(isa, &t.data, t.shape[0], t.shape[1], b),
                        act: n.act,
                        out,
                    }
                }
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
                    Instr::Conv {
                        x: ins[0],
                        conv: Box::new(Conv2d::new(
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
                        )),
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
        CpuProgram {
            isa,
            instrs,
            slot_numel: low.slot_numel,
            obs_slot: low.obs_slot,
            state_sizes: low.state_slots.iter().map(|(_, n)| *n).collect(),
            state_slots: low.state_slots,
            row_width: low.readback.iter().map(|(_, n)| n).sum(),
            readback: low.readback,
        }
    }

    /// One step; the readback values concatenated per row go to `rows` (cleared first).
    fn run(
        &self,
        scratch: &mut CpuScratch,
        batch: usize,
        obs: &[f32],
        states: &[Vec<f32>],
        rows: &mut Vec<f32>,
    ) {
        let CpuScratch {
            bufs,
            patches,
            result,
        } = scratch;
        for (buf, n) in bufs.iter_mut().zip(&self.slot_numel) {
            if buf.len() < batch * n {
                buf.resize(batch * n, 0.0);
            }
        }
        bufs[self.obs_slot][..obs.len()].copy_from_slice(obs);
        for ((slot, _), data) in self.state_slots.iter().zip(states) {
            bufs[*slot][..data.len()].copy_from_slice(data);
        }
        let isa = self.isa;
        for instr in &self.instrs {
            let out_slot = match instr {
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
            let input = |s: usize| &bufs[s][..batch * self.slot_numel[s]];
            match instr {
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
        rows.clear();
        for r in 0..batch {
            for (slot, n) in &self.readback {
                rows.extend_from_slice(&bufs[*slot][r * n..(r + 1) * n]);
            }
        }
    }
}

impl Executor for CpuProgram {
    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        self.row_width
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(CpuScratch {
            bufs: vec![vec![]; self.slot_numel.len()],
            patches: vec![],
            result: vec![],
        })
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        self.run(
            scratch_of::<CpuScratch>(scratch),
            step.batch,
            step.obs,
            step.states,
            rows,
        );
        Ok(Pending::Ready)
    }
}
