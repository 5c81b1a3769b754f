//! CleanRL checkpoints (`torch.save(agent.state_dict(), path)`) → manifest + weights. A state dict holds no
//! architecture and no spaces, so the user names the script's agent (`--layout`) and gives the spaces; the
//! layouts are the single-file agents of CleanRL as published, and every key and shape is checked against them:
//!
//! - `cleanrl-ppo` (`ppo.py`): `actor.{0,2,4}` and `critic.{0,2,4}` Linear layers with Tanh between; categorical.
//! - `cleanrl-ppo-continuous` (`ppo_continuous_action.py`): `actor_mean.{0,2,4}`, `critic.{0,2,4}`, the state-independent
//!   `actor_logstd` `[1, n]`; diagonal Gaussian, actions clipped to the bounds (the script's `ClipAction` wrapper).
//! - `cleanrl-atari` (`ppo_atari.py`): `network.{0,2,4}` NatureCNN convolutions + `network.7` Linear, `actor`, `critic`
//!   on `x / 255` of uint8 `[4, 84, 84]` frames.
//! - `cleanrl-sac` (`sac_continuous_action.py`, the `Actor`): `fc1`, `fc2` (ReLU), `fc_mean`, `fc_logstd`, the log-std
//!   squashed `-5 + 3.5 (tanh(l) + 1)`; the squashed Gaussian rescaled to the bounds (`action_scale`/`action_bias`).

use std::collections::BTreeMap;

use policyport_format::container::Tensor;
use policyport_format::{
    ActionSpace, Distribution, LogStd, Manifest, Module, ModuleRole, Node, OBS_VALUE, ObsDType,
    ObservationSpace, Op, Preprocess, Producer,
};

use crate::ImportError;
use crate::onnx::Imported;
use crate::torchfile::read_state_dict;

/// Which CleanRL agent wrote the state dict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanrlLayout {
    Ppo,
    PpoContinuous,
    Atari,
    Sac,
}

impl std::str::FromStr for CleanrlLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "cleanrl-ppo" => CleanrlLayout::Ppo,
            "cleanrl-ppo-continuous" => CleanrlLayout::PpoContinuous,
            "cleanrl-atari" => CleanrlLayout::Atari,
            "cleanrl-sac" => CleanrlLayout::Sac,
            other => {
                return Err(format!(
                    "unknown layout '{other}' (cleanrl-ppo, cleanrl-ppo-continuous, cleanrl-atari, cleanrl-sac)"
                ));
            }
        })
    }
}

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("CleanRL checkpoint: {}", detail.into()))
}

struct Builder<'a> {
    sd: &'a BTreeMap<String, Tensor>,
    tensors: BTreeMap<String, Tensor>,
    nodes: Vec<Node>,
}

impl Builder<'_> {
    fn take(&mut self, key: &str) -> Result<Tensor, ImportError> {
        let t = self
            .sd
            .get(key)
            .ok_or_else(|| bad(format!("no '{key}' (is --layout right?)")))?
            .clone();
        self.tensors.insert(key.to_string(), t.clone());
        Ok(t)
    }

    fn node(&mut self, op: Op, x: &str, out: &str) -> String {
        self.nodes.push(Node {
            name: out.to_string(),
            op,
            inputs: vec![x.to_string()],
            output: out.to_string(),
        });
        out.to_string()
    }

    fn linear(&mut self, key: &str, x: &str, dim: usize) -> Result<(String, usize), ImportError> {
        let w = self.take(&format!("{key}.weight"))?;
        if w.shape.len() != 2 || w.shape[1] != dim {
            return Err(bad(format!("'{key}.weight' is {:?}, expected [_, {dim}]", w.shape)));
        }
        let b = format!("{key}.bias");
        let bias = if self.sd.contains_key(&b) {
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

    /// `prefix.0`, `prefix.2`, ..., Linear layers with `act` between (not after the last).
    fn seq(&mut self, prefix: &str, x: &str, dim: usize, act: Op) -> Result<(String, usize), ImportError> {
        let (mut x, mut dim) = (x.to_string(), dim);
        let mut i = 0;
        loop {
            let (y, d) = self.linear(&format!("{prefix}.{i}"), &x, dim)?;
            dim = d;
            if !self.sd.contains_key(&format!("{prefix}.{}.weight", i + 2)) {
                return Ok((y, dim));
            }
            x = self.node(act.clone(), &y, &format!("{prefix}.{}", i + 1));
            i += 2;
        }
    }

    fn module(&mut self, name: &str, role: ModuleRole, inputs: Vec<String>, outputs: Vec<String>) -> Module {
        Module {
            name: name.into(),
            role,
            inputs,
            outputs,
            nodes: std::mem::take(&mut self.nodes),
        }
    }
}

/// Import a CleanRL state dict with the given layout and spaces.
pub fn import_cleanrl(
    bytes: &[u8],
    layout: CleanrlLayout,
    observation: ObservationSpace,
    action: ActionSpace,
    source: &str,
) -> Result<Imported, ImportError> {
    let sd = read_state_dict(bytes)?;
    let mut b = Builder {
        sd: &sd,
        tensors: BTreeMap::new(),
        nodes: vec![],
    };
    let mut preprocess = vec![];
    let obs_shape = match &observation {
        ObservationSpace::Box { shape, .. } => shape.clone(),
        ObservationSpace::Discrete { n } => {
            preprocess.push(Preprocess::OneHot { n: *n });
            vec![*n]
        }
    };
    let flat: usize = obs_shape.iter().product();
    let mut x = OBS_VALUE.to_string();
    let mut modules = vec![];
    if obs_shape.len() > 1 && layout != CleanrlLayout::Atari {
        x = b.node(Op::Flatten, &x, "obs.flat");
        modules.push(b.module("flatten", ModuleRole::Encoder, vec![OBS_VALUE.into()], vec![x.clone()]));
    }
    let box_bounds = |a: &ActionSpace| matches!(a, ActionSpace::Box { low, high, .. } if low.iter().chain(high).all(Option::is_some));
    let (distribution, value) = match layout {
        CleanrlLayout::Ppo | CleanrlLayout::PpoContinuous => {
            let actor = if layout == CleanrlLayout::Ppo { "actor" } else { "actor_mean" };
            let (head, k) = b.seq(actor, &x, flat, Op::Tanh)?;
            let dist = match (&action, layout) {
                (ActionSpace::Discrete { n }, CleanrlLayout::Ppo) if *n == k => {
                    Distribution::Categorical { logits: head.clone() }
                }
                (ActionSpace::MultiDiscrete { nvec }, CleanrlLayout::Ppo) if nvec.iter().sum::<usize>() == k => {
                    Distribution::MultiCategorical { logits: head.clone() }
                }
                (ActionSpace::Box { .. }, CleanrlLayout::PpoContinuous) if action.action_len() == k => {
                    let ls = b.take("actor_logstd")?;
                    if ls.data.len() != k {
                        return Err(bad(format!("actor_logstd has {} values for {k} actions", ls.data.len())));
                    }
                    Distribution::DiagGaussian {
                        mean: head.clone(),
                        log_std: LogStd::Parameter {
                            tensor: "actor_logstd".into(),
                        },
                        log_std_range: None,
                        clip: true,
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "the actor has {k} outputs, which does not fit {action:?} for layout {layout:?}"
                    )));
                }
            };
            modules.push(b.module("actor", ModuleRole::PolicyHead, vec![x.clone()], vec![head]));
            let (v, one) = b.seq("critic", &x, flat, Op::Tanh)?;
            if one != 1 {
                return Err(bad(format!("the critic has {one} outputs")));
            }
            modules.push(b.module("critic", ModuleRole::ValueHead, vec![x.clone()], vec![v.clone()]));
            (dist, Some(v))
        }
        CleanrlLayout::Atari => {
            if obs_shape.len() != 3 || !matches!(observation, ObservationSpace::Box { dtype: ObsDType::U8, .. }) {
                return Err(bad(format!("cleanrl-atari needs uint8 [C, H, W] frames, not {observation:?}")));
            }
            preprocess.push(Preprocess::Scale { factor: 1.0 / 255.0 });
            let mut shape = obs_shape.clone();
            for (i, (k, s)) in [(8usize, 4usize), (4, 2), (3, 1)].iter().enumerate() {
                let key = format!("network.{}", 2 * i);
                let w = b.take(&format!("{key}.weight"))?;
                b.take(&format!("{key}.bias"))?;
                if w.shape != [w.shape[0], shape[0], *k, *k] {
                    return Err(bad(format!("'{key}.weight' is {:?}, expected [_, {}, {k}, {k}]", w.shape, shape[0])));
                }
                let y = b.node(
                    Op::Conv2d {
                        weight: format!("{key}.weight"),
                        bias: Some(format!("{key}.bias")),
                        stride: [*s, *s],
                        padding: [0; 4],
                        dilation: [1, 1],
                        groups: 1,
                    },
                    &x,
                    &key,
                );
                x = b.node(Op::Relu, &y, &format!("network.{}", 2 * i + 1));
                let side = |n: usize| n.checked_sub(*k).map(|v| v / s + 1).ok_or_else(|| bad("frames too small"));
                shape = vec![w.shape[0], side(shape[1])?, side(shape[2])?];
            }
            let f = b.node(Op::Flatten, &x, "network.6");
            let (h, d) = b.linear("network.7", &f, shape.iter().product())?;
            let h = b.node(Op::Relu, &h, "network.8");
            modules.push(b.module("network", ModuleRole::Encoder, vec![OBS_VALUE.into()], vec![h.clone()]));
            let (logits, k) = b.linear("actor", &h, d)?;
            if !matches!(action, ActionSpace::Discrete { n } if n == k) {
                return Err(bad(format!("the actor has {k} outputs for {action:?}")));
            }
            modules.push(b.module("actor", ModuleRole::PolicyHead, vec![h.clone()], vec![logits.clone()]));
            let (v, _) = b.linear("critic", &h, d)?;
            modules.push(b.module("critic", ModuleRole::ValueHead, vec![h], vec![v.clone()]));
            (Distribution::Categorical { logits }, Some(v))
        }
        CleanrlLayout::Sac => {
            if !box_bounds(&action) {
                return Err(bad("cleanrl-sac needs a Box action space with finite bounds"));
            }
            let (h, d) = b.linear("fc1", &x, flat)?;
            let h = b.node(Op::Relu, &h, "fc1.relu");
            let (h, d) = b.linear("fc2", &h, d)?;
            let h = b.node(Op::Relu, &h, "fc2.relu");
            let (mean, k) = b.linear("fc_mean", &h, d)?;
            let (ls, _) = b.linear("fc_logstd", &h, d)?;
            if k != action.action_len() {
                return Err(bad(format!("fc_mean has {k} outputs for {} actions", action.action_len())));
            }
            // log_std = LOG_STD_MIN + 0.5 (LOG_STD_MAX - LOG_STD_MIN) (tanh(l) + 1), MIN -5, MAX 2.
            let t = b.node(Op::Tanh, &ls, "fc_logstd.tanh");
            b.tensors.insert("log_std.scale".into(), Tensor::new(vec![1], vec![3.5]));
            b.tensors.insert("log_std.shift".into(), Tensor::new(vec![1], vec![-1.5]));
            let log_std = b.node(
                Op::Affine {
                    scale: Some("log_std.scale".into()),
                    shift: Some("log_std.shift".into()),
                },
                &t,
                "log_std",
            );
            modules.push(b.module("actor", ModuleRole::PolicyHead, vec![x.clone()], vec![mean.clone(), log_std.clone()]));
            (
                Distribution::SquashedGaussian {
                    mean,
                    log_std: LogStd::Value { value: log_std },
                    log_std_range: None,
                },
                None,
            )
        }
    };
    let manifest = Manifest {
        name: source.rsplit('/').next().unwrap_or(source).to_string(),
        producer: Producer {
            tool: "policyport".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source: format!("cleanrl:{source}"),
            notes: format!("layout {layout:?}"),
        },
        observation,
        action,
        preprocess,
        modules,
        distribution,
        value,
        recurrent: None,
        golden: vec![],
    };
    Ok(Imported {
        manifest,
        tensors: b.tensors,
    })
}
