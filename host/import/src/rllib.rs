//! RLlib (new API stack, Ray ≥ 2.40; measured on 2.60) checkpoint directories → manifest + weights, without
//! Python. `algo.save(dir)` writes a tree of pickles; three of them say everything inference needs:
//!
//! - `learner_group/learner/rl_module/<module id>/module_state.pkl`: the RLModule's `state_dict()` as an
//!   `OrderedDict` of NumPy arrays (the env runner's module is never saved; the learner's is the full one);
//! - `.../<module id>/class_and_ctor_args.pkl`: the module class, the gymnasium spaces and the *partial*
//!   `model_config` (only what the user or the algorithm set; the rest are `DefaultModelConfig`'s defaults);
//! - `env_runner/env_to_module_connector/`: the connector pipeline (a `MeanStdFilter` piece, when configured,
//!   runs on the raw observations; a leading `FlattenObservations` turns a Dict observation into the module's
//!   flat vector) with the env's own observation space (the pipeline's input space), and the filter's
//!   statistics in `MeanStdFilter/state.pkl` (base64 of a zlib-compressed `.npy`, float64).
//!
//! Each is read by the restricted pickle reader ([`crate::pickle`]): nothing is executed, and a class outside the
//! allow-list (a custom RLModule, a user connector) is a typed error naming it.
//!
//! Supported: `DefaultPPOTorchRLModule` with separate actor and critic encoders (PPO's default) — MLP
//! (`fcnet_hiddens`, `fcnet_activation`), CNN (`conv_filters` or the default filters for 10/42/64/84/96-pixel
//! square frames, TF-style "same" padding, channels-last input, flattened in (h, w, c) order) and `use_lstm`
//! (the encoder as tokenizer, then `nn.LSTM`, its h and c per env) — with `head_fcnet_hiddens` heads, on
//! Discrete, MultiDiscrete and Box actions. Box actions are mapped as RLlib's env runner maps them
//! (`normalize_actions`: `low + (a + 1)(high − low)/2`, clipped): the artifact's Gaussian is that map applied to
//! the module's mean and log-std, so its deterministic and sampled actions are the env's.
//! `DefaultSACTorchRLModule` on Box actions ([`sac_policy`]): `pi_encoder` + `pi`, a squashed Gaussian whose
//! deterministic action is the un-squashed mean rescaled and clipped (format 1.3's `clipped_mean`), as RLlib's env
//! runner acts with explore=False. Dict observations of Boxes through `FlattenObservations` (the first piece):
//! the artifact's observation is the env's Dict with its parts in RLlib's flatten order (keys sorted).
//! Also read: `vf_share_layers=True` (one `encoder.encoder` under both heads), `free_log_std` (the
//! state-independent `pi.log_std`), LayerNorm MLPs (`fcnet_use_layernorm`, `head_fcnet_use_layernorm`).
//! IMPALA trains `DefaultPPOTorchRLModule` itself; `DefaultAPPOTorchRLModule` adds target copies (`_old_*`),
//! never read. `DefaultDQNTorchRLModule` ([`dqn_policy`]): Q values, plain, dueling or distributional.
//! RLlib's example `ActionMaskingTorchRLModule` ([`ModuleKind::ActionMasking`]): PPO's networks on the Dict's
//! `observations`, the Dict's `action_mask` as the request's action mask (the manifest's `action_masks`).
//! Refused by name: LSTM with a shared encoder, LayerNorm CNNs, multi-agent checkpoints with
//! several modules (point at one module's directory), Dict parts that are not Boxes (FlattenObservations
//! one-hot encodes them), `keys_to_remove`, a MeanStdFilter before the flatten, other connectors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use policyport_format::container::Tensor;
use policyport_format::{
    ActionSpace, Distribution, LogStd, Manifest, Module, ModuleRole, OBS_VALUE, ObsDType,
    ObservationSpace, Op, Preprocess, RecurrentSpec, SquashedDeterministic, StateSpec,
};

use crate::ImportError;
use crate::builder::{GraphBuilder, producer};
use crate::npy_pickle::{Array, array, attributes};
use crate::onnx::Imported;
use crate::pickle::{self, Node, Pickle, PickleError};

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("RLlib checkpoint: {}", detail.into()))
}

fn unsupported(what: impl Into<String>, hint: impl Into<String>) -> ImportError {
    ImportError::Unsupported {
        what: what.into(),
        hint: hint.into(),
    }
}

/// The files of one RLModule of a checkpoint, read from disk.
#[derive(Debug, Clone)]
pub struct RllibFiles {
    /// The module's directory (`.../rl_module/<module id>`).
    pub module_dir: PathBuf,
    pub module_state: Vec<u8>,
    pub module_ctor: Vec<u8>,
    /// `env_to_module_connector/class_and_ctor_args.pkl`, when the algorithm's directory is known.
    pub env_to_module: Option<Vec<u8>>,
    /// `module_to_env_connector/class_and_ctor_args.pkl` (NormalizeAndClipActions' flags), likewise.
    pub module_to_env: Option<Vec<u8>>,
    /// `env_to_module_connector/MeanStdFilter/state.pkl`, when present.
    pub mean_std_state: Option<Vec<u8>>,
}

/// Is this directory an RLlib checkpoint (an algorithm's, a MultiRLModule's or one RLModule's)?
pub fn is_rllib_checkpoint(path: &Path) -> bool {
    path.is_dir()
        && (path.join("rllib_checkpoint.json").is_file()
            || path.join("module_state.pkl").is_file()
            || path.join("metadata.json").is_file()
                && path.join("class_and_ctor_args.pkl").is_file())
}

fn read(path: &Path) -> Result<Vec<u8>, ImportError> {
    std::fs::read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))
}

/// The module directories (holding `module_state.pkl`) directly inside `dir`.
fn module_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.join("module_state.pkl").is_file()
                        && p.join("class_and_ctor_args.pkl").is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Find the module and the connector files from any of: the algorithm's directory (`algo.save(dir)`), its
/// `learner_group/learner/rl_module` (a MultiRLModule with one module), or one module's directory.
pub fn read_rllib_checkpoint(path: &Path) -> Result<RllibFiles, ImportError> {
    let (module_dir, root) = if path.join("learner_group/learner/rl_module").is_dir() {
        (
            path.join("learner_group/learner/rl_module"),
            Some(path.to_path_buf()),
        )
    } else {
        (path.to_path_buf(), None)
    };
    let module_dir = if module_dir.join("module_state.pkl").is_file()
        && module_dirs(&module_dir).is_empty()
    {
        module_dir
    } else {
        let mods = module_dirs(&module_dir);
        match mods.len() {
            1 => mods.into_iter().next().unwrap(),
            0 => {
                return Err(bad(format!(
                    "{} holds no RLModule (no <module id>/module_state.pkl); give the directory algo.save() wrote",
                    path.display()
                )));
            }
            _ => {
                return Err(unsupported(
                    format!(
                        "a checkpoint with {} RLModules ({})",
                        mods.len(),
                        mods.iter()
                            .map(|m| m.file_name().unwrap_or_default().to_string_lossy())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "compile one module: give its directory (.../learner_group/learner/rl_module/<module id>)",
                ));
            }
        }
    };
    // The algorithm's directory: given, or four levels above a module inside one.
    let root = root.or_else(|| {
        let r = module_dir.ancestors().nth(4)?;
        r.join("rllib_checkpoint.json")
            .is_file()
            .then(|| r.to_path_buf())
    });
    let (mut env_to_module, mut mean_std_state, mut module_to_env) = (None, None, None);
    if let Some(root) = &root {
        for d in [
            "env_runner/module_to_env_connector",
            "module_to_env_connector",
        ] {
            let f = root.join(d).join("class_and_ctor_args.pkl");
            if f.is_file() {
                module_to_env = Some(read(&f)?);
                break;
            }
        }
        for d in [
            "env_runner/env_to_module_connector",
            "env_to_module_connector",
        ] {
            let d = root.join(d);
            if d.join("class_and_ctor_args.pkl").is_file() {
                env_to_module = Some(read(&d.join("class_and_ctor_args.pkl"))?);
                let f = d.join("MeanStdFilter/state.pkl");
                if f.is_file() {
                    mean_std_state = Some(read(&f)?);
                }
                break;
            }
        }
    }
    Ok(RllibFiles {
        module_state: read(&module_dir.join("module_state.pkl"))?,
        module_ctor: read(&module_dir.join("class_and_ctor_args.pkl"))?,
        module_dir,
        env_to_module,
        module_to_env,
        mean_std_state,
    })
}

/// A pickle of an RLlib file; a global outside the allow-list becomes "unsupported `what` <global>".
fn parse(bytes: &[u8], what: &str) -> Result<Pickle, ImportError> {
    pickle::parse(bytes).map_err(|e| match e {
        PickleError::ForbiddenGlobal { module, name } => unsupported(
            format!("{what} {module}.{name}"),
            "RLlib's default PPO, APPO / IMPALA, SAC and DQN RLModules, its example ActionMaskingTorchRLModule and their default connectors (plus MeanStdFilter and FlattenObservations) are read",
        ),
        other => other.into(),
    })
}

/// `dict[key]` for a pickled dict (or a filled `OrderedDict()` call) with string keys.
fn get<'p>(pk: &'p Pickle, i: usize, key: &str) -> Option<usize> {
    let items = match pk.get(i) {
        Node::Dict(items) => items,
        Node::Call { items, .. } => items,
        _ => return None,
    };
    items
        .iter()
        .find(|(k, _)| pk.str(*k) == Some(key))
        .map(|(_, v)| *v)
}

/// A model_config value, as JSON (what the importer compares against). The config is walked as a tree, so a
/// shared object is expanded once per reference: visits count against `walk` (a typed error past it, never an
/// expansion until the allocator gives up).
fn to_json(
    pk: &Pickle,
    i: usize,
    depth: usize,
    walk: &mut pickle::Walk,
) -> Result<serde_json::Value, ImportError> {
    use serde_json::Value;
    walk.step().map_err(ImportError::Pickle)?;
    if depth > pickle::MAX_DEPTH {
        return Ok(Value::Null);
    }
    Ok(match pk.get(i) {
        Node::None => Value::Null,
        Node::Bool(b) => Value::Bool(*b),
        Node::Int(v) => Value::from(*v),
        Node::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Node::Str(s) => Value::String(s.clone()),
        Node::List(v) | Node::Tuple(v) => Value::Array(
            v.iter()
                .map(|x| to_json(pk, *x, depth + 1, walk))
                .collect::<Result<_, _>>()?,
        ),
        Node::Dict(items) => {
            let mut m = serde_json::Map::new();
            for (k, v) in items {
                if let Some(k) = pk.str(*k) {
                    m.insert(k.to_string(), to_json(pk, *v, depth + 1, walk)?);
                }
            }
            Value::Object(m)
        }
        _ => Value::String("<object>".into()),
    })
}

/// Values one model_config may expand to (a real one holds dozens).
const MAX_CONFIG_VALUES: usize = 100_000;

fn space_attr<'p>(pk: &'p Pickle, i: usize, key: &str) -> Result<usize, ImportError> {
    attributes(pk, i)
        .and_then(|a| a.iter().find(|(k, _)| *k == key).map(|(_, v)| *v))
        .ok_or_else(|| bad(format!("space without '{key}'")))
}

fn arr(pk: &Pickle, i: usize, what: &str) -> Result<Array, ImportError> {
    array(pk, i).map_err(|e| bad(format!("{what}: {e}")))
}

fn space_dtype_u8(pk: &Pickle, i: usize) -> bool {
    let Ok(d) = space_attr(pk, i, "dtype") else {
        return false;
    };
    matches!(pk.get(d), Node::Call { args, .. } if pk.items(*args).and_then(|a| a.first()).and_then(|k| pk.str(*k)) == Some("u1"))
}

/// A gymnasium space as a policy observation: a Box, or (the input of a `FlattenObservations` connector) a Dict
/// of Boxes in the order RLlib flattens it — keys sorted (dm-tree's `tree.flatten`), whatever order the space
/// keeps — each part flattened row-major and cast to float32.
fn observation_space(pk: &Pickle, i: usize) -> Result<ObservationSpace, ImportError> {
    if pk.call_name(i).as_deref() != Some("gymnasium.spaces.dict.Dict") {
        return box_space(pk, i);
    }
    let spaces = space_attr(pk, i, "spaces")?;
    let items = match pk.get(spaces) {
        Node::Dict(items) | Node::Call { items, .. } => items,
        _ => return Err(bad("Dict.spaces is not a dict")),
    };
    let mut parts = vec![];
    for (k, v) in items {
        let key = pk
            .str(*k)
            .ok_or_else(|| bad("a Dict observation key that is not a string"))?;
        match box_space(pk, *v) {
            Ok(ObservationSpace::Box { shape, dtype }) => {
                parts.push(policyport_format::DictEntry {
                    key: key.to_string(),
                    shape,
                    dtype,
                })
            }
            Ok(_) => unreachable!("box_space gives boxes"),
            Err(ImportError::Unsupported { what, .. }) => {
                return Err(unsupported(
                    format!("Dict observation part '{key}': {what}"),
                    "Dict parts must be Box spaces (FlattenObservations one-hot encodes Discrete parts, which \
                     the format's dict parts cannot express yet)",
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if parts.is_empty() {
        return Err(bad("an empty Dict observation space"));
    }
    parts.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(ObservationSpace::Dict { spaces: parts })
}

fn box_space(pk: &Pickle, i: usize) -> Result<ObservationSpace, ImportError> {
    match pk.call_name(i).as_deref() {
        Some("gymnasium.spaces.box.Box") => {
            let shape = pk
                .items(space_attr(pk, i, "_shape")?)
                .ok_or_else(|| bad("Box _shape is not a tuple"))?
                .iter()
                .map(|d| {
                    pk.int(*d)
                        .and_then(|v| usize::try_from(v).ok())
                        .filter(|v| *v >= 1)
                        .ok_or_else(|| bad("a Box dim that is not a positive size"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ObservationSpace::Box {
                shape,
                dtype: if space_dtype_u8(pk, i) {
                    ObsDType::U8
                } else {
                    ObsDType::F32
                },
            })
        }
        Some("gymnasium.spaces.discrete.Discrete") => Err(unsupported(
            "Discrete observations in an RLlib checkpoint",
            "RLlib's default encoders one-hot them in a connector this route does not read yet",
        )),
        other => Err(unsupported(
            format!("observation space {}", other.unwrap_or("?")),
            "Box observations, and Dicts of Boxes through FlattenObservations, are supported",
        )),
    }
}

fn action_space(pk: &Pickle, i: usize) -> Result<ActionSpace, ImportError> {
    match pk.call_name(i).as_deref() {
        Some("gymnasium.spaces.discrete.Discrete") => {
            let n = arr(pk, space_attr(pk, i, "n")?, "Discrete.n")?;
            if let Ok(s) = space_attr(pk, i, "start") {
                if arr(pk, s, "Discrete.start")?.data.iter().any(|v| *v != 0.0) {
                    return Err(unsupported(
                        "a Discrete action space with start != 0",
                        "use start=0",
                    ));
                }
            }
            match n.data.as_slice() {
                [n] if *n >= 1.0 && *n < (1u64 << 31) as f64 => {
                    Ok(ActionSpace::Discrete { n: *n as usize })
                }
                _ => Err(bad("Discrete.n is not a positive integer")),
            }
        }
        Some("gymnasium.spaces.multi_discrete.MultiDiscrete") => {
            let nvec = arr(pk, space_attr(pk, i, "nvec")?, "MultiDiscrete.nvec")?;
            if let Ok(s) = space_attr(pk, i, "start") {
                if arr(pk, s, "MultiDiscrete.start")?
                    .data
                    .iter()
                    .any(|v| *v != 0.0)
                {
                    return Err(unsupported(
                        "a MultiDiscrete action space with start != 0",
                        "use start=0",
                    ));
                }
            }
            if nvec.shape.len() != 1
                || nvec
                    .data
                    .iter()
                    .any(|n| !(*n >= 1.0 && *n < (1u64 << 31) as f64))
            {
                return Err(bad(
                    "MultiDiscrete.nvec is not a vector of positive integers",
                ));
            }
            Ok(ActionSpace::MultiDiscrete {
                nvec: nvec.data.iter().map(|n| *n as usize).collect(),
            })
        }
        Some("gymnasium.spaces.box.Box") => {
            let low = arr(pk, space_attr(pk, i, "low")?, "Box.low")?;
            let high = arr(pk, space_attr(pk, i, "high")?, "Box.high")?;
            if low.shape.len() != 1 || low.shape != high.shape {
                return Err(unsupported(
                    format!("a Box action space of shape {:?}", low.shape),
                    "flat Box actions",
                ));
            }
            let b = |v: &[f64], side: &'static str| -> Result<Vec<Option<f32>>, ImportError> {
                v.iter()
                    .enumerate()
                    .map(|(i, x)| crate::action_bound(*x, side, i))
                    .collect()
            };
            Ok(ActionSpace::Box {
                shape: low.shape.clone(),
                low: b(&low.data, "low")?,
                high: b(&high.data, "high")?,
            })
        }
        other => Err(unsupported(
            format!("action space {}", other.unwrap_or("?")),
            "Discrete, MultiDiscrete and Box actions are supported",
        )),
    }
}

/// `model_config` merged over RLlib's `DefaultModelConfig` (the keys this route reads).
struct ModelConfig {
    fcnet_activation: Option<Op>,
    conv_activation: Option<Op>,
    head_activation: Option<Op>,
    conv_filters: Option<serde_json::Value>,
    use_lstm: bool,
    /// The policy head gives only the mean; the log-std is the state-independent `pi.log_std`.
    free_log_std: bool,
    log_std_clip: f32,
    /// DQN's keys (DQNConfig copies its `dueling`, `num_atoms`, `v_min`, `v_max` and `epsilon` into the
    /// module's model_config).
    dqn: DqnConfig,
}

/// What a DQN module's model_config says about its head and exploration.
#[derive(Debug, Clone, Default)]
struct DqnConfig {
    dueling: bool,
    num_atoms: Option<serde_json::Value>,
    v_min: Option<f64>,
    v_max: Option<f64>,
    epsilon: Option<serde_json::Value>,
}

fn activation(v: Option<&serde_json::Value>, default: &str) -> Result<Option<Op>, ImportError> {
    let name = match v {
        None => default,
        Some(serde_json::Value::Null) => "linear",
        Some(serde_json::Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(unsupported(
                format!("activation {other}"),
                "tanh, relu, elu, swish/silu or linear",
            ));
        }
    };
    Ok(match name.to_ascii_lowercase().as_str() {
        "tanh" => Some(Op::Tanh),
        "relu" => Some(Op::Relu),
        "elu" => Some(Op::Elu { alpha: 1.0 }),
        "swish" | "silu" => Some(Op::Silu),
        "linear" => None,
        other => {
            return Err(unsupported(
                format!("activation '{other}'"),
                "tanh, relu, elu, swish/silu or linear",
            ));
        }
    })
}

fn model_config(cfg: &serde_json::Value) -> Result<ModelConfig, ImportError> {
    let empty = serde_json::Map::new();
    let m = cfg.as_object().unwrap_or(&empty);
    // Keys that change nothing at inference (initialisers, training-time sequence length) or that the weights'
    // shapes already say (layer sizes); any other key could change the computation: refused by name.
    const READ: &[&str] = &[
        "fcnet_hiddens",
        "fcnet_activation",
        "conv_filters",
        "conv_activation",
        "head_fcnet_hiddens",
        "head_fcnet_activation",
        "use_lstm",
        "lstm_cell_size",
        "max_seq_len",
        "vf_share_layers",
        "free_log_std",
        "log_std_clip_param",
        "fcnet_use_layernorm",
        "head_fcnet_use_layernorm",
        "conv_use_layernorm",
        // SAC's twin Q networks and their fusion layers: critics only, never read at inference.
        "twin_q",
        "fusionnet_hiddens",
        "fusionnet_activation",
        // DQN: its head (dueling, distributional atoms on [v_min, v_max]) and exploration (epsilon: a constant
        // or a schedule); double_q only changes the learner's target, std_init only noisy layers (which the new
        // API stack's DQN module does not build: their weights would be refused as unknown layers).
        "dueling",
        "double_q",
        "num_atoms",
        "v_min",
        "v_max",
        "epsilon",
        "std_init",
    ];
    for k in m.keys() {
        let harmless = k.ends_with("_initializer")
            || k.ends_with("_initializer_config")
            || k.ends_with("_initializer_kwargs");
        if !READ.contains(&k.as_str()) && !harmless {
            return Err(unsupported(
                format!("model_config key '{k}'"),
                "RLlib's DefaultModelConfig keys for PPO, APPO / IMPALA, SAC and DQN",
            ));
        }
    }
    let flag = |k: &str| {
        m.get(k)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    // (fcnet_use_layernorm / head_fcnet_use_layernorm: the LayerNorm layers are read from the weights.)
    if flag("conv_use_layernorm") {
        return Err(unsupported("conv_use_layernorm=True", "not read yet"));
    }
    Ok(ModelConfig {
        fcnet_activation: activation(m.get("fcnet_activation"), "tanh")?,
        conv_activation: activation(m.get("conv_activation"), "relu")?,
        head_activation: activation(m.get("head_fcnet_activation"), "relu")?,
        conv_filters: m.get("conv_filters").filter(|v| !v.is_null()).cloned(),
        use_lstm: flag("use_lstm"),
        free_log_std: flag("free_log_std"),
        log_std_clip: m
            .get("log_std_clip_param")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(20.0) as f32,
        dqn: DqnConfig {
            dueling: flag("dueling"),
            num_atoms: m.get("num_atoms").cloned(),
            v_min: m.get("v_min").and_then(serde_json::Value::as_f64),
            v_max: m.get("v_max").and_then(serde_json::Value::as_f64),
            epsilon: m.get("epsilon").cloned(),
        },
    })
}

/// One conv layer of the config: (out channels, kernel, stride, "same" padding?).
type Filter = (usize, usize, usize, bool);

/// `conv_filters` (`[[out, kernel, stride(, padding)], ...]`, kernel/stride ints or pairs of equal ints), or
/// RLlib's defaults for square frames (`get_filter_config`).
fn filters(
    cfg: &Option<serde_json::Value>,
    h: usize,
    w: usize,
) -> Result<Vec<Filter>, ImportError> {
    let Some(v) = cfg else {
        let d: &[Filter] = match (h, w) {
            (96, 96) => &[(16, 8, 4, true), (32, 4, 2, true), (256, 11, 2, true)],
            (84, 84) => &[(16, 8, 4, true), (32, 4, 2, true), (256, 11, 1, true)],
            (64, 64) => &[
                (16, 4, 2, true),
                (32, 4, 2, true),
                (64, 4, 2, true),
                (128, 4, 2, true),
            ],
            (42, 42) => &[(16, 4, 2, true), (32, 4, 2, true), (256, 11, 1, true)],
            (10, 10) => &[(16, 5, 2, true), (32, 5, 2, true)],
            _ => {
                return Err(bad(format!(
                    "no conv_filters in model_config and RLlib has no default for {h}x{w} frames"
                )));
            }
        };
        return Ok(d.to_vec());
    };
    let square = |x: &serde_json::Value| -> Option<usize> {
        match x {
            serde_json::Value::Number(n) => n.as_u64().map(|v| v as usize),
            serde_json::Value::Array(a) if a.len() == 2 && a[0] == a[1] => {
                a[0].as_u64().map(|v| v as usize)
            }
            _ => None,
        }
    };
    v.as_array()
        .ok_or_else(|| bad("conv_filters is not a list"))?
        .iter()
        .map(|f| {
            let f = f.as_array().filter(|f| f.len() == 3 || f.len() == 4);
            let parsed = f.and_then(|f| {
                let same = match f.get(3) {
                    None => true,
                    Some(serde_json::Value::String(s)) if s == "same" => true,
                    Some(serde_json::Value::String(s)) if s == "valid" => false,
                    _ => return None,
                };
                Some((
                    f[0].as_u64()? as usize,
                    square(&f[1])?,
                    square(&f[2])?,
                    same,
                ))
            });
            parsed.filter(|p| p.1 >= 1 && p.2 >= 1).ok_or_else(|| {
                unsupported(
                    format!("conv_filters entry {f:?}"),
                    "[out, k, stride(, \"same\"|\"valid\")] with square kernels",
                )
            })
        })
        .collect()
}

/// An encoder branch (`encoder.actor_encoder` / `encoder.critic_encoder`) on `x` of feature shape `shape`;
/// returns (value, width).
fn encoder(
    g: &mut GraphBuilder,
    p: &str,
    x: &str,
    shape: &[usize],
    mc: &ModelConfig,
) -> Result<(String, usize), ImportError> {
    if g.has(&format!("{p}.net.0.cnn.1.weight")) || g.has(&format!("{p}.net.0.cnn.0.weight")) {
        let [h, w, c] = shape else {
            return Err(bad(format!(
                "a CNN encoder on observations of shape {shape:?} (expects [H, W, C])"
            )));
        };
        let (mut x, mut dims) = (
            g.node(
                Op::Transpose {
                    perm: vec![2, 0, 1],
                },
                x,
                &format!("{p}.nchw"),
            ),
            [*c, *h, *w],
        );
        let convs: Vec<usize> = (0..64)
            .filter(|j| g.has(&format!("{p}.net.0.cnn.{j}.weight")))
            .collect();
        let fl = filters(&mc.conv_filters, *h, *w)?;
        if fl.len() != convs.len() {
            return Err(bad(format!(
                "{} conv layers in the weights, {} in conv_filters",
                convs.len(),
                fl.len()
            )));
        }
        for (j, (out, k, s, same)) in convs.into_iter().zip(fl) {
            let key = format!("{p}.net.0.cnn.{j}");
            let wt = g.take(&format!("{key}.weight"))?;
            if wt.shape != [out, dims[0], k, k] {
                return Err(bad(format!(
                    "'{key}.weight' is {:?}, conv_filters say [{out}, {}, {k}, {k}]",
                    wt.shape, dims[0]
                )));
            }
            let bias = g.has(&format!("{key}.bias")).then(|| format!("{key}.bias"));
            if let Some(b) = &bias {
                g.take(b)?;
            }
            // TF-style "same" (RLlib's same_padding): out = ceil(in / s), the odd pixel of padding at the end.
            let pad = |n: usize| -> (usize, usize) {
                if !same {
                    return (0, 0);
                }
                let o = n.div_ceil(s);
                let total = ((o - 1) * s + k).saturating_sub(n);
                (total / 2, total - total / 2)
            };
            let ((t, b), (l, r)) = (pad(dims[1]), pad(dims[2]));
            let side = |n: usize, a: usize, z: usize| (n + a + z).checked_sub(k).map(|v| v / s + 1);
            let (Some(oh), Some(ow)) = (side(dims[1], t, b), side(dims[2], l, r)) else {
                return Err(bad(format!("frames {shape:?} are too small for '{key}'")));
            };
            let y = g.node(
                Op::Conv2d {
                    weight: format!("{key}.weight"),
                    bias,
                    stride: [s, s],
                    padding: [t, l, b, r],
                    dilation: [1, 1],
                    groups: 1,
                },
                &x,
                &key,
            );
            x = match &mc.conv_activation {
                Some(act) => g.node(act.clone(), &y, &format!("{key}.act")),
                None => y,
            };
            dims = [out, oh, ow];
        }
        // Back to channels-last, then Flatten: (h, w, c) order.
        let nhwc = g.node(
            Op::Transpose {
                perm: vec![1, 2, 0],
            },
            &x,
            &format!("{p}.nhwc"),
        );
        return Ok((
            g.node(Op::Flatten, &nhwc, &format!("{p}.flatten")),
            dims.iter().product(),
        ));
    }
    let n: usize = shape.iter().product();
    let x = if shape.len() > 1 {
        g.node(Op::Flatten, x, &format!("{p}.flat_obs"))
    } else {
        x.to_string()
    };
    if !g.has(&format!("{p}.net.mlp.0.weight")) {
        return Err(bad(format!(
            "no '{p}.net.mlp.0.weight' (not a default PPO encoder?)"
        )));
    }
    mlp(
        g,
        &format!("{p}.net.mlp"),
        &x,
        n,
        mc.fcnet_activation.as_ref(),
        true,
    )
}

/// RLlib's `TorchMLP` (`{prefix}.N`): per layer a Linear, then a LayerNorm (eps 1e-3, hard-coded by RLlib) when
/// the config asked for one (`fcnet_use_layernorm`, `head_fcnet_use_layernorm`: a 1-D weight right after the
/// Linear), then the activation (no layer of its own for "linear", so indices step by one less). The
/// activation follows every layer but the last, and the last too when `act_after_last` (encoders).
fn mlp(
    g: &mut GraphBuilder,
    prefix: &str,
    x: &str,
    dim: usize,
    act: Option<&Op>,
    act_after_last: bool,
) -> Result<(String, usize), ImportError> {
    let (mut x, mut dim, mut i) = (x.to_string(), dim, 0usize);
    loop {
        (x, dim) = g.linear(&format!("{prefix}.{i}"), &x, dim)?;
        let mut j = i + 1;
        let ln = format!("{prefix}.{j}");
        if g.peek(&format!("{ln}.weight"))
            .is_ok_and(|t| t.shape.len() == 1)
        {
            let w = g.take(&format!("{ln}.weight"))?;
            if w.shape != [dim] {
                return Err(bad(format!(
                    "'{ln}.weight' is {:?}, expected [{dim}]",
                    w.shape
                )));
            }
            let bias = format!("{ln}.bias");
            let bias = if g.has(&bias) {
                if g.take(&bias)?.shape != [dim] {
                    return Err(bad(format!("'{bias}' is not [{dim}]")));
                }
                Some(bias)
            } else {
                None
            };
            x = g.node(
                Op::LayerNorm {
                    scale: Some(format!("{ln}.weight")),
                    bias,
                    epsilon: 1e-3,
                },
                &x,
                &ln,
            );
            j += 1;
        }
        let next = if act.is_some() { j + 1 } else { j };
        let more = g.has(&format!("{prefix}.{next}.weight"));
        if let Some(act) = act {
            if more || act_after_last {
                x = g.node(act.clone(), &x, &format!("{prefix}.{j}"));
            }
        }
        if !more {
            return Ok((x, dim));
        }
        i = next;
    }
}

/// A head (`pi` / `vf`): `net.mlp` Linear layers, `head_fcnet_activation` between them, none after the last.
fn head(
    g: &mut GraphBuilder,
    p: &str,
    x: &str,
    d: usize,
    mc: &ModelConfig,
) -> Result<(String, usize), ImportError> {
    if !g.has(&format!("{p}.net.mlp.0.weight")) {
        return Err(bad(format!("no '{p}.net.mlp.0.weight'")));
    }
    mlp(
        g,
        &format!("{p}.net.mlp"),
        x,
        d,
        mc.head_activation.as_ref(),
        false,
    )
}

/// The MeanStdFilter's statistics: (mean, std + 1e-6, clip), per observation element.
fn mean_std(bytes: &[u8], numel: usize) -> Result<(Vec<f32>, Vec<f32>, Option<f32>), ImportError> {
    let pk = parse(bytes, "MeanStdFilter state")?;
    let Node::Dict(items) = pk.get(pk.root) else {
        return Err(bad("MeanStdFilter state is not a dict"));
    };
    let [(_, st)] = items.as_slice() else {
        return Err(unsupported(
            "a multi-agent MeanStdFilter",
            "one agent's statistics",
        ));
    };
    let st = *st;
    let truthy = |k: &str, default: bool| {
        get(&pk, st, k).map_or(default, |i| pk.int(i).is_some_and(|v| v != 0))
    };
    let (demean, destd) = (
        truthy("de_mean_to_zero", true),
        truthy("de_std_to_one", true),
    );
    let clip = match get(&pk, st, "clip_by_value").map(|i| pk.get(i)) {
        None | Some(Node::None) => None,
        Some(Node::Float(f)) if *f > 0.0 && f.is_finite() => Some(*f as f32),
        Some(Node::Int(v)) if *v > 0 => Some(*v as f32),
        Some(Node::Float(f)) if *f == 0.0 => None,
        _ => return Err(bad("MeanStdFilter clip_by_value is not a positive number")),
    };
    let rs = get(&pk, st, "running_stats")
        .and_then(|i| pk.items(i))
        .ok_or_else(|| bad("MeanStdFilter without running_stats"))?;
    let [rs] = rs else {
        return Err(unsupported(
            format!("a MeanStdFilter over {} observation parts", rs.len()),
            "Box observations",
        ));
    };
    let n = get(&pk, *rs, "num_pushes")
        .and_then(|i| pk.int(i))
        .ok_or_else(|| bad("running_stats without num_pushes"))?;
    let npy = |k: &str| -> Result<Vec<f64>, ImportError> {
        let s = get(&pk, *rs, k)
            .and_then(|i| pk.str(i))
            .ok_or_else(|| bad(format!("running_stats without {k}")))?;
        let z = base64(s).ok_or_else(|| bad(format!("{k} is not base64")))?;
        let raw = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&z, 16 + 8 * (1 << 24))
            .map_err(|_| {
            bad(format!(
                "{k} is not zlib data (or inflates past the size limit)"
            ))
        })?;
        let a = npy_f64(&raw).ok_or_else(|| bad(format!("{k} is not a float64 .npy array")))?;
        if a.len() != numel {
            return Err(bad(format!(
                "{k} has {} values for {numel} observation elements",
                a.len()
            )));
        }
        Ok(a)
    };
    let mean = npy("mean_array")?;
    let ssd = npy("sum_sq_diff_array")?;
    // RunningStat.var = float32(ssd / (n - 1)) (zeros for n <= 1); MeanStdFilter divides by std + 1e-6.
    let std: Vec<f32> = ssd
        .iter()
        .map(|s| {
            let var = if n > 1 {
                (s / (n - 1) as f64) as f32
            } else {
                0.0
            };
            if destd {
                ((var.max(0.0) as f64).sqrt() + 1e-6) as f32
            } else {
                1.0
            }
        })
        .collect();
    let mean = mean
        .iter()
        .map(|m| if demean { *m as f32 } else { 0.0 })
        .collect();
    Ok((mean, std, clip))
}

fn base64(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let body: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let body = body
        .strip_suffix(b"==")
        .or_else(|| body.strip_suffix(b"="))
        .unwrap_or(&body);
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// The values of a little-endian float64, C-ordered `.npy` (format 1.x / 2.x).
fn npy_f64(b: &[u8]) -> Option<Vec<f64>> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return None;
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10usize),
        2 | 3 => (
            u32::from_le_bytes(b.get(8..12)?.try_into().ok()?) as usize,
            12,
        ),
        _ => return None,
    };
    let header = std::str::from_utf8(b.get(start..start.checked_add(hlen)?)?).ok()?;
    let compact: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("'descr':'<f8'") || !compact.contains("'fortran_order':False") {
        return None;
    }
    let shape = compact.split("'shape':(").nth(1)?.split(')').next()?;
    let n = shape
        .split(',')
        .filter(|d| !d.is_empty())
        .try_fold(1usize, |a, d| a.checked_mul(d.parse::<usize>().ok()?))?;
    let data = b.get(start + hlen..)?;
    (data.len() == n.checked_mul(8)?).then(|| {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    })
}

/// Import one RLModule of an RLlib checkpoint (see the module docs for what is read and what is refused).
pub fn import_rllib(files: &RllibFiles, source: &str) -> Result<Imported, ImportError> {
    import_with(files, source, Route::Checkpoint)
}

/// One RLModule alone, from the bytes of its state and constructor (`pickle.dumps(module.get_state())` and
/// `pickle.dumps({"class": ..., "ctor_args_and_kwargs": module.get_ctor_args_and_kwargs()})`: what
/// `module.save_to_path` writes as `module_state.pkl` / `class_and_ctor_args.pkl`), compiled to the module's own
/// function: observations as the module takes them (no connector runs: RLlib's env-to-module pipeline still
/// does, around it) and actions as the module's distribution draws them (no `NormalizeAndClipActions` mapping:
/// the env runner's module-to-env pipeline still does it). This is what an env runner's module is replaced by
/// (the Python package's RLlib integration, rebuilt at every weight sync). An `inference_only` module (no
/// value function) gives an artifact without a value output. RLlib SAC is refused here (its squashed actions
/// are defined together with the env runner's action mapping: compile its checkpoint directory instead).
pub fn import_rllib_module(
    module_state: &[u8],
    module_ctor: &[u8],
    name: &str,
    source: &str,
) -> Result<Imported, ImportError> {
    let files = RllibFiles {
        module_dir: PathBuf::from(name),
        module_state: module_state.to_vec(),
        module_ctor: module_ctor.to_vec(),
        env_to_module: None,
        module_to_env: None,
        mean_std_state: None,
    };
    import_with(&files, source, Route::ModuleOnly)
}

/// The RLModule classes read, by what their weights and forwards are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModuleKind {
    /// `DefaultPPOTorchRLModule` (PPO and IMPALA) and `DefaultAPPOTorchRLModule` (the same networks plus the
    /// `_old_encoder` / `_old_pi` target copies APPO's learner keeps: training-only, never read).
    Ppo,
    /// RLlib's example `ActionMaskingTorchRLModule` (`ray.rllib.examples.rl_modules.classes.action_masking_rlm`):
    /// PPO's networks on the Dict's `observations`, logits masked by the Dict's `action_mask`
    /// (`logits + clamp(log(mask), FLOAT_MIN)`): the artifact takes the mask as the request's action mask.
    ActionMasking,
    Sac,
    /// `DefaultDQNTorchRLModule` ([`dqn_policy`]).
    Dqn,
}

impl ModuleKind {
    /// The kind of a class named `module.Name` (the pickle allow-list already limits which classes appear).
    fn of(class: &str) -> Option<Self> {
        Some(match class.rsplit('.').next()? {
            "DefaultPPOTorchRLModule" | "DefaultAPPOTorchRLModule" => ModuleKind::Ppo,
            "ActionMaskingTorchRLModule" => ModuleKind::ActionMasking,
            "DefaultSACTorchRLModule" => ModuleKind::Sac,
            "DefaultDQNTorchRLModule" => ModuleKind::Dqn,
            _ => return None,
        })
    }
}

/// The action-masking module's observation space, `Dict({"action_mask": Box(0, 1, (n,)), "observations": S})`:
/// (S's node, n). Any other key, or a mask that is not a flat Box, is refused by name.
fn masking_spaces(pk: &Pickle, i: usize) -> Result<(usize, usize), ImportError> {
    let layout =
        "ActionMaskingTorchRLModule's Dict({'action_mask': Box(0, 1, (n,)), 'observations': ...})";
    if pk.call_name(i).as_deref() != Some("gymnasium.spaces.dict.Dict") {
        return Err(bad(format!(
            "an ActionMaskingTorchRLModule whose observation space is not a Dict (expects {layout})"
        )));
    }
    let spaces = space_attr(pk, i, "spaces")?;
    let items = match pk.get(spaces) {
        Node::Dict(items) | Node::Call { items, .. } => items,
        _ => return Err(bad("Dict.spaces is not a dict")),
    };
    let (mut obs, mut mask) = (None, None);
    for (k, v) in items {
        match pk.str(*k) {
            Some("observations") => obs = Some(*v),
            Some("action_mask") => mask = Some(*v),
            other => {
                return Err(unsupported(
                    format!("the action-masking Dict's key {other:?}"),
                    layout,
                ));
            }
        }
    }
    let (Some(obs), Some(mask)) = (obs, mask) else {
        return Err(bad(format!("the Dict lacks a key of {layout}")));
    };
    match box_space(pk, mask)? {
        ObservationSpace::Box { shape, .. } if shape.len() == 1 => Ok((obs, shape[0])),
        other => Err(unsupported(
            format!("an action_mask space {other:?}"),
            "a flat Box, one flag per logit",
        )),
    }
}

/// Where an import's connectors come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A checkpoint directory: its connector files when present, RLlib's defaults otherwise.
    Checkpoint,
    /// The module alone: no connector, raw actions ([`import_rllib_module`]).
    ModuleOnly,
}

fn import_with(files: &RllibFiles, source: &str, route: Route) -> Result<Imported, ImportError> {
    // The pickle holds the class and its constructor arguments (spaces, model_config, ...): a global refused
    // anywhere in it is named with the file, not as "the RLModule class" (a bad model_config entry was).
    let ctor = parse(
        &files.module_ctor,
        "global in class_and_ctor_args.pkl (the RLModule's class or a constructor argument such as model_config):",
    )?;
    let (class, kind) = module_class(&ctor)?;
    let sac = kind == ModuleKind::Sac;
    let kwargs = get(&ctor, ctor.root, "ctor_args_and_kwargs")
        .and_then(|i| ctor.items(i))
        .and_then(|t| t.get(1).copied())
        .ok_or_else(|| bad("class_and_ctor_args without (args, kwargs)"))?;
    let kw = |k: &str| {
        get(&ctor, kwargs, k).ok_or_else(|| bad(format!("RLModule kwargs without '{k}'")))
    };
    let action = action_space(&ctor, kw("action_space")?)?;
    // The action-masking module's space is a Dict of the mask and the observations; its networks see the
    // observations only, and the mask becomes the request's action mask (format 1.4).
    let module_observation = if kind == ModuleKind::ActionMasking {
        action_masking_observation(&ctor, kw("observation_space")?, &action)?
    } else {
        observation_space(&ctor, kw("observation_space")?)?
    };
    let mut walk = pickle::Walk::new(MAX_CONFIG_VALUES, "model_config");
    let mc = model_config(&to_json(&ctor, kw("model_config")?, 0, &mut walk)?)?;

    // The env-to-module pipeline: its pieces must be RLlib's defaults, plus MeanStdFilter and a leading
    // FlattenObservations (how RLlib users feed Dict observations to the default encoders).
    let pipeline = match &files.env_to_module {
        Some(b) => Some(Pipeline::read(&parse(b, "env-to-module connector")?)?),
        None => None,
    };
    let has_filter = pipeline.as_ref().is_some_and(|p| p.mean_std_filter);
    let actions = match (&files.module_to_env, route) {
        (_, Route::ModuleOnly) => ActionMapping {
            normalize: false,
            clip: false,
        },
        (Some(b), _) => ActionMapping::read(&parse(b, "module-to-env connector")?)?,
        (None, Route::Checkpoint) => ActionMapping::default(),
    };
    if sac && route == Route::ModuleOnly {
        return Err(unsupported(
            "an RLlib SAC module compiled alone",
            "its checkpoint directory (algo.save()): SAC's actions are defined with the env runner's action mapping",
        ));
    }
    let ObservationSpace::Box {
        shape: obs_shape, ..
    } = &module_observation
    else {
        return Err(unsupported(
            "non-Box observations in an RLlib module",
            "Box observations (Dicts through FlattenObservations)",
        ));
    };
    let numel: usize = obs_shape.iter().product();
    let observation =
        artifact_observation(pipeline.as_ref(), &module_observation, obs_shape, numel)?;
    let (preprocess, norm) = mean_std_normalization(
        files.mean_std_state.as_deref(),
        has_filter,
        obs_shape,
        numel,
    )?;

    let sd = module_state_dict(&files.module_state)?;
    let parts = ModuleParts {
        sd: &sd,
        mc: &mc,
        obs_shape,
        observation,
        action,
        preprocess,
        norm,
        class: &class,
        actions,
    };
    match kind {
        ModuleKind::Dqn => dqn_policy(parts, files, source),
        ModuleKind::Sac => sac_policy(parts, files, source),
        ModuleKind::Ppo | ModuleKind::ActionMasking => {
            ppo_policy(parts, kind == ModuleKind::ActionMasking, files, source)
        }
    }
}

/// The RLModule's class (`module.Name`) named by `class_and_ctor_args.pkl`, and its kind; a MultiRLModule or a
/// class not read is refused by name.
fn module_class(ctor: &Pickle) -> Result<(String, ModuleKind), ImportError> {
    let class =
        get(ctor, ctor.root, "class").ok_or_else(|| bad("class_and_ctor_args without 'class'"))?;
    let class = match ctor.get(class) {
        Node::Global(m, n) => format!("{m}.{n}"),
        _ => return Err(bad("'class' is not a class")),
    };
    if class.ends_with("MultiRLModule") {
        return Err(bad(
            "this is a MultiRLModule's directory; give one module's directory inside it",
        ));
    }
    let Some(kind) = ModuleKind::of(&class) else {
        return Err(unsupported(
            format!("RLModule class {class}"),
            "RLlib's DefaultPPOTorchRLModule (PPO, IMPALA), DefaultAPPOTorchRLModule, DefaultSACTorchRLModule, \
             DefaultDQNTorchRLModule or the example ActionMaskingTorchRLModule",
        ));
    };
    Ok((class, kind))
}

/// The action-masking module's observation space (node `i`, a Dict of the mask and the observations): the
/// observations' space, once the mask is checked to have one flag per logit of `action` (Discrete or
/// MultiDiscrete).
fn action_masking_observation(
    ctor: &Pickle,
    i: usize,
    action: &ActionSpace,
) -> Result<ObservationSpace, ImportError> {
    let (obs, mask_len) = masking_spaces(ctor, i)?;
    let logits = match action {
        ActionSpace::Discrete { n } => *n,
        ActionSpace::MultiDiscrete { nvec } => nvec.iter().sum(),
        other => {
            return Err(unsupported(
                format!("ActionMaskingTorchRLModule with {other:?} actions"),
                "Discrete or MultiDiscrete actions (a mask is one flag per logit)",
            ));
        }
    };
    if mask_len != logits {
        return Err(bad(format!(
            "the action_mask space has {mask_len} flags for {logits} logits"
        )));
    }
    observation_space(ctor, obs)
}

/// The artifact's observation space: the env's, when the pipeline's `FlattenObservations` flattens it into the
/// module's `numel` numbers (a flattened Box takes the module's shape), else the module's own.
fn artifact_observation(
    pipeline: Option<&Pipeline>,
    module_observation: &ObservationSpace,
    obs_shape: &[usize],
    numel: usize,
) -> Result<ObservationSpace, ImportError> {
    Ok(match pipeline.and_then(|p| p.flattened.clone()) {
        Some(env_space) => {
            if env_space.raw_len() != numel {
                return Err(bad(format!(
                    "FlattenObservations' input space has {} numbers, the module takes {numel}",
                    env_space.raw_len()
                )));
            }
            match env_space {
                // A flattened Box is the same numbers row-major: the graph takes the module's flat vector.
                ObservationSpace::Box { dtype, .. } => ObservationSpace::Box {
                    shape: obs_shape.to_vec(),
                    dtype,
                },
                dict => dict,
            }
        }
        None => module_observation.clone(),
    })
}

/// The MeanStdFilter's normalization of the module's observations (`obs_shape`, `numel` numbers): the
/// preprocess step and its `obs_filter.*` tensors from the saved statistics, none without a filter; a filter
/// without statistics is refused.
fn mean_std_normalization(
    mean_std_state: Option<&[u8]>,
    has_filter: bool,
    obs_shape: &[usize],
    numel: usize,
) -> Result<(Vec<Preprocess>, Vec<(String, Tensor)>), ImportError> {
    let mut preprocess = vec![];
    let mut norm = vec![];
    match (mean_std_state, has_filter) {
        (Some(st), _) => {
            let (mean, std, clip) = mean_std(st, numel)?;
            norm.push((
                "obs_filter.mean".to_string(),
                Tensor::new(obs_shape.to_vec(), mean),
            ));
            norm.push((
                "obs_filter.std".to_string(),
                Tensor::new(obs_shape.to_vec(), std),
            ));
            preprocess.push(Preprocess::Normalize {
                mean: "obs_filter.mean".into(),
                std: "obs_filter.std".into(),
                clip,
            });
        }
        (None, true) => {
            return Err(bad(
                "the env-to-module pipeline has a MeanStdFilter but no saved statistics",
            ));
        }
        (None, false) => {}
    }
    Ok((preprocess, norm))
}

/// The RLModule's `state_dict()` (`module_state.pkl`, an `OrderedDict` of NumPy arrays) as f32 tensors by key.
fn module_state_dict(module_state: &[u8]) -> Result<BTreeMap<String, Tensor>, ImportError> {
    let state = parse(module_state, "global in the RLModule's state pickle:")?;
    let Node::Call { items, .. } = state.get(state.root) else {
        return Err(bad("module_state.pkl is not an OrderedDict of arrays"));
    };
    let mut sd = BTreeMap::new();
    for (k, v) in items {
        let key = state
            .str(*k)
            .ok_or_else(|| bad("a module_state key is not a string"))?;
        let a = arr(&state, *v, key)?;
        sd.insert(
            key.to_string(),
            Tensor::new(a.shape, a.data.iter().map(|x| *x as f32).collect()),
        );
    }
    Ok(sd)
}

/// RLlib's `DefaultPPOTorchRLModule` (PPO, IMPALA, APPO, and the action-masking example's networks): actor and
/// critic encoders (or one shared encoder), optionally with an LSTM, under the `pi` head's distribution and the
/// `vf` head's value (absent in an inference-only module). `action_masks`: the manifest takes the request's
/// action mask.
fn ppo_policy(
    p: ModuleParts<'_>,
    action_masks: bool,
    files: &RllibFiles,
    source: &str,
) -> Result<Imported, ImportError> {
    let shared = p.sd.keys().any(|k| k.starts_with("encoder.encoder."));
    if !shared && !p.sd.keys().any(|k| k.starts_with("encoder.actor_encoder.")) {
        return Err(bad(
            "a PPO module with neither 'encoder.actor_encoder.*' nor (vf_share_layers) 'encoder.encoder.*' weights",
        ));
    }
    if shared && p.mc.use_lstm {
        return Err(unsupported(
            "use_lstm with vf_share_layers=True",
            "not read yet (separate encoders, PPO's default, are)",
        ));
    }

    let mut g = GraphBuilder::new(p.sd, "RLlib checkpoint");
    let mut modules = vec![];
    let mut states = vec![];
    let mut branch = |g: &mut GraphBuilder, which: &str, modules: &mut Vec<Module>| {
        ppo_encoder_branch(g, which, p.obs_shape, p.mc, modules, &mut states)
    };
    // An env runner's module (built with inference_only=True, as RLlib builds them, and as its weights are
    // synced) has no value function: neither `vf.*` nor, with separate encoders, `encoder.critic_encoder.*`.
    // The artifact then has no value output.
    let has_vf = p.sd.keys().any(|k| k.starts_with("vf."));
    let ((a, da), critic) = if shared {
        let e = branch(&mut g, "shared", &mut modules)?;
        (e.clone(), has_vf.then_some(e))
    } else {
        let actor = branch(&mut g, "actor", &mut modules)?;
        let critic = if has_vf {
            Some(branch(&mut g, "critic", &mut modules)?)
        } else {
            None
        };
        (actor, critic)
    };
    let (logits, k) = head(&mut g, "pi", &a, da, p.mc)?;
    let distribution = ppo_distribution(&mut g, &p.action, &logits, k, p.mc, p.actions)?;
    let head_out = distribution
        .param_values()
        .iter()
        .map(|s| s.to_string())
        .collect();
    modules.push(g.module("pi", ModuleRole::PolicyHead, vec![a], head_out));
    let value = match critic {
        Some((c, dc)) => {
            let (value, one) = head(&mut g, "vf", &c, dc, p.mc)?;
            if one != 1 {
                return Err(bad(format!("the vf head has {one} outputs")));
            }
            modules.push(g.module("vf", ModuleRole::ValueHead, vec![c], vec![value.clone()]));
            Some(value)
        }
        None => None,
    };
    let manifest = Manifest {
        name: checkpoint_name(files),
        producer: producer(
            "rllib",
            source,
            format!("{}; model_config over DefaultModelConfig", p.class),
        ),
        observation: p.observation,
        action: p.action,
        preprocess: p.preprocess,
        modules,
        distribution,
        value,
        recurrent: (!states.is_empty()).then_some(RecurrentSpec { states }),
        golden: vec![],
        action_masks,
    };
    // Never read for acting: APPO's target copies (`_old_*`), and every head's `log_std_clip_param_const` (a
    // copy of model_config's log_std_clip_param: checked against it where a Gaussian head uses it).
    g.check_every_key_read(&["_old_", "*.log_std_clip_param_const"])?;
    let mut tensors = g.tensors;
    tensors.extend(p.norm);
    Ok(Imported { manifest, tensors })
}

/// One PPO encoder branch on the observation (`which`: `shared` for `encoder.encoder`, else `actor` / `critic`
/// for `encoder.{which}_encoder`): the encoder, or with `use_lstm` the encoder as tokenizer then the LSTM (its
/// states added to `states`), each a module pushed on `modules`; returns (value, width).
fn ppo_encoder_branch(
    g: &mut GraphBuilder,
    which: &str,
    obs_shape: &[usize],
    mc: &ModelConfig,
    modules: &mut Vec<Module>,
    states: &mut Vec<StateSpec>,
) -> Result<(String, usize), ImportError> {
    let p = if which == "shared" {
        "encoder.encoder".to_string()
    } else {
        format!("encoder.{which}_encoder")
    };
    if mc.use_lstm {
        let (t, d) = encoder(g, &format!("{p}.tokenizer"), OBS_VALUE, obs_shape, mc)?;
        modules.push(g.module(
            &format!("{which}_tokenizer"),
            ModuleRole::Encoder,
            vec![OBS_VALUE.into()],
            vec![t.clone()],
        ));
        let r = g.torch_lstm(&format!("{p}.lstm"), &t, d)?;
        let mut inputs = vec![t];
        inputs.extend(r.reads.iter().cloned());
        modules.push(g.module(
            &format!("{which}_lstm"),
            ModuleRole::RecurrentCore,
            inputs,
            r.outputs(),
        ));
        states.extend(r.states.iter().cloned());
        Ok((r.output, r.hidden))
    } else {
        let (y, d) = encoder(g, &p, OBS_VALUE, obs_shape, mc)?;
        modules.push(g.module(
            &format!("{which}_encoder"),
            ModuleRole::Encoder,
            vec![OBS_VALUE.into()],
            vec![y.clone()],
        ));
        Ok((y, d))
    }
}

/// The PPO `pi` head's distribution over `action` from its `k` outputs `logits`: categorical for Discrete and
/// MultiDiscrete actions, [`ppo_gaussian`] for Box actions; a head of another width is refused.
fn ppo_distribution(
    g: &mut GraphBuilder,
    action: &ActionSpace,
    logits: &str,
    k: usize,
    mc: &ModelConfig,
    actions: ActionMapping,
) -> Result<Distribution, ImportError> {
    Ok(match action {
        ActionSpace::Discrete { n } if *n == k => Distribution::Categorical {
            logits: logits.to_string(),
        },
        ActionSpace::MultiDiscrete { nvec } if nvec.iter().sum::<usize>() == k => {
            Distribution::MultiCategorical {
                logits: logits.to_string(),
            }
        }
        ActionSpace::Box { low, high, .. }
            if k == action.action_len() * if mc.free_log_std { 1 } else { 2 } =>
        {
            ppo_gaussian(g, logits, action.action_len(), low, high, mc, actions)?
        }
        _ => {
            return Err(bad(format!(
                "the pi head has {k} outputs, which does not fit {action:?}"
            )));
        }
    })
}

/// The PPO `pi` head's diagonal Gaussian over `n` Box actions (bounds `low`, `high`), from its `logits`
/// (`[mean | log_std]`, or the mean alone with `free_log_std`), mapped to the env's actions as RLlib's
/// NormalizeAndClipActions maps them.
fn ppo_gaussian(
    g: &mut GraphBuilder,
    logits: &str,
    n: usize,
    low: &[Option<f32>],
    high: &[Option<f32>],
    mc: &ModelConfig,
    actions: ActionMapping,
) -> Result<Distribution, ImportError> {
    let c = mc.log_std_clip;
    // The head's own copy of the clip (RLlib keeps it as a buffer): it must say what model_config says.
    if g.has("pi.log_std_clip_param_const") {
        let t = g.peek("pi.log_std_clip_param_const")?;
        if t.data.len() != 1 || t.data[0] != c {
            return Err(bad(format!(
                "'pi.log_std_clip_param_const' is {:?} but model_config's log_std_clip_param is {c}",
                t.data
            )));
        }
    }
    // The log-std: the head's second half, clamped to ±log_std_clip_param (TorchMLPHead's clip_log_std
    // for Gaussians), or with free_log_std the state-independent `pi.log_std` parameter, clamped alike.
    let (mean, ls) = if mc.free_log_std {
        let t = g.peek("pi.log_std")?;
        if t.data.len() != n {
            return Err(bad(format!(
                "'pi.log_std' has {} values for {n} actions",
                t.data.len()
            )));
        }
        let clamped: Vec<f32> = t.data.iter().map(|v| v.clamp(-c, c)).collect();
        (logits.to_string(), Err(clamped))
    } else {
        let mean = g.node(Op::Slice { start: 0, len: n }, logits, "pi.mean");
        let ls = g.node(Op::Slice { start: n, len: n }, logits, "pi.log_std_raw");
        let ls = g.node(
            Op::Clip {
                min: Some(-c),
                max: Some(c),
            },
            &ls,
            "pi.log_std_clipped",
        );
        (mean, Ok(ls))
    };
    let bounded = low.iter().chain(high).all(Option::is_some);
    // NormalizeAndClipActions: with normalize_actions (the default) a bounded Box's actions are mapped
    // from [-1, 1] and clipped; without it, clipped to the bounds if clip_actions, else sent as they are.
    let finite = bounded && actions.normalize;
    // NormalizeAndClipActions: a_env = clip(low + (a + 1)(high - low)/2); on the Gaussian that is
    // mean' = mean·half + (low + half), log_std' = log_std + ln(half).
    let half: Vec<f32> = if finite {
        low.iter()
            .zip(high)
            .map(|(l, h)| ((h.unwrap() as f64 - l.unwrap() as f64) / 2.0) as f32)
            .collect()
    } else {
        vec![1.0; n]
    };
    let ln: Vec<f32> = half.iter().map(|h| (*h as f64).ln() as f32).collect();
    let mean = if finite {
        let shift: Vec<f32> = low.iter().zip(&half).map(|(l, h)| l.unwrap() + h).collect();
        let s = g.derived("pi.env_scale", Tensor::new(vec![n], half.clone()));
        let t = g.derived("pi.env_shift", Tensor::new(vec![n], shift));
        g.node(
            Op::Affine {
                scale: Some(s),
                shift: Some(t),
            },
            &mean,
            "pi.mean_env",
        )
    } else {
        mean
    };
    let log_std = match ls {
        Ok(ls) if finite => {
            let l = g.derived("pi.env_log_scale", Tensor::new(vec![n], ln));
            LogStd::Value {
                value: g.node(
                    Op::Affine {
                        scale: None,
                        shift: Some(l),
                    },
                    &ls,
                    "pi.log_std_env",
                ),
            }
        }
        Ok(ls) => LogStd::Value { value: ls },
        Err(param) => {
            let data = param.iter().zip(&ln).map(|(v, l)| v + l).collect();
            LogStd::Parameter {
                tensor: g.derived("pi.log_std_env", Tensor::new(vec![n], data)),
            }
        }
    };
    Ok(Distribution::DiagGaussian {
        mean,
        log_std,
        log_std_range: None,
        clip: if actions.normalize {
            bounded
        } else {
            actions.clip
        },
    })
}

/// The checkpoint's directory name (the algorithm's, or the module's when given alone).
fn checkpoint_name(files: &RllibFiles) -> String {
    files
        .module_dir
        .ancestors()
        .nth(4)
        .filter(|r| r.join("rllib_checkpoint.json").is_file())
        .unwrap_or(&files.module_dir)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rllib".into())
}

/// What the env-to-module pipeline (`env_to_module_connector/class_and_ctor_args.pkl`: the pipeline's input
/// spaces, then its pieces as `(class, args, kwargs)`) does to observations before the module sees them.
struct Pipeline {
    mean_std_filter: bool,
    /// The env's observation space, when a `FlattenObservations` piece flattens it first.
    flattened: Option<ObservationSpace>,
}

/// A connector pipeline's `class_and_ctor_args` (env-to-module or module-to-env): `((input observation space,
/// input action space), {"connectors": [(class, args, kwargs), ...]})`. Returns the input observation space's
/// node and each piece's class name with its kwargs node (`None` without a `connectors` list).
#[allow(clippy::type_complexity)]
fn pipeline_pieces(
    pk: &Pickle,
    what: &str,
) -> Result<(Option<usize>, Option<Vec<(String, Option<usize>)>>), ImportError> {
    let malformed = || {
        bad(format!(
            "the {what} pipeline's class_and_ctor_args is not (spaces, {{connectors}})"
        ))
    };
    let ak = get(pk, pk.root, "ctor_args_and_kwargs")
        .and_then(|i| pk.items(i))
        .ok_or_else(malformed)?;
    let space = ak
        .first()
        .and_then(|a| pk.items(*a))
        .and_then(|a| a.first().copied());
    let pieces = match ak.get(1).and_then(|kw| get(pk, *kw, "connectors")) {
        Some(l) => Some(
            pk.items(l)
                .ok_or_else(malformed)?
                .iter()
                .map(|piece| {
                    let t = pk.items(*piece).ok_or_else(malformed)?;
                    let name = match t.first().map(|c| pk.get(*c)) {
                        Some(Node::Global(_, n)) => n.clone(),
                        _ => return Err(malformed()),
                    };
                    Ok((name, t.get(2).copied()))
                })
                .collect::<Result<_, ImportError>>()?,
        ),
        None => None,
    };
    Ok((space, pieces))
}

impl Pipeline {
    fn read(pk: &Pickle) -> Result<Self, ImportError> {
        let (space, pieces) = pipeline_pieces(pk, "env-to-module")?;
        let pieces = pieces.unwrap_or_default();
        let at = |n: &str| pieces.iter().position(|(p, _)| p == n);
        let (filter, flatten) = (at("MeanStdFilter"), at("FlattenObservations"));
        let flattened = match flatten {
            None => None,
            Some(i) => {
                if i != 0 {
                    return Err(unsupported(
                        format!("FlattenObservations as piece {i} of the env-to-module pipeline"),
                        "FlattenObservations first (before MeanStdFilter)",
                    ));
                }
                let kwargs = pieces[i].1;
                let kwarg = |k: &str| kwargs.and_then(|kw| get(pk, kw, k)).map(|v| pk.get(v));
                if !matches!(kwarg("keys_to_remove"), None | Some(Node::None)) {
                    return Err(unsupported(
                        "FlattenObservations with keys_to_remove",
                        "flatten every key (the removed keys' spaces are not saved)",
                    ));
                }
                if matches!(kwarg("multi_agent"), Some(Node::Bool(true))) {
                    return Err(unsupported(
                        "a multi-agent FlattenObservations",
                        "a single-agent checkpoint",
                    ));
                }
                let space = space.ok_or_else(|| {
                    bad("the env-to-module pipeline's class_and_ctor_args has no input space")
                })?;
                Some(observation_space(pk, space)?)
            }
        };
        if let (Some(f), Some(fl)) = (filter, flatten) {
            if f < fl {
                return Err(unsupported(
                    "a MeanStdFilter before FlattenObservations",
                    "FlattenObservations first",
                ));
            }
        }
        Ok(Pipeline {
            mean_std_filter: filter.is_some(),
            flattened,
        })
    }
}

/// NormalizeAndClipActions' flags, from the module-to-env pipeline (`module_to_env_connector/
/// class_and_ctor_args.pkl`: its pieces as `(class, args, kwargs)`); RLlib's defaults (normalize, no clip) when the
/// checkpoint has no such file (a module directory given alone).
#[derive(Debug, Clone, Copy)]
struct ActionMapping {
    normalize: bool,
    clip: bool,
}

impl Default for ActionMapping {
    fn default() -> Self {
        ActionMapping {
            normalize: true,
            clip: false,
        }
    }
}

impl ActionMapping {
    fn read(pk: &Pickle) -> Result<Self, ImportError> {
        let pieces = pipeline_pieces(pk, "module-to-env")?.1.ok_or_else(|| {
            bad("the module-to-env pipeline's class_and_ctor_args is not (spaces, {connectors})")
        })?;
        if let Some((_, kwargs)) = pieces.iter().find(|(n, _)| n == "NormalizeAndClipActions") {
            let flag = |k: &str| -> Result<bool, ImportError> {
                match kwargs.and_then(|kw| get(pk, kw, k)).map(|v| pk.get(v)) {
                    Some(Node::Bool(b)) => Ok(*b),
                    _ => Err(bad(format!(
                        "NormalizeAndClipActions without a boolean '{k}'"
                    ))),
                }
            };
            return Ok(ActionMapping {
                normalize: flag("normalize_actions")?,
                clip: flag("clip_actions")?,
            });
        }
        // No such piece: the env gets the module's actions as they are.
        Ok(ActionMapping {
            normalize: false,
            clip: false,
        })
    }
}

/// What the PPO, SAC and DQN routes need from [`import_rllib`]'s common part.
struct ModuleParts<'a> {
    sd: &'a BTreeMap<String, Tensor>,
    mc: &'a ModelConfig,
    obs_shape: &'a [usize],
    observation: ObservationSpace,
    action: ActionSpace,
    preprocess: Vec<Preprocess>,
    norm: Vec<(String, Tensor)>,
    class: &'a str,
    actions: ActionMapping,
}

/// RLlib's `DefaultSACTorchRLModule`: the policy is `pi_encoder` (an MLP, `fcnet_activation` after every layer)
/// and the `pi` head giving `[mean | log_std]`; the Q networks (`qf*`, `target_qf*`) are training-only. RLlib's
/// `TorchSquashedGaussian` clamps the log-std to [-5, 2] (fixed, not `log_std_clip_param`) and samples
/// `tanh(mean + std·z)`, which the env runner maps from [-1, 1] to the bounds (`normalize_actions`); at inference
/// (`explore=False`) it takes the un-squashed mean and maps it the same way, clipped: the format's
/// `clipped_mean` (1.3). No value estimate (SAC has none).
fn sac_policy(
    p: ModuleParts<'_>,
    files: &RllibFiles,
    source: &str,
) -> Result<Imported, ImportError> {
    if p.mc.use_lstm || p.mc.free_log_std {
        return Err(unsupported(
            "use_lstm or free_log_std with SAC",
            "RLlib's default SAC module (RLlib's SAC supports neither)",
        ));
    }
    let ActionSpace::Box { low, high, .. } = &p.action else {
        return Err(unsupported(
            format!("RLlib SAC with {:?} actions", p.action),
            "Box actions (RLlib's SAC on Discrete actions is not read yet)",
        ));
    };
    if !low.iter().chain(high).all(Option::is_some) {
        return Err(unsupported(
            "RLlib SAC on an unbounded Box action space",
            "finite bounds (RLlib squashes actions into them)",
        ));
    }
    if !p.actions.normalize {
        return Err(unsupported(
            "RLlib SAC with normalize_actions=False",
            "the default normalize_actions=True (the env then gets the squashed action in [-1, 1], not in its bounds)",
        ));
    }
    let mut g = GraphBuilder::new(p.sd, "RLlib checkpoint");
    let (x, d) = encoder(&mut g, "pi_encoder", OBS_VALUE, p.obs_shape, p.mc)?;
    let mut modules = vec![g.module(
        "pi_encoder",
        ModuleRole::Encoder,
        vec![OBS_VALUE.into()],
        vec![x.clone()],
    )];
    let (out, k) = head(&mut g, "pi", &x, d, p.mc)?;
    let n = p.action.action_len();
    if k != 2 * n {
        return Err(bad(format!(
            "the SAC pi head has {k} outputs; {n} actions need {}",
            2 * n
        )));
    }
    let mean = g.node(Op::Slice { start: 0, len: n }, &out, "pi.mean");
    let ls = g.node(Op::Slice { start: n, len: n }, &out, "pi.log_std");
    modules.push(g.module(
        "pi",
        ModuleRole::PolicyHead,
        vec![x],
        vec![mean.clone(), ls.clone()],
    ));
    let manifest = Manifest {
        name: checkpoint_name(files),
        producer: producer(
            "rllib",
            source,
            format!("{}; model_config over DefaultModelConfig", p.class),
        ),
        observation: p.observation,
        action: p.action,
        preprocess: p.preprocess,
        modules,
        distribution: Distribution::SquashedGaussian {
            mean,
            log_std: LogStd::Value { value: ls },
            log_std_range: Some((-5.0, 2.0)),
            deterministic: SquashedDeterministic::ClippedMean,
        },
        value: None,
        recurrent: None,
        golden: vec![],
        action_masks: false,
    };
    // The twin Q-functions, their encoders and target copies train the actor; acting reads only the actor.
    g.check_every_key_read(&[
        "qf.",
        "qf_encoder.",
        "qf_twin.",
        "qf_twin_encoder.",
        "target_qf",
        "*.log_std_clip_param_const",
    ])?;
    let mut tensors = g.tensors;
    tensors.extend(p.norm);
    Ok(Imported { manifest, tensors })
}

/// The epsilon a DQN's model_config explores with once trained: a constant, or an RLlib schedule
/// (`[[timestep, value], ...]`, a `PiecewiseSchedule` whose `outside_value` is the last value) at its end. The
/// step the learner had reached is not in the module's files (the schedule runs on the env runner), so a
/// checkpoint saved mid-schedule records the final value; requests can override it (`Request::epsilon`).
fn dqn_epsilon(v: Option<&serde_json::Value>) -> Result<f32, ImportError> {
    use serde_json::Value;
    let eps = match v {
        None => return Err(bad("a DQN model_config without 'epsilon'")),
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::Array(steps)) => steps
            .last()
            .and_then(Value::as_array)
            .filter(|pair| pair.len() == 2)
            .and_then(|pair| pair[1].as_f64()),
        Some(_) => None,
    };
    match eps {
        Some(e) if (0.0..=1.0).contains(&e) => Ok(e as f32),
        Some(e) => Err(bad(format!("the DQN's epsilon {e} is not a probability"))),
        None => Err(bad(format!(
            "the DQN's epsilon {} is neither a number nor a [[timestep, value], ...] schedule",
            v.map(|v| v.to_string()).unwrap_or_default()
        ))),
    }
}

/// RLlib's `DefaultDQNTorchRLModule` on Discrete actions: `encoder` (MLP or CNN, as PPO's) under the `af` head,
/// Q values as `compute_q_values` gives them (what `forward_inference` takes the argmax of):
/// - plain: `Q = af(h)`;
/// - `dueling`: `Q = V + A − mean(A)` with `A = af(h)`, `V = vf(h)`: the centring and the broadcast of `V` to
///   every action are folded into the two heads' last layers (f64, rounded once), then one add;
/// - `num_atoms` K > 1 (distributional): `af` gives `[n·K]` logits; `Q[a] = Σ_j z_j softmax_j(logits[a, ·])`
///   with the support `z_j = v_min + j (v_max − v_min) / (K − 1)`: a reshape to `[n, K]`, a softmax over the
///   atoms and one dense with the support. With `dueling` too, RLlib centres the logits over the atoms and adds
///   `V` to all of them, which a softmax over the atoms cancels: the `vf` weights then change nothing and are not
///   read (said in the notes).
///
/// Sampled actions are epsilon-greedy with [`dqn_epsilon`]'s rate (RLlib's own exploration draws a uniformly
/// random action with probability epsilon too, from torch's generator). The target networks (`_target_*`) and
/// `double_q` are training-only. No value output: the Q vector is the distribution's parameters.
fn dqn_policy(
    p: ModuleParts<'_>,
    files: &RllibFiles,
    source: &str,
) -> Result<Imported, ImportError> {
    let ActionSpace::Discrete { n } = p.action else {
        return Err(unsupported(
            format!("RLlib DQN with {:?} actions", p.action),
            "Discrete actions (RLlib's DQN takes no other)",
        ));
    };
    if p.mc.use_lstm {
        return Err(unsupported(
            "use_lstm with DQN",
            "not read yet (RLlib's DQN with MLP and CNN encoders is)",
        ));
    }
    let cfg = &p.mc.dqn;
    let atoms = match &cfg.num_atoms {
        None => 1,
        Some(v) => match v.as_u64() {
            Some(k) if (1..=4096).contains(&k) => k as usize,
            _ => {
                return Err(bad(format!(
                    "the DQN's num_atoms {v} is not a count in 1..=4096"
                )));
            }
        },
    };
    let epsilon = dqn_epsilon(cfg.epsilon.as_ref())?;
    let mut g = GraphBuilder::new(p.sd, "RLlib checkpoint");
    let (h, d) = encoder(&mut g, "encoder", OBS_VALUE, p.obs_shape, p.mc)?;
    let mut modules = vec![g.module(
        "encoder",
        ModuleRole::Encoder,
        vec![OBS_VALUE.into()],
        vec![h.clone()],
    )];
    let (af, k) = head(&mut g, "af", &h, d, p.mc)?;
    if k != n * atoms {
        return Err(bad(format!(
            "the af head has {k} outputs; {n} actions x {atoms} atoms need {}",
            n * atoms
        )));
    }
    let mut notes = format!(
        "{}; model_config over DefaultModelConfig; epsilon {epsilon} (the schedule's final value)",
        p.class
    );
    let q = if atoms > 1 {
        let q = distributional_q(&mut g, &af, n, atoms, cfg)?;
        if cfg.dueling {
            notes.push_str(
                "; dueling with atoms: the vf stream adds one constant to every atom logit, which the softmax \
                 over the atoms cancels (not read)",
            );
        }
        q
    } else if cfg.dueling {
        // A − mean(A): the centring matrix I − 1/n on the advantage layer's rows.
        let centre: Vec<f64> = (0..n * n)
            .map(|i| f64::from(u8::from(i / n == i % n)) - 1.0 / n as f64)
            .collect();
        g.compose_into_dense(&af, &centre, n, "centred")?;
        let (vf, one) = head(&mut g, "vf", &h, d, p.mc)?;
        if one != 1 {
            return Err(bad(format!("the dueling vf head has {one} outputs")));
        }
        // V on every action: a ones column on the value layer.
        g.compose_into_dense(&vf, &vec![1.0; n], n, "per_action")?;
        g.node_n(Op::Add, &[&af, &vf], "q")
    } else {
        af
    };
    modules.push(g.module("q", ModuleRole::PolicyHead, vec![h], vec![q.clone()]));
    let manifest = Manifest {
        name: checkpoint_name(files),
        producer: producer("rllib", source, notes),
        observation: p.observation,
        action: p.action,
        preprocess: p.preprocess,
        modules,
        distribution: Distribution::QValues { q, epsilon },
        value: None,
        recurrent: None,
        golden: vec![],
        action_masks: false,
    };
    // The target network (`_target_*`, double Q) is training-only; the heads' clip constants are unused here;
    // a distributional dueling DQN's `vf` stream changes nothing (see above), so it alone may stay unread.
    let unread_ok: &[&str] = if atoms > 1 {
        &["_target_", "*.log_std_clip_param_const", "vf."]
    } else {
        &["_target_", "*.log_std_clip_param_const"]
    };
    g.check_every_key_read(unread_ok)?;
    let mut tensors = g.tensors;
    tensors.extend(p.norm);
    Ok(Imported { manifest, tensors })
}

/// A distributional DQN's Q values from the `af` head's `[n·atoms]` logits: a reshape to `[n, atoms]`, a softmax
/// over the atoms and one dense with the support `z_j = v_min + j (v_max − v_min) / (atoms − 1)` (see
/// [`dqn_policy`]); `v_min` and `v_max` must be finite and ordered.
fn distributional_q(
    g: &mut GraphBuilder,
    af: &str,
    n: usize,
    atoms: usize,
    cfg: &DqnConfig,
) -> Result<String, ImportError> {
    let (v_min, v_max) = match (cfg.v_min, cfg.v_max) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() && a < b => (a, b),
        (a, b) => {
            return Err(bad(format!(
                "distributional DQN needs finite v_min < v_max, has {a:?}, {b:?}"
            )));
        }
    };
    let grid = g.node(
        Op::Reshape {
            shape: vec![n, atoms],
        },
        af,
        "af.atoms",
    );
    let probs = g.node(Op::Softmax, &grid, "af.atom_probs");
    let flat = g.node(Op::Flatten, &probs, "af.atom_probs_flat");
    let mut support = vec![0f32; n * n * atoms];
    for a in 0..n {
        for j in 0..atoms {
            let z = v_min + j as f64 * (v_max - v_min) / (atoms - 1) as f64;
            support[a * n * atoms + a * atoms + j] = z as f32;
        }
    }
    let w = g.derived("q.support", Tensor::new(vec![n, n * atoms], support));
    Ok(g.node(
        Op::Dense {
            weight: w,
            bias: None,
        },
        &flat,
        "q",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36: a model_config whose lists each reference the one below twice (memo BINGETs) expanded into a
    /// tree of 2^60 values until the allocator aborted the process. Now its values are counted: a typed error.
    #[test]
    fn a_model_config_of_shared_lists_is_a_typed_error_not_an_abort() {
        let mut p = b"\x80\x02]q\x00K\x01a".to_vec();
        for level in 1..=60u8 {
            p.extend_from_slice(&[
                b']',
                b'q',
                level,
                b'(',
                b'h',
                level - 1,
                b'h',
                level - 1,
                b'e',
            ]);
        }
        p.push(b'.');
        let pk = pickle::parse(&p).unwrap();
        let mut walk = pickle::Walk::new(MAX_CONFIG_VALUES, "model_config");
        let err = to_json(&pk, pk.root, 0, &mut walk).unwrap_err();
        assert!(
            matches!(
                err,
                ImportError::Pickle(pickle::PickleError::SharedExpansion {
                    what: "model_config",
                    ..
                })
            ),
            "{err}"
        );
        // A config that shares one small list twice (as Python pickles a reused object) still reads.
        let p = b"\x80\x02}(X\x01\x00\x00\x00a]q\x00(K\x01K\x02eX\x01\x00\x00\x00bh\x00u.";
        let pk = pickle::parse(p).unwrap();
        let mut walk = pickle::Walk::new(MAX_CONFIG_VALUES, "model_config");
        assert_eq!(
            to_json(&pk, pk.root, 0, &mut walk).unwrap(),
            serde_json::json!({"a": [1, 2], "b": [1, 2]})
        );
    }

    #[test]
    fn dqn_epsilon_is_the_constant_or_the_schedules_final_value_and_a_probability() {
        use serde_json::json;
        assert_eq!(dqn_epsilon(Some(&json!(0.25))).unwrap(), 0.25);
        assert_eq!(
            dqn_epsilon(Some(&json!([[0, 1.0], [10000, 0.05]]))).unwrap(),
            0.05
        );
        assert_eq!(dqn_epsilon(Some(&json!([[0, 0]]))).unwrap(), 0.0);
        for bad in [
            json!(1.5),
            json!(-0.1),
            json!("0.1"),
            json!([]),
            json!([[0, 1.0], [5]]),
            json!([[0, 1.0], [5, 2.0]]),
            json!({"a": 1}),
        ] {
            assert!(
                matches!(dqn_epsilon(Some(&bad)), Err(ImportError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(dqn_epsilon(None).is_err());
    }

    #[test]
    fn a_map_composed_into_a_dense_layer_is_the_map_of_its_outputs() {
        // y = W x + b (3 outputs), then the dueling centring (I - 1/3): the folded layer equals it in f64.
        let w = Tensor::new(vec![3, 2], vec![1.0, 2.0, -3.0, 0.5, 4.0, -1.0]);
        let b = Tensor::new(vec![3], vec![0.1, -0.2, 0.3]);
        let sd: BTreeMap<String, Tensor> = [("l.weight".to_string(), w), ("l.bias".to_string(), b)]
            .into_iter()
            .collect();
        let mut g = GraphBuilder::new(&sd, "test");
        let (y, k) = g.linear("l", "x", 2).unwrap();
        let centre: Vec<f64> = (0..9)
            .map(|i| f64::from(u8::from(i / 3 == i % 3)) - 1.0 / 3.0)
            .collect();
        assert_eq!(g.compose_into_dense(&y, &centre, k, "centred").unwrap(), 3);
        assert!(
            !g.tensors.contains_key("l.weight"),
            "the layer's own weight left the artifact"
        );
        let (w2, b2) = (&g.tensors["l.centred.weight"], &g.tensors["l.centred.bias"]);
        let x = [0.7f64, -1.3];
        let raw: Vec<f64> = (0..3)
            .map(|r| {
                sd["l.weight"].data[r * 2] as f64 * x[0]
                    + sd["l.weight"].data[r * 2 + 1] as f64 * x[1]
                    + sd["l.bias"].data[r] as f64
            })
            .collect();
        let mean = raw.iter().sum::<f64>() / 3.0;
        for r in 0..3 {
            let got =
                w2.data[r * 2] as f64 * x[0] + w2.data[r * 2 + 1] as f64 * x[1] + b2.data[r] as f64;
            assert!(
                (got - (raw[r] - mean)).abs() < 1e-6,
                "row {r}: {got} vs {}",
                raw[r] - mean
            );
        }
        // A map of the wrong size, or onto something that is not a dense layer's output: typed errors.
        assert!(g.compose_into_dense(&y, &[1.0; 4], 2, "bad").is_err());
        assert!(g.compose_into_dense("nothing", &[1.0], 1, "bad").is_err());
    }

    #[test]
    fn base64_and_npy_round_trip_what_numpy_writes() {
        assert_eq!(base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64("aGVsbG8h").unwrap(), b"hello!");
        assert_eq!(base64("aGk=").unwrap(), b"hi");
        assert!(base64("a$==").is_none());
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
        let padded = format!("{header:<118}\n");
        npy.extend_from_slice(&(padded.len() as u16).to_le_bytes());
        npy.extend_from_slice(padded.as_bytes());
        npy.extend_from_slice(&1.5f64.to_le_bytes());
        npy.extend_from_slice(&(-2.0f64).to_le_bytes());
        assert_eq!(npy_f64(&npy).unwrap(), vec![1.5, -2.0]);
        assert!(npy_f64(&npy[..npy.len() - 1]).is_none(), "truncated data");
        let f4: Vec<u8> = String::from_utf8_lossy(&npy[..10 + padded.len()])
            .replace("<f8", "<f4")
            .into_bytes();
        assert!(npy_f64(&f4).is_none(), "float32 is refused, not misread");
    }
}
