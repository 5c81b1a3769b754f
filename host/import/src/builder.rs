//! Building a manifest's op graph straight from a state dict (the routes that read trainers' files: SB3 archives,
//! CleanRL checkpoints): every weight a node names is taken from the state dict by key and its shape checked
//! against the layer it is used as, so a state dict of another architecture is a typed error naming the key.

use std::collections::BTreeMap;

use policyport_format::container::Tensor;
use policyport_format::{Module, ModuleRole, Node, Op, Producer, STATE_PREFIX, StateSpec};

use crate::ImportError;

pub(crate) struct GraphBuilder<'a> {
    sd: &'a BTreeMap<String, Tensor>,
    /// What the route said it reads, for errors ("SB3 archive", "CleanRL checkpoint").
    what: &'static str,
    /// The weights the graph uses (copied out of the state dict).
    pub(crate) tensors: BTreeMap<String, Tensor>,
    nodes: Vec<Node>,
    /// The state dict's keys read so far (taken or peeked): [`GraphBuilder::check_every_key_read`] names the rest.
    read: std::cell::RefCell<std::collections::BTreeSet<&'a str>>,
}

impl<'a> GraphBuilder<'a> {
    pub(crate) fn new(sd: &'a BTreeMap<String, Tensor>, what: &'static str) -> Self {
        GraphBuilder {
            sd,
            what,
            tensors: BTreeMap::new(),
            nodes: vec![],
            read: Default::default(),
        }
    }

    /// Keys under `alias` that hold exactly the tensors of the same keys under `of` count as read (a module saved
    /// under two names, as SB3 saves a shared features extractor); a copy that differs stays unread.
    pub(crate) fn read_as_alias(&self, alias: &str, of: &str) {
        let same = |a: &Tensor, b: &Tensor| {
            a.shape == b.shape
                && a.data
                    .iter()
                    .zip(&b.data)
                    .all(|(x, y)| x.to_bits() == y.to_bits())
        };
        let mut read = self.read.borrow_mut();
        for (k, t) in self.sd.range(alias.to_string()..) {
            let Some(rest) = k.strip_prefix(alias) else {
                break;
            };
            if self
                .sd
                .get(&format!("{of}{rest}"))
                .is_some_and(|o| same(o, t))
            {
                read.insert(k.as_str());
            }
        }
    }

    /// Every key of the state dict was read, or is under one of `training_only` (what the trainer keeps that acting
    /// never uses: target networks, critics of off-policy actors, optimiser state): a key prefix, or `*suffix`. A key neither read nor
    /// declared is a layer this importer does not know: compiling without it would drop it without a word.
    pub(crate) fn check_every_key_read(&self, training_only: &[&str]) -> Result<(), ImportError> {
        let read = self.read.borrow();
        let unread: Vec<&str> = self
            .sd
            .keys()
            .map(String::as_str)
            .filter(|k| {
                !read.contains(k)
                    && !training_only.iter().any(|p| match p.strip_prefix('*') {
                        Some(suffix) => k.ends_with(suffix),
                        None => k.starts_with(p),
                    })
            })
            .collect();
        if unread.is_empty() {
            return Ok(());
        }
        Err(ImportError::UnreadWeights {
            what: self.what,
            keys: unread
                .iter()
                .take(if std::env::var_os("POLICYPORT_ALL_UNREAD").is_some() {
                    usize::MAX
                } else {
                    12
                })
                .map(|k| k.to_string())
                .collect(),
            count: unread.len(),
        })
    }

    pub(crate) fn bad(&self, detail: impl Into<String>) -> ImportError {
        ImportError::Malformed(format!("{}: {}", self.what, detail.into()))
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.sd.contains_key(key)
    }

    /// Every key of the state dict.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &'a str> + use<'a> {
        self.sd.keys().map(String::as_str)
    }

    /// The state dict's tensor `key`, recorded as a weight of the artifact.
    pub(crate) fn take(&mut self, key: &str) -> Result<Tensor, ImportError> {
        let t = self.peek(key)?.clone();
        self.tensors.insert(key.to_string(), t.clone());
        Ok(t)
    }

    /// The state dict's tensor `key`, read but not recorded (its data goes into a derived weight).
    pub(crate) fn peek(&self, key: &str) -> Result<&'a Tensor, ImportError> {
        let (k, t) = self
            .sd
            .get_key_value(key)
            .ok_or_else(|| self.bad(format!("the state dict lacks '{key}'")))?;
        self.read.borrow_mut().insert(k.as_str());
        Ok(t)
    }

    /// Record a weight computed at import (e.g. an LSTM's two matrices side by side); returns its name.
    pub(crate) fn derived(&mut self, name: &str, t: Tensor) -> String {
        self.tensors.insert(name.to_string(), t);
        name.to_string()
    }

    /// A node reading `x`, defining (and named) `out`.
    pub(crate) fn node(&mut self, op: Op, x: &str, out: &str) -> String {
        self.node_n(op, &[x], out)
    }

    /// A node reading several values (Add, Mul, Concat).
    pub(crate) fn node_n(&mut self, op: Op, inputs: &[&str], out: &str) -> String {
        self.nodes.push(Node {
            name: out.to_string(),
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            output: out.to_string(),
        });
        out.to_string()
    }

    /// A PyTorch `nn.LSTM` stored under `key` (`weight_ih_l{k}`, `weight_hh_l{k}`, optional `bias_ih_l{k}`,
    /// `bias_hh_l{k}`; as many layers as it has), stepped once on `x` (`dim` features). Each layer's `h` and `c`
    /// become per-env recurrent states (zeros at an episode start, as SB3, CleanRL and RLlib reset them).
    pub(crate) fn torch_lstm(
        &mut self,
        key: &str,
        x: &str,
        dim: usize,
    ) -> Result<Recurrent, ImportError> {
        const GATES: usize = 4;
        let prefix = format!("{key}.");
        for k in self.sd.keys().filter(|k| k.starts_with(&prefix)) {
            let field = &k[prefix.len()..];
            if field.ends_with("_reverse") {
                return Err(ImportError::Unsupported {
                    what: format!("a bidirectional recurrent layer ('{k}')"),
                    hint: "a policy steps forward in time; train with bidirectional=False".into(),
                });
            }
            if field.starts_with("weight_hr_") {
                return Err(ImportError::Unsupported {
                    what: format!("an LSTM with proj_size ('{k}')"),
                    hint: "train with proj_size=0".into(),
                });
            }
        }
        let (mut x, mut dim) = (x.to_string(), dim);
        let mut out = Recurrent::default();
        let mut layer = 0;
        while self.has(&format!("{key}.weight_ih_l{layer}")) || layer == 0 {
            let w_ih = self.peek(&format!("{key}.weight_ih_l{layer}"))?;
            let w_hh = self.peek(&format!("{key}.weight_hh_l{layer}"))?;
            let h = w_hh.shape.get(1).copied().unwrap_or(0);
            if w_hh.shape != [GATES * h, h] || h == 0 {
                return Err(self.bad(format!(
                    "'{key}.weight_hh_l{layer}' is {:?}, expected [{GATES}·H, H]",
                    w_hh.shape
                )));
            }
            if w_ih.shape != [GATES * h, dim] {
                return Err(self.bad(format!(
                    "'{key}.weight_ih_l{layer}' is {:?}, expected [{}, {dim}]",
                    w_ih.shape,
                    GATES * h
                )));
            }
            let bias = |g: &Self, which: &str| -> Result<Option<&'a Tensor>, ImportError> {
                let k = format!("{key}.bias_{which}_l{layer}");
                if !g.has(&k) {
                    return Ok(None);
                }
                let b = g.peek(&k)?;
                if b.shape != [GATES * h] {
                    return Err(g.bad(format!("'{k}' is {:?}, expected [{}]", b.shape, GATES * h)));
                }
                Ok(Some(b))
            };
            let (b_ih, b_hh) = (bias(self, "ih")?, bias(self, "hh")?);
            let w = CellWeights {
                hidden: h,
                w_ih: &w_ih.data,
                w_hh: &w_hh.data,
                b_ih: b_ih.map(|b| b.data.as_slice()),
                b_hh: b_hh.map(|b| b.data.as_slice()),
            };
            let name = format!("{key}.l{layer}");
            let (h_state, c_state) = (format!("{name}.h"), format!("{name}.c"));
            let (h_in, c_in) = (
                format!("{STATE_PREFIX}{h_state}"),
                format!("{STATE_PREFIX}{c_state}"),
            );
            let (h_next, c_next) = self.lstm_cell(&name, &x, dim, w, &h_in, &c_in);
            out.reads.extend([h_in, c_in]);
            out.states.push(StateSpec {
                name: h_state,
                shape: vec![h],
                next: h_next.clone(),
            });
            out.states.push(StateSpec {
                name: c_state,
                shape: vec![h],
                next: c_next,
            });
            (x, dim) = (h_next, h);
            layer += 1;
        }
        out.output = x;
        out.hidden = dim;
        Ok(out)
    }

    /// One LSTM step (PyTorch's gate order i, f, g, o in `w`) in the format's ops: the two matrices side by side
    /// over `concat(x, h)` (one GEMM, the two biases summed), the gate rows reordered to i, f, o, g so one sigmoid
    /// covers three gates; `c' = f·c + i·g`, `h' = o·tanh(c')`.
    /// Returns (h', c').
    pub(crate) fn lstm_cell(
        &mut self,
        name: &str,
        x: &str,
        dim: usize,
        w: CellWeights,
        h_in: &str,
        c_in: &str,
    ) -> (String, String) {
        let h = w.hidden;
        let width = dim + h;
        // New row block j reads PyTorch's block ORDER[j].
        const ORDER: [usize; 4] = [0, 1, 3, 2];
        let mut cat = Vec::with_capacity(4 * h * width);
        let mut bias = Vec::with_capacity(4 * h);
        for &src in &ORDER {
            for r in src * h..(src + 1) * h {
                cat.extend_from_slice(&w.w_ih[r * dim..(r + 1) * dim]);
                cat.extend_from_slice(&w.w_hh[r * h..(r + 1) * h]);
                let sum = w.b_ih.map_or(0.0, |b| b[r] as f64) + w.b_hh.map_or(0.0, |b| b[r] as f64);
                bias.push(sum as f32);
            }
        }
        let weight = self.derived(
            &format!("{name}.weight"),
            Tensor::new(vec![4 * h, width], cat),
        );
        let has_bias = w.b_ih.is_some() || w.b_hh.is_some();
        let bias =
            has_bias.then(|| self.derived(&format!("{name}.bias"), Tensor::new(vec![4 * h], bias)));
        let xh = self.node_n(Op::Concat, &[x, h_in], &format!("{name}.xh"));
        let gates = self.node(Op::Dense { weight, bias }, &xh, &format!("{name}.gates"));
        let ifo = self.node(
            Op::Slice {
                start: 0,
                len: 3 * h,
            },
            &gates,
            &format!("{name}.ifo_pre"),
        );
        let ifo = self.node(Op::Sigmoid, &ifo, &format!("{name}.ifo"));
        let g = self.node(
            Op::Slice {
                start: 3 * h,
                len: h,
            },
            &gates,
            &format!("{name}.g_pre"),
        );
        let g = self.node(Op::Tanh, &g, &format!("{name}.g"));
        let i = self.node(Op::Slice { start: 0, len: h }, &ifo, &format!("{name}.i"));
        let f = self.node(Op::Slice { start: h, len: h }, &ifo, &format!("{name}.f"));
        let o = self.node(
            Op::Slice {
                start: 2 * h,
                len: h,
            },
            &ifo,
            &format!("{name}.o"),
        );
        let fc = self.node_n(Op::Mul, &[&f, c_in], &format!("{name}.fc"));
        let ig = self.node_n(Op::Mul, &[&i, &g], &format!("{name}.ig"));
        let c_next = self.node_n(Op::Add, &[&fc, &ig], &format!("{name}.c_next"));
        let tc = self.node(Op::Tanh, &c_next, &format!("{name}.tanh_c"));
        let h_next = self.node_n(Op::Mul, &[&o, &tc], &format!("{name}.h_next"));
        (h_next, c_next)
    }

    /// One GRU step (PyTorch's gate order r, z, n in `w`): `r, z = σ(W_i x + b_i + W_h h + b_h)` on their rows,
    /// `n = tanh(W_in x + b_in + r·(W_hn h + b_hn))` (`linear_before_reset`, PyTorch's form; otherwise ONNX's
    /// default `n = tanh(W_in x + b_in + W_hn (r·h) + b_hn)`), `h' = (1 − z)·n + z·h`.
    pub(crate) fn gru_cell(
        &mut self,
        name: &str,
        x: &str,
        dim: usize,
        w: CellWeights,
        linear_before_reset: bool,
        h_in: &str,
    ) -> String {
        let h = w.hidden;
        let tensor = |rows: std::ops::Range<usize>, m: &[f32], cols: usize| {
            Tensor::new(
                vec![rows.len(), cols],
                m[rows.start * cols..rows.end * cols].to_vec(),
            )
        };
        let bias_of = |g: &mut Self, b: Option<&[f32]>, rows: std::ops::Range<usize>, n: &str| {
            b.map(|b| g.derived(n, Tensor::new(vec![rows.len()], b[rows].to_vec())))
        };
        let wx = self.derived(&format!("{name}.weight_x"), tensor(0..3 * h, w.w_ih, dim));
        let bx = bias_of(self, w.b_ih, 0..3 * h, &format!("{name}.bias_x"));
        let gx = self.node(
            Op::Dense {
                weight: wx,
                bias: bx,
            },
            x,
            &format!("{name}.gx"),
        );
        let (gh_rz, gh_n) = if linear_before_reset {
            let wh = self.derived(&format!("{name}.weight_h"), tensor(0..3 * h, w.w_hh, h));
            let bh = bias_of(self, w.b_hh, 0..3 * h, &format!("{name}.bias_h"));
            let gh = self.node(
                Op::Dense {
                    weight: wh,
                    bias: bh,
                },
                h_in,
                &format!("{name}.gh"),
            );
            let rz = self.node(
                Op::Slice {
                    start: 0,
                    len: 2 * h,
                },
                &gh,
                &format!("{name}.gh_rz"),
            );
            let n = self.node(
                Op::Slice {
                    start: 2 * h,
                    len: h,
                },
                &gh,
                &format!("{name}.gh_n"),
            );
            (rz, Some(n))
        } else {
            let wh = self.derived(&format!("{name}.weight_h_rz"), tensor(0..2 * h, w.w_hh, h));
            let bh = bias_of(self, w.b_hh, 0..2 * h, &format!("{name}.bias_h_rz"));
            (
                self.node(
                    Op::Dense {
                        weight: wh,
                        bias: bh,
                    },
                    h_in,
                    &format!("{name}.gh_rz"),
                ),
                None,
            )
        };
        let gx_rz = self.node(
            Op::Slice {
                start: 0,
                len: 2 * h,
            },
            &gx,
            &format!("{name}.gx_rz"),
        );
        let rz = self.node_n(Op::Add, &[&gx_rz, &gh_rz], &format!("{name}.rz_pre"));
        let rz = self.node(Op::Sigmoid, &rz, &format!("{name}.rz"));
        let r = self.node(Op::Slice { start: 0, len: h }, &rz, &format!("{name}.r"));
        let z = self.node(Op::Slice { start: h, len: h }, &rz, &format!("{name}.z"));
        let hn = match gh_n {
            Some(gh_n) => self.node_n(Op::Mul, &[&r, &gh_n], &format!("{name}.r_hn")),
            None => {
                let rh = self.node_n(Op::Mul, &[&r, h_in], &format!("{name}.rh"));
                let wn = self.derived(
                    &format!("{name}.weight_h_n"),
                    tensor(2 * h..3 * h, w.w_hh, h),
                );
                let bn = bias_of(self, w.b_hh, 2 * h..3 * h, &format!("{name}.bias_h_n"));
                self.node(
                    Op::Dense {
                        weight: wn,
                        bias: bn,
                    },
                    &rh,
                    &format!("{name}.r_hn"),
                )
            }
        };
        let gx_n = self.node(
            Op::Slice {
                start: 2 * h,
                len: h,
            },
            &gx,
            &format!("{name}.gx_n"),
        );
        let n = self.node_n(Op::Add, &[&gx_n, &hn], &format!("{name}.n_pre"));
        let n = self.node(Op::Tanh, &n, &format!("{name}.n"));
        let minus = self.derived(
            &format!("{name}.one_minus.scale"),
            Tensor::new(vec![1], vec![-1.0]),
        );
        let one = self.derived(
            &format!("{name}.one_minus.shift"),
            Tensor::new(vec![1], vec![1.0]),
        );
        let omz = self.node(
            Op::Affine {
                scale: Some(minus),
                shift: Some(one),
            },
            &z,
            &format!("{name}.one_minus_z"),
        );
        let a = self.node_n(Op::Mul, &[&omz, &n], &format!("{name}.keep_n"));
        let b = self.node_n(Op::Mul, &[&z, h_in], &format!("{name}.keep_h"));
        self.node_n(Op::Add, &[&a, &b], &format!("{name}.h_next"))
    }

    /// The nodes built so far (for a route that owns its node list: the ONNX importer).
    pub(crate) fn take_nodes(&mut self) -> Vec<Node> {
        std::mem::take(&mut self.nodes)
    }

    /// `key.weight` `[out, dim]` (+ `key.bias` if present) as a dense layer on `x`; returns (value, out).
    pub(crate) fn linear(
        &mut self,
        key: &str,
        x: &str,
        dim: usize,
    ) -> Result<(String, usize), ImportError> {
        let w = self.take(&format!("{key}.weight"))?;
        if w.shape.len() != 2 || w.shape[1] != dim {
            return Err(self.bad(format!(
                "'{key}.weight' is {:?}, expected [_, {dim}]",
                w.shape
            )));
        }
        let b = format!("{key}.bias");
        let bias = if self.has(&b) {
            self.take(&b)?;
            Some(b)
        } else {
            None
        };
        let y = self.node(
            Op::Dense {
                weight: format!("{key}.weight"),
                bias,
            },
            x,
            key,
        );
        Ok((y, w.shape[0]))
    }

    /// Compose a constant linear map `m` (`rows` × k, row-major, f64) onto the output of the dense node that
    /// defines `value` (k outputs): its weight `W` and bias `b` become `m·W` and `m·b`, computed in f64 and
    /// rounded once (RLlib's dueling head: the advantage stream centred, `A − mean(A)`, and the value stream
    /// broadcast to every action, each folded into its last layer instead of run as ops). The node keeps its
    /// name; the folded weights are derived tensors `{value}.{tag}.weight` / `.bias`, and the layer's own weights
    /// leave the artifact. Returns the new output width (`rows`).
    pub(crate) fn compose_into_dense(
        &mut self,
        value: &str,
        m: &[f64],
        rows: usize,
        tag: &str,
    ) -> Result<usize, ImportError> {
        let i = self
            .nodes
            .iter()
            .rposition(|n| n.output == value)
            .ok_or_else(|| self.bad(format!("no pending node defines '{value}'")))?;
        let Op::Dense { weight, bias } = self.nodes[i].op.clone() else {
            return Err(self.bad(format!("'{value}' is not a dense layer's output")));
        };
        let w = self
            .tensors
            .get(&weight)
            .cloned()
            .ok_or_else(|| self.bad(format!("'{weight}' is not a recorded weight")))?;
        let (k, d) = (w.shape[0], w.shape[1]);
        if rows == 0 || m.len() != rows * k {
            return Err(self.bad(format!(
                "a {} x {k} map onto '{value}' ({k} outputs) has {} entries",
                rows,
                m.len()
            )));
        }
        let b = match &bias {
            Some(b) => Some(
                self.tensors
                    .get(b)
                    .cloned()
                    .ok_or_else(|| self.bad(format!("'{b}' is not a recorded weight")))?,
            ),
            None => None,
        };
        let mut w2 = vec![0f32; rows * d];
        let mut b2 = vec![0f32; rows];
        for r in 0..rows {
            let coef = &m[r * k..(r + 1) * k];
            for (c, out) in w2[r * d..(r + 1) * d].iter_mut().enumerate() {
                *out = coef
                    .iter()
                    .enumerate()
                    .map(|(j, a)| a * w.data[j * d + c] as f64)
                    .sum::<f64>() as f32;
            }
            if let Some(b) = &b {
                b2[r] = coef
                    .iter()
                    .zip(&b.data)
                    .map(|(a, v)| a * *v as f64)
                    .sum::<f64>() as f32;
            }
        }
        // The layer's own weights are used by this node alone (`linear` recorded them for it).
        self.tensors.remove(&weight);
        if let Some(b) = &bias {
            self.tensors.remove(b);
        }
        let weight = self.derived(
            &format!("{value}.{tag}.weight"),
            Tensor::new(vec![rows, d], w2),
        );
        let bias = b
            .is_some()
            .then(|| self.derived(&format!("{value}.{tag}.bias"), Tensor::new(vec![rows], b2)));
        self.nodes[i].op = Op::Dense { weight, bias };
        Ok(rows)
    }

    /// Linear layers `prefix.0`, `prefix.2`, ... (an `nn.Sequential` with activations at odd indices), with `act`
    /// after every layer (`act_after_last`, SB3's `create_mlp` hidden stack) or between them (CleanRL's heads).
    /// At least `min_layers` layers (SB3's `net_arch=[]` is an empty stack; a CleanRL head has one or more), and
    /// every key under `prefix.` must be one of the layers read: a missing head used to compile into a policy
    /// whose output was its input, and a gap or a renamed layer was dropped without a word.
    pub(crate) fn sequential(
        &mut self,
        prefix: &str,
        x: &str,
        dim: usize,
        act: &Op,
        act_after_last: bool,
        min_layers: usize,
    ) -> Result<(String, usize), ImportError> {
        let (mut x, mut dim) = (x.to_string(), dim);
        let mut i = 0;
        while self.has(&format!("{prefix}.{i}.weight")) {
            let (y, d) = self.linear(&format!("{prefix}.{i}"), &x, dim)?;
            dim = d;
            let more = self.has(&format!("{prefix}.{}.weight", i + 2));
            x = if more || act_after_last {
                self.node(act.clone(), &y, &format!("{prefix}.{}", i + 1))
            } else {
                y
            };
            i += 2;
        }
        if i / 2 < min_layers {
            return Err(self.bad(format!(
                "no '{prefix}.0.weight': the state dict has no '{prefix}' layers (at least {min_layers} expected)"
            )));
        }
        let under = format!("{prefix}.");
        let stray: Vec<&str> = self
            .keys()
            .filter(|k| k.starts_with(&under))
            .filter(|k| {
                let mut parts = k[under.len()..].splitn(2, '.');
                let index = parts.next().and_then(|s| s.parse::<usize>().ok());
                let field = parts.next();
                !(matches!(index, Some(j) if j % 2 == 0 && j < i)
                    && matches!(field, Some("weight" | "bias")))
            })
            .collect();
        if !stray.is_empty() {
            let read = match i / 2 {
                0 => "none".to_string(),
                1 => "index 0".to_string(),
                n => format!("indices 0, 2, .. {}", 2 * (n - 1)),
            };
            return Err(self.bad(format!(
                "{} are not layers of '{prefix}' read ({read}): a gap or a renamed layer would be dropped",
                stray
                    .iter()
                    .take(6)
                    .map(|k| format!("'{k}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok((x, dim))
    }

    /// NatureCNN (Mnih et al. 2015, as SB3, CleanRL and RLlib build it) on a `[C, H, W]` value: Conv(8, stride 4)
    /// ReLU Conv(4, 2) ReLU Conv(3, 1) ReLU Flatten, then `linear` + ReLU. `convs` are the three conv keys;
    /// `names` the value names of the flatten and the final ReLU. Returns (value, features).
    pub(crate) fn nature_cnn(
        &mut self,
        convs: [String; 3],
        linear: &str,
        x: &str,
        input: &[usize],
        names: [&str; 2],
    ) -> Result<(String, usize), ImportError> {
        if input.len() != 3 {
            return Err(self.bad(format!("NatureCNN on observations of shape {input:?}")));
        }
        let mut shape = input.to_vec();
        let mut x = x.to_string();
        for (key, (k, s)) in convs.iter().zip([(8usize, 4usize), (4, 2), (3, 1)]) {
            let w = self.take(&format!("{key}.weight"))?;
            self.take(&format!("{key}.bias"))?;
            if w.shape.len() != 4 || w.shape[1..] != [shape[0], k, k] {
                return Err(self.bad(format!(
                    "'{key}.weight' is {:?}; NatureCNN expects [_, {}, {k}, {k}] here",
                    w.shape, shape[0]
                )));
            }
            let y = self.node(
                Op::Conv2d {
                    weight: format!("{key}.weight"),
                    bias: Some(format!("{key}.bias")),
                    stride: [s, s],
                    padding: [0; 4],
                    dilation: [1, 1],
                    groups: 1,
                },
                &x,
                key,
            );
            x = self.node(Op::Relu, &y, &format!("{key}.relu"));
            let side = |n: usize| n.checked_sub(k).map(|v| v / s + 1);
            match (side(shape[1]), side(shape[2])) {
                (Some(h), Some(w2)) => shape = vec![w.shape[0], h, w2],
                _ => {
                    return Err(self.bad(format!(
                        "observations {input:?} are too small for NatureCNN"
                    )));
                }
            }
        }
        let flat = self.node(Op::Flatten, &x, names[0]);
        let (y, d) = self.linear(linear, &flat, shape.iter().product())?;
        Ok((self.node(Op::Relu, &y, names[1]), d))
    }

    /// The nodes built since the last module, as a module.
    pub(crate) fn module(
        &mut self,
        name: &str,
        role: ModuleRole,
        inputs: Vec<String>,
        outputs: Vec<String>,
    ) -> Module {
        Module {
            name: name.into(),
            role,
            inputs,
            outputs,
            nodes: std::mem::take(&mut self.nodes),
        }
    }

    /// Were nodes built since the last module?
    pub(crate) fn pending(&self) -> bool {
        !self.nodes.is_empty()
    }
}

/// The weights of one recurrent layer in PyTorch's layout and gate order: `w_ih` `[G·H, in]`, `w_hh` `[G·H, H]`,
/// biases `[G·H]` (G = 4 for an LSTM, 3 for a GRU).
pub(crate) struct CellWeights<'w> {
    pub(crate) hidden: usize,
    pub(crate) w_ih: &'w [f32],
    pub(crate) w_hh: &'w [f32],
    pub(crate) b_ih: Option<&'w [f32]>,
    pub(crate) b_hh: Option<&'w [f32]>,
}

/// What a stack of recurrent layers added: its output value and width, the state values it reads (the module's
/// inputs besides `x`) and its states (for the manifest's `recurrent`), layer by layer.
#[derive(Debug, Default)]
pub(crate) struct Recurrent {
    pub(crate) output: String,
    pub(crate) hidden: usize,
    pub(crate) reads: Vec<String>,
    pub(crate) states: Vec<StateSpec>,
}

impl Recurrent {
    /// The module's outputs: the stack's output, then every next state.
    pub(crate) fn outputs(&self) -> Vec<String> {
        let mut v = vec![self.output.clone()];
        v.extend(
            self.states
                .iter()
                .map(|s| s.next.clone())
                .filter(|n| *n != self.output),
        );
        v
    }
}

/// Who made an artifact: this toolchain, from `route:source` (e.g. `sb3:model.zip`), with the route's notes.
pub(crate) fn producer(route: &str, source: &str, notes: String) -> Producer {
    Producer {
        tool: "policyport".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        source: format!("{route}:{source}"),
        notes,
    }
}

/// A policy's default name: the source file's name without its directory and `extension`.
pub(crate) fn file_stem<'s>(source: &'s str, extension: &str) -> &'s str {
    let name = source.rsplit('/').next().unwrap_or(source);
    name.strip_suffix(extension).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    //! The recurrent cells in the format's ops, against the textbook equations in float64 (PyTorch's, as its
    //! `nn.LSTM` / `nn.GRU` docs write them), stepped with the state carried, through the reference interpreter.
    use super::*;
    use policyport_format::{
        ActionSpace, Distribution, Manifest, OBS_VALUE, ObsDType, ObservationSpace, RecurrentSpec,
    };

    fn filled(shape: &[usize], seed: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::new(
            shape.to_vec(),
            (0..n)
                .map(|i| ((i as f32 * 0.731 + seed).sin()) * 0.6)
                .collect(),
        )
    }

    fn sig(v: f64) -> f64 {
        1.0 / (1.0 + (-v).exp())
    }

    /// `W x` for a row-major `[rows, cols]` f32 matrix, rows `r0..r0+n`.
    fn mv(w: &Tensor, x: &[f64], r0: usize, n: usize) -> Vec<f64> {
        let cols = w.shape[1];
        (r0..r0 + n)
            .map(|r| (0..cols).map(|c| w.data[r * cols + c] as f64 * x[c]).sum())
            .collect()
    }

    fn manifest(
        g: &mut GraphBuilder,
        kind: &str,
        linear_before_reset: bool,
        dim: usize,
    ) -> Manifest {
        let r = match kind {
            "lstm" => g.torch_lstm("rnn", OBS_VALUE, dim).unwrap(),
            _ => {
                let t = |k: &str| g.sd[k].clone();
                let (wi, wh, bi, bh) = (
                    t("rnn.weight_ih_l0"),
                    t("rnn.weight_hh_l0"),
                    t("rnn.bias_ih_l0"),
                    t("rnn.bias_hh_l0"),
                );
                let w = CellWeights {
                    hidden: 4,
                    w_ih: &wi.data,
                    w_hh: &wh.data,
                    b_ih: Some(&bi.data),
                    b_hh: Some(&bh.data),
                };
                let h_next = g.gru_cell(
                    "rnn.l0",
                    OBS_VALUE,
                    dim,
                    w,
                    linear_before_reset,
                    "state/rnn.l0.h",
                );
                Recurrent {
                    output: h_next.clone(),
                    hidden: 4,
                    reads: vec!["state/rnn.l0.h".into()],
                    states: vec![StateSpec {
                        name: "rnn.l0.h".into(),
                        shape: vec![4],
                        next: h_next,
                    }],
                }
            }
        };
        let mut inputs = vec![OBS_VALUE.to_string()];
        inputs.extend(r.reads.iter().cloned());
        let module = g.module("rnn", ModuleRole::RecurrentCore, inputs, r.outputs());
        Manifest {
            name: kind.into(),
            producer: producer("test", "x", String::new()),
            observation: ObservationSpace::Box {
                shape: vec![dim],
                dtype: ObsDType::F32,
            },
            action: ActionSpace::Discrete { n: r.hidden },
            preprocess: vec![],
            modules: vec![module],
            distribution: Distribution::Categorical {
                logits: r.output.clone(),
            },
            value: None,
            recurrent: Some(RecurrentSpec { states: r.states }),
            golden: vec![],
            action_masks: false,
        }
    }

    /// Runs `steps` steps of a batch of 2 from zero state; returns each step's output rows.
    fn run(m: &Manifest, t: &BTreeMap<String, Tensor>, xs: &[Vec<f32>]) -> Vec<Vec<f64>> {
        let spec = &m.recurrent.as_ref().unwrap().states;
        let mut states: Vec<Vec<f64>> = spec.iter().map(|s| vec![0.0; 2 * s.shape[0]]).collect();
        let mut outs = vec![];
        for x in xs {
            let vals = crate::reference::eval_step(m, t, x, 2, &states).unwrap();
            states = spec.iter().map(|s| vals[&s.next].clone()).collect();
            outs.push(vals[m.distribution.param_values()[0]].clone());
        }
        outs
    }

    fn inputs(dim: usize) -> Vec<Vec<f32>> {
        (0..4)
            .map(|s| {
                (0..2 * dim)
                    .map(|i| ((i * 7 + s * 3) as f32 * 0.41).cos())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_two_layer_lstm_steps_like_the_equations() {
        let (dim, h) = (3, 4);
        let mut sd = BTreeMap::new();
        for (l, d) in [(0, dim), (1, h)] {
            sd.insert(
                format!("rnn.weight_ih_l{l}"),
                filled(&[4 * h, d], 0.1 + l as f32),
            );
            sd.insert(
                format!("rnn.weight_hh_l{l}"),
                filled(&[4 * h, h], 0.2 + l as f32),
            );
            sd.insert(
                format!("rnn.bias_ih_l{l}"),
                filled(&[4 * h], 0.3 + l as f32),
            );
            sd.insert(
                format!("rnn.bias_hh_l{l}"),
                filled(&[4 * h], 0.4 + l as f32),
            );
        }
        let mut g = GraphBuilder::new(&sd, "test");
        let m = manifest(&mut g, "lstm", true, dim);
        assert_eq!(
            m.recurrent.as_ref().unwrap().states.len(),
            4,
            "h and c per layer"
        );
        let xs = inputs(dim);
        let got = run(&m, &g.tensors, &xs);
        // The equations, per env row.
        let mut st = vec![[vec![0.0f64; h], vec![0.0; h], vec![0.0; h], vec![0.0; h]]; 2];
        for (step, x) in xs.iter().enumerate() {
            for row in 0..2 {
                let mut inp: Vec<f64> = x[row * dim..(row + 1) * dim]
                    .iter()
                    .map(|v| *v as f64)
                    .collect();
                for l in 0..2 {
                    let (wi, wh) = (
                        &sd[&format!("rnn.weight_ih_l{l}")],
                        &sd[&format!("rnn.weight_hh_l{l}")],
                    );
                    let (bi, bh) = (
                        &sd[&format!("rnn.bias_ih_l{l}")],
                        &sd[&format!("rnn.bias_hh_l{l}")],
                    );
                    let a = mv(wi, &inp, 0, 4 * h);
                    let b = mv(wh, &st[row][2 * l], 0, 4 * h);
                    let z: Vec<f64> = (0..4 * h)
                        .map(|j| a[j] + b[j] + bi.data[j] as f64 + bh.data[j] as f64)
                        .collect();
                    let c: Vec<f64> = (0..h)
                        .map(|j| {
                            sig(z[h + j]) * st[row][2 * l + 1][j] + sig(z[j]) * z[2 * h + j].tanh()
                        })
                        .collect();
                    let hn: Vec<f64> = (0..h).map(|j| sig(z[3 * h + j]) * c[j].tanh()).collect();
                    st[row][2 * l] = hn.clone();
                    st[row][2 * l + 1] = c;
                    inp = hn;
                }
                for j in 0..h {
                    // The two biases are summed once in f32 at import: one rounding, ~1e-8 here.
                    let d = (got[step][row * h + j] - inp[j]).abs();
                    assert!(d < 1e-7, "step {step} row {row}: {d:e}");
                }
            }
        }
    }

    #[test]
    fn a_gru_steps_like_the_equations_in_both_reset_forms() {
        let (dim, h) = (3, 4);
        let mut sd = BTreeMap::new();
        sd.insert("rnn.weight_ih_l0".to_string(), filled(&[3 * h, dim], 0.5));
        sd.insert("rnn.weight_hh_l0".to_string(), filled(&[3 * h, h], 0.6));
        sd.insert("rnn.bias_ih_l0".to_string(), filled(&[3 * h], 0.7));
        sd.insert("rnn.bias_hh_l0".to_string(), filled(&[3 * h], 0.8));
        for (kind, before) in [("gru_cell", true), ("gru_cell", false)] {
            let mut g = GraphBuilder::new(&sd, "test");
            let m = manifest(&mut g, kind, before, dim);
            let xs = inputs(dim);
            let got = run(&m, &g.tensors, &xs);
            let (wi, wh, bi, bh) = (
                &sd["rnn.weight_ih_l0"],
                &sd["rnn.weight_hh_l0"],
                &sd["rnn.bias_ih_l0"],
                &sd["rnn.bias_hh_l0"],
            );
            let mut st = vec![vec![0.0f64; h]; 2];
            for (step, x) in xs.iter().enumerate() {
                for row in 0..2 {
                    let inp: Vec<f64> = x[row * dim..(row + 1) * dim]
                        .iter()
                        .map(|v| *v as f64)
                        .collect();
                    let hp = st[row].clone();
                    let a = mv(wi, &inp, 0, 3 * h);
                    let b = mv(wh, &hp, 0, 3 * h);
                    let bi = |j: usize| bi.data[j] as f64;
                    let bh = |j: usize| bh.data[j] as f64;
                    let r: Vec<f64> = (0..h).map(|j| sig(a[j] + bi(j) + b[j] + bh(j))).collect();
                    let z: Vec<f64> = (0..h)
                        .map(|j| sig(a[h + j] + bi(h + j) + b[h + j] + bh(h + j)))
                        .collect();
                    let hn: Vec<f64> = if before {
                        (0..h)
                            .map(|j| r[j] * (b[2 * h + j] + bh(2 * h + j)))
                            .collect()
                    } else {
                        let rh: Vec<f64> = (0..h).map(|j| r[j] * hp[j]).collect();
                        let m = mv(wh, &rh, 2 * h, h);
                        (0..h).map(|j| m[j] + bh(2 * h + j)).collect()
                    };
                    let n: Vec<f64> = (0..h)
                        .map(|j| (a[2 * h + j] + bi(2 * h + j) + hn[j]).tanh())
                        .collect();
                    st[row] = (0..h).map(|j| (1.0 - z[j]) * n[j] + z[j] * hp[j]).collect();
                    for j in 0..h {
                        assert!(
                            (got[step][row * h + j] - st[row][j]).abs() < 1e-12,
                            "{kind} {before} step {step}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bidirectional_and_projected_lstms_are_refused_by_name() {
        let mut sd = BTreeMap::new();
        sd.insert("rnn.weight_ih_l0".to_string(), filled(&[8, 3], 0.1));
        sd.insert("rnn.weight_hh_l0".to_string(), filled(&[8, 2], 0.1));
        sd.insert("rnn.weight_ih_l0_reverse".to_string(), filled(&[8, 3], 0.1));
        let mut g = GraphBuilder::new(&sd, "test");
        let e = g.torch_lstm("rnn", OBS_VALUE, 3).unwrap_err();
        assert!(e.to_string().contains("bidirectional"), "{e}");
        sd.remove("rnn.weight_ih_l0_reverse");
        sd.insert("rnn.weight_hr_l0".to_string(), filled(&[1, 2], 0.1));
        let mut g = GraphBuilder::new(&sd, "test");
        assert!(
            g.torch_lstm("rnn", OBS_VALUE, 3)
                .unwrap_err()
                .to_string()
                .contains("proj_size")
        );
        sd.remove("rnn.weight_hr_l0");
        // A hidden size the input weights disagree with.
        sd.insert("rnn.weight_hh_l0".to_string(), filled(&[8, 3], 0.1));
        let mut g = GraphBuilder::new(&sd, "test");
        assert!(
            g.torch_lstm("rnn", OBS_VALUE, 3)
                .unwrap_err()
                .to_string()
                .contains("weight_hh_l0")
        );
    }
}
