//! The manifest: everything about a policy except the weight bytes. Serialized as JSON inside the artifact.
//!
//! A policy is: an observation space, preprocessing applied to raw observations, an ordered list of named
//! submodules (typed op graphs over a shared namespace of values), an action distribution reading some of those
//! values, an optional value estimate, optional recurrent state, and golden vectors. Every value has an implied
//! leading batch dimension; shapes in the manifest are the per-env feature shapes.

use serde::{Deserialize, Serialize};

/// The name of the preprocessed observation in the value namespace.
pub const OBS_VALUE: &str = "obs";
/// Recurrent state `s` is visible to modules as the value `state/<s>`.
pub const STATE_PREFIX: &str = "state/";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Human-readable policy name.
    pub name: String,
    /// Who produced the artifact and from what.
    pub producer: Producer,
    pub observation: ObservationSpace,
    pub action: ActionSpace,
    /// Applied in order to the raw observation; the result is the value `obs`.
    #[serde(default)]
    pub preprocess: Vec<Preprocess>,
    /// Executed in order; each module reads values defined before it and defines its outputs.
    pub modules: Vec<Module>,
    pub distribution: Distribution,
    /// Name of the value-estimate value (feature shape `[1]`), if the policy has a critic.
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub recurrent: Option<RecurrentSpec>,
    /// Inputs with expected outputs, checked by `policyport verify` and the conformance suite.
    #[serde(default)]
    pub golden: Vec<GoldenCase>,
    /// (1.4) The policy was trained with action masks (sb3-contrib `MaskablePPO`, RLlib's action-masking
    /// module): callers are expected to pass one (`Request::action_mask`); acting without one is unmasked, as
    /// the trainer's own `predict` without `action_masks` is. Discrete and multi-discrete spaces only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub action_masks: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Producer {
    pub tool: String,
    pub version: String,
    /// The file or route it came from, e.g. "onnx:policy.onnx".
    pub source: String,
    #[serde(default)]
    pub notes: String,
}

impl Manifest {
    /// The op introduced last (by format minor) among the manifest's nodes, with that minor.
    pub fn newest_op(&self) -> Option<(String, u16)> {
        self.modules
            .iter()
            .flat_map(|m| &m.nodes)
            .max_by_key(|n| n.op.since_minor())
            .map(|n| (n.op.kind(), n.op.since_minor()))
    }

    /// The lowest format minor (of major 1) able to hold this manifest.
    pub fn required_minor(&self) -> u16 {
        self.newest_op()
            .map_or(0, |(_, m)| m)
            .max(self.observation.since_minor())
            .max(self.distribution.since_minor())
            .max(if self.action_masks { 4 } else { 0 })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObsDType {
    F32,
    /// Raw bytes (image frames); usually followed by a `scale` preprocess step.
    U8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ObservationSpace {
    Box {
        shape: Vec<usize>,
        dtype: ObsDType,
    },
    /// One integer per env in `0..n`, given to the runtime as an f32 holding that integer; one-hot encoded.
    Discrete {
        n: usize,
    },
    /// (1.2) A gymnasium `Dict` of boxes: the runtime receives each env's parts flattened and concatenated in
    /// this order (the order the trainer iterates them); the value `obs` is that flat vector.
    Dict {
        spaces: Vec<DictEntry>,
    },
}

/// One part of a [`ObservationSpace::Dict`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DictEntry {
    pub key: String,
    pub shape: Vec<usize>,
    pub dtype: ObsDType,
}

impl ObservationSpace {
    /// Number of raw input numbers per env.
    pub fn raw_len(&self) -> usize {
        match self {
            ObservationSpace::Box { shape, .. } => shape.iter().product(),
            ObservationSpace::Discrete { .. } => 1,
            ObservationSpace::Dict { spaces } => spaces
                .iter()
                .map(|e| e.shape.iter().product::<usize>())
                .sum(),
        }
    }

    /// The element type the runtime receives: bytes for a `u8` box or a dict of `u8` boxes only, else f32.
    pub fn raw_dtype(&self) -> ObsDType {
        match self {
            ObservationSpace::Box { dtype, .. } => *dtype,
            ObservationSpace::Discrete { .. } => ObsDType::F32,
            ObservationSpace::Dict { spaces } if spaces.iter().all(|e| e.dtype == ObsDType::U8) => {
                ObsDType::U8
            }
            ObservationSpace::Dict { .. } => ObsDType::F32,
        }
    }

    /// The first format minor (of major 1) that has this kind of space.
    pub fn since_minor(&self) -> u16 {
        match self {
            ObservationSpace::Dict { .. } => 2,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ActionSpace {
    Discrete {
        n: usize,
    },
    MultiDiscrete {
        nvec: Vec<usize>,
    },
    /// Continuous actions with bounds (one per element; +-inf allowed, encoded as JSON null).
    Box {
        shape: Vec<usize>,
        low: Vec<Bound>,
        high: Vec<Bound>,
    },
}

/// A float bound that may be infinite (JSON has no infinity: `null` means unbounded on that side).
pub type Bound = Option<f32>;

impl ActionSpace {
    /// Numbers per env in the action output: 1 for Discrete, one per component or element otherwise.
    pub fn action_len(&self) -> usize {
        match self {
            ActionSpace::Discrete { .. } => 1,
            ActionSpace::MultiDiscrete { nvec } => nvec.len(),
            ActionSpace::Box { shape, .. } => shape.iter().product(),
        }
    }
    pub fn is_discrete(&self) -> bool {
        !matches!(self, ActionSpace::Box { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Preprocess {
    /// `x * factor` elementwise (e.g. 1/255 for uint8 frames).
    Scale { factor: f32 },
    /// `clamp((x - mean) / std, -clip, clip)`; `mean` and `std` are weight tensors of the observation's shape
    /// (SB3 VecNormalize stores var: std = sqrt(var + eps) is precomputed by the importer).
    Normalize {
        mean: String,
        std: String,
        clip: Option<f32>,
    },
    /// Discrete observation -> one-hot vector of length n.
    OneHot { n: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleRole {
    Encoder,
    PolicyHead,
    ValueHead,
    RecurrentCore,
    Other,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Module {
    pub name: String,
    pub role: ModuleRole,
    /// Values from the namespace this module reads.
    pub inputs: Vec<String>,
    /// Values this module exports to the namespace (must be node outputs or inputs).
    pub outputs: Vec<String>,
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<String>,
    pub output: String,
}

/// Typed ops. All act on the feature dimensions; "last axis" means the last feature axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// `y = x W^T + b`, x of shape `[in]`, weight `[out, in]` (PyTorch's layout), bias `[out]`.
    Dense {
        weight: String,
        bias: Option<String>,
    },
    Relu,
    Tanh,
    Sigmoid,
    Silu,
    Elu {
        alpha: f32,
    },
    LeakyRelu {
        alpha: f32,
    },
    /// `approximate`: the tanh form.
    Gelu {
        approximate: bool,
    },
    /// The error function, elementwise (older ONNX opsets spell GELU with it).
    Erf,
    Softmax,
    LogSoftmax,
    /// Concatenation of all inputs along the last axis.
    Concat,
    /// Elementwise sum / product of two inputs of the same shape.
    Add,
    Mul,
    /// `y = x * scale + shift` with constant tensors broadcast over the last axis (either may be absent).
    Affine {
        scale: Option<String>,
        shift: Option<String>,
    },
    /// `y = x[..., start .. start + len]` along the last axis.
    Slice {
        start: usize,
        len: usize,
    },
    /// Collapse the feature shape to one axis.
    Flatten,
    /// `e^x`, elementwise (format 1.1).
    Exp,
    /// `min(max(x, min), max)`, elementwise; a `null` bound is open (format 1.1).
    Clip {
        min: Option<f32>,
        max: Option<f32>,
    },
    /// The feature shape becomes `shape` (same element count, row-major order kept) (format 1.1).
    Reshape {
        shape: Vec<usize>,
    },
    /// Permute the feature axes: output axis `i` is input axis `perm[i]` (format 1.1). The batch axis stays first.
    Transpose {
        perm: Vec<usize>,
    },
    /// 2-D cross-correlation (PyTorch's `Conv2d`) over a `[C, H, W]` input, giving `[O, OH, OW]` (format 1.1).
    /// `weight` is `[O, C / groups, KH, KW]`, `bias` `[O]`; `padding` is `[top, left, bottom, right]` (zeros);
    /// `OH = (H + top + bottom - dilation[0] * (KH - 1) - 1) / stride[0] + 1`, and the same for `OW`.
    Conv2d {
        weight: String,
        bias: Option<String>,
        stride: [usize; 2],
        padding: [usize; 4],
        dilation: [usize; 2],
        groups: usize,
    },
    /// 2-D max pooling over a `[C, H, W]` input (format 1.1). Padding (`[top, left, bottom, right]`) never wins:
    /// a window takes the maximum over its positions inside the input, and every window has at least one.
    MaxPool2d {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 4],
        dilation: [usize; 2],
    },
    /// Layer normalisation over the last axis: `(x - mean) / sqrt(var + epsilon) * scale + bias`, with the
    /// biased variance; `scale` and `bias` have the last axis' length or are absent (format 1.1).
    LayerNorm {
        scale: Option<String>,
        bias: Option<String>,
        epsilon: f32,
    },
}

impl Op {
    pub const KNOWN: &'static str = "dense relu tanh sigmoid silu elu leaky_relu gelu erf softmax log_softmax concat add mul affine slice flatten exp clip reshape transpose conv2d max_pool2d layer_norm";

    /// The format minor version (of major 1) that introduced the op.
    pub fn since_minor(&self) -> u16 {
        match self {
            Op::Exp
            | Op::Clip { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Conv2d { .. }
            | Op::MaxPool2d { .. }
            | Op::LayerNorm { .. } => 1,
            _ => 0,
        }
    }

    /// The op's `kind` as the manifest spells it.
    pub fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Names of the weight tensors the op reads.
    pub fn tensors(&self) -> Vec<&str> {
        match self {
            Op::Dense { weight, bias } => std::iter::once(weight.as_str())
                .chain(bias.as_deref())
                .collect(),
            Op::Conv2d { weight, bias, .. } => std::iter::once(weight.as_str())
                .chain(bias.as_deref())
                .collect(),
            Op::Affine { scale, shift }
            | Op::LayerNorm {
                scale, bias: shift, ..
            } => scale
                .as_deref()
                .into_iter()
                .chain(shift.as_deref())
                .collect(),
            _ => vec![],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LogStd {
    /// State-independent log-std: a weight tensor of the action's shape.
    Parameter { tensor: String },
    /// State-dependent log-std: a value produced by a module.
    Value { value: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Distribution {
    /// Categorical over `logits` (feature shape `[n]`).
    Categorical { logits: String },
    /// One categorical per component; `logits` holds them concatenated (feature shape `[sum(nvec)]`).
    MultiCategorical { logits: String },
    /// Normal(mean, exp(log_std)) per element; if `clip`, actions are clipped to the action-space bounds.
    DiagGaussian {
        mean: String,
        log_std: LogStd,
        #[serde(default)]
        log_std_range: Option<(f32, f32)>,
        #[serde(default)]
        clip: bool,
    },
    /// tanh(Normal(mean, exp(log_std))), rescaled from [-1, 1] to the (finite) action bounds (SAC).
    SquashedGaussian {
        mean: String,
        log_std: LogStd,
        #[serde(default)]
        log_std_range: Option<(f32, f32)>,
        /// (1.3) What the deterministic action is; absent means [`SquashedDeterministic::Tanh`].
        #[serde(default, skip_serializing_if = "SquashedDeterministic::is_tanh")]
        deterministic: SquashedDeterministic,
    },
    /// (1.4) Q-learning (DQN and its relatives): `q` holds one action value per discrete action (feature shape
    /// `[n]`). Deterministic: the first index of the largest value. Sampled: epsilon-greedy, a uniformly random
    /// action with probability `epsilon` (the trainer's exploration rate at save time; callers may override it
    /// per request), else the greedy one (SPEC.md §4).
    QValues { q: String, epsilon: f32 },
    /// (1.4) A deterministic actor (TD3, DDPG): `action` holds the action itself (feature shape = the Box's).
    /// `rescale`: the actor ends in tanh and its `[-1, 1]` output is mapped to the (finite) bounds as
    /// `low + (a + 1) · (high − low) / 2` (SB3's `unscale_action`); otherwise it is clipped to the bounds.
    /// Sampled actions add the trainer's recorded exploration `noise` in the actor's own space (clipped to
    /// `[-1, 1]` when rescaled) before the mapping; without noise a sampled action is the deterministic one.
    Deterministic {
        action: String,
        rescale: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        noise: Option<ActionNoise>,
    },
}

/// Exploration noise of a deterministic actor, as the trainer recorded it (SB3's `NormalActionNoise`): one
/// independent normal draw per action element (SPEC.md §4's Gaussian words `2d`, `2d + 1`), `mean[d] + sigma[d] ·
/// z_d`. (A plain struct, not a tagged enum: serde's internally tagged enums cost the browser bundle kilobytes; a
/// second kind of noise would be a new optional field, a minor version.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionNoise {
    pub mean: Vec<f32>,
    pub sigma: Vec<f32>,
}

/// The deterministic action of a squashed Gaussian. Trainers disagree here, so the format says which one the
/// policy was trained and evaluated with; sampled actions are the same in both (tanh of the draw, rescaled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SquashedDeterministic {
    /// `low + (tanh(mean) + 1) · (high − low) / 2`: the draw at `z = 0` (SB3's `predict(deterministic=True)`,
    /// CleanRL's `get_action` mean).
    #[default]
    Tanh,
    /// `clamp(low + (mean + 1) · (high − low) / 2, low, high)`: the mean itself taken as a [-1, 1] action and
    /// unsquashed the way an env runner maps actions, without tanh (format 1.3; RLlib's SAC at inference:
    /// `TorchSquashedGaussian.to_deterministic()` is the un-squashed mean, then `unsquash_action` clips).
    ClippedMean,
}

impl SquashedDeterministic {
    pub fn is_tanh(&self) -> bool {
        *self == SquashedDeterministic::Tanh
    }
}

impl Distribution {
    /// The first format minor (of major 1) able to hold this distribution.
    pub fn since_minor(&self) -> u16 {
        match self {
            Distribution::SquashedGaussian {
                deterministic: SquashedDeterministic::ClippedMean,
                ..
            } => 3,
            Distribution::QValues { .. } | Distribution::Deterministic { .. } => 4,
            _ => 0,
        }
    }

    /// The values the distribution reads, in the order their parameters are laid out in `dist_params` outputs.
    pub fn param_values(&self) -> Vec<&str> {
        match self {
            Distribution::Categorical { logits } | Distribution::MultiCategorical { logits } => {
                vec![logits]
            }
            Distribution::DiagGaussian { mean, log_std, .. }
            | Distribution::SquashedGaussian { mean, log_std, .. } => match log_std {
                LogStd::Value { value } => vec![mean, value],
                LogStd::Parameter { .. } => vec![mean],
            },
            Distribution::QValues { q, .. } => vec![q],
            Distribution::Deterministic { action, .. } => vec![action],
        }
    }

    /// What a reader needing `since_minor()` calls it, for [`crate::FormatError::OpNewerThanFile`].
    pub fn feature_name(&self) -> &'static str {
        match self {
            Distribution::QValues { .. } => "distribution kind 'q_values'",
            Distribution::Deterministic { .. } => "distribution kind 'deterministic'",
            _ => "a squashed Gaussian's 'deterministic': 'clipped_mean'",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecurrentSpec {
    pub states: Vec<StateSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// Visible to modules as `state/<name>`; zeros at reset.
    pub name: String,
    pub shape: Vec<usize>,
    /// The value holding the next state after a step.
    pub next: String,
}

/// One golden vector: observations, sampling counters, and expected outputs (float64 from the oracle).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenCase {
    pub name: String,
    pub batch: usize,
    /// Raw observations, `batch * observation.raw_len()` numbers.
    pub obs: Vec<f32>,
    pub seed: u64,
    pub step: u64,
    /// Env index of row 0; row r is env `env_offset + r`.
    pub env_offset: u32,
    /// Max tolerated relative error of float outputs (see SPEC.md: relative to the tensor's max magnitude).
    pub tolerance: f64,
    /// Expected values keyed by value name (e.g. the logits, the value estimate), row-major `batch x width`.
    pub values: std::collections::BTreeMap<String, Vec<f64>>,
    /// Actions drawn with `(seed, env, step)`; discrete actions as integers stored in f64.
    pub sampled_actions: Vec<f64>,
    pub deterministic_actions: Vec<f64>,
}
