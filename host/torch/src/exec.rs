//! The libtorch executor behind [`super::TorchPolicy`].
//!
//! At load the guest's one lowering and fusion pass (`policyport::lower`) is translated into libtorch instructions
//! over its value slots, and the head is built from the artifact's `HeadPlan` (the one decoder of the
//! distribution): Dense weights are uploaded once, pre-transposed to `[in, out]` in the compute precision. One act() is [`TorchExec::step`]:
//! device preprocessing → gather per-env state rows → the op program → distribution parameters finished on the
//! device → actions (on the device, or on the host with the guest's sampler) → next state scattered back to the
//! env rows → one packed `[batch, width]` f32 tensor read back. The CUDA-graph path captures exactly that
//! function per bucket over static buffers.

use policyport::format::sampling::ActMode;
use policyport::format::{
    Artifact, HeadKind as Dist, HeadPlan, ObsDType, ObservationSpace, Op, Preprocess,
    ValidatedPlan, read_artifact, validate,
};
use policyport::lower::{affine_group, expand_affine, lower};
use policyport::{
    ActOutputs, Activation, DEFAULT_MAX_ENVS, EnvIdError, EnvIds, GoldenReport, GoldenShape,
    MAX_BATCH, Observations, PolicyError, Request, activation_of, check_observations,
    compare_golden, one_hot_width,
};
use tch::{Device, Kind, Tensor};

use super::buckets::{BucketPlan, padded_env_ids};
use super::graph::CudaGraph;
use super::philox::{DevicePhilox, RNG_LEN, rng_input, u01, u01_open_closed};
use super::{Launch, Precision, Sampling, TorchDevice, TorchError, TorchInfo, TorchOptions};

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
    obs_u8: bool,
    raw_len: i64,
    /// (slot, numel) of each state input, and the slot of its next value.
    states: Vec<(usize, i64, usize)>,
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
        let m = &art.manifest;
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
                    // [out, in] → [in, out] once, so act() is x @ w (+ b as addmm).
                    let w = upload(&t.data, &[o, i], compute, device)?
                        .f_t_copy()
                        .and_then(|w| w.f_contiguous())
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
                Op::Flatten => Instr::Alias { x: ins[0], out },
                other => Instr::Act {
                    x: ins[0],
                    f: activation_of(other).expect("the remaining ops are activations"),
                    out,
                },
            });
        }
        let pre = m
            .preprocess
            .iter()
            .map(|p| {
                Ok(match p {
                    Preprocess::Scale { factor } => PreStep::Scale(*factor as f64),
                    Preprocess::Normalize { mean, std, clip } => {
                        let n = art.tensors[mean].data.len() as i64;
                        PreStep::Normalize {
                            mean: upload(&art.tensors[mean].data, &[1, n], Kind::Float, device)?,
                            std: upload(&art.tensors[std].data, &[1, n], Kind::Float, device)?,
                            clip: clip.map(|c| c as f64),
                        }
                    }
                    Preprocess::OneHot { n } => PreStep::OneHot(*n as i64),
                })
            })
            .collect::<R<Vec<_>>>()?;
        Ok(Program {
            n_slots: low.slot_numel.len(),
            readback,
            obs_slot: low.obs_slot,
            instrs,
            pre,
            obs_u8: matches!(
                m.observation,
                ObservationSpace::Box {
                    dtype: ObsDType::U8,
                    ..
                }
            ),
            raw_len: m.observation.raw_len() as i64,
            states,
        })
    }

    /// Raw observations `[batch, raw_len]` (f32, or u8 for uint8 spaces) → preprocessed f32 `[batch, features]`.
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

    /// Run the ops; returns every slot (values are `[batch, numel]`).
    fn run(&self, obs: Tensor, states: Vec<Tensor>) -> Result<Vec<Option<Tensor>>, tch::TchError> {
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
                    let y = match b {
                        Some(b) => b.f_addmm(&x, w)?,
                        None => x.f_matmul(w)?,
                    };
                    (*out, activate(*act, &y)?)
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
            };
            s[out] = Some(t);
        }
        Ok(s)
    }
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
    })
}

/// How the distribution turns values into parameters and actions, on the device.
struct Head {
    dist: HeadKind,
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

enum HeadKind {
    Categorical(Vec<i64>),
    Gaussian { squashed: bool, clip: bool },
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
            Dist::Categorical { .. } | Dist::MultiCategorical { .. } => {
                HeadKind::Categorical(head.segments.iter().map(|n| *n as i64).collect())
            }
            Dist::Gaussian { squashed, clip } => HeadKind::Gaussian { squashed, clip },
        };
        let log_std_param = match head.log_std_parameter() {
            Some(d) => Some(upload(d, &[1, k as i64], Kind::Float, device)?),
            None => None,
        };
        let range = head.log_std_range;
        let (low, high) = head.bounds_for_device();
        let words = match &dist {
            HeadKind::Categorical(nvec) => nvec.len(),
            HeadKind::Gaussian { .. } => 2 * k,
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

    /// Finished distribution parameters `[batch, p]` in f32 (log-std clamped / broadcast, as the guest's
    /// `Sampler::finish_params`).
    fn params(&self, s: &[Option<Tensor>]) -> Result<Tensor, tch::TchError> {
        let v = |i: usize| {
            s[self.param_slots[i]]
                .as_ref()
                .expect("computed")
                .f_to_kind(Kind::Float)
        };
        match &self.dist {
            HeadKind::Categorical(_) => v(0),
            HeadKind::Gaussian { .. } => {
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
                HeadKind::Categorical(nvec) => {
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
                HeadKind::Gaussian { squashed, clip } => {
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
                    if *squashed {
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

/// Static buffers (and captured graphs) of one bucket.
struct BucketRun {
    bucket: usize,
    obs: Tensor,
    /// Env ids `[bucket]` then the rng input `[RNG_LEN]`, int64: one host→device copy per call.
    idx: Tensor,
    out: [Option<Tensor>; 2],
    graphs: [Option<CudaGraph>; 2],
}

pub(crate) struct TorchExec {
    artifact: Artifact,
    validated: ValidatedPlan,
    compute: Kind,
    device: Device,
    opts: TorchOptions,
    program: Program,
    head: Head,
    sampler: HeadPlan,
    one_hot: Option<usize>,
    /// Per state: `[num_envs + 1, numel]` f32; the last row is the scratch row padded rows use.
    state: Vec<Tensor>,
    num_envs: usize,
    plan: BucketPlan,
    runs: Vec<BucketRun>,
    has_value: bool,
    p: usize,
    rows: Vec<f32>,
    ids: Vec<i64>,
    /// The request's env ids (the shared check's scratch, reused across calls).
    env_scratch: Vec<u32>,
}

impl TorchExec {
    pub(crate) fn load(bytes: &[u8], opts: &TorchOptions) -> R<Self> {
        let artifact = read_artifact(bytes)?;
        let plan = validate(&artifact, &Default::default())?;
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
        let _guard = tch::no_grad_guard();
        let program = Program::new(
            &artifact,
            &plan,
            &policyport::lower::step_readback(&artifact, &plan),
            compute,
            device,
        )?;
        let head = Head::new(&plan.head, &program.readback, device)?;
        let sampler = plan.head.clone();
        let p = sampler.dist_params_len();
        let mut opts = opts.clone();
        if opts.launch != Launch::Eager {
            opts.sampling = Sampling::Device;
        }
        let mut ex = TorchExec {
            validated: plan,
            compute,
            one_hot: one_hot_width(&artifact),
            has_value: artifact.manifest.value.is_some(),
            artifact,
            device,
            plan: opts.bucket_plan(),
            opts,
            program,
            head,
            sampler,
            state: vec![],
            num_envs: 0,
            runs: vec![],
            p,
            rows: vec![],
            ids: vec![],
            env_scratch: vec![],
        };
        ex.grow_state(ex.opts.num_envs.max(1))?;
        // Warm-up: one act per mode (eager paths), so kernels, cuBLAS handles and allocator pools exist.
        if ex.opts.launch == Launch::Eager {
            let obs_len = ex.artifact.manifest.observation.raw_len();
            let mut out = ActOutputs::default();
            for mode in [ActMode::Deterministic, ActMode::Sample { seed: 0, step: 0 }] {
                match ex.program.obs_u8 {
                    true => ex.act(
                        &Request::new(Observations::U8(&vec![0; obs_len]), 1, mode),
                        &mut out,
                    )?,
                    false => ex.act(
                        &Request::new(Observations::F32(&vec![0.0; obs_len]), 1, mode),
                        &mut out,
                    )?,
                }
            }
            ex.reset(&[0])?;
        }
        Ok(ex)
    }

    fn width(&self) -> usize {
        let k = self.sampler.action_len();
        let dev_k = if self.opts.sampling == Sampling::Device {
            k
        } else {
            0
        };
        dev_k + self.p + self.has_value as usize
    }

    /// (Re)allocate the device state for `num_envs` envs (+1 scratch row), keeping existing rows; then rebuild
    /// the static buffers and graphs, which point at the state tensors.
    fn grow_state(&mut self, num_envs: usize) -> R<()> {
        let _guard = tch::no_grad_guard();
        let mut state = vec![];
        for (k, (_, numel, _)) in self.program.states.iter().enumerate() {
            let t = Tensor::f_zeros([num_envs as i64 + 1, *numel], (Kind::Float, self.device))
                .map_err(te)?;
            if let Some(old) = self.state.get(k) {
                let keep = self.num_envs.min(num_envs) as i64;
                t.f_narrow(0, 0, keep)
                    .and_then(|mut d| d.f_copy_(&old.f_narrow(0, 0, keep)?))
                    .map_err(te)?;
            }
            state.push(t);
        }
        self.runs.clear(); // graphs reference the old state tensors: drop them first
        self.state = state;
        self.num_envs = num_envs;
        if self.opts.launch != Launch::Eager {
            self.build_runs()?;
        }
        Ok(())
    }

    fn build_runs(&mut self) -> R<()> {
        let obs_kind = if self.program.obs_u8 {
            Kind::Uint8
        } else {
            Kind::Float
        };
        let scratch = self.num_envs as i64;
        let mut runs = vec![];
        for &bucket in self.plan.sizes() {
            let b = bucket as i64;
            let obs =
                Tensor::f_zeros([b, self.program.raw_len], (obs_kind, self.device)).map_err(te)?;
            let mut idx_host = vec![scratch; bucket + RNG_LEN];
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
                if self.opts.launch == Launch::CudaGraphs {
                    let TorchDevice::Cuda(dev) = self.opts.device else {
                        unreachable!("checked at load")
                    };
                    let mut captured = None;
                    let graph = CudaGraph::capture(dev, || {
                        captured = Some(self.step_static(&run, sample)?);
                        Ok(())
                    })?;
                    run.out[m] = captured;
                    run.graphs[m] = Some(graph);
                } else {
                    run.out[m] = Some(self.step_static(&run, sample)?);
                }
            }
            runs.push(run);
        }
        self.runs = runs;
        Ok(())
    }

    /// The step over a bucket's static buffers.
    fn step_static(&self, run: &BucketRun, sample: bool) -> R<Tensor> {
        let b = run.bucket as i64;
        let envs = run.idx.f_narrow(0, 0, b).map_err(te)?;
        let rng = run.idx.f_narrow(0, b, RNG_LEN as i64).map_err(te)?;
        self.step(&run.obs, &envs, sample.then_some(&rng))
    }

    /// One act() on the device: raw obs `[batch, raw_len]`, env ids `[batch]` int64 (rows of the state tensors),
    /// rng input (device sampling in sample mode) → packed f32 `[batch, width]`: actions (device sampling only),
    /// finished distribution parameters, value. Next states are written to the env rows.
    fn step(&self, obs: &Tensor, envs: &Tensor, rng: Option<&Tensor>) -> R<Tensor> {
        let _guard = tch::no_grad_guard();
        let x = self.program.preprocess(obs).map_err(te)?;
        let states = self
            .state
            .iter()
            .map(|s| s.f_index_select(0, envs))
            .collect::<Result<Vec<_>, _>>()
            .map_err(te)?;
        let slots = self.program.run(x, states).map_err(te)?;
        let params = self.head.params(&slots).map_err(te)?;
        let mut parts = vec![];
        if self.opts.sampling == Sampling::Device {
            parts.push(self.head.actions(&params, rng.map(|r| (envs, r)))?);
        }
        parts.push(params);
        if let Some(v) = self.head.value_slot {
            parts.push(
                slots[v]
                    .as_ref()
                    .expect("computed")
                    .f_to_kind(Kind::Float)
                    .map_err(te)?,
            );
        }
        for (st, (_, _, next)) in self.state.iter().zip(&self.program.states) {
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

    /// The guest's request check of env ids (one rule for every runtime), then state growth.
    fn check_envs(&mut self, batch: usize, envs: EnvIds<'_>) -> R<()> {
        let ids = &mut self.env_scratch;
        envs.resolve(batch, ids).map_err(PolicyError::from)?;
        if self.program.states.is_empty() {
            return Ok(());
        }
        envs.check_distinct(batch, ids).map_err(PolicyError::from)?;
        let max = (0..batch).map(|r| envs.get(r)).max().unwrap_or(0) as usize;
        if max >= DEFAULT_MAX_ENVS {
            return Err(PolicyError::from(EnvIdError::BeyondLimit {
                env: max as u32,
                limit: DEFAULT_MAX_ENVS,
            })
            .into());
        }
        if max >= self.num_envs {
            self.grow_state((max + 1).max(self.num_envs * 2))?;
        }
        Ok(())
    }

    pub(crate) fn act(&mut self, req: &Request<'_>, out: &mut ActOutputs) -> R<()> {
        let (obs, batch, mode, envs) = (req.obs, req.batch, req.mode, req.envs);
        if batch == 0 || batch > MAX_BATCH {
            return Err(PolicyError::Batch {
                batch,
                max: MAX_BATCH,
            }
            .into());
        }
        check_observations(
            &self.artifact.manifest.observation,
            &self.one_hot,
            obs,
            batch,
        )
        .map_err(PolicyError::from)?;
        if let Some(s) = req.episode_starts
            && s.len() != batch
        {
            return Err(PolicyError::from(policyport::StateError::EpisodeStarts {
                found: s.len(),
                batch,
            })
            .into());
        }
        self.check_envs(batch, envs)?;
        // The one state model: a flagged row's env state is zeroed before the step.
        if let Some(s) = req.episode_starts
            && !self.program.states.is_empty()
        {
            let starting: Vec<u32> = (0..batch).filter(|r| s[*r]).map(|r| envs.get(r)).collect();
            if !starting.is_empty() {
                self.reset(&starting)?;
            }
        }
        let width = self.width();
        let mut rows = std::mem::take(&mut self.rows);
        rows.resize(batch * width, 0.0);
        let r = match self.opts.launch {
            Launch::Eager => self.run_eager(obs, batch, mode, envs, &mut rows),
            _ => self.run_static(obs, batch, mode, envs, &mut rows),
        };
        if let Err(e) = r {
            self.rows = rows;
            return Err(e);
        }
        self.unpack(&rows, batch, mode, envs, out);
        self.rows = rows;
        Ok(())
    }

    fn obs_tensor(&self, obs: Observations<'_>, rows: std::ops::Range<usize>) -> R<Tensor> {
        let raw = self.program.raw_len as usize;
        let (start, len) = (rows.start, rows.len());
        let t = match obs {
            Observations::F32(x) => Tensor::f_from_slice(&x[start * raw..(start + len) * raw]),
            Observations::U8(x) => Tensor::f_from_slice(&x[start * raw..(start + len) * raw]),
        };
        t.and_then(|t| t.f_reshape([len as i64, raw as i64]))
            .map_err(te)
    }

    fn run_eager(
        &mut self,
        obs: Observations<'_>,
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        rows: &mut [f32],
    ) -> R<()> {
        let x = self
            .obs_tensor(obs, 0..batch)?
            .f_to_device(self.device)
            .map_err(te)?;
        self.ids.clear();
        self.ids.extend((0..batch).map(|r| envs.get(r) as i64));
        let device_rng = match (mode, self.opts.sampling) {
            (ActMode::Sample { seed, step }, Sampling::Device) => {
                let mut rng = [0i64; RNG_LEN];
                rng_input(seed, step, &mut rng);
                self.ids.extend_from_slice(&rng);
                true
            }
            _ => false,
        };
        let idx = Tensor::f_from_slice(&self.ids)
            .and_then(|t| t.f_to_device(self.device))
            .map_err(te)?;
        let env_t = idx.f_narrow(0, 0, batch as i64).map_err(te)?;
        let rng_t = if device_rng {
            Some(idx.f_narrow(0, batch as i64, RNG_LEN as i64).map_err(te)?)
        } else {
            None
        };
        let packed = self.step(&x, &env_t, rng_t.as_ref())?;
        packed
            .f_to_device(Device::Cpu)
            .and_then(|t| t.f_contiguous())
            .and_then(|t| t.f_copy_data(rows, rows.len()))
            .map_err(te)
    }

    fn run_static(
        &mut self,
        obs: Observations<'_>,
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        rows: &mut [f32],
    ) -> R<()> {
        let width = self.width();
        let scratch = self.num_envs as u32;
        let sample = matches!(mode, ActMode::Sample { .. });
        let mut rng = [0i64; RNG_LEN];
        if let ActMode::Sample { seed, step } = mode {
            rng_input(seed, step, &mut rng);
        }
        let _guard = tch::no_grad_guard();
        for chunk in self.plan.chunks(batch) {
            let ri = self
                .runs
                .iter()
                .position(|r| r.bucket == chunk.bucket)
                .expect("a run per bucket");
            let mut ids = std::mem::take(&mut self.ids);
            padded_env_ids(
                (chunk.start..chunk.start + chunk.len).map(|r| envs.get(r)),
                chunk.bucket,
                scratch,
                &mut ids,
            );
            ids.extend_from_slice(&rng);
            let x = self.obs_tensor(obs, chunk.start..chunk.start + chunk.len)?;
            let res = self.run_chunk(ri, sample, chunk.len, &x, &ids);
            self.ids = ids;
            let dst = &mut rows[chunk.start * width..(chunk.start + chunk.len) * width];
            res?.f_copy_data(dst, chunk.len * width).map_err(te)?;
        }
        Ok(())
    }

    /// Fill bucket `ri`'s inputs, replay (or run) it, and read back its first `len` rows.
    fn run_chunk(
        &mut self,
        ri: usize,
        sample: bool,
        len: usize,
        x: &Tensor,
        ids: &[i64],
    ) -> R<Tensor> {
        {
            let run = &self.runs[ri];
            run.obs
                .f_narrow(0, 0, len as i64)
                .and_then(|mut d| d.f_copy_(x))
                .map_err(te)?;
            let ids = Tensor::f_from_slice(ids).map_err(te)?;
            run.idx.shallow_clone().f_copy_(&ids).map_err(te)?;
        }
        let m = sample as usize;
        let out = if self.opts.launch == Launch::CudaGraphs {
            self.runs[ri].graphs[m]
                .as_mut()
                .expect("captured")
                .replay()?;
            self.runs[ri].out[m]
                .as_ref()
                .expect("captured")
                .shallow_clone()
        } else {
            self.step_static(&self.runs[ri], sample)?
        };
        out.f_narrow(0, 0, len as i64)
            .and_then(|t| t.f_to_device(Device::Cpu))
            .and_then(|t| t.f_contiguous())
            .map_err(te)
    }

    fn unpack(
        &self,
        rows: &[f32],
        batch: usize,
        mode: ActMode,
        envs: EnvIds<'_>,
        out: &mut ActOutputs,
    ) {
        let (k, p, width) = (self.sampler.action_len(), self.p, self.width());
        let dev_k = if self.opts.sampling == Sampling::Device {
            k
        } else {
            0
        };
        let disc = self.sampler.is_discrete();
        out.batch = batch;
        out.dist_params.resize(batch * p, 0.0);
        out.value
            .resize(if self.has_value { batch } else { 0 }, 0.0);
        if disc {
            out.discrete.resize(batch * k, 0);
            out.continuous.clear();
        } else {
            out.continuous.resize(batch * k, 0.0);
            out.discrete.clear();
        }
        for row in 0..batch {
            let src = &rows[row * width..(row + 1) * width];
            let params = &src[dev_k..dev_k + p];
            out.dist_params[row * p..(row + 1) * p].copy_from_slice(params);
            if self.has_value {
                out.value[row] = src[dev_k + p];
            }
            if dev_k > 0 {
                if disc {
                    for (d, a) in out.discrete[row * k..(row + 1) * k]
                        .iter_mut()
                        .zip(&src[..k])
                    {
                        *d = *a as i64;
                    }
                } else {
                    out.continuous[row * k..(row + 1) * k].copy_from_slice(&src[..k]);
                }
            } else {
                let (d, c) = if disc {
                    (&mut out.discrete[row * k..(row + 1) * k], &mut [][..])
                } else {
                    (&mut [][..], &mut out.continuous[row * k..(row + 1) * k])
                };
                self.sampler.act_row(params, mode, envs.get(row), d, c);
            }
        }
    }

    pub(crate) fn reset(&mut self, envs: &[u32]) -> R<()> {
        if self.program.states.is_empty() {
            return Ok(());
        }
        // Envs past the allocated rows have no state yet: they start at zero when first used.
        let ids: Vec<i64> = envs
            .iter()
            .filter(|e| (**e as usize) < self.num_envs)
            .map(|e| *e as i64)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let _guard = tch::no_grad_guard();
        let idx = Tensor::f_from_slice(&ids)
            .and_then(|t| t.f_to_device(self.device))
            .map_err(te)?;
        for st in &self.state {
            let _ = st.shallow_clone().f_index_fill_(0, &idx, 0.0).map_err(te)?;
        }
        Ok(())
    }

    pub(crate) fn state(&self, k: usize, env: u32) -> R<Vec<f32>> {
        let st = self.state.get(k).ok_or_else(|| {
            PolicyError::from(policyport::StateError::NoSuchTensor {
                index: k,
                count: self.state.len(),
            })
        })?;
        if env as usize >= self.num_envs {
            return Ok(vec![0.0; self.program.states[k].1 as usize]);
        }
        let row = st
            .f_get(env as i64)
            .and_then(|t| t.f_to_device(Device::Cpu))
            .map_err(te)?;
        Vec::<f32>::try_from(&row).map_err(te)
    }

    pub(crate) fn info(&self) -> TorchInfo {
        TorchInfo {
            name: self.artifact.manifest.name.clone(),
            device: format!("{:?}", self.device),
            precision: self.opts.precision,
            launch: self.opts.launch,
            sampling: self.opts.sampling,
            buckets: if self.opts.launch == Launch::Eager {
                vec![]
            } else {
                self.plan.sizes().to_vec()
            },
            obs_len: self.artifact.manifest.observation.raw_len(),
            action_len: self.sampler.action_len(),
            recurrent_states: self.program.states.len(),
            num_envs: self.num_envs,
        }
    }

    pub(crate) fn verify(&mut self) -> R<Vec<GoldenReport>> {
        let m = self.artifact.manifest.clone();
        let shape = GoldenShape {
            action_len: self.sampler.action_len(),
            dist_params_len: self.p,
            discrete: self.sampler.is_discrete(),
        };
        let mut reports = vec![];
        for case in &m.golden {
            let envs: Vec<u32> = (case.env_offset..case.env_offset + case.batch as u32).collect();
            let obs = Observations::F32(&case.obs);
            let mut det = ActOutputs::default();
            self.reset(&envs)?;
            self.act(
                &Request::new(obs, case.batch, ActMode::Deterministic)
                    .envs(EnvIds::Range(case.env_offset)),
                &mut det,
            )?;
            let mut sampled = ActOutputs::default();
            self.reset(&envs)?;
            let mode = ActMode::Sample {
                seed: case.seed,
                step: case.step,
            };
            self.act(
                &Request::new(obs, case.batch, mode).envs(EnvIds::Range(case.env_offset)),
                &mut sampled,
            )?;
            self.reset(&envs)?;
            reports.push(compare_golden(
                case,
                &m,
                shape,
                &det,
                &sampled,
                &mut |name| self.probe(&case.obs, case.batch, name),
            )?);
        }
        Ok(reports)
    }

    /// Any named value for a batch (zero recurrent state), read back as f32.
    /// A golden value that is not an act() output: the same lowering, reading back `name` (so the fusion pass
    /// keeps it), run once.
    fn probe(&self, obs: &[f32], batch: usize, name: &str) -> R<Vec<f32>> {
        if !self.validated.shapes.contains_key(name) {
            return Err(TorchError::Artifact(
                policyport::format::FormatError::UndefinedValue {
                    name: name.into(),
                    user: "golden case".into(),
                },
            ));
        }
        let _guard = tch::no_grad_guard();
        let program = Program::new(
            &self.artifact,
            &self.validated,
            &[name],
            self.compute,
            self.device,
        )?;
        let slot = program.readback[0];
        let x = self
            .obs_tensor(Observations::F32(obs), 0..batch)?
            .f_to_device(self.device)
            .map_err(te)?;
        let x = program.preprocess(&x).map_err(te)?;
        let states = program
            .states
            .iter()
            .map(|(_, n, _)| Tensor::f_zeros([batch as i64, *n], (Kind::Float, self.device)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(te)?;
        let s = program.run(x, states).map_err(te)?;
        let t = s[slot]
            .as_ref()
            .ok_or_else(|| TorchError::Torch(format!("value {name} is not computed by act()")))?
            .f_to_kind(Kind::Float)
            .and_then(|t| t.f_to_device(Device::Cpu))
            .and_then(|t| t.f_reshape([-1]))
            .map_err(te)?;
        Vec::<f32>::try_from(&t).map_err(te)
    }
}
