//! Building a manifest's op graph straight from a state dict (the routes that read trainers' files: SB3 archives,
//! CleanRL checkpoints): every weight a node names is taken from the state dict by key and its shape checked
//! against the layer it is used as, so a state dict of another architecture is a typed error naming the key.

use std::collections::BTreeMap;

use policyport_format::container::Tensor;
use policyport_format::{Module, ModuleRole, Node, Op, Producer};

use crate::ImportError;

pub(crate) struct GraphBuilder<'a> {
    sd: &'a BTreeMap<String, Tensor>,
    /// What the route said it reads, for errors ("SB3 archive", "CleanRL checkpoint").
    what: &'static str,
    /// The weights the graph uses (copied out of the state dict).
    pub(crate) tensors: BTreeMap<String, Tensor>,
    nodes: Vec<Node>,
}

impl<'a> GraphBuilder<'a> {
    pub(crate) fn new(sd: &'a BTreeMap<String, Tensor>, what: &'static str) -> Self {
        GraphBuilder {
            sd,
            what,
            tensors: BTreeMap::new(),
            nodes: vec![],
        }
    }

    pub(crate) fn bad(&self, detail: impl Into<String>) -> ImportError {
        ImportError::Malformed(format!("{}: {}", self.what, detail.into()))
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.sd.contains_key(key)
    }

    /// The state dict's tensor `key`, recorded as a weight of the artifact.
    pub(crate) fn take(&mut self, key: &str) -> Result<Tensor, ImportError> {
        let t = self
            .sd
            .get(key)
            .ok_or_else(|| self.bad(format!("the state dict lacks '{key}'")))?
            .clone();
        self.tensors.insert(key.to_string(), t.clone());
        Ok(t)
    }

    /// A node reading `x`, defining (and named) `out`.
    pub(crate) fn node(&mut self, op: Op, x: &str, out: &str) -> String {
        self.nodes.push(Node {
            name: out.to_string(),
            op,
            inputs: vec![x.to_string()],
            output: out.to_string(),
        });
        out.to_string()
    }

    /// `key.weight` `[out, dim]` (+ `key.bias` if present) as a dense layer on `x`; returns (value, out).
    pub(crate) fn linear(&mut self, key: &str, x: &str, dim: usize) -> Result<(String, usize), ImportError> {
        let w = self.take(&format!("{key}.weight"))?;
        if w.shape.len() != 2 || w.shape[1] != dim {
            return Err(self.bad(format!("'{key}.weight' is {:?}, expected [_, {dim}]", w.shape)));
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

    /// Linear layers `prefix.0`, `prefix.2`, ... (an `nn.Sequential` with activations at odd indices), with `act`
    /// after every layer (`act_after_last`, SB3's `create_mlp` hidden stack) or between them (CleanRL's heads).
    pub(crate) fn sequential(
        &mut self,
        prefix: &str,
        x: &str,
        dim: usize,
        act: &Op,
        act_after_last: bool,
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
                _ => return Err(self.bad(format!("observations {input:?} are too small for NatureCNN"))),
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
