//! What the user tells the importer about a graph: which outputs mean what, the spaces, preprocessing.
//! Read from a JSON file (`policyport compile --spec import.json`) or built from CLI flags.

use policyport_format::{ActionSpace, ObservationSpace};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportSpec {
    #[serde(default)]
    pub name: Option<String>,
    pub distribution: DistSpec,
    /// Graph output holding the value estimate.
    #[serde(default)]
    pub value: Option<String>,
    /// Defaults to a float Box of the graph input's shape.
    #[serde(default)]
    pub observation: Option<ObservationSpace>,
    /// Defaults to Discrete(n) / MultiDiscrete for categorical heads; required for Gaussians.
    #[serde(default)]
    pub action: Option<ActionSpace>,
    /// Observation normalisation the trainer applied outside the network (e.g. SB3 VecNormalize).
    #[serde(default)]
    pub normalize: Option<NormalizeSpec>,
    /// Multiply raw observations by this first (e.g. 1/255 for uint8 frames).
    #[serde(default)]
    pub scale: Option<f32>,
    /// Graph input holding the observation (needed only if the graph has several inputs).
    #[serde(default)]
    pub input: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
    /// Recurrent state carried between steps: each pair names the graph input the state is fed to (as
    /// `[layers, batch, hidden]`, the way `nn.LSTM` / `nn.GRU` take it, or `[batch, hidden]`) and the graph
    /// output holding the next state. Zeros at an episode start.
    #[serde(default)]
    pub recurrent: Vec<StatePair>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePair {
    pub input: String,
    pub output: String,
}

impl ImportSpec {
    /// A spec saying only what the outputs mean; everything else defaulted (spaces from the graph, no
    /// preprocessing, one graph input, no recurrent state).
    pub fn new(distribution: DistSpec) -> Self {
        ImportSpec {
            name: None,
            distribution,
            value: None,
            observation: None,
            action: None,
            normalize: None,
            scale: None,
            input: None,
            source: None,
            recurrent: vec![],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DistSpec {
    Categorical {
        logits: String,
    },
    MultiCategorical {
        logits: String,
        nvec: Vec<usize>,
    },
    DiagGaussian {
        mean: String,
        log_std: LogStdSpec,
        #[serde(default)]
        clip: bool,
        #[serde(default)]
        log_std_range: Option<(f32, f32)>,
    },
    SquashedGaussian {
        mean: String,
        log_std: LogStdSpec,
        #[serde(default)]
        log_std_range: Option<(f32, f32)>,
        /// The deterministic action: `tanh` (default; SB3, CleanRL) or `clipped_mean` (RLlib's SAC: the mean
        /// rescaled without tanh, clipped; format 1.3).
        #[serde(default)]
        deterministic: policyport_format::SquashedDeterministic,
    },
}

/// Where the log-std comes from: a graph output, a graph initializer, or literal values (for trainers whose
/// state-independent log-std parameter is not part of the exported forward pass).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStdSpec {
    Output(String),
    Initializer(String),
    Values(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormalizeSpec {
    pub mean: Vec<f32>,
    /// Standard deviation (if you have a variance: sqrt(var + eps)).
    pub std: Vec<f32>,
    #[serde(default)]
    pub clip: Option<f32>,
}
