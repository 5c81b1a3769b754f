//! The libtorch executor: `policyport`'s [`Executor`] trait implemented with libtorch ops, so a libtorch policy is
//! a [`policyport::CompiledPolicy`] like any other and its [`policyport::Session`]s do the request check, the
//! state model (per-env state, resets, episode starts), host sampling and golden verification — the same code as
//! for every backend.
//!
//! At load the guest's one lowering and fusion pass (`policyport::lower`) is translated into libtorch instructions
//! over its value slots, and the head is built from the artifact's `HeadPlan` (the one decoder of the
//! distribution): Dense weights are uploaded once, pre-transposed to `[in, out]` in the compute precision, and
//! shared by every session ([`TorchExecutor`]). What a step mutates lives in the session's scratch
//! ([`TorchScratch`]): the device copy of the recurrent state and, on the static paths, the bucket buffers and
//! captured CUDA graphs (which point at that state). One step is [`TorchExecutor::step`]: device preprocessing →
//! gather per-env state rows → the op program → distribution values (finished on the device when it samples) →
//! actions (device sampling) → next state scattered back to the env rows → one packed `[batch, width]` f32
//! tensor read back. The CUDA-graph path captures exactly that function per bucket over static buffers.

use std::sync::{Arc, Mutex};

use policyport::executor::{
    ExecScratch, Executor, ExecutorBuilder, Pending, Placement, StepInput, scratch_of,
};
use policyport::format::sampling::ActMode;
use policyport::format::{Artifact, HeadKind, HeadPlan, Op, PreprocessStep, ValidatedPlan};
use policyport::lower::act_of as activation_of;
use policyport::lower::{affine_group, expand_affine, lower, transpose_index};
use policyport::{Activation, Backend, BackendError, MAX_BATCH, PolicyError};
use tch::{Device, Kind, Tensor};

use super::buckets::{BucketPlan, padded_env_ids};
use super::graph::CudaGraph;
use super::philox::{DevicePhilox, RNG_LEN, rng_input, u01, u01_open_closed};
use super::{Launch, Precision, Sampling, TorchDevice, TorchError, TorchOptions};

type R<T> = Result<T, TorchError>;

fn te(e: tch::TchError) -> TorchError {
    TorchError::Torch(e.to_string())
}

pub(crate) fn cuda_device_count() -> usize {
    super::graph::device_count()
}

fn upload(data: &[f32], shape: &[i64], kind: Kind, device: Device) -> R<Tensor> {
    Tensor::f_from_slice(data)
        .and_then(|t| t.f_reshape(shape))
        .and_then(|t| t.f_to_kind(kind))
        .and_then(|t| t.f_to_device(device))
        .map_err(te)
}

enum Instr {
    /// `act`: the activation the lowering fused into this dense.
    Dense {
        x: usize,
        w: Tensor,
        b: Option<Tensor>,
        act: Activation,
        out: usize,
    },
    Act {
        x: usize,
        f: Activation,
        out: usize,
    },
    /// Softmax / log-softmax along groups of `last` features, in f32.
    Softmax {
        x: usize,
        last: i64,
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
        scale: Option<Tensor>,
        shift: Option<Tensor>,
        group: i64,
        out: usize,
    },
    Concat {
        xs: Vec<(usize, i64)>,
        out: usize,
    },
    Slice {
        x: usize,
        last: i64,
        start: i64,
        len: i64,
        out: usize,
    },
    Alias {
        x: usize,
        out: usize,
    },
    /// `pad`: `[left, right, top, bottom]` applied before the convolution when asymmetric (else `None` and the
    /// symmetric `padding` goes to conv2d); `input`: `[C, H, W]`.
    Conv {
        x: usize,
        w: Tensor,
        b: Option<Tensor>,
        stride: [i64; 2],
        padding: [i64; 2],
        pad: Option<[i64; 4]>,
        dilation: [i64; 2],
        groups: i64,
        input: [i64; 3],
        act: Activation,
        out: usize,
    },
    /// Padding is applied as -inf before pooling (libtorch's max_pool2d refuses padding over half the kernel).
    MaxPool {
        x: usize,
        kernel: [i64; 2],
        stride: [i64; 2],
        pad: Option<[i64; 4]>,
        dilation: [i64; 2],
        input: [i64; 3],
        out: usize,
    },
    LayerNorm {
        x: usize,
        last: i64,
        scale: Option<Tensor>,
        bias: Option<Tensor>,
        epsilon: f64,
        out: usize,
    },
    Gather {
        x: usize,
        index: Tensor,
        out: usize,
    },
}

enum PreStep {
    Scale(f64),
    Normalize {
        mean: Tensor,
        std: Tensor,
        clip: Option<f64>,
    },
    OneHot(i64),
}

/// The op program of an artifact on one device.
struct Program {
    /// Slots of the values a step reads back (the head's values, then the next states; or a probe's value).
    readback: Vec<usize>,
    n_slots: usize,
    obs_slot: usize,
    instrs: Vec<Instr>,
    pre: Vec<PreStep>,
    /// (slot, numel) of each state input, and the slot of its next value.
    states: Vec<(usize, i64, usize)>,
    /// tanh over large f32 tensors as [`tanh_by_expm1`] instead of libtorch's `tanh`: f32 on the CPU, where MKL
    /// runs its generic path ([`mkl_runs_its_generic_path`]).
    expm1_tanh_here: bool,
}

/// Below this many values libtorch's own `tanh_` is kept: [`tanh_by_expm1`] is seven ops, and at a few thousand
/// values their dispatch costs more than the faster arithmetic saves (measured with torch 2.11.0, one thread, Zen
/// 5: equal at ~8 000 values, 34 -> 25 µs at 64 x 256, 536 -> 320 µs at 1 024 x 256; from Python, where each op
/// costs more to call than from here).
const TANH_BY_EXPM1_MIN_NUMEL: i64 = 8192;

/// `out` = tanh(`x`) in f32 on the CPU as sign(x) · m / (m + 2), m = expm1(2 · min(|x|, 9)): the guest's own
/// `tanh_f` form, in seven elementwise libtorch ops; `out` may be `x` itself, `scratch` is a tensor of x's shape
/// (overwritten).
///
/// Why not libtorch's `tanh`: on x86-64 it is MKL's VML `vsTanh`, which on a CPU not made by Intel runs MKL's
/// generic code, ~2 ns a value on one core (Zen 5): 36 % of the benchmark MLP's act() at batch 1 024 on this
/// executor (and 30 % of torch eager's forward). expm1 (Sleef / VML) and the other ops here cost ~1.2 ns a value in all. Accuracy: within
/// 1.6e-7 relative of f64 tanh over [-20, 20] (libtorch's: 6e-8), so no cancellation near 0, unlike
/// 2·sigmoid(2x) − 1 (1.8e-7 absolute, 5 % relative near 0); ±0, subnormals, ±inf (→ ±1) and NaN come back as
/// `tanh` gives them. The clamp keeps m finite (tanh(9) rounds to 1 in f32).
fn tanh_by_expm1(x: &Tensor, out: &mut Tensor, scratch: &mut Tensor) -> Result<(), tch::TchError> {
    let _ = x.f_abs_out(scratch)?;
    let _ = scratch.f_mul_scalar_(2.0)?.f_clamp_max_(18.0)?.f_expm1_()?;
    // copysign(m, x) into out (out may be x: an elementwise op over the same storage).
    let _ = scratch.f_copysign_out(out, x)?;
    let _ = scratch.f_add_scalar_(2.0)?;
    let _ = out.f_div_(scratch)?;
    Ok(())
}

/// `y` = tanh(`y`) by [`tanh_by_expm1`], `y` a tensor this instruction made (nothing else reads it yet); its
/// scratch from `reuse` where there is one.
fn tanh_in_place(mut y: Tensor, reuse: Option<&mut Reuse>) -> Result<Tensor, tch::TchError> {
    let mut scratch = match reuse {
        Some(r) => r.scratch_like(&y)?,
        None => y.f_empty_like()?,
    };
    let x = y.shallow_clone();
    tanh_by_expm1(&x, &mut y, &mut scratch)?;
    Ok(y)
}

/// Whether this is an x86-64 CPU on which MKL (libtorch's `tanh` on x86-64 is its VML `vsTanh`) runs its generic
/// code path: any vendor but Intel. On the Intel Xeon VM of 2026-12-03 `vsTanh` was 8.6 % of this executor's act()
/// at batch 1 024 (~0.5 ns a value), where [`tanh_by_expm1`] would not gain; on AMD Zen 5 it was 36 % (~2 ns a
/// value). By vendor ([`policyport::cpu_is_intel`]), so one machine always computes the same bits. Elsewhere
/// (aarch64) libtorch's tanh is Sleef's.
fn mkl_runs_its_generic_path() -> bool {
    cfg!(target_arch = "x86_64") && !policyport::cpu_is_intel()
}

/// What the eager path keeps from one call to the next: no fresh allocation per layer and call.
#[derive(Default)]
struct Reuse {
    /// Per program slot, the dense layer output of the last call, written into again by a call of the same
    /// batch.
    dense_out: Vec<Option<Tensor>>,
    /// [`tanh_by_expm1`]'s scratch, kept at the largest shape it was asked for.
    tanh_scratch: Option<Tensor>,
}

impl Reuse {
    /// A scratch tensor of `like`'s shape and kind: a view of the kept one where it holds enough values, else a
    /// new one (kept).
    fn scratch_like(&mut self, like: &Tensor) -> Result<Tensor, tch::TchError> {
        let numel = like.numel() as i64;
        let fits = self
            .tanh_scratch
            .as_ref()
            .is_some_and(|t| t.numel() as i64 >= numel && t.kind() == like.kind());
        if !fits {
            self.tanh_scratch = Some(Tensor::f_empty([numel], (like.kind(), like.device()))?);
        }
        let t = self.tanh_scratch.as_ref().expect("made above");
        t.f_narrow(0, 0, numel)?.f_view(like.size().as_slice())
    }
}

impl Program {
    /// The guest's one lowering and fusion pass ([`policyport::lower`]), translated into libtorch instructions:
    /// slots, fused activations and affine groups are exactly the guest executors'. `readback`: the values a step
    /// needs (the head's, then the next states), or one value for a golden probe.
    fn new(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: &[&str],
        compute: Kind,
        device: Device,
    ) -> R<Self> {
        let low = lower(art, plan, readback);
        let readback: Vec<usize> = low.readback.iter().map(|(s, _)| *s).collect();
        // Next-state slots follow the head's values in a step's readback (none in a probe's).
        let n_head = plan.head.readback_values().len();
        let states = low
            .state_slots
            .iter()
            .enumerate()
            .map(|(i, (slot, numel))| {
                (
                    *slot,
                    *numel as i64,
                    readback.get(n_head + i).copied().unwrap_or(usize::MAX),
                )
            })
            .collect();
        let mut instrs = vec![];
        for n in &low.nodes {
            let (ins, out) = (&n.ins, n.out);
            let x_last = n.in_last[0] as i64;
            instrs.push(match n.op {
                Op::Dense { weight, bias } => {
                    let t = &art.tensors[weight];
                    let (o, i) = (t.shape[0] as i64, t.shape[1] as i64);
                    // Kept `[out, in]` as PyTorch's Linear keeps it; `w` is its transposed view, so addmm hands
                    // the BLAS a transposed B, as torch eager does (see the regression note in CONTRIBUTING).
                    let w = upload(&t.data, &[o, i], compute, device)?
                        .f_tr()
                        .map_err(te)?;
                    let b = match bias {
                        Some(b) => Some(upload(&art.tensors[b].data, &[o], compute, device)?),
                        None => None,
                    };
                    Instr::Dense {
                        x: ins[0],
                        w,
                        b,
                        act: n.act,
                        out,
                    }
                }
                Op::Softmax | Op::LogSoftmax => Instr::Softmax {
                    x: ins[0],
                    last: x_last,
                    log: matches!(n.op, Op::LogSoftmax),
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
                    let group =
                        affine_group(art, scale, shift, low.slot_numel[ins[0]], n.in_last[0]);
                    let row = |t: &String| -> R<Tensor> {
                        let v = expand_affine(&art.tensors[t].data, group);
                        upload(&v, &[1, group as i64], Kind::Float, device)
                    };
                    Instr::Affine {
                        x: ins[0],
                        scale: scale.as_ref().map(row).transpose()?,
                        shift: shift.as_ref().map(row).transpose()?,
                        group: group as i64,
                        out,
                    }
                }
                Op::Concat => Instr::Concat {
                    xs: ins
                        .iter()
                        .copied()
                        .zip(n.in_last.iter().map(|l| *l as i64))
                        .collect(),
                    out,
                },
                Op::Slice { start, len } => Instr::Slice {
                    x: ins[0],
                    last: x_last,
                    start: *start as i64,
                    len: *len as i64,
                    out,
                },
                Op::Flatten | Op::Reshape { .. } => Instr::Alias { x: ins[0], out },
                Op::Transpose { perm } => {
                    let index: Vec<i64> = transpose_index(&n.in_shapes[0], perm)
                        .into_iter()
                        .map(i64::from)
                        .collect();
                    Instr::Gather {
                        x: ins[0],
                        index: Tensor::f_from_slice(&index)
                            .and_then(|t| t.f_to_device(device))
                            .map_err(te)?,
                        out,
                    }
                }
                Op::Conv2d {
                    weight,
                    bias,
                    stride,
                    padding,
                    dilation,
                    groups,
                } => {
                    let t = &art.tensors[weight];
                    let shape: Vec<i64> = t.shape.iter().map(|d| *d as i64).collect();
                    let [top, left, bottom, right] = padding.map(|p| p as i64);
                    let symmetric = top == bottom && left == right;
                    Instr::Conv {
                        x: ins[0],
                        w: upload(&t.data, &shape, compute, device)?,
                        b: match bias {
                            Some(b) => {
                                Some(upload(&art.tensors[b].data, &[shape[0]], compute, device)?)
                            }
                            None => None,
                        },
                        stride: stride.map(|v| v as i64),
                        padding: if symmetric { [top, left] } else { [0, 0] },
                        pad: (!symmetric).then_some([left, right, top, bottom]),
                        dilation: dilation.map(|v| v as i64),
                        groups: *groups as i64,
                        input: chw(&n.in_shapes[0]),
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
                    let [top, left, bottom, right] = padding.map(|p| p as i64);
                    Instr::MaxPool {
                        x: ins[0],
                        kernel: kernel.map(|v| v as i64),
                        stride: stride.map(|v| v as i64),
                        pad: (padding.iter().any(|p| *p != 0))
                            .then_some([left, right, top, bottom]),
                        dilation: dilation.map(|v| v as i64),
                        input: chw(&n.in_shapes[0]),
                        out,
                    }
                }
                Op::LayerNorm {
                    scale,
                    bias,
                    epsilon,
                } => {
                    let vec1 = |t: &String| -> R<Tensor> {
                        let d = &art.tensors[t].data;
                        upload(d, &[d.len() as i64], Kind::Float, device)
                    };
                    Instr::LayerNorm {
                        x: ins[0],
                        last: x_last,
                        scale: scale.as_ref().map(vec1).transpose()?,
                        bias: bias.as_ref().map(vec1).transpose()?,
                        epsilon: *epsilon as f64,
                        out,
                    }
                }
                other => Instr::Act {
                    x: ins[0],
                    f: activation_of(other).expect("the remaining ops are activations"),
                    out,
                },
            });
        }
        let pre = plan
            .preprocess
            .steps
            .iter()
            .map(|p| {
                Ok(match p {
                    PreprocessStep::Scale(factor) => PreStep::Scale(*factor as f64),
                    PreprocessStep::Normalize { mean, std, clip } => {
                        let n = mean.len() as i64;
                        PreStep::Normalize {
                            mean: upload(mean, &[1, n], Kind::Float, device)?,
                            std: upload(std, &[1, n], Kind::Float, device)?,
                            clip: clip.map(|c| c as f64),
                        }
                    }
                    PreprocessStep::OneHot(n) => PreStep::OneHot(*n as i64),
                })
            })
            .collect::<R<Vec<_>>>()?;
        Ok(Program {
            n_slots: low.slot_numel.len(),
            readback,
            obs_slot: low.obs_slot,
            instrs,
            pre,
            states,
            expm1_tanh_here: compute == Kind::Float
                && device == Device::Cpu
                && mkl_runs_its_generic_path(),
        })
    }

    /// Whether tanh over `x` runs as [`tanh_by_expm1`]: f32 on the CPU, and enough values to pay for its ops.
    fn uses_expm1_tanh(&self, x: &Tensor) -> bool {
        self.expm1_tanh_here
            && x.kind() == Kind::Float
            && x.numel() as i64 >= TANH_BY_EXPM1_MIN_NUMEL
    }

    /// Raw observations `[batch, raw_len]` (f32; uint8 spaces arrive as exact f32 bytes) → preprocessed f32
    /// `[batch, features]`.
    fn preprocess(&self, obs: &Tensor) -> Result<Tensor, tch::TchError> {
        let mut x = obs.f_to_kind(Kind::Float)?;
        for step in &self.pre {
            x = match step {
                PreStep::Scale(f) => x.f_mul_scalar(*f)?,
                PreStep::Normalize { mean, std, clip } => {
                    let z = x.f_sub(mean)?.f_div(std)?;
                    match clip {
                        Some(c) => z.f_clamp(-*c, *c)?,
                        None => z,
                    }
                }
                PreStep::OneHot(n) => {
                    let b = x.size()[0];
                    x.f_to_kind(Kind::Int64)?
                        .f_reshape([b])?
                        .f_one_hot(*n)?
                        .f_to_kind(Kind::Float)?
                }
            };
        }
        Ok(x)
    }

    /// Run the ops; returns every slot (values are `[batch, numel]`). `reuse`: the tensors of an earlier call to
    /// write into again (the eager path's; see [`Reuse`]), refilled here.
    fn run(
        &self,
        obs: Tensor,
        states: Vec<Tensor>,
        mut reuse: Option<&mut Reuse>,
    ) -> Result<Vec<Option<Tensor>>, tch::TchError> {
        let mut s: Vec<Option<Tensor>> = (0..self.n_slots).map(|_| None).collect();
        s[self.obs_slot] = Some(obs);
        for ((slot, _, _), t) in self.states.iter().zip(states) {
            s[*slot] = Some(t);
        }
        fn get(s: &[Option<Tensor>], i: usize) -> &Tensor {
            s[i].as_ref().expect("validated: defined before use")
        }
        for instr in &self.instrs {
            let (out, t) = match instr {
                Instr::Dense { x, w, b, act, out } => {
                    let x = get(&s, *x).f_to_kind(w.kind())?;
                    // Into last call's output when it has this call's shape: a fresh `[batch, out]` tensor per
                    // layer and call is memory the allocator maps and the kernel zero-fills again (at batch 1 024
                    // ~100 µs of a 3.3 ms act() went to page faults).
                    let shape = [x.size()[0], w.size()[1]];
                    let kept = reuse
                        .as_deref_mut()
                        .and_then(|r| r.dense_out.get_mut(*out))
                        .and_then(Option::take)
                        .filter(|t| t.size() == shape && t.kind() == w.kind());
                    let mut y = match (b, kept) {
                        (Some(b), Some(o)) => b.f_addmm_out(&o, &x, w)?,
                        (None, Some(o)) => x.f_mm_out(&o, w)?,
                        (Some(b), None) => b.f_addmm(&x, w)?,
                        (None, None) => x.f_matmul(w)?,
                    };
                    // The GEMM's result is this instruction's own tensor: the common activations run in place,
                    // one fresh `[batch, out]` tensor less per layer and call (at batch 1024 each is 1 MB the
                    // allocator maps and the kernel zero-fills: ~12 % of act() went to page faults).
                    let y = match act {
                        Activation::Relu => y.f_relu_()?,
                        Activation::Tanh if self.uses_expm1_tanh(&y) => {
                            tanh_in_place(y, reuse.as_deref_mut())?
                        }
                        Activation::Tanh => y.f_tanh_()?,
                        Activation::Sigmoid => y.f_sigmoid_()?,
                        other => activate(*other, &y)?,
                    };
                    if let Some(slot) = reuse.as_deref_mut().and_then(|r| r.dense_out.get_mut(*out))
                    {
                        // The same storage, for the next call (this call's readback copies out of it first).
                        *slot = Some(y.shallow_clone());
                    }
                    (*out, y)
                }
                Instr::Act {
                    x,
                    f: Activation::Tanh,
                    out,
                } if self.uses_expm1_tanh(get(&s, *x)) => {
                    let x = get(&s, *x);
                    let (mut y, mut scratch) = (x.f_empty_like()?, x.f_empty_like()?);
                    tanh_by_expm1(x, &mut y, &mut scratch)?;
                    (*out, y)
                }
                Instr::Act { x, f, out } => (*out, activate(*f, get(&s, *x))?),
                Instr::Softmax { x, last, log, out } => {
                    let x = get(&s, *x).f_to_kind(Kind::Float)?;
                    let (rows, width) = (x.size()[0], x.size()[1]);
                    let g = x.f_reshape([rows * width / last, *last])?;
                    let y = if *log {
                        g.f_log_softmax(1, Kind::Float)?
                    } else {
                        g.f_softmax(1, Kind::Float)?
                    };
                    (*out, y.f_reshape([rows, width])?)
                }
                Instr::Add { a, b, out } => (*out, get(&s, *a).f_add(get(&s, *b))?),
                Instr::Mul { a, b, out } => (*out, get(&s, *a).f_mul(get(&s, *b))?),
                Instr::Affine {
                    x,
                    scale,
                    shift,
                    group,
                    out,
                } => {
                    let x = get(&s, *x);
                    let (rows, width) = (x.size()[0], x.size()[1]);
                    let mut g = x.f_reshape([rows * width / group, *group])?;
                    if let Some(sc) = scale {
                        g = g.f_mul(sc)?;
                    }
                    if let Some(sh) = shift {
                        g = g.f_add(sh)?;
                    }
                    (*out, g.f_reshape([rows, width])?)
                }
                Instr::Concat { xs, out } => {
                    let first = get(&s, xs[0].0);
                    let rows = first.size()[0];
                    // Mixed precisions (an fp32 affine next to a bf16 dense) meet in fp32.
                    let kind = if xs.iter().all(|(i, _)| get(&s, *i).kind() == first.kind()) {
                        first.kind()
                    } else {
                        Kind::Float
                    };
                    let parts = xs
                        .iter()
                        .map(|(i, last)| {
                            let t = get(&s, *i);
                            let w = t.size()[1];
                            t.f_to_kind(kind)?.f_reshape([rows * w / last, *last])
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    (*out, Tensor::f_cat(&parts, 1)?.f_reshape([rows, -1])?)
                }
                Instr::Slice {
                    x,
                    last,
                    start,
                    len,
                    out,
                } => {
                    let x = get(&s, *x);
                    let (rows, width) = (x.size()[0], x.size()[1]);
                    let g = x
                        .f_reshape([rows * width / last, *last])?
                        .f_narrow(1, *start, *len)?;
                    (*out, g.f_reshape([rows, -1])?)
                }
                Instr::Alias { x, out } => (*out, get(&s, *x).shallow_clone()),
                Instr::Conv {
                    x,
                    w,
                    b,
                    stride,
                    padding,
                    pad,
                    dilation,
                    groups,
                    input,
                    act,
                    out,
                } => {
                    let t = get(&s, *x).f_to_kind(w.kind())?;
                    let rows = t.size()[0];
                    let mut t = t.f_reshape([rows, input[0], input[1], input[2]])?;
                    if let Some(p) = pad {
                        t = t.f_constant_pad_nd(p)?;
                    }
                    let y = t
                        .f_conv2d(w, b.as_ref(), stride, padding, dilation, *groups)?
                        .f_reshape([rows, -1])?;
                    let y = match act {
                        Activation::Tanh if self.uses_expm1_tanh(&y) => {
                            tanh_in_place(y, reuse.as_deref_mut())?
                        }
                        _ => activate(*act, &y)?,
                    };
                    (*out, y)
                }
                Instr::MaxPool {
                    x,
                    kernel,
                    stride,
                    pad,
                    dilation,
                    input,
                    out,
                } => {
                    let t = get(&s, *x);
                    let rows = t.size()[0];
                    let mut t = t.f_reshape([rows, input[0], input[1], input[2]])?;
                    if let Some(p) = pad {
                        t = t.f_pad(p, "constant", f64::NEG_INFINITY)?;
                    }
                    let y = t.f_max_pool2d(kernel, stride, [0, 0], dilation, false)?;
                    (*out, y.f_reshape([rows, -1])?)
                }
                Instr::LayerNorm {
                    x,
                    last,
                    scale,
                    bias,
                    epsilon,
                    out,
                } => {
                    // In f32 whatever the compute precision (a reduction over the features).
                    let x = get(&s, *x).f_to_kind(Kind::Float)?;
                    let (rows, width) = (x.size()[0], x.size()[1]);
                    let g = x.f_reshape([rows * width / last, *last])?;
                    let y =
                        g.f_layer_norm([*last], scale.as_ref(), bias.as_ref(), *epsilon, false)?;
                    (*out, y.f_reshape([rows, width])?)
                }
                Instr::Gather { x, index, out } => (*out, get(&s, *x).f_index_select(1, index)?),
            };
            s[out] = Some(t);
        }
        Ok(s)
    }
}

/// A validated `[C, H, W]` feature shape.
fn chw(shape: &[usize]) -> [i64; 3] {
    [shape[0] as i64, shape[1] as i64, shape[2] as i64]
}

/// An elementwise activation as libtorch ops.
fn activate(f: Activation, x: &Tensor) -> Result<Tensor, tch::TchError> {
    Ok(match f {
        Activation::Identity => x.shallow_clone(),
        Activation::Relu => x.f_relu()?,
        Activation::Tanh => x.f_tanh()?,
        Activation::Sigmoid => x.f_sigmoid()?,
        Activation::Silu => x.f_silu()?,
        Activation::Elu(a) => {
            let neg = x.f_expm1()?.f_mul_scalar(a as f64)?;
            x.f_where_self(&x.f_gt(0.0)?, &neg)?
        }
        Activation::LeakyRelu(a) => {
            let neg = x.f_mul_scalar(a as f64)?;
            x.f_where_self(&x.f_ge(0.0)?, &neg)?
        }
        Activation::Gelu => x.f_gelu("none")?,
        Activation::GeluTanh => x.f_gelu("tanh")?,
        Activation::Erf => x.f_erf()?,
        // The same clamp as the guest's kernels (exp overflows f32 above 88.72).
        Activation::Exp => x.f_clamp(-104.0, 88.7)?.f_exp()?,
        Activation::Clip(lo, hi) => {
            let t = if lo.is_finite() {
                x.f_clamp_min(lo as f64)?
            } else {
                x.shallow_clone()
            };
            if hi.is_finite() {
                t.f_clamp_max(hi as f64)?
            } else {
                t
            }
        }
    })
}

/// How the distribution turns values into parameters and actions, on the device.
struct Head {
    dist: DeviceHead,
    k: i64,
    /// Slots of the distribution values (logits; or mean [, log-std]) and of the value estimate.
    param_slots: Vec<usize>,
    value_slot: Option<usize>,
    log_std_param: Option<Tensor>,
    log_std_range: Option<(f64, f64)>,
    low: Tensor,
    high: Tensor,
    philox: DevicePhilox,
}

/// The distribution of the head as the device samples it, with its parameters as tensors (the format's
/// [`HeadKind`] resolved for this device).
enum DeviceHead {
    Categorical(Vec<i64>),
    Gaussian {
        squashed: bool,
        clip: bool,
        linear_deterministic: bool,
    },
    /// Greedy, or epsilon-greedy when sampled (SPEC.md §4): `n` actions.
    QValues {
        n: i64,
        epsilon: f64,
    },
    /// A deterministic actor: `noise` holds the recorded exploration noise's `(mean, sigma)` as `[1, k]`.
    Deterministic {
        rescale: bool,
        noise: Option<(Tensor, Tensor)>,
    },
}

impl Head {
    /// From the artifact's decoded head (the one decoder of the distribution, shared with the guest's samplers).
    /// `readback`: the program's readback slots, which start with the head's values in `readback_values` order.
    fn new(head: &HeadPlan, readback: &[usize], device: Device) -> R<Self> {
        let k = head.action_len;
        let n = head.param_values.len();
        let param_slots = readback[..n].to_vec();
        let value_slot = head.value.as_ref().map(|_| readback[n]);
        let dist = match head.kind {
            HeadKind::Categorical { .. } | HeadKind::MultiCategorical { .. } => {
                DeviceHead::Categorical(head.segments.iter().map(|n| *n as i64).collect())
            }
            HeadKind::Gaussian {
                squashed,
                clip,
                linear_deterministic,
            } => DeviceHead::Gaussian {
                squashed,
                clip,
                linear_deterministic,
            },
            HeadKind::QValues { n, epsilon } => DeviceHead::QValues {
                n: n as i64,
                epsilon: epsilon as f64,
            },
            HeadKind::Deterministic { rescale, ref noise } => DeviceHead::Deterministic {
                rescale,
                noise: match noise {
                    Some(n) => Some((
                        upload(&n.mean, &[1, k as i64], Kind::Float, device)?,
                        upload(&n.sigma, &[1, k as i64], Kind::Float, device)?,
                    )),
                    None => None,
                },
            },
        };
        let log_std_param = match head.log_std_parameter() {
            Some(d) => Some(upload(d, &[1, k as i64], Kind::Float, device)?),
            None => None,
        };
        let range = head.log_std_range;
        let (low, high) = head.bounds_for_device();
        let words = match &dist {
            DeviceHead::Categorical(nvec) => nvec.len(),
            DeviceHead::Gaussian { .. } | DeviceHead::Deterministic { .. } => 2 * k,
            DeviceHead::QValues { .. } => 2,
        };
        Ok(Head {
            dist,
            k: k as i64,
            param_slots,
            value_slot,
            log_std_param,
            log_std_range: range.map(|(a, b)| (a as f64, b as f64)),
            low: upload(&low, &[1, k as i64], Kind::Float, device)?,
            high: upload(&high, &[1, k as i64], Kind::Float, device)?,
            philox: DevicePhilox::new(words, device)?,
        })
    }

    /// The head's raw distribution values `[batch, raw]` in f32 (the rows a host-sampling step reads back; the
    /// session finishes them with `HeadPlan::finish_params`).
    fn raw(&self, s: &[Option<Tensor>]) -> Result<Tensor, tch::TchError> {
        let parts = self
            .param_slots
            .iter()
            .map(|i| s[*i].as_ref().expect("computed").f_to_kind(Kind::Float))
            .collect::<Result<Vec<_>, _>>()?;
        Tensor::f_cat(&parts, 1)
    }

    /// Finished distribution parameters `[batch, p]` in f32 (log-std clamped / broadcast, as the guest's
    /// `HeadPlan::finish_params`).
    fn params(&self, s: &[Option<Tensor>]) -> Result<Tensor, tch::TchError> {
        let v = |i: usize| {
            s[self.param_slots[i]]
                .as_ref()
                .expect("computed")
                .f_to_kind(Kind::Float)
        };
        match &self.dist {
            DeviceHead::Categorical(_)
            | DeviceHead::QValues { .. }
            | DeviceHead::Deterministic { .. } => v(0),
            DeviceHead::Gaussian { .. } => {
                let mean = v(0)?;
                let log_std = match &self.log_std_param {
                    Some(p) => p.f_expand([mean.size()[0], self.k], false)?,
                    None => {
                        let l = v(1)?;
                        match self.log_std_range {
                            Some((lo, hi)) => l.f_clamp(lo, hi)?,
                            None => l,
                        }
                    }
                };
                Tensor::f_cat(&[mean, log_std], 1)
            }
        }
    }

    /// Actions `[batch, k]` as f32 (discrete indices are exact in f32) from finished parameters.
    fn actions(&self, params: &Tensor, rng: Option<(&Tensor, &Tensor)>) -> R<Tensor> {
        let words = match rng {
            Some((envs, rng)) => Some(self.philox.words(envs, rng)?),
            None => None,
        };
        let f = || -> Result<Tensor, tch::TchError> {
            match &self.dist {
                DeviceHead::Categorical(nvec) => {
                    let mut off = 0;
                    let mut cols = vec![];
                    for (j, n) in nvec.iter().enumerate() {
                        let logits = params.f_narrow(1, off, *n)?;
                        off += n;
                        cols.push(match &words {
                            None => logits.f_argmax(1, true)?,
                            Some(w) => {
                                // Inverse CDF as SPEC.md: first i with e_0 + … + e_i > u · Σe, accumulated in
                                // f32 left to right (cumsum), Σe being the last partial sum.
                                let u = u01(&w.f_narrow(1, j as i64, 1)?).map_err(tch_err)?;
                                let max = logits.f_amax([1], true)?;
                                let c = logits.f_sub(&max)?.f_exp()?.f_cumsum(1, Kind::Float)?;
                                let t = u.f_mul(&c.f_narrow(1, n - 1, 1)?)?;
                                c.f_le_tensor(&t)?
                                    .f_sum_dim_intlist([1i64].as_slice(), true, Kind::Int64)?
                                    .f_clamp_max(n - 1)?
                            }
                        });
                    }
                    Tensor::f_cat(&cols, 1)?.f_to_kind(Kind::Float)
                }
                DeviceHead::QValues { n, epsilon } => {
                    let greedy = params.f_argmax(1, true)?;
                    let pick = match &words {
                        None => greedy,
                        Some(w) => {
                            // u01(w0) < epsilon: floor(w1 · n / 2^32), exact in int64.
                            let explore = u01(&w.f_narrow(1, 0, 1)?)
                                .map_err(tch_err)?
                                .f_lt(*epsilon as f32 as f64)?;
                            let uniform = w
                                .f_narrow(1, 1, 1)?
                                .f_mul_scalar(*n)?
                                .f_bitwise_right_shift_tensor_scalar(32)?;
                            uniform.f_where_self(&explore, &greedy)?
                        }
                    };
                    pick.f_to_kind(Kind::Float)
                }
                DeviceHead::Deterministic { rescale, noise } => {
                    let mut a = params.f_narrow(1, 0, self.k)?;
                    if let (Some(w), Some((nm, ns))) = (&words, noise) {
                        let b = w.size()[0];
                        let pairs = w.f_reshape([b, self.k, 2])?;
                        let u1 = u01_open_closed(&pairs.f_select(2, 0)?).map_err(tch_err)?;
                        let u2 = u01(&pairs.f_select(2, 1)?).map_err(tch_err)?;
                        let z = u1
                            .f_log()?
                            .f_mul_scalar(-2.0)?
                            .f_sqrt()?
                            .f_mul(&u2.f_mul_scalar(std::f32::consts::TAU as f64)?.f_cos()?)?;
                        a = a.f_add(&nm.f_add(&ns.f_mul(&z)?)?)?;
                        if *rescale {
                            a = a.f_clamp(-1.0, 1.0)?;
                        }
                    }
                    if *rescale {
                        let span = self.high.f_sub(&self.low)?;
                        a = a
                            .f_add_scalar(1.0)?
                            .f_mul_scalar(0.5)?
                            .f_mul(&span)?
                            .f_add(&self.low)?;
                    } else {
                        a = a.f_maximum(&self.low)?.f_minimum(&self.high)?;
                    }
                    Ok(a)
                }
                DeviceHead::Gaussian {
                    squashed,
                    clip,
                    linear_deterministic,
                } => {
                    let mean = params.f_narrow(1, 0, self.k)?;
                    let mut a = match &words {
                        None => mean,
                        Some(w) => {
                            let b = w.size()[0];
                            let pairs = w.f_reshape([b, self.k, 2])?;
                            let u1 = u01_open_closed(&pairs.f_select(2, 0)?).map_err(tch_err)?;
                            let u2 = u01(&pairs.f_select(2, 1)?).map_err(tch_err)?;
                            let z =
                                u1.f_log()?.f_mul_scalar(-2.0)?.f_sqrt()?.f_mul(
                                    &u2.f_mul_scalar(std::f32::consts::TAU as f64)?.f_cos()?,
                                )?;
                            let std = params.f_narrow(1, self.k, self.k)?.f_exp()?;
                            mean.f_add(&std.f_mul(&z)?)?
                        }
                    };
                    if *squashed && *linear_deterministic && words.is_none() {
                        // RLlib's SAC at inference: the mean rescaled without tanh, then clipped.
                        let span = self.high.f_sub(&self.low)?;
                        a = a
                            .f_add_scalar(1.0)?
                            .f_mul_scalar(0.5)?
                            .f_mul(&span)?
                            .f_add(&self.low)?
                            .f_maximum(&self.low)?
                            .f_minimum(&self.high)?;
                    } else if *squashed {
                        let span = self.high.f_sub(&self.low)?;
                        a = a
                            .f_tanh()?
                            .f_add_scalar(1.0)?
                            .f_mul_scalar(0.5)?
                            .f_mul(&span)?
                            .f_add(&self.low)?;
                    } else if *clip {
                        a = a.f_maximum(&self.low)?.f_minimum(&self.high)?;
                    }
                    Ok(a)
                }
            }
        };
        f().map_err(te)
    }
}

/// Smuggle a TorchError through a closure returning tch errors (only the message survives).
fn tch_err(e: TorchError) -> tch::TchError {
    tch::TchError::Torch(e.to_string())
}

/// Static buffers (and captured graphs) of one bucket, in one session's scratch.
struct BucketRun {
    bucket: usize,
    /// Raw observations `[bucket, raw_len]` f32.
    obs: Tensor,
    /// Env ids `[bucket]` then the rng input `[RNG_LEN]`, int64: one host→device copy per call.
    idx: Tensor,
    /// Per mode (deterministic, sample): the step's output over these buffers (replayed in place by a graph).
    out: [Option<Tensor>; 2],
    graphs: [Option<CudaGraph>; 2],
}

/// The error type at the `Executor` boundary: request and artifact errors keep their kind, anything libtorch or
/// CUDA raised is a device error with libtorch's message.
fn to_policy(e: TorchError) -> PolicyError {
    match e {
        TorchError::Policy(p) => p,
        TorchError::Artifact(f) => PolicyError::Artifact(f),
        other => BackendError::Device(other.to_string()).into(),
    }
}

/// Captures of CUDA graphs are serialised process-wide: a capture in global mode makes unsafe CUDA calls of
/// other threads (another session capturing, allocating) fail.
static CAPTURE: Mutex<()> = Mutex::new(());

/// Builds libtorch executors with fixed options (device, precision, launch, sampling, buckets) — the
/// [`ExecutorBuilder`] a libtorch [`policyport::CompiledPolicy`] keeps for golden probes.
pub(crate) struct TorchBuilder {
    pub(crate) opts: TorchOptions,
    pub(crate) device: Device,
    pub(crate) compute: Kind,
}

impl ExecutorBuilder for TorchBuilder {
    fn backend(&self) -> Backend {
        Backend::Torch
    }

    fn build(
        &self,
        art: &Artifact,
        plan: &ValidatedPlan,
        readback: Option<&[&str]>,
    ) -> Result<Box<dyn Executor>, PolicyError> {
        let _guard = tch::no_grad_guard();
        let step = readback.is_none();
        let head_and_states = policyport::lower::step_readback(art, plan);
        let values = readback.unwrap_or(&head_and_states);
        let program =
            Program::new(art, plan, values, self.compute, self.device).map_err(to_policy)?;
        // A probe reads back only its values: no head (and its readback has no head slots to index).
        let head = match step {
            true => Some(Head::new(&plan.head, &program.readback, self.device).map_err(to_policy)?),
            false => None,
        };
        let k = plan.head.action_len;
        let device_sampling = step && self.opts.sampling == Sampling::Device;
        let width = if !step {
            0 // a probe's rows are exactly its values, sized when read back (`run_probe`)
        } else if device_sampling {
            k + plan.head.dist_params_len + plan.head.has_value() as usize
        } else {
            plan.head.raw_params_len + plan.head.has_value() as usize
        };
        Ok(Box::new(TorchExecutor {
            state_sizes: program.states.iter().map(|(_, n, _)| *n as usize).collect(),
            program,
            head,
            device: self.device,
            launch: if step {
                self.opts.launch
            } else {
                Launch::Eager
            },
            graph_device: match (self.opts.launch, self.opts.device) {
                (Launch::CudaGraphs, super::TorchDevice::Cuda(i)) => Some(i),
                _ => None,
            },
            placement: if step {
                Placement {
                    preprocess: true,
                    state: true,
                    sampling: device_sampling,
                    raw_observations: false,
                    outputs: false,
                }
            } else {
                Placement::default()
            },
            buckets: self.opts.bucket_plan(),
            initial_envs: self.opts.num_envs.max(1),
            raw_len: art.manifest.observation.raw_len() as i64,
            width,
        }))
    }
}

/// One artifact lowered onto libtorch: weights, constants and the head on the device. Shared by every session of
/// a policy; a step's mutable data is the session's [`TorchScratch`].
///
/// Two kinds: the step program (placement: preprocessing, state and — with device sampling — sampling on the
/// device) and probe programs (`Placement::default()`: preprocessed observations and host state rows in, the
/// probed values out), as the [`ExecutorBuilder`] contract says.
struct TorchExecutor {
    program: Program,
    /// The distribution on the device (step programs only).
    head: Option<Head>,
    device: Device,
    launch: Launch,
    /// The CUDA device graphs are captured on (`Launch::CudaGraphs` only).
    graph_device: Option<usize>,
    placement: Placement,
    buckets: BucketPlan,
    /// Envs the device state holds at first (grown on demand).
    initial_envs: usize,
    state_sizes: Vec<usize>,
    /// Raw observation length (columns of the static observation buffers).
    raw_len: i64,
    /// Numbers per row of a step (0 for probes: their rows are sized when read back).
    width: usize,
}

// Why sharing is sound: `tch::Tensor` is `Send` but not `Sync` only because it is a raw handle. Every tensor a
// `TorchExecutor` holds (weights, biases, affine and normalisation constants, the head's bounds and log-std, the
// Philox constants) is created in `TorchBuilder::build` and never mutated afterwards: steps only read them as
// inputs of libtorch ops (under `no_grad`, so no autograd metadata or version counter is touched), and libtorch's
// tensor refcounts are atomic. Concurrent reads of one at::Tensor from several threads are what libtorch's own
// multi-threaded inference (and tch's `Sync` `CModule`) rely on. Everything a step mutates lives in the
// session's `TorchScratch`, behind `&mut`.
// SAFETY: every tensor here is read-only after `build` (above), and concurrent reads of a tensor are sound.
unsafe impl Sync for TorchExecutor {}

/// One session's mutable libtorch data.
struct TorchScratch {
    /// Per state tensor: `[num_envs + 1, numel]` f32 on the device; the last row is the scratch row padded rows
    /// of the static paths read and write.
    state: Vec<Tensor>,
    num_envs: usize,
    /// Static paths: per bucket of the plan, its buffers and graphs, made on first use (and dropped when the
    /// state grows: graphs point at the state tensors).
    runs: Vec<Option<BucketRun>>,
    /// Env ids (+ rng input) of one call, reused.
    ids: Vec<i64>,
    /// The eager path's tensors kept from call to call ([`Reuse`]). The static paths have their own buffers.
    reuse: Reuse,
}

impl Executor for TorchExecutor {
    /// libtorch's allocations fail as C++ exceptions, which tch's `f_` calls (the only ones used here) return as
    /// errors: a typed `BackendError::Device`, never an abort.
    fn allocations_are_fallible(&self) -> bool {
        true
    }

    fn backend(&self) -> Backend {
        Backend::Torch
    }

    fn placement(&self) -> Placement {
        self.placement
    }

    /// Sampling on the device (CUDA graphs, device Philox) has per-shape setup at a larger batch too.
    fn warm_up_batches(&self) -> &'static [usize] {
        if self.placement.sampling {
            &[1, 64]
        } else {
            &[1]
        }
    }

    fn state_sizes(&self) -> &[usize] {
        &self.state_sizes
    }

    fn row_width(&self) -> usize {
        self.width
    }

    fn new_scratch(&self) -> ExecScratch {
        Box::new(TorchScratch {
            state: vec![],
            num_envs: 0,
            runs: (0..self.buckets.sizes().len()).map(|_| None).collect(),
            ids: vec![],
            reuse: Reuse::default(),
        })
    }

    fn launch(
        &self,
        scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let s = scratch_of::<TorchScratch>(scratch);
        let _guard = tch::no_grad_guard();
        rows.clear();
        rows.resize(step.batch * self.width, 0.0);
        let r = if !self.placement.preprocess {
            self.run_probe(step, rows)
        } else {
            self.ensure_envs(s, step.num_envs)
                .and_then(|()| match self.launch {
                    Launch::Eager => self.run_eager(s, step, rows),
                    _ => self.run_static(s, step, rows),
                })
        };
        r.map(|()| Pending::Ready).map_err(to_policy)
    }

    fn reset_state(&self, scratch: &mut ExecScratch, envs: &[u32]) -> Result<(), PolicyError> {
        let s = scratch_of::<TorchScratch>(scratch);
        // Envs past the allocated rows have no state yet: they start at zero when first used.
        // Episode starts land here from act(): the scratch's id buffer, no allocation.
        let mut ids = std::mem::take(&mut s.ids);
        ids.clear();
        ids.extend(
            envs.iter()
                .filter(|e| (**e as usize) < s.num_envs)
                .map(|e| *e as i64),
        );
        if ids.is_empty() || s.state.is_empty() {
            s.ids = ids;
            return Ok(());
        }
        let _guard = tch::no_grad_guard();
        let f = || -> R<()> {
            let idx = Tensor::f_from_slice(&ids)
                .and_then(|t| t.f_to_device(self.device))
                .map_err(te)?;
            for st in &s.state {
                let _ = st.shallow_clone().f_index_fill_(0, &idx, 0.0).map_err(te)?;
            }
            Ok(())
        };
        let r = f().map_err(to_policy);
        s.ids = ids;
        r
    }

    fn write_state(
        &self,
        scratch: &mut ExecScratch,
        envs: &[u32],
        values: &[&[f32]],
        num_envs: usize,
    ) -> Result<(), PolicyError> {
        if !self.placement.state || self.program.states.is_empty() || envs.is_empty() {
            return Ok(());
        }
        let s = scratch_of::<TorchScratch>(scratch);
        let _guard = tch::no_grad_guard();
        let mut f = || -> R<()> {
            // Grown like a step grows it (graphs are dropped only when the tensors are replaced); rows are
            // written in place with index_copy_, so captured CUDA graphs keep pointing at the same state.
            self.ensure_envs(s, num_envs)?;
            let ids: Vec<i64> = envs.iter().map(|e| *e as i64).collect();
            let idx = Tensor::f_from_slice(&ids)
                .and_then(|t| t.f_to_device(self.device))
                .map_err(te)?;
            for ((st, (_, numel, _)), v) in s.state.iter().zip(&self.program.states).zip(values) {
                let src = Tensor::f_from_slice(v)
                    .and_then(|t| t.f_reshape([envs.len() as i64, *numel]))
                    .and_then(|t| t.f_to_device(self.device))
                    .map_err(te)?;
                let _ = st
                    .shallow_clone()
                    .f_index_copy_(0, &idx, &src)
                    .map_err(te)?;
            }
            Ok(())
        };
        f().map_err(to_policy)
    }

    fn read_state(&self, scratch: &mut ExecScratch) -> Result<Option<Vec<Vec<f32>>>, PolicyError> {
        let s = scratch_of::<TorchScratch>(scratch);
        if !self.placement.state || s.state.is_empty() {
            return Ok(None);
        }
        let n = s.num_envs as i64;
        let f = || -> R<Vec<Vec<f32>>> {
            s.state
                .iter()
                .map(|st| {
                    let t = st
                        .f_narrow(0, 0, n)
                        .and_then(|t| t.f_to_device(Device::Cpu))
                        .and_then(|t| t.f_reshape([-1]))
                        .map_err(te)?;
                    Vec::<f32>::try_from(&t).map_err(te)
                })
                .collect()
        };
        f().map(Some).map_err(to_policy)
    }
}

impl TorchExecutor {
    /// Make the device state hold at least `needed` envs (doubling, so graphs are rarely recaptured), keeping
    /// existing rows; growing drops the static buffers and graphs, which point at the old state tensors.
    fn ensure_envs(&self, s: &mut TorchScratch, needed: usize) -> R<()> {
        if self.program.states.is_empty() || (!s.state.is_empty() && needed <= s.num_envs) {
            return Ok(());
        }
        let num_envs = if s.state.is_empty() {
            needed.max(self.initial_envs)
        } else {
            needed.max(s.num_envs * 2)
        };
        let mut state = vec![];
        for (k, (_, numel, _)) in self.program.states.iter().enumerate() {
            let t = Tensor::f_zeros([num_envs as i64 + 1, *numel], (Kind::Float, self.device))
                .map_err(te)?;
            if let Some(old) = s.state.get(k) {
                let keep = s.num_envs.min(num_envs) as i64;
                t.f_narrow(0, 0, keep)
                    .and_then(|mut d| d.f_copy_(&old.f_narrow(0, 0, keep)?))
                    .map_err(te)?;
            }
            state.push(t);
        }
        s.runs.iter_mut().for_each(|r| *r = None); // graphs reference the old tensors: drop them first
        s.state = state;
        s.num_envs = num_envs;
        Ok(())
    }

    /// The row of the state tensors padded rows use (no env's).
    fn scratch_row(&self, s: &TorchScratch) -> i64 {
        s.num_envs as i64
    }

    fn run_eager(&self, s: &mut TorchScratch, step: &StepInput<'_>, rows: &mut [f32]) -> R<()> {
        let batch = step.batch;
        let x = obs_tensor(step.obs, 0..batch, self.raw_len as usize)?
            .f_to_device(self.device)
            .map_err(te)?;
        s.ids.clear();
        s.ids
            .extend(step.env_ids[..batch].iter().map(|e| *e as i64));
        let device_rng = match step.mode {
            ActMode::Sample { seed, step } if self.placement.sampling => {
                let mut rng = [0i64; RNG_LEN];
                rng_input(seed, step, &mut rng);
                s.ids.extend_from_slice(&rng);
                true
            }
            _ => false,
        };
        let idx = Tensor::f_from_slice(&s.ids)
            .and_then(|t| t.f_to_device(self.device))
            .map_err(te)?;
        let env_t = idx.f_narrow(0, 0, batch as i64).map_err(te)?;
        let rng_t = if device_rng {
            Some(idx.f_narrow(0, batch as i64, RNG_LEN as i64).map_err(te)?)
        } else {
            None
        };
        if s.reuse.dense_out.len() != self.program.n_slots {
            s.reuse.dense_out = (0..self.program.n_slots).map(|_| None).collect();
        }
        let packed = self.step(&s.state, &x, &env_t, rng_t.as_ref(), Some(&mut s.reuse))?;
        read_into(&packed, rows)
    }

    /// A probe: preprocessed observations and host state rows in, the probed values out.
    fn run_probe(&self, step: &StepInput<'_>, rows: &mut Vec<f32>) -> R<()> {
        let batch = step.batch as i64;
        let width = step.obs.len() as i64 / batch.max(1);
        let x = Tensor::f_from_slice(step.obs)
            .and_then(|t| t.f_reshape([batch, width]))
            .and_then(|t| t.f_to_device(self.device))
            .map_err(te)?;
        let states = self
            .program
            .states
            .iter()
            .zip(step.states)
            .map(|((_, n, _), rows)| {
                Tensor::f_from_slice(rows)
                    .and_then(|t| t.f_reshape([batch, *n]))
                    .and_then(|t| t.f_to_device(self.device))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(te)?;
        let slots = self.program.run(x, states, None).map_err(te)?;
        let parts = self
            .program
            .readback
            .iter()
            .map(|i| {
                slots[*i]
                    .as_ref()
                    .ok_or_else(|| TorchError::Torch("a probed value was not computed".into()))?
                    .f_to_kind(Kind::Float)
                    .map_err(te)
            })
            .collect::<R<Vec<_>>>()?;
        let t = Tensor::f_cat(&parts, 1).map_err(te)?;
        rows.resize(t.numel(), 0.0);
        read_into(&t, rows)
    }

    fn run_static(&self, s: &mut TorchScratch, step: &StepInput<'_>, rows: &mut [f32]) -> R<()> {
        let width = self.width;
        let scratch_row = self.scratch_row(s) as u32;
        let sample = matches!(step.mode, ActMode::Sample { .. });
        let mut rng = [0i64; RNG_LEN];
        if let ActMode::Sample { seed, step } = step.mode {
            rng_input(seed, step, &mut rng);
        }
        for chunk in self.buckets.chunks(step.batch) {
            let ri = self
                .buckets
                .sizes()
                .iter()
                .position(|b| *b == chunk.bucket)
                .expect("a chunk's bucket is one of the plan's");
            if s.runs[ri].is_none() {
                s.runs[ri] = Some(self.make_run(&s.state, scratch_row as i64, chunk.bucket)?);
            }
            let mut ids = std::mem::take(&mut s.ids);
            padded_env_ids(
                step.env_ids[chunk.start..chunk.start + chunk.len]
                    .iter()
                    .copied(),
                chunk.bucket,
                scratch_row,
                &mut ids,
            );
            ids.extend_from_slice(&rng);
            let x = obs_tensor(
                step.obs,
                chunk.start..chunk.start + chunk.len,
                self.raw_len as usize,
            )?;
            let run = s.runs[ri].as_mut().expect("made above");
            let res = self.run_chunk(run, &s.state, sample, chunk.len, &x, &ids);
            s.ids = ids;
            let dst = &mut rows[chunk.start * width..(chunk.start + chunk.len) * width];
            read_into(&res?, dst)?;
        }
        Ok(())
    }

    /// A bucket's static buffers; with `Launch::CudaGraphs` its graphs captured (one per mode). The env-id
    /// buffer starts at the scratch row, so the capture's warm-up runs touch no env's state.
    fn make_run(&self, state: &[Tensor], scratch_row: i64, bucket: usize) -> R<BucketRun> {
        let b = bucket as i64;
        let raw = self.raw_len;
        let obs = Tensor::f_zeros([b, raw], (Kind::Float, self.device)).map_err(te)?;
        let mut idx_host = vec![scratch_row; bucket + RNG_LEN];
        idx_host[bucket..].iter_mut().for_each(|v| *v = 0);
        let idx = Tensor::f_from_slice(&idx_host)
            .and_then(|t| t.f_to_device(self.device))
            .map_err(te)?;
        let mut run = BucketRun {
            bucket,
            obs,
            idx,
            out: [None, None],
            graphs: [None, None],
        };
        for (m, sample) in [false, true].into_iter().enumerate() {
            match self.graph_device {
                Some(dev) => {
                    let _one_capture = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
                    let mut captured = None;
                    let graph = CudaGraph::capture(dev, || {
                        captured = Some(self.step_static(state, &run, sample)?);
                        Ok(())
                    })?;
                    run.out[m] = captured;
                    run.graphs[m] = Some(graph);
                }
                None => run.out[m] = Some(self.step_static(state, &run, sample)?),
            }
        }
        Ok(run)
    }

    /// Fill a bucket's inputs, replay (or run) it, and return its first `len` rows on the host.
    fn run_chunk(
        &self,
        run: &mut BucketRun,
        state: &[Tensor],
        sample: bool,
        len: usize,
        x: &Tensor,
        ids: &[i64],
    ) -> R<Tensor> {
        run.obs
            .f_narrow(0, 0, len as i64)
            .and_then(|mut d| d.f_copy_(x))
            .map_err(te)?;
        let ids = Tensor::f_from_slice(ids).map_err(te)?;
        run.idx.shallow_clone().f_copy_(&ids).map_err(te)?;
        let m = sample as usize;
        let out = if self.graph_device.is_some() {
            run.graphs[m].as_mut().expect("captured").replay()?;
            run.out[m].as_ref().expect("captured").shallow_clone()
        } else {
            self.step_static(state, run, sample)?
        };
        out.f_narrow(0, 0, len as i64)
            .and_then(|t| t.f_to_device(Device::Cpu))
            .and_then(|t| t.f_contiguous())
            .map_err(te)
    }

    /// The step over a bucket's static buffers.
    fn step_static(&self, state: &[Tensor], run: &BucketRun, sample: bool) -> R<Tensor> {
        let b = run.bucket as i64;
        let envs = run.idx.f_narrow(0, 0, b).map_err(te)?;
        let rng = run.idx.f_narrow(0, b, RNG_LEN as i64).map_err(te)?;
        self.step(state, &run.obs, &envs, sample.then_some(&rng), None)
    }

    /// One step on the device: raw obs `[batch, raw_len]`, env ids `[batch]` int64 (rows of the state tensors),
    /// rng input (device sampling in sample mode) → packed f32 `[batch, width]`: with device sampling actions,
    /// finished distribution parameters, value; else the head's raw values and the value (the session samples).
    /// Next states are written to the env rows.
    fn step(
        &self,
        state: &[Tensor],
        obs: &Tensor,
        envs: &Tensor,
        rng: Option<&Tensor>,
        reuse: Option<&mut Reuse>,
    ) -> R<Tensor> {
        let x = self.program.preprocess(obs).map_err(te)?;
        let states = state
            .iter()
            .map(|s| s.f_index_select(0, envs))
            .collect::<Result<Vec<_>, _>>()
            .map_err(te)?;
        let head = self
            .head
            .as_ref()
            .ok_or_else(|| TorchError::Torch("a probe program cannot run a step".into()))?;
        let slots = self.program.run(x, states, reuse).map_err(te)?;
        let mut parts = vec![];
        if self.placement.sampling {
            let params = head.params(&slots).map_err(te)?;
            parts.push(head.actions(&params, rng.map(|r| (envs, r)))?);
            parts.push(params);
        } else {
            parts.push(head.raw(&slots).map_err(te)?);
        }
        if let Some(v) = head.value_slot {
            parts.push(
                slots[v]
                    .as_ref()
                    .expect("computed")
                    .f_to_kind(Kind::Float)
                    .map_err(te)?,
            );
        }
        for (st, (_, _, next)) in state.iter().zip(&self.program.states) {
            let next = slots[*next]
                .as_ref()
                .expect("computed")
                .f_to_kind(Kind::Float)
                .map_err(te)?;
            let _ = st
                .shallow_clone()
                .f_index_copy_(0, envs, &next)
                .map_err(te)?;
        }
        Tensor::f_cat(&parts, 1).map_err(te)
    }
}

/// Rows `rows` of the step's raw f32 observations as a host tensor `[len, raw]`.
fn obs_tensor(obs: &[f32], rows: std::ops::Range<usize>, raw: usize) -> R<Tensor> {
    let (start, len) = (rows.start, rows.len());
    Tensor::f_from_slice(&obs[start * raw..(start + len) * raw])
        .and_then(|t| t.f_reshape([len as i64, raw as i64]))
        .map_err(te)
}

/// Copy a packed `[rows, width]` f32 tensor into `dst` (exactly its length).
fn read_into(t: &Tensor, dst: &mut [f32]) -> R<()> {
    t.f_to_device(Device::Cpu)
        .and_then(|t| t.f_contiguous())
        .and_then(|t| t.f_copy_data(dst, dst.len()))
        .map_err(te)
}

/// The executor builder for `opts`, after checking them against this machine: the CUDA device exists, CUDA graphs
/// have a CUDA device, the largest bucket is a batch act() accepts. Static paths always sample on the device.
pub(crate) fn builder(opts: &TorchOptions) -> R<Arc<dyn ExecutorBuilder>> {
    let device = match opts.device {
        TorchDevice::Cpu => Device::Cpu,
        TorchDevice::Cuda(i) => {
            let n = cuda_device_count();
            if i >= n {
                return Err(TorchError::NoCuda(format!(
                    "cuda:{i} asked for, libtorch sees {n} CUDA device(s)"
                )));
            }
            Device::Cuda(i)
        }
    };
    if opts.launch == Launch::CudaGraphs && device == Device::Cpu {
        return Err(TorchError::NoCuda("CUDA graphs need a CUDA device".into()));
    }
    if opts.max_batch == 0 || opts.max_batch > MAX_BATCH {
        return Err(PolicyError::Batch {
            batch: opts.max_batch,
            max: MAX_BATCH,
        }
        .into());
    }
    let compute = match opts.precision {
        Precision::F32 => Kind::Float,
        Precision::F16 => Kind::Half,
        Precision::Bf16 => Kind::BFloat16,
    };
    let opts = opts.effective();
    Ok(Arc::new(TorchBuilder {
        opts,
        device,
        compute,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tanh_by_expm1` against f64 tanh over [-20, 20] and the values a layer can hold at its edges: within 2e-7
    /// relative (measured 1.5e-7), the sign of zero kept, subnormals unchanged, ±inf → ±1, NaN → NaN; into a
    /// separate output and in place.
    #[test]
    fn tanh_by_expm1_matches_f64_and_keeps_special_values() {
        let _guard = tch::no_grad_guard();
        let mut xs: Vec<f32> = (0..=400_000).map(|i| -20.0 + i as f32 * 1e-4).collect();
        let specials = [
            0.0,
            -0.0,
            1e-30,
            -1e-38,
            f32::from_bits(1), // the smallest subnormal
            -f32::from_bits(0x007f_ffff),
            8.9,
            9.0,
            9.1,
            1e30,
            -f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        xs.extend(specials);
        let x = Tensor::from_slice(&xs);
        let mut scratch = x.empty_like();
        let mut apart = x.empty_like();
        tanh_by_expm1(&x, &mut apart, &mut scratch).unwrap();
        let mut inplace = x.copy();
        let alias = inplace.shallow_clone();
        tanh_by_expm1(&alias, &mut inplace, &mut scratch).unwrap();
        for got in [apart, inplace] {
            let got = Vec::<f32>::try_from(&got).unwrap();
            let mut worst = 0.0f64;
            for (x, y) in xs.iter().zip(&got) {
                let want = (*x as f64).tanh();
                if x.is_nan() {
                    assert!(y.is_nan(), "tanh(NaN) = {y}");
                } else if want == 0.0 {
                    assert_eq!(
                        y.to_bits(),
                        x.to_bits(),
                        "tanh({x:e}) keeps the zero's sign"
                    );
                } else {
                    worst = worst.max((*y as f64 - want).abs() / want.abs());
                }
            }
            assert!(worst <= 2e-7, "worst relative error {worst:e}");
        }
    }

    /// The kept scratch serves a smaller tensor as a view of itself, and is replaced by a larger one when asked
    /// for more (the shape always the one asked for).
    #[test]
    fn tanh_scratch_is_reused_and_grown() {
        let mut reuse = Reuse::default();
        let big = Tensor::zeros([64, 256], (Kind::Float, Device::Cpu));
        let small = Tensor::zeros([40, 256], (Kind::Float, Device::Cpu));
        let a = reuse.scratch_like(&big).unwrap();
        assert_eq!(a.size(), [64, 256]);
        let b = reuse.scratch_like(&small).unwrap();
        assert_eq!(b.size(), [40, 256]);
        assert_eq!(a.data_ptr(), b.data_ptr(), "the kept storage, narrowed");
        let bigger = Tensor::zeros([65, 256], (Kind::Float, Device::Cpu));
        let c = reuse.scratch_like(&bigger).unwrap();
        assert_eq!(c.size(), [65, 256]);
        assert_eq!(reuse.tanh_scratch.as_ref().unwrap().numel(), 65 * 256);
    }
}
