//! Stable-Baselines3 `model.save()` archives → manifest + weights, without Python: the spaces and `policy_kwargs`
//! come from the `data` entry (JSON; SB3 writes each space's readable attributes next to its cloudpickle, which is
//! never touched), the weights from `policy.pth` (a `torch.save` state dict, [`crate::torchfile`]). The policy's
//! architecture is read from the state dict's keys and shapes, the activation from `policy_kwargs`, and the
//! computation is SB3's own: `preprocess_obs` (one-hot for Discrete, `/255` for image boxes), the features
//! extractor (Flatten, or NatureCNN for `CnnPolicy`), `mlp_extractor`, `action_net` / `value_net`, and SB3's
//! action distributions (`predict` clips Gaussian actions to the bounds; SAC squashes with tanh and rescales).
//!
//! Supported: PPO / A2C `ActorCriticPolicy` and `ActorCriticCnnPolicy` (shared or separate feature extractors) on
//! Discrete, MultiDiscrete and Box actions; `MultiInputPolicy` (a Dict of Box parts through `CombinedExtractor`:
//! NatureCNN for images, Flatten for the rest; format 1.2's dict observation); sb3-contrib `RecurrentPPO` (`MlpLstmPolicy`, `CnnLstmPolicy`: any
//! number of LSTM layers, the critic with its own LSTM, a Linear, or the actor's), its LSTM states per env in the
//! artifact; SAC `SACPolicy` / `CnnPolicy` and sb3-contrib TQC (the same actor); DQN and sb3-contrib QR-DQN
//! (format 1.4's Q values: greedy, epsilon-greedy at the saved `exploration_rate`; QR-DQN's mean over quantiles
//! folded into its last layer); TD3 / DDPG (format 1.4's deterministic actor, its tanh output rescaled to the
//! bounds, sampled with the recorded `NormalActionNoise`); sb3-contrib MaskablePPO (the artifact records that
//! masks are expected). Anything else (MultiBinary, Dict parts that are not boxes, gSDE) is a typed error naming
//! it.

use std::collections::BTreeMap;

use policyport_format::container::Tensor;
use policyport_format::{
    ActionSpace, DictEntry, Distribution, LogStd, Manifest, Module, ModuleRole, OBS_VALUE,
    ObsDType, ObservationSpace, Op, Preprocess, RecurrentSpec, StateSpec,
};
use serde_json::Value;

use crate::ImportError;
use crate::builder::{GraphBuilder, file_stem, producer};
use crate::onnx::Imported;
use crate::torchfile::read_state_dict;
use crate::zipread::Zip;

fn unsupported(what: impl Into<String>, hint: impl Into<String>) -> ImportError {
    ImportError::Unsupported {
        what: what.into(),
        hint: hint.into(),
    }
}

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("SB3 archive: {}", detail.into()))
}

/// Is this an SB3 archive (a zip with `data` and `policy.pth`)?
pub fn is_sb3_archive(bytes: &[u8]) -> bool {
    crate::zipread::is_zip(bytes)
        && Zip::open(bytes)
            .is_ok_and(|z| z.names().any(|n| n == "data") && z.names().any(|n| n == "policy.pth"))
}

/// The class SB3 recorded for a space (`":type:"`), e.g. `Box`.
fn space_class(v: &Value) -> String {
    v.get(":type:")
        .and_then(Value::as_str)
        .and_then(|t| t.rsplit('.').next())
        .map(|t| t.trim_end_matches("'>").to_string())
        .unwrap_or_default()
}

/// A NumPy array's `str()` as SB3 stores it (`"[-4.8  -inf 0.41 inf]"`), as floats (f64: a value past f32's
/// range must not turn into an infinity before the caller sees it).
fn parse_np_floats(s: &str) -> Result<Vec<f64>, ImportError> {
    s.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<f64>()
                .map_err(|_| bad(format!("bound '{t}' is not a number")))
        })
        .collect()
}

fn shape_of(v: &Value) -> Result<Vec<usize>, ImportError> {
    v.get("_shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("space without _shape"))?
        .iter()
        .map(|d| {
            d.as_u64()
                .map(|d| d as usize)
                .ok_or_else(|| bad("shape entry is not a size"))
        })
        .collect()
}

/// An integer SB3 wrote as a string (`"n": "2"`) or a number.
fn int_field(v: &Value, k: &str) -> Result<usize, ImportError> {
    match v.get(k) {
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(Value::Number(n)) => n.as_u64().map(|n| n as usize),
        _ => None,
    }
    .ok_or_else(|| bad(format!("space field '{k}' missing or not an integer")))
}

fn observation_space(v: &Value) -> Result<(ObservationSpace, bool), ImportError> {
    match space_class(v).as_str() {
        "Box" => {
            let shape = shape_of(v)?;
            let dtype = v.get("dtype").and_then(Value::as_str).unwrap_or("float32");
            let u8 = dtype == "uint8";
            // SB3's is_image_space: uint8, rank 3, bounds 0..255; channels first after VecTransposeImage.
            let image = u8 && shape.len() == 3;
            Ok((
                ObservationSpace::Box {
                    shape,
                    dtype: if u8 { ObsDType::U8 } else { ObsDType::F32 },
                },
                image,
            ))
        }
        "Discrete" => {
            if int_field(v, "start").unwrap_or(0) != 0 {
                return Err(unsupported(
                    "a Discrete observation space with start != 0",
                    "use start=0",
                ));
            }
            Ok((
                ObservationSpace::Discrete {
                    n: int_field(v, "n")?,
                },
                false,
            ))
        }
        "Dict" => {
            let repr = v
                .get("spaces")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Dict space without its 'spaces'"))?;
            Ok((
                ObservationSpace::Dict {
                    spaces: dict_entries(repr)?,
                },
                false,
            ))
        }
        other => Err(unsupported(
            format!("observation space {other}"),
            "Box, Discrete and Dict (of Box) observations are supported",
        )),
    }
}

fn action_space(v: &Value) -> Result<ActionSpace, ImportError> {
    match space_class(v).as_str() {
        "Discrete" => {
            if int_field(v, "start").unwrap_or(0) != 0 {
                return Err(unsupported(
                    "a Discrete action space with start != 0",
                    "use start=0",
                ));
            }
            Ok(ActionSpace::Discrete {
                n: int_field(v, "n")?,
            })
        }
        "MultiDiscrete" => {
            let nvec = v
                .get("nvec")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("MultiDiscrete without nvec"))?;
            // Each component's action count: a positive integer (a NaN, a fraction or a negative count used to
            // become 0 or a truncated count without a word).
            let nvec = parse_np_floats(nvec)?
                .into_iter()
                .map(|x| {
                    (x.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(&x))
                        .then_some(x as usize)
                        .ok_or_else(|| {
                            bad(format!(
                                "MultiDiscrete nvec entry {x} is not a positive integer"
                            ))
                        })
                })
                .collect::<Result<_, _>>()?;
            Ok(ActionSpace::MultiDiscrete { nvec })
        }
        "Box" => {
            let shape = shape_of(v)?;
            let bound = |k: &'static str| -> Result<Vec<Option<f32>>, ImportError> {
                let s = v
                    .get(k)
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("Box without {k}")))?;
                let mut vals = parse_np_floats(s)?;
                let n: usize = shape.iter().product();
                if vals.len() == 1 && n > 1 {
                    vals = vec![vals[0]; n];
                }
                if vals.len() != n {
                    return Err(bad(format!(
                        "{k} has {} values for shape {shape:?}",
                        vals.len()
                    )));
                }
                vals.into_iter()
                    .enumerate()
                    .map(|(i, x)| crate::action_bound(x, k, i))
                    .collect()
            };
            Ok(ActionSpace::Box {
                low: bound("low")?,
                high: bound("high")?,
                shape,
            })
        }
        other => Err(unsupported(
            format!("action space {other}"),
            "Discrete, MultiDiscrete and Box actions are supported",
        )),
    }
}

/// `policy_kwargs.activation_fn` (`"<class 'torch.nn.modules.activation.ReLU'>"`) as an op.
fn activation(kwargs: &Value, default: Op) -> Result<Op, ImportError> {
    let Some(s) = kwargs.get("activation_fn").and_then(Value::as_str) else {
        return Ok(default);
    };
    let name = s.rsplit('.').next().unwrap_or("").trim_end_matches("'>");
    Ok(match name {
        "Tanh" => Op::Tanh,
        "ReLU" => Op::Relu,
        "ELU" => Op::Elu { alpha: 1.0 },
        "LeakyReLU" => Op::LeakyRelu { alpha: 0.01 },
        "SiLU" => Op::Silu,
        "GELU" => Op::Gelu { approximate: false },
        "Sigmoid" => Op::Sigmoid,
        other => {
            return Err(unsupported(
                format!("activation_fn {other}"),
                "Tanh, ReLU, ELU, LeakyReLU, SiLU, GELU or Sigmoid",
            ));
        }
    })
}

/// The parts of a Dict space from the `repr` SB3 writes for it, e.g. `{'image': Box(0, 255, (3, 36, 36), uint8),
/// 'vec': Box(-1.0, 1.0, (5,), float32)}` (keys in the space's order: the order `CombinedExtractor` concatenates).
/// Only the shape and dtype are read (the bounds are not needed: images are known by their CNN weights).
fn dict_entries(repr: &str) -> Result<Vec<DictEntry>, ImportError> {
    let body = repr
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| bad(format!("Dict spaces '{repr}'")))?;
    let mut out = vec![];
    let mut rest = body.trim();
    while !rest.is_empty() {
        let r = rest
            .strip_prefix('\'')
            .ok_or_else(|| bad(format!("Dict key in '{rest}'")))?;
        let end = r.find('\'').ok_or_else(|| bad("unterminated Dict key"))?;
        let key = r[..end].to_string();
        let r = r[end + 1..]
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| bad("Dict entry without ':'"))?
            .trim_start();
        let Some(r) = r.strip_prefix("Box(") else {
            let kind: String = r.chars().take_while(|c| c.is_alphanumeric()).collect();
            return Err(unsupported(
                format!("a Dict observation part '{key}' of kind {kind}"),
                "Dict parts must be Box spaces",
            ));
        };
        // The Box's closing parenthesis: the first ')' at depth 0 (bounds may be arrays, the shape a tuple).
        let mut depth = 0i32;
        let close = r
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '(' | '[' => depth += 1,
                    ')' | ']' => depth -= 1,
                    _ => {}
                }
                depth < 0
            })
            .map(|(i, _)| i)
            .ok_or_else(|| bad(format!("unterminated Box of part '{key}'")))?;
        let inner = &r[..close];
        let (shape_part, dtype) = inner
            .rsplit_once("),")
            .ok_or_else(|| bad(format!("Box of part '{key}' without a shape")))?;
        let shape_str = shape_part
            .rsplit_once('(')
            .map(|(_, s)| s)
            .ok_or_else(|| bad("Box shape"))?;
        let shape = shape_str
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                d.parse::<usize>()
                    .map_err(|_| bad(format!("Box dim '{d}' of part '{key}'")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let dtype = match dtype.trim() {
            "uint8" => ObsDType::U8,
            "float32" | "float64" | "float16" => ObsDType::F32,
            other => {
                return Err(unsupported(
                    format!("Dict part '{key}' of dtype {other}"),
                    "float or uint8 boxes",
                ));
            }
        };
        if shape.is_empty() {
            return Err(bad(format!("Dict part '{key}' has no shape")));
        }
        out.push(DictEntry { key, shape, dtype });
        rest = r[close + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    if out.is_empty() {
        return Err(bad("an empty Dict space"));
    }
    Ok(out)
}

/// SB3's `CombinedExtractor` on the flat dict observation: each part sliced out (in the space's order), images
/// (parts with `extractors.<key>.cnn` weights) reshaped, scaled by 1/255 and through their NatureCNN, the others
/// as they are (Flatten); then concatenated.
fn dict_features(
    g: &mut GraphBuilder,
    prefix: &str,
    spaces: &[DictEntry],
) -> Result<(String, usize), ImportError> {
    let (mut off, mut feats, mut dim) = (0usize, vec![], 0usize);
    for e in spaces {
        let n: usize = e.shape.iter().product();
        let base = format!("{prefix}.extractors.{}", e.key);
        let part = g.node(
            Op::Slice { start: off, len: n },
            OBS_VALUE,
            &format!("{base}.obs"),
        );
        off += n;
        if g.has(&format!("{base}.cnn.0.weight")) {
            if e.dtype != ObsDType::U8 || e.shape.len() != 3 {
                return Err(bad(format!(
                    "part '{}' has CNN weights but is not a uint8 image",
                    e.key
                )));
            }
            let img = g.node(
                Op::Reshape {
                    shape: e.shape.clone(),
                },
                &part,
                &format!("{base}.chw"),
            );
            let scale = g.derived(
                &format!("{base}.scale"),
                Tensor::new(vec![1], vec![1.0 / 255.0]),
            );
            let img = g.node(
                Op::Affine {
                    scale: Some(scale),
                    shift: None,
                },
                &img,
                &format!("{base}.scaled"),
            );
            let convs = [0, 2, 4].map(|i| format!("{base}.cnn.{i}"));
            let names = [format!("{base}.cnn.6"), format!("{base}.linear.1")];
            let (f, d) = g.nature_cnn(
                convs,
                &format!("{base}.linear.0"),
                &img,
                &e.shape,
                [&names[0], &names[1]],
            )?;
            feats.push(f);
            dim += d;
        } else {
            feats.push(part);
            dim += n;
        }
    }
    let refs: Vec<&str> = feats.iter().map(String::as_str).collect();
    let f = if refs.len() == 1 {
        feats[0].clone()
    } else {
        g.node_n(Op::Concat, &refs, &format!("{prefix}.concat"))
    };
    Ok((f, dim))
}

/// SB3's features extractors: NatureCNN (`cnn.0/2/4` + `linear.0`) if its weights are there, else Flatten.
fn features(
    g: &mut GraphBuilder,
    prefix: &str,
    observation: &ObservationSpace,
    obs_shape: &[usize],
) -> Result<(String, usize), ImportError> {
    if let ObservationSpace::Dict { spaces } = observation {
        return dict_features(g, prefix, spaces);
    }
    if !g.has(&format!("{prefix}.cnn.0.weight")) {
        let n: usize = obs_shape.iter().product();
        if obs_shape.len() == 1 {
            return Ok((OBS_VALUE.to_string(), n));
        }
        return Ok((
            g.node(Op::Flatten, OBS_VALUE, &format!("{prefix}.flatten")),
            n,
        ));
    }
    let convs = [0, 2, 4].map(|i| format!("{prefix}.cnn.{i}"));
    let names = [format!("{prefix}.cnn.6"), format!("{prefix}.linear.1")];
    g.nature_cnn(
        convs,
        &format!("{prefix}.linear.0"),
        OBS_VALUE,
        obs_shape,
        [&names[0], &names[1]],
    )
}

/// Observation statistics of a `VecNormalize.save()` pickle: `(x - mean) / sqrt(var + epsilon)` clipped to
/// `±clip_obs`, as `VecNormalize.normalize_obs` computes it.
#[derive(Debug, Clone, PartialEq)]
pub struct VecNormalizeStats {
    pub mean: Vec<f32>,
    /// `sqrt(var + epsilon)`, computed in f64.
    pub std: Vec<f32>,
    pub clip: f32,
}

/// Read a `VecNormalize.save()` pickle (nothing in it is executed; see [`crate::pickle`]). `None` when the
/// wrapper does not normalise observations (`norm_obs=False`).
pub fn read_vecnormalize(bytes: &[u8]) -> Result<Option<VecNormalizeStats>, ImportError> {
    use crate::npy_pickle::{array, attributes};
    let pk = crate::pickle::parse(bytes)?;
    let vb = |d: &str| bad(format!("vecnormalize: {d}"));
    if pk.call_name(pk.root).as_deref()
        != Some("stable_baselines3.common.vec_env.vec_normalize.VecNormalize")
    {
        return Err(vb("not a VecNormalize object"));
    }
    let attrs = attributes(&pk, pk.root).ok_or_else(|| vb("no attributes"))?;
    let get = |k: &str| attrs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let num = |k: &str| -> Result<f64, ImportError> {
        let a = array(&pk, get(k).ok_or_else(|| vb(&format!("no {k}")))?).map_err(|e| vb(&e))?;
        a.data
            .first()
            .copied()
            .filter(|_| a.data.len() == 1)
            .ok_or_else(|| vb(&format!("{k} is not a number")))
    };
    if get("norm_obs").is_some_and(|i| pk.int(i) == Some(0)) {
        return Ok(None);
    }
    if get("norm_obs_keys").is_some_and(|i| {
        !matches!(pk.get(i), crate::pickle::Node::None)
            && pk.items(i).is_some_and(|v| !v.is_empty())
    }) {
        return Err(unsupported(
            "VecNormalize over Dict observations",
            "not supported yet",
        ));
    }
    let rms = get("obs_rms").ok_or_else(|| vb("no obs_rms"))?;
    let rattrs = attributes(&pk, rms).ok_or_else(|| vb("obs_rms has no attributes"))?;
    let rget = |k: &str| rattrs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let mean =
        array(&pk, rget("mean").ok_or_else(|| vb("no obs_rms.mean"))?).map_err(|e| vb(&e))?;
    let var = array(&pk, rget("var").ok_or_else(|| vb("no obs_rms.var"))?).map_err(|e| vb(&e))?;
    if mean.data.len() != var.data.len() || mean.data.is_empty() {
        return Err(vb("mean and var differ in size"));
    }
    let eps = num("epsilon")?;
    let clip = num("clip_obs")?;
    if !(clip.is_finite() && clip > 0.0) || !eps.is_finite() || eps < 0.0 {
        return Err(vb("clip_obs / epsilon out of range"));
    }
    let std: Vec<f32> = var.data.iter().map(|v| (v + eps).sqrt() as f32).collect();
    if std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || mean.data.iter().any(|m| !m.is_finite())
    {
        return Err(vb("statistics are not finite and positive"));
    }
    Ok(Some(VecNormalizeStats {
        mean: mean.data.iter().map(|v| *v as f32).collect(),
        std,
        clip: clip as f32,
    }))
}

/// Import an SB3 archive, with the observation statistics of its `VecNormalize` wrapper if it was trained with one.
pub fn import_sb3(
    bytes: &[u8],
    source: &str,
    vecnormalize: Option<&[u8]>,
) -> Result<Imported, ImportError> {
    let Sb3Archive {
        data,
        state_dict,
        version,
    } = read_archive(bytes)?;
    let (observation, image) = observation_space(
        data.get("observation_space")
            .ok_or_else(|| bad("no observation_space"))?,
    )?;
    let action = action_space(
        data.get("action_space")
            .ok_or_else(|| bad("no action_space"))?,
    )?;
    let kwargs = data.get("policy_kwargs").cloned().unwrap_or(Value::Null);
    refuse_unsupported_settings(&data, &kwargs, image)?;
    let (mut preprocess, norm_tensors) = vecnormalize_preprocess(vecnormalize, &observation)?;
    let obs_shape = policy_input_shape(&observation, image, &mut preprocess);
    let mut g = GraphBuilder::new(&state_dict, "SB3 archive");
    let policy = policy_graph(
        &mut g,
        &PolicyInputs {
            data: &data,
            kwargs: &kwargs,
            observation: &observation,
            obs_shape: &obs_shape,
            action: &action,
        },
    )?;
    let mut notes = format!("stable-baselines3 {version}");
    notes.push_str(&policy.notes);
    let states = policy.states;
    let manifest = Manifest {
        name: file_stem(source, ".zip").to_string(),
        producer: producer("sb3", source, notes),
        observation,
        action,
        preprocess,
        modules: policy.modules,
        distribution: policy.distribution,
        value: policy.value,
        recurrent: (!states.is_empty()).then_some(RecurrentSpec { states }),
        golden: vec![],
        // sb3-contrib MaskablePPO (`MaskableActorCriticPolicy` and its Cnn / MultiInput kin): trained with masks.
        action_masks: policy_module(&data).contains("maskable"),
    };
    g.check_every_key_read(policy.training_only)?;
    let mut tensors = g.tensors;
    tensors.extend(norm_tensors);
    Ok(Imported { manifest, tensors })
}

/// The entries of an SB3 archive that the import reads.
struct Sb3Archive {
    /// The `data` entry (JSON): the spaces, `policy_kwargs` and the algorithm's settings.
    data: Value,
    /// The `policy.pth` entry's state dict.
    state_dict: BTreeMap<String, Tensor>,
    /// The `_stable_baselines3_version` entry; empty when absent.
    version: String,
}

/// Open an SB3 archive and read its `data`, `policy.pth` and version entries.
fn read_archive(bytes: &[u8]) -> Result<Sb3Archive, ImportError> {
    let zip = Zip::open(bytes)?;
    let data: Value = serde_json::from_slice(
        zip.get("data")
            .ok_or_else(|| bad("no 'data' entry (not a Stable-Baselines3 archive?)"))??,
    )
    .map_err(|e| bad(format!("'data' is not JSON: {e}")))?;
    let state_dict = read_state_dict(
        zip.get("policy.pth")
            .ok_or_else(|| bad("no 'policy.pth' entry"))??,
    )?;
    let version = zip
        .get("_stable_baselines3_version")
        .and_then(Result::ok)
        .map(|v| String::from_utf8_lossy(v).trim().to_string())
        .unwrap_or_default();
    Ok(Sb3Archive {
        data,
        state_dict,
        version,
    })
}

/// Refuse the training settings whose policy this import cannot reproduce: gSDE exploration, and image
/// observations without SB3's `/255`.
fn refuse_unsupported_settings(
    data: &Value,
    kwargs: &Value,
    image: bool,
) -> Result<(), ImportError> {
    if kwargs.get("use_sde").and_then(Value::as_bool) == Some(true)
        || data.get("use_sde").and_then(Value::as_bool) == Some(true)
    {
        return Err(unsupported(
            "gSDE exploration (use_sde=True)",
            "train without use_sde",
        ));
    }
    if kwargs.get("normalize_images").and_then(Value::as_bool) == Some(false) && image {
        return Err(unsupported(
            "normalize_images=False",
            "keep SB3's default /255 for images",
        ));
    }
    Ok(())
}

/// The `Normalize` preprocessing step and its `obs_norm.mean` / `obs_norm.std` tensors for a `VecNormalize`
/// pickle that normalises observations; neither without one.
fn vecnormalize_preprocess(
    vecnormalize: Option<&[u8]>,
    observation: &ObservationSpace,
) -> Result<(Vec<Preprocess>, Vec<(String, Tensor)>), ImportError> {
    let mut preprocess = vec![];
    let mut norm_tensors = vec![];
    if let Some(vn) = vecnormalize.map(read_vecnormalize).transpose()?.flatten() {
        // VecNormalize runs in the env wrapper, before the policy's own preprocessing.
        let ObservationSpace::Box { shape, .. } = observation else {
            return Err(unsupported(
                "VecNormalize statistics for Discrete or Dict observations",
                "drop --vecnormalize",
            ));
        };
        if vn.mean.len() != shape.iter().product::<usize>() {
            return Err(bad(format!(
                "vecnormalize has {} statistics for observations of shape {shape:?}",
                vn.mean.len()
            )));
        }
        norm_tensors.push((
            "obs_norm.mean".to_string(),
            Tensor::new(shape.clone(), vn.mean),
        ));
        norm_tensors.push((
            "obs_norm.std".to_string(),
            Tensor::new(shape.clone(), vn.std),
        ));
        preprocess.push(Preprocess::Normalize {
            mean: "obs_norm.mean".into(),
            std: "obs_norm.std".into(),
            clip: Some(vn.clip),
        });
    }
    Ok((preprocess, norm_tensors))
}

/// The shape of the policy's input after SB3's `preprocess_obs` (a Dict's parts side by side, Discrete one-hot),
/// appending that preprocessing (one-hot, `/255` for images) to `preprocess`.
fn policy_input_shape(
    observation: &ObservationSpace,
    image: bool,
    preprocess: &mut Vec<Preprocess>,
) -> Vec<usize> {
    match observation {
        ObservationSpace::Dict { .. } => vec![observation.raw_len()],
        ObservationSpace::Discrete { n } => {
            preprocess.push(Preprocess::OneHot { n: *n });
            vec![*n]
        }
        ObservationSpace::Box { shape, .. } => {
            if image {
                preprocess.push(Preprocess::Scale {
                    factor: 1.0 / 255.0,
                });
            }
            shape.clone()
        }
    }
}

/// What every policy family's graph is built from besides the state dict.
struct PolicyInputs<'p> {
    /// The archive's `data` entry.
    data: &'p Value,
    /// Its `policy_kwargs` (`Null` when absent).
    kwargs: &'p Value,
    observation: &'p ObservationSpace,
    /// The shape of the policy's input after preprocessing.
    obs_shape: &'p [usize],
    action: &'p ActionSpace,
}

/// A policy family's graph: what the manifest takes from it.
struct PolicyGraph {
    modules: Vec<Module>,
    distribution: Distribution,
    value: Option<String>,
    /// The recurrent states (RecurrentPPO's LSTMs), empty for a feed-forward policy.
    states: Vec<StateSpec>,
    // What the trainer keeps that acting never reads (checked by name at the end: every other weight of the file
    // must be read by a layer built here).
    training_only: &'static [&'static str],
    /// Appended to the producer's notes (TD3 / DDPG's recorded action noise).
    notes: String,
}

/// The policy's graph, built by the family that the state dict's keys name.
fn policy_graph(g: &mut GraphBuilder, p: &PolicyInputs) -> Result<PolicyGraph, ImportError> {
    if g.has("actor.mu.weight") {
        sac_actor(g, p)
    } else if g.has("action_net.weight") {
        actor_critic(g, p)
    } else if g.has("q_net.q_net.0.weight") || g.has("quantile_net.quantile_net.0.weight") {
        q_network(g, p)
    } else if g.has("actor.mu.0.weight") {
        td3_actor(g, p)
    } else {
        Err(unsupported(
            "an SB3 policy whose state dict has none of action_net, actor.mu, q_net or quantile_net",
            "PPO, A2C, SAC, TD3, DDPG, DQN (and sb3-contrib's RecurrentPPO, MaskablePPO, TQC, QR-DQN) are \
             supported",
        ))
    }
}

/// SAC's (and TQC's) actor as a squashed Gaussian.
fn sac_actor(g: &mut GraphBuilder, p: &PolicyInputs) -> Result<PolicyGraph, ImportError> {
    // SAC: actor = features -> latent_pi (ReLU) -> mu, log_std (clamped to [-20, 2]) -> squashed Gaussian.
    let action = p.action;
    let act = activation(p.kwargs, Op::Relu)?;
    let (f, d) = features(g, "actor.features_extractor", p.observation, p.obs_shape)?;
    let (latent, d) = g.sequential("actor.latent_pi", &f, d, &act, true, 0)?;
    let (mean, k) = g.linear("actor.mu", &latent, d)?;
    let (ls, _) = g.linear("actor.log_std", &latent, d)?;
    let log_std = g.node(
        Op::Clip {
            min: Some(-20.0),
            max: Some(2.0),
        },
        &ls,
        "actor.log_std.clamped",
    );
    if !matches!(action, ActionSpace::Box { low, high, .. } if low.iter().chain(high).all(Option::is_some))
    {
        return Err(unsupported(
            "SAC without finite Box bounds",
            "bound the action space",
        ));
    }
    if action.action_len() != k {
        return Err(bad(format!(
            "actor.mu has {k} outputs for {} actions",
            action.action_len()
        )));
    }
    let modules = vec![g.module(
        "actor",
        ModuleRole::PolicyHead,
        vec![OBS_VALUE.into()],
        vec![mean.clone(), log_std.clone()],
    )];
    Ok(PolicyGraph {
        modules,
        distribution: Distribution::SquashedGaussian {
            mean,
            log_std: LogStd::Value { value: log_std },
            log_std_range: None,
            deterministic: Default::default(),
        },
        value: None,
        states: vec![],
        training_only: &["critic.", "critic_target."],
        notes: String::new(),
    })
}

/// PPO / A2C `ActorCriticPolicy` (and sb3-contrib's RecurrentPPO and MaskablePPO): features, RecurrentPPO's LSTMs,
/// `mlp_extractor`, `action_net` and `value_net`.
fn actor_critic(g: &mut GraphBuilder, p: &PolicyInputs) -> Result<PolicyGraph, ImportError> {
    let act = activation(p.kwargs, Op::Tanh)?;
    let mut modules = vec![];
    let mut states = vec![];
    let (pi_f, vf_f, d) = actor_critic_features(g, &mut modules, p)?;
    if g.keys().any(|k| k.starts_with("mlp_extractor.shared_net.")) {
        return Err(unsupported(
            "a shared mlp_extractor trunk (SB3 < 1.8 net_arch)",
            "re-save with SB3 >= 2",
        ));
    }
    let (pi_f, vf_f, dp, dv) = recurrent_ppo_lstms(g, &mut modules, &mut states, pi_f, vf_f, d)?;
    let (latent_pi, dp) = g.sequential("mlp_extractor.policy_net", &pi_f, dp, &act, true, 0)?;
    let (head, k) = g.linear("action_net", &latent_pi, dp)?;
    let distribution = action_net_distribution(g, p.action, &head, k)?;
    let pi_inputs = vec![pi_f.clone()];
    modules.push(g.module("pi", ModuleRole::PolicyHead, pi_inputs, vec![head]));
    let (latent_vf, dv) = g.sequential("mlp_extractor.value_net", &vf_f, dv, &act, true, 0)?;
    let (value, one) = g.linear("value_net", &latent_vf, dv)?;
    if one != 1 {
        return Err(bad(format!("value_net has {one} outputs")));
    }
    modules.push(g.module("vf", ModuleRole::ValueHead, vec![vf_f], vec![value.clone()]));
    Ok(PolicyGraph {
        modules,
        distribution,
        value: Some(value),
        states,
        training_only: &[],
        notes: String::new(),
    })
}

/// An actor-critic policy's features extractor(s), shared or one each, as the `features` module: (the actor's
/// features, the critic's, their width).
fn actor_critic_features(
    g: &mut GraphBuilder,
    modules: &mut Vec<Module>,
    p: &PolicyInputs,
) -> Result<(String, String, usize), ImportError> {
    let shared = g.keys().any(|k| k.starts_with("features_extractor."))
        || !g.keys().any(|k| k.starts_with("pi_features_extractor."));
    if shared {
        let (f, d) = features(g, "features_extractor", p.observation, p.obs_shape)?;
        // A shared extractor is saved three times (SB3 >= 2 keeps pi_ / vf_features_extractor as aliases of
        // the one module): the copies are read only if they are the very same weights.
        g.read_as_alias("pi_features_extractor.", "features_extractor.");
        g.read_as_alias("vf_features_extractor.", "features_extractor.");
        push_encoder(g, modules, vec![f.clone()]);
        Ok((f.clone(), f, d))
    } else {
        let (pf, d) = features(g, "pi_features_extractor", p.observation, p.obs_shape)?;
        let (vf, _) = features(g, "vf_features_extractor", p.observation, p.obs_shape)?;
        push_encoder(g, modules, vec![pf.clone(), vf.clone()]);
        Ok((pf, vf, d))
    }
}

/// RecurrentPPO's LSTMs, if the state dict has them, as `RecurrentCore` modules (their states added to `states`):
/// (the actor's input to `mlp_extractor`, the critic's, their widths); the features `pi_f` / `vf_f` of width `d`
/// unchanged without them.
fn recurrent_ppo_lstms(
    g: &mut GraphBuilder,
    modules: &mut Vec<Module>,
    states: &mut Vec<StateSpec>,
    pi_f: String,
    vf_f: String,
    d: usize,
) -> Result<(String, String, usize, usize), ImportError> {
    // sb3-contrib RecurrentPPO: an LSTM between the features and mlp_extractor, for the actor; the critic has
    // its own LSTM (enable_critic_lstm), a Linear (neither), or reads the actor's (shared_lstm).
    if !g.has("lstm_actor.weight_ih_l0") {
        return Ok((pi_f, vf_f, d, d));
    }
    let actor = g.torch_lstm("lstm_actor", &pi_f, d)?;
    let mut inputs = vec![pi_f.clone()];
    inputs.extend(actor.reads.iter().cloned());
    modules.push(g.module(
        "lstm_actor",
        ModuleRole::RecurrentCore,
        inputs,
        actor.outputs(),
    ));
    states.extend(actor.states.iter().cloned());
    let (vf, dv) = if g.has("lstm_critic.weight_ih_l0") {
        let critic = g.torch_lstm("lstm_critic", &vf_f, d)?;
        let mut inputs = vec![vf_f.clone()];
        inputs.extend(critic.reads.iter().cloned());
        modules.push(g.module(
            "lstm_critic",
            ModuleRole::RecurrentCore,
            inputs,
            critic.outputs(),
        ));
        states.extend(critic.states);
        (critic.output, critic.hidden)
    } else if g.has("critic.weight") {
        let (v, dv) = g.linear("critic", &vf_f, d)?;
        modules.push(g.module(
            "critic",
            ModuleRole::Encoder,
            vec![vf_f.clone()],
            vec![v.clone()],
        ));
        (v, dv)
    } else {
        (actor.output.clone(), actor.hidden)
    };
    Ok((actor.output, vf, actor.hidden, dv))
}

/// The distribution SB3 puts on `action_net`'s `k` outputs `head` for `action`, checking their number.
fn action_net_distribution(
    g: &mut GraphBuilder,
    action: &ActionSpace,
    head: &str,
    k: usize,
) -> Result<Distribution, ImportError> {
    if action_n(action).is_some_and(|n| n != k) {
        return Err(bad(format!("action_net has {k} outputs for {action:?}")));
    }
    Ok(match action {
        ActionSpace::Discrete { .. } => Distribution::Categorical {
            logits: head.to_string(),
        },
        ActionSpace::MultiDiscrete { .. } => Distribution::MultiCategorical {
            logits: head.to_string(),
        },
        ActionSpace::Box { .. } => {
            if k != action.action_len() {
                return Err(bad(format!(
                    "action_net has {k} outputs for {} actions",
                    action.action_len()
                )));
            }
            g.take("log_std")?;
            // SB3's predict clips Gaussian actions to the space (the policy itself is unsquashed).
            Distribution::DiagGaussian {
                mean: head.to_string(),
                log_std: LogStd::Parameter {
                    tensor: "log_std".into(),
                },
                log_std_range: None,
                clip: true,
            }
        }
    })
}

/// DQN's or QR-DQN's Q network as Q values over a Discrete action space.
fn q_network(g: &mut GraphBuilder, p: &PolicyInputs) -> Result<PolicyGraph, ImportError> {
    // DQN (`q_net`: features -> q_net MLP, one Q value per action) and sb3-contrib QR-DQN (`quantile_net`:
    // n_quantiles x n_actions outputs, predict takes their mean over quantiles). The target networks
    // (`q_net_target`, `quantile_net_target`) are training-only.
    let quantile = !g.has("q_net.q_net.0.weight");
    let net = if quantile { "quantile_net" } else { "q_net" };
    let training_only: &'static [&'static str] = if quantile {
        &["quantile_net_target."]
    } else {
        &["q_net_target."]
    };
    let action = p.action;
    let &ActionSpace::Discrete { n } = action else {
        return Err(unsupported(
            format!(
                "a {} over {action:?}",
                if quantile { "QR-DQN" } else { "DQN" }
            ),
            "Q-learning policies need a Discrete action space",
        ));
    };
    let act = activation(p.kwargs, Op::Relu)?;
    let mut modules = vec![];
    let (f, d) = features(
        g,
        &format!("{net}.features_extractor"),
        p.observation,
        p.obs_shape,
    )?;
    push_encoder(g, &mut modules, vec![f.clone()]);
    let prefix = format!("{net}.{net}");
    let (hidden, d, last) = hidden_layers(g, &prefix, &f, d, &act)?;
    let q = if quantile {
        quantile_mean_layer(g, &last, &hidden, d, n)?
    } else {
        let (q, out) = g.linear(&last, &hidden, d)?;
        if out != n {
            return Err(bad(format!("{last} has {out} outputs for {n} actions")));
        }
        q
    };
    modules.push(g.module(
        "q",
        ModuleRole::PolicyHead,
        vec![f.clone()],
        vec![q.clone()],
    ));
    Ok(PolicyGraph {
        modules,
        distribution: Distribution::QValues {
            q,
            epsilon: exploration_rate(p.data)?,
        },
        value: None,
        states: vec![],
        training_only,
        notes: String::new(),
    })
}

/// TD3's (and DDPG's) deterministic actor, rescaled to the bounds, with its recorded action noise.
fn td3_actor(g: &mut GraphBuilder, p: &PolicyInputs) -> Result<PolicyGraph, ImportError> {
    // TD3 / DDPG (`TD3Policy`): actor = features -> mu MLP ending in tanh (squash_output); predict maps its
    // [-1, 1] output to the bounds (`unscale_action`); the critics and the target networks are training-only.
    let action = p.action;
    let act = activation(p.kwargs, Op::Relu)?;
    let bounded = matches!(action, ActionSpace::Box { low, high, .. }
        if low.iter().chain(high).all(Option::is_some));
    if !bounded {
        return Err(unsupported(
            "TD3 / DDPG without finite Box bounds",
            "bound the action space (SB3 rescales the actor's tanh output to it)",
        ));
    }
    let mut modules = vec![];
    let (f, d) = features(g, "actor.features_extractor", p.observation, p.obs_shape)?;
    push_encoder(g, &mut modules, vec![f.clone()]);
    let (hidden, d, last) = hidden_layers(g, "actor.mu", &f, d, &act)?;
    let (mu, k) = g.linear(&last, &hidden, d)?;
    if k != action.action_len() {
        return Err(bad(format!(
            "{last} has {k} outputs for {} actions",
            action.action_len()
        )));
    }
    let squashed = g.node(Op::Tanh, &mu, "actor.mu.tanh");
    modules.push(g.module(
        "actor",
        ModuleRole::PolicyHead,
        vec![f.clone()],
        vec![squashed.clone()],
    ));
    let (noise, notes) = action_noise(p.data, k)?;
    Ok(PolicyGraph {
        modules,
        distribution: Distribution::Deterministic {
            action: squashed,
            rescale: true,
            noise,
        },
        value: None,
        states: vec![],
        training_only: &["actor_target.", "critic.", "critic_target."],
        notes,
    })
}

/// The features extractor's nodes (if it built any: Flatten of a vector builds none) as the `features` encoder
/// module, reading `obs` and giving `outputs`.
fn push_encoder(g: &mut GraphBuilder, modules: &mut Vec<Module>, outputs: Vec<String>) {
    if g.pending() {
        modules.push(g.module(
            "features",
            ModuleRole::Encoder,
            vec![OBS_VALUE.into()],
            outputs,
        ));
    }
}

/// The module SB3 recorded for the policy class (`policy_class.__module__`), e.g.
/// `sb3_contrib.common.maskable.policies`; empty when absent.
fn policy_module(data: &Value) -> String {
    data.get("policy_class")
        .and_then(|c| c.get("__module__"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// An `nn.Sequential` of Linear layers at even indices (`prefix.0`, `prefix.2`, ...) with `act` between them:
/// every layer but the last, applied to `x`; returns (value, width, the last layer's key). Indices must be
/// contiguous (a gap would silently drop a layer).
fn hidden_layers(
    g: &mut GraphBuilder,
    prefix: &str,
    x: &str,
    dim: usize,
    act: &Op,
) -> Result<(String, usize, String), ImportError> {
    let (mut x, mut dim, mut i) = (x.to_string(), dim, 0usize);
    if !g.has(&format!("{prefix}.0.weight")) {
        return Err(bad(format!("no '{prefix}.0.weight'")));
    }
    while g.has(&format!("{prefix}.{}.weight", i + 2)) {
        let (y, d) = g.linear(&format!("{prefix}.{i}"), &x, dim)?;
        x = g.node(act.clone(), &y, &format!("{prefix}.{}", i + 1));
        dim = d;
        i += 2;
    }
    let stray = format!("{prefix}.");
    let last_index = g
        .keys()
        .filter_map(|k| k.strip_prefix(&stray))
        .filter_map(|k| k.split('.').next()?.parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    if last_index != i {
        return Err(bad(format!(
            "'{prefix}' has a layer at index {last_index} after a gap (its layers end at {i})"
        )));
    }
    Ok((x, dim, format!("{prefix}.{i}")))
}

/// QR-DQN's last layer (`n_quantiles x n` outputs, viewed as `[n_quantiles, n]`) folded into one that gives
/// the mean over quantiles directly: `mean_j (W_j x + b_j) = (mean_j W_j) x + mean_j b_j`, computed in f64 and
/// rounded once (the trainer's `quantiles.mean(dim=1)` up to float32 rounding).
fn quantile_mean_layer(
    g: &mut GraphBuilder,
    key: &str,
    x: &str,
    dim: usize,
    n: usize,
) -> Result<String, ImportError> {
    let w = g.peek(&format!("{key}.weight"))?.clone();
    if w.shape.len() != 2 || w.shape[1] != dim || w.shape[0] == 0 || w.shape[0] % n != 0 {
        return Err(bad(format!(
            "'{key}.weight' is {:?}: QR-DQN needs [n_quantiles x {n}, {dim}]",
            w.shape
        )));
    }
    let nq = w.shape[0] / n;
    let mean_rows = |data: &[f32], width: usize| -> Vec<f32> {
        let mut out = vec![0.0f64; n * width];
        for j in 0..nq {
            for a in 0..n {
                let row = &data[(j * n + a) * width..(j * n + a + 1) * width];
                for (o, v) in out[a * width..(a + 1) * width].iter_mut().zip(row) {
                    *o += *v as f64;
                }
            }
        }
        out.iter().map(|v| (v / nq as f64) as f32).collect()
    };
    let weight = g.derived(
        &format!("{key}.weight.quantile_mean"),
        Tensor::new(vec![n, dim], mean_rows(&w.data, dim)),
    );
    let bias_key = format!("{key}.bias");
    let bias = if g.has(&bias_key) {
        let b = g.peek(&bias_key)?.clone();
        if b.data.len() != w.shape[0] {
            return Err(bad(format!("'{bias_key}' has {} values", b.data.len())));
        }
        Some(g.derived(
            &format!("{key}.bias.quantile_mean"),
            Tensor::new(vec![n], mean_rows(&b.data, 1)),
        ))
    } else {
        None
    };
    Ok(g.node(Op::Dense { weight, bias }, x, "quantile_mean"))
}

/// A DQN's exploration rate at save time (what its `predict(deterministic=False)` uses).
fn exploration_rate(data: &Value) -> Result<f32, ImportError> {
    let eps = ["exploration_rate", "exploration_final_eps"]
        .iter()
        .find_map(|k| data.get(*k).and_then(Value::as_f64))
        .ok_or_else(|| bad("a DQN without exploration_rate"))?;
    if !(0.0..=1.0).contains(&eps) {
        return Err(bad(format!("exploration_rate {eps} is not a probability")));
    }
    Ok(eps as f32)
}

/// TD3 / DDPG exploration noise as recorded in `data` (`action_noise`): SB3's `NormalActionNoise` becomes the
/// artifact's sampled mode; no noise, or noise the format cannot hold (Ornstein-Uhlenbeck is a per-env process
/// with state), leaves sampled actions equal to the deterministic ones, and the producer notes say so.
fn action_noise(
    data: &Value,
    k: usize,
) -> Result<(Option<policyport_format::ActionNoise>, String), ImportError> {
    let Some(noise) = data.get("action_noise").filter(|v| !v.is_null()) else {
        return Ok((
            None,
            "; no action noise recorded: sampled actions are the deterministic ones".into(),
        ));
    };
    let ty = noise.get(":type:").and_then(Value::as_str).unwrap_or("");
    if !ty.contains("NormalActionNoise") || ty.contains("Vectorized") {
        return Ok((
            None,
            format!(
                "; action noise {ty} is not stored (only NormalActionNoise is): sampled actions are the \
                 deterministic ones"
            ),
        ));
    }
    let read = |key: &str| -> Result<Vec<f32>, ImportError> {
        let s = noise
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("NormalActionNoise without {key}")))?;
        let mut v: Vec<f32> = parse_np_floats(s)?.into_iter().map(|x| x as f32).collect();
        if v.len() == 1 && k > 1 {
            v = vec![v[0]; k];
        }
        if v.len() != k || v.iter().any(|x| !x.is_finite()) {
            return Err(bad(format!(
                "NormalActionNoise {key} '{s}' does not fit {k} actions"
            )));
        }
        Ok(v)
    };
    let (mean, sigma) = (read("_mu")?, read("_sigma")?);
    if sigma.iter().any(|s| *s < 0.0) {
        return Err(bad("NormalActionNoise with a negative sigma"));
    }
    Ok((
        Some(policyport_format::ActionNoise { mean, sigma }),
        "; sampled actions add the recorded NormalActionNoise".into(),
    ))
}

fn action_n(a: &ActionSpace) -> Option<usize> {
    match a {
        ActionSpace::Discrete { n } => Some(*n),
        ActionSpace::MultiDiscrete { nvec } => Some(nvec.iter().sum()),
        ActionSpace::Box { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn box_space(low: &str, high: &str) -> Value {
        json!({":type:": "<class 'gymnasium.spaces.box.Box'>", "_shape": [2], "low": low, "high": high})
    }

    /// Issue 36: a NaN bound was read as "unbounded" (the artifact lost its clip without a word). Only ±inf is.
    #[test]
    fn a_nan_action_bound_is_a_typed_error_not_unbounded() {
        match action_space(&box_space("[nan -2.]", "[2. 2.]")).unwrap_err() {
            ImportError::ActionBound { side, index, value } => {
                assert_eq!((side, index), ("low", 0));
                assert!(value.is_nan());
            }
            other => panic!("{other}"),
        }
        assert!(matches!(
            action_space(&box_space("[-2. -2.]", "[2. 1e300]")).unwrap_err(),
            ImportError::ActionBound {
                side: "high",
                index: 1,
                ..
            }
        ));
        let ActionSpace::Box { low, high, .. } =
            action_space(&box_space("[-inf -2.]", "[inf 2.]")).unwrap()
        else {
            panic!("a Box")
        };
        assert_eq!((low, high), (vec![None, Some(-2.0)], vec![None, Some(2.0)]));
    }

    /// A MultiDiscrete count that is NaN, fractional or negative became 0 or a truncated count.
    #[test]
    fn a_multidiscrete_count_that_is_not_a_positive_integer_is_refused() {
        for nvec in ["[3 nan]", "[3 2.5]", "[3 -2]", "[3 0]"] {
            let v = json!({":type:": "<class 'gymnasium.spaces.multi_discrete.MultiDiscrete'>", "nvec": nvec});
            let e = action_space(&v).unwrap_err();
            assert!(
                e.to_string().contains("not a positive integer"),
                "{nvec}: {e}"
            );
        }
    }
}
