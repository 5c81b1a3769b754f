//! CleanRL checkpoints (`torch.save(agent.state_dict(), path)`, or the same state dict as a safetensors file)
//! → manifest + weights. A state dict holds no
//! architecture and no spaces, so the user names the script's agent (`--layout`) and gives the spaces; the
//! layouts are the single-file agents of CleanRL as published, and every key and shape is checked against them:
//!
//! - `cleanrl-ppo` (`ppo.py`): `actor.{0,2,4}` and `critic.{0,2,4}` Linear layers with Tanh between; categorical.
//! - `cleanrl-ppo-continuous` (`ppo_continuous_action.py`): `actor_mean.{0,2,4}`, `critic.{0,2,4}`, the state-independent
//!   `actor_logstd` `[1, n]`; diagonal Gaussian, actions clipped to the bounds (the script's `ClipAction` wrapper).
//! - `cleanrl-atari` (`ppo_atari.py`): `network.{0,2,4}` NatureCNN convolutions + `network.7` Linear, `actor`, `critic`
//!   on `x / 255` of uint8 `[4, 84, 84]` frames.
//! - `cleanrl-atari-lstm` (`ppo_atari_lstm.py`): the same `network` on `[1, 84, 84]` frames, then `lstm`
//!   (`nn.LSTM(512, 128)`, its `h` and `c` per env, zeroed where `done`, i.e. at an episode start), `actor`, `critic`.
//! - `cleanrl-sac` (`sac_continuous_action.py`, the `Actor`): `fc1`, `fc2` (ReLU), `fc_mean`, `fc_logstd`, the log-std
//!   squashed `-5 + 3.5 (tanh(l) + 1)`; the squashed Gaussian rescaled to the bounds (`action_scale`/`action_bias`).

use policyport_format::container::Tensor;
use policyport_format::{
    ActionSpace, Distribution, LogStd, Manifest, Module, ModuleRole, OBS_VALUE, ObsDType,
    ObservationSpace, Op, Preprocess, RecurrentSpec, StateSpec,
};

use crate::ImportError;
use crate::builder::{GraphBuilder, file_stem, producer};
use crate::onnx::Imported;
use crate::torchfile::read_any_state_dict;

/// Which CleanRL agent wrote the state dict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanrlLayout {
    Ppo,
    PpoContinuous,
    Atari,
    AtariLstm,
    Sac,
}

impl std::str::FromStr for CleanrlLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "cleanrl-ppo" => CleanrlLayout::Ppo,
            "cleanrl-ppo-continuous" => CleanrlLayout::PpoContinuous,
            "cleanrl-atari" => CleanrlLayout::Atari,
            "cleanrl-atari-lstm" => CleanrlLayout::AtariLstm,
            "cleanrl-sac" => CleanrlLayout::Sac,
            other => {
                return Err(format!(
                    "unknown layout '{other}' (cleanrl-ppo, cleanrl-ppo-continuous, cleanrl-atari, \
                     cleanrl-atari-lstm, cleanrl-sac)"
                ));
            }
        })
    }
}

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("CleanRL checkpoint: {}", detail.into()))
}

/// Import a CleanRL state dict with the given layout and spaces.
pub fn import_cleanrl(
    bytes: &[u8],
    layout: CleanrlLayout,
    observation: ObservationSpace,
    action: ActionSpace,
    source: &str,
) -> Result<Imported, ImportError> {
    let sd = read_any_state_dict(bytes)?;
    let mut b = GraphBuilder::new(&sd, "CleanRL checkpoint");
    let mut preprocess = vec![];
    let obs_shape = policy_input_shape(&observation, &mut preprocess)?;
    let flat: usize = obs_shape.iter().product();
    let mut x = OBS_VALUE.to_string();
    let mut modules = vec![];
    let atari = matches!(layout, CleanrlLayout::Atari | CleanrlLayout::AtariLstm);
    let mut states = vec![];
    if obs_shape.len() > 1 && !atari {
        x = b.node(Op::Flatten, &x, "obs.flat");
        modules.push(b.module(
            "flatten",
            ModuleRole::Encoder,
            vec![OBS_VALUE.into()],
            vec![x.clone()],
        ));
    }
    let agent = AgentInputs {
        layout,
        observation: &observation,
        action: &action,
        obs_shape: &obs_shape,
        x: &x,
        flat,
    };
    let (distribution, value) = match layout {
        CleanrlLayout::Ppo | CleanrlLayout::PpoContinuous => {
            ppo_agent(&mut b, &mut modules, &agent)?
        }
        CleanrlLayout::Atari | CleanrlLayout::AtariLstm => {
            atari_agent(&mut b, &mut modules, &mut preprocess, &mut states, &agent)?
        }
        CleanrlLayout::Sac => sac_actor(&mut b, &mut modules, &agent)?,
    };
    b.check_every_key_read(&[])?;
    let manifest = Manifest {
        name: file_stem(source, "").to_string(),
        producer: producer("cleanrl", source, format!("layout {layout:?}")),
        observation,
        action,
        preprocess,
        modules,
        distribution,
        value,
        recurrent: (!states.is_empty()).then_some(RecurrentSpec { states }),
        golden: vec![],
        action_masks: false,
    };
    Ok(Imported {
        manifest,
        tensors: b.tensors,
    })
}

/// The shape of the agent's input (a Discrete observation one-hot, appended to `preprocess`); a Dict is refused.
fn policy_input_shape(
    observation: &ObservationSpace,
    preprocess: &mut Vec<Preprocess>,
) -> Result<Vec<usize>, ImportError> {
    Ok(match observation {
        ObservationSpace::Dict { .. } => {
            return Err(bad(
                "CleanRL's agents take Box or Discrete observations, not a Dict",
            ));
        }
        ObservationSpace::Box { shape, .. } => shape.clone(),
        ObservationSpace::Discrete { n } => {
            preprocess.push(Preprocess::OneHot { n: *n });
            vec![*n]
        }
    })
}

/// What every layout's graph is built from besides the state dict.
struct AgentInputs<'i> {
    layout: CleanrlLayout,
    observation: &'i ObservationSpace,
    action: &'i ActionSpace,
    /// The shape of the agent's input after preprocessing.
    obs_shape: &'i [usize],
    /// The value the agent's first layer reads (the observation, flattened for an MLP of a multi-dimensional one).
    x: &'i str,
    /// The width of `x` (the product of `obs_shape`).
    flat: usize,
}

/// `ppo.py`'s and `ppo_continuous_action.py`'s MLP actor and critic: the distribution and the value.
fn ppo_agent(
    b: &mut GraphBuilder,
    modules: &mut Vec<Module>,
    agent: &AgentInputs,
) -> Result<(Distribution, Option<String>), ImportError> {
    let AgentInputs {
        layout,
        action,
        x,
        flat,
        ..
    } = *agent;
    let actor = if layout == CleanrlLayout::Ppo {
        "actor"
    } else {
        "actor_mean"
    };
    let (head, k) = b.sequential(actor, x, flat, &Op::Tanh, false, 1)?;
    let dist = match (action, layout) {
        (ActionSpace::Discrete { n }, CleanrlLayout::Ppo) if *n == k => Distribution::Categorical {
            logits: head.clone(),
        },
        (ActionSpace::MultiDiscrete { nvec }, CleanrlLayout::Ppo)
            if nvec.iter().sum::<usize>() == k =>
        {
            Distribution::MultiCategorical {
                logits: head.clone(),
            }
        }
        (ActionSpace::Box { .. }, CleanrlLayout::PpoContinuous) if action.action_len() == k => {
            let ls = b.take("actor_logstd")?;
            if ls.data.len() != k {
                return Err(bad(format!(
                    "actor_logstd has {} values for {k} actions",
                    ls.data.len()
                )));
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
    modules.push(b.module(
        "actor",
        ModuleRole::PolicyHead,
        vec![x.to_string()],
        vec![head],
    ));
    let (v, one) = b.sequential("critic", x, flat, &Op::Tanh, false, 1)?;
    if one != 1 {
        return Err(bad(format!("the critic has {one} outputs")));
    }
    modules.push(b.module(
        "critic",
        ModuleRole::ValueHead,
        vec![x.to_string()],
        vec![v.clone()],
    ));
    Ok((dist, Some(v)))
}

/// `ppo_atari.py`'s (and `ppo_atari_lstm.py`'s) NatureCNN `network` on `x / 255` (then the `lstm`, its states added
/// to `states`), `actor` and `critic`: the categorical distribution and the value.
fn atari_agent(
    b: &mut GraphBuilder,
    modules: &mut Vec<Module>,
    preprocess: &mut Vec<Preprocess>,
    states: &mut Vec<StateSpec>,
    agent: &AgentInputs,
) -> Result<(Distribution, Option<String>), ImportError> {
    let AgentInputs {
        layout,
        observation,
        action,
        obs_shape,
        x,
        ..
    } = *agent;
    if obs_shape.len() != 3
        || !matches!(
            observation,
            ObservationSpace::Box {
                dtype: ObsDType::U8,
                ..
            }
        )
    {
        return Err(bad(format!(
            "{layout:?} needs uint8 [C, H, W] frames, not {observation:?}"
        )));
    }
    preprocess.push(Preprocess::Scale {
        factor: 1.0 / 255.0,
    });
    let convs = ["network.0", "network.2", "network.4"].map(String::from);
    let (mut h, mut d) =
        b.nature_cnn(convs, "network.7", x, obs_shape, ["network.6", "network.8"])?;
    modules.push(b.module(
        "network",
        ModuleRole::Encoder,
        vec![OBS_VALUE.into()],
        vec![h.clone()],
    ));
    if layout == CleanrlLayout::AtariLstm {
        let r = b.torch_lstm("lstm", &h, d)?;
        let mut inputs = vec![h.clone()];
        inputs.extend(r.reads.iter().cloned());
        modules.push(b.module("lstm", ModuleRole::RecurrentCore, inputs, r.outputs()));
        *states = r.states;
        (h, d) = (r.output, r.hidden);
    }
    let (logits, k) = b.linear("actor", &h, d)?;
    if !matches!(action, ActionSpace::Discrete { n } if *n == k) {
        return Err(bad(format!("the actor has {k} outputs for {action:?}")));
    }
    modules.push(b.module(
        "actor",
        ModuleRole::PolicyHead,
        vec![h.clone()],
        vec![logits.clone()],
    ));
    let (v, _) = b.linear("critic", &h, d)?;
    modules.push(b.module("critic", ModuleRole::ValueHead, vec![h], vec![v.clone()]));
    Ok((Distribution::Categorical { logits }, Some(v)))
}

/// `sac_continuous_action.py`'s `Actor` (`fc1`, `fc2`, `fc_mean`, `fc_logstd`) as a squashed Gaussian rescaled to
/// the bounds; no value.
fn sac_actor(
    b: &mut GraphBuilder,
    modules: &mut Vec<Module>,
    agent: &AgentInputs,
) -> Result<(Distribution, Option<String>), ImportError> {
    let AgentInputs {
        action, x, flat, ..
    } = *agent;
    let box_bounds = |a: &ActionSpace| matches!(a, ActionSpace::Box { low, high, .. } if low.iter().chain(high).all(Option::is_some));
    if !box_bounds(action) {
        return Err(bad(
            "cleanrl-sac needs a Box action space with finite bounds",
        ));
    }
    check_action_rescaling(b, action)?;
    let (h, d) = b.linear("fc1", x, flat)?;
    let h = b.node(Op::Relu, &h, "fc1.relu");
    let (h, d) = b.linear("fc2", &h, d)?;
    let h = b.node(Op::Relu, &h, "fc2.relu");
    let (mean, k) = b.linear("fc_mean", &h, d)?;
    let (ls, _) = b.linear("fc_logstd", &h, d)?;
    if k != action.action_len() {
        return Err(bad(format!(
            "fc_mean has {k} outputs for {} actions",
            action.action_len()
        )));
    }
    // log_std = LOG_STD_MIN + 0.5 (LOG_STD_MAX - LOG_STD_MIN) (tanh(l) + 1), MIN -5, MAX 2.
    let t = b.node(Op::Tanh, &ls, "fc_logstd.tanh");
    b.tensors
        .insert("log_std.scale".into(), Tensor::new(vec![1], vec![3.5]));
    b.tensors
        .insert("log_std.shift".into(), Tensor::new(vec![1], vec![-1.5]));
    let log_std = b.node(
        Op::Affine {
            scale: Some("log_std.scale".into()),
            shift: Some("log_std.shift".into()),
        },
        &t,
        "log_std",
    );
    modules.push(b.module(
        "actor",
        ModuleRole::PolicyHead,
        vec![x.to_string()],
        vec![mean.clone(), log_std.clone()],
    ));
    Ok((
        Distribution::SquashedGaussian {
            mean,
            log_std: LogStd::Value { value: log_std },
            log_std_range: None,
            deterministic: Default::default(),
        },
        None,
    ))
}

/// The SAC actor's `action_scale` / `action_bias` buffers, where the checkpoint has them, match the action bounds
/// given.
fn check_action_rescaling(b: &GraphBuilder, action: &ActionSpace) -> Result<(), ImportError> {
    // The actor's buffers `action_scale = (high - low) / 2` and `action_bias = (high + low) / 2` are what
    // the trainer's env had: they must be the bounds given here (the artifact rescales with these).
    if let ActionSpace::Box { low, high, .. } = action {
        for (key, f) in [
            (
                "action_scale",
                (|l: f32, h: f32| (h - l) / 2.0) as fn(f32, f32) -> f32,
            ),
            ("action_bias", |l: f32, h: f32| (h + l) / 2.0),
        ] {
            if !b.has(key) {
                continue;
            }
            let t = b.peek(key)?;
            let want: Vec<f32> = low
                .iter()
                .zip(high)
                .map(|(l, h)| f(l.unwrap_or(0.0), h.unwrap_or(0.0)))
                .collect();
            let fits = t.data.len() == want.len()
                && t.data
                    .iter()
                    .zip(&want)
                    .all(|(a, w)| (a - w).abs() <= 1e-6 * w.abs().max(1.0));
            if !fits {
                return Err(bad(format!(
                    "the checkpoint's {key} {:?} does not match the action bounds given ({want:?}): \
                     pass the bounds the agent was trained with",
                    t.data
                )));
            }
        }
    }
    Ok(())
}
