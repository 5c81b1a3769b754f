//! `policyport compile`: a trained policy (an ONNX export, a Stable-Baselines3 archive, a CleanRL state dict, an
//! RLlib checkpoint directory) into a `.policy` artifact. Which importer runs is decided by the file's content,
//! never its name; each route refuses the flags that belong to another.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use policyport_import::{DistSpec, FixtureIo, ImportSpec, LogStdSpec, StorageDType, compile_onnx};

use super::{read, write_atomically};

/// `policyport compile`'s arguments.
#[derive(Args, Clone)]
pub struct CompileArgs {
    pub model: PathBuf,
    #[arg(short, long)]
    pub out: PathBuf,
    /// Import spec (JSON): distribution, outputs, spaces, normalisation. Flags below override it.
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Output naming conventions: `logits-value` (categorical over "logits", critic "value"),
    /// `gaussian` (diagonal Gaussian over "mean" and "log_std", critic "value"), `squashed` (SAC actor:
    /// tanh-squashed Gaussian over "mean" and "log_std"). Other flags override a preset.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    #[arg(long, value_enum)]
    pub dist: Option<DistArg>,
    #[arg(long)]
    pub logits: Option<String>,
    #[arg(long)]
    pub mean: Option<String>,
    /// A graph output or initializer holding the log-std.
    #[arg(long)]
    pub log_std: Option<String>,
    #[arg(long)]
    pub value: Option<String>,
    /// Continuous action bounds, comma-separated (one per action element).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub low: Option<Vec<f32>>,
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub high: Option<Vec<f32>>,
    /// Oracle outputs to embed as golden vectors (io.json from the fixture scripts).
    #[arg(long)]
    pub golden: Option<PathBuf>,
    /// Weight storage: f32, f16, bf16.
    #[arg(long, default_value = "f32")]
    pub storage: StorageDType,
    /// For a PyTorch state dict: the agent that wrote it (cleanrl-ppo, cleanrl-ppo-continuous,
    /// cleanrl-atari, cleanrl-atari-lstm, cleanrl-sac).
    #[arg(long)]
    pub layout: Option<policyport_import::CleanrlLayout>,
    /// For a state dict: the spaces as JSON, `{"observation": {...}, "action": {...}}` (SPEC.md's spaces).
    #[arg(long)]
    pub spaces: Option<PathBuf>,
    /// For a state dict: the observation shape, comma-separated (instead of --spaces).
    #[arg(long, value_delimiter = ',')]
    pub obs_shape: Option<Vec<usize>>,
    /// For a state dict: f32 or u8 observations.
    #[arg(long, value_enum, default_value = "f32")]
    pub obs_dtype: ObsDTypeArg,
    /// For a state dict: Discrete(N) actions (or --low/--high for a Box).
    #[arg(long)]
    pub actions: Option<usize>,
    /// For an SB3 archive: the `VecNormalize.save()` pickle of the env it was trained in (observation
    /// statistics become the policy's normalisation step).
    #[arg(long)]
    pub vecnormalize: Option<PathBuf>,
}

/// `compile --preset`: output naming conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// A categorical over "logits", critic "value".
    LogitsValue,
    /// A diagonal Gaussian over "mean" and "log_std", critic "value".
    Gaussian,
    /// A SAC actor: a tanh-squashed Gaussian over "mean" and "log_std".
    Squashed,
}

/// `compile --dist`: the action distribution over the model's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DistArg {
    /// Over --logits.
    Categorical,
    /// Over --mean and --log-std.
    DiagGaussian,
    /// tanh-squashed, over --mean and --log-std.
    SquashedGaussian,
}

/// `compile --obs-dtype` (state dicts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObsDTypeArg {
    F32,
    U8,
}

pub fn run(args: CompileArgs) -> Result<()> {
    let io: Option<FixtureIo> = match &args.golden {
        Some(p) => Some(
            serde_json::from_slice(&read(p)?)
                .with_context(|| format!("parsing {}", p.display()))?,
        ),
        None => None,
    };
    let (bytes, route) = if args.model.is_dir() {
        (from_rllib(&args, io.as_ref())?, " from an RLlib checkpoint")
    } else {
        let model_bytes = read(&args.model)?;
        // By content: a damaged file is named as what it is, never sent down the ONNX route.
        let kind = policyport_import::detect_model(&model_bytes)
            .with_context(|| format!("reading {}", args.model.display()))?;
        match kind {
            policyport_import::ModelKind::Sb3Archive => (
                from_sb3(&args, &model_bytes, io.as_ref())?,
                " from a Stable-Baselines3 archive",
            ),
            policyport_import::ModelKind::StateDict => (
                from_state_dict(args.clone(), &model_bytes, io.as_ref())?,
                " from a CleanRL checkpoint",
            ),
            _ => (from_onnx(args.clone(), &model_bytes, io.as_ref())?, ""),
        }
    };
    write_atomically(&args.out, &bytes)?;
    println!(
        "wrote {} ({} bytes){route}",
        args.out.display(),
        bytes.len()
    );
    Ok(())
}

/// An RLlib checkpoint directory: it says what its outputs mean, so no flag may say otherwise.
fn from_rllib(args: &CompileArgs, io: Option<&FixtureIo>) -> Result<Vec<u8>> {
    let model = &args.model;
    anyhow::ensure!(
        policyport_import::rllib::is_rllib_checkpoint(model),
        "{} is a directory but not an RLlib checkpoint (no rllib_checkpoint.json, module_state.pkl or \
         metadata.json + class_and_ctor_args.pkl); give a model file or what algo.save() wrote",
        model.display()
    );
    anyhow::ensure!(
        args.spec.is_none()
            && args.preset.is_none()
            && args.dist.is_none()
            && args.layout.is_none()
            && args.vecnormalize.is_none(),
        "{} is an RLlib checkpoint: it says what its outputs mean; drop --spec/--preset/--dist/--layout/--vecnormalize",
        model.display()
    );
    Ok(policyport_import::compile_rllib(
        model,
        &model.display().to_string(),
        io,
        args.storage,
    )?)
}

/// A Stable-Baselines3 archive: everything is in it (spaces, architecture, weights), plus VecNormalize's
/// statistics when given.
fn from_sb3(args: &CompileArgs, model_bytes: &[u8], io: Option<&FixtureIo>) -> Result<Vec<u8>> {
    anyhow::ensure!(
        args.spec.is_none() && args.preset.is_none() && args.dist.is_none(),
        "{} is a Stable-Baselines3 archive: it says what its outputs mean, drop --spec/--preset/--dist",
        args.model.display()
    );
    let vn = args.vecnormalize.as_deref().map(read).transpose()?;
    Ok(policyport_import::compile_sb3(
        model_bytes,
        vn.as_deref(),
        &args.model.display().to_string(),
        io,
        args.storage,
    )?)
}

/// A PyTorch state dict: no architecture inside, so the agent that wrote it (`--layout`) and the spaces are
/// the user's to give.
fn from_state_dict(
    args: CompileArgs,
    model_bytes: &[u8],
    io: Option<&FixtureIo>,
) -> Result<Vec<u8>> {
    let Some(layout) = args.layout else {
        bail!(
            "{} is a PyTorch state dict (torch.save or safetensors): it holds no architecture. Say which agent wrote \
             it with --layout cleanrl-ppo|cleanrl-ppo-continuous|cleanrl-atari|cleanrl-atari-lstm|cleanrl-sac and give the \
             spaces (--spaces spaces.json, or --obs-shape/--obs-dtype with --actions N or --low/--high)",
            args.model.display()
        );
    };
    let (observation, action) = spaces_from_flags(
        args.spaces.as_deref(),
        args.obs_shape,
        args.obs_dtype,
        args.actions,
        args.low,
        args.high,
    )?;
    Ok(policyport_import::compile_cleanrl(
        model_bytes,
        layout,
        observation,
        action,
        &args.model.display().to_string(),
        io,
        args.storage,
    )?)
}

/// An ONNX model: what its outputs mean comes from `--spec`, a `--preset`, or `--dist` with the output names.
fn from_onnx(args: CompileArgs, model_bytes: &[u8], io: Option<&FixtureIo>) -> Result<Vec<u8>> {
    anyhow::ensure!(
        args.vecnormalize.is_none(),
        "--vecnormalize goes with a Stable-Baselines3 archive; {} is not one",
        args.model.display()
    );
    anyhow::ensure!(
        args.layout.is_none(),
        "--layout is for PyTorch state dicts; {} is not one",
        args.model.display()
    );
    let source = args.model.display().to_string();
    let storage = args.storage;
    let spec = spec_from_flags(args)?;
    Ok(compile_onnx(model_bytes, &spec, &source, io, storage)?)
}

/// The import spec of an ONNX model: `--spec` (a JSON file), then a preset's output names, then the flags
/// (each overriding what came before it).
fn spec_from_flags(args: CompileArgs) -> Result<ImportSpec> {
    let CompileArgs {
        spec,
        preset,
        dist,
        logits,
        mean,
        log_std,
        value,
        low,
        high,
        ..
    } = args;
    let (mut dist, mut logits, mut mean, mut log_std, mut value) =
        (dist, logits, mean, log_std, value);
    let name = |n: &str| Some(n.to_string());
    match preset {
        None => {}
        Some(Preset::LogitsValue) => {
            dist = dist.or(Some(DistArg::Categorical));
            logits = logits.or(name("logits"));
            value = value.or(name("value"));
        }
        Some(p @ (Preset::Gaussian | Preset::Squashed)) => {
            dist = dist.or(Some(if p == Preset::Gaussian {
                DistArg::DiagGaussian
            } else {
                DistArg::SquashedGaussian
            }));
            mean = mean.or(name("mean"));
            log_std = log_std.or(name("log_std"));
            if p == Preset::Gaussian {
                value = value.or(name("value"));
            }
        }
    }
    let mut s: Option<ImportSpec> = match &spec {
        Some(p) => Some(
            serde_json::from_slice(&read(p)?)
                .with_context(|| format!("parsing {}", p.display()))?,
        ),
        None => None,
    };
    if let Some(d) = dist {
        let d_name = d
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        let need = |o: &Option<String>, flag: &str| {
            o.clone()
                .with_context(|| format!("--dist {d_name} needs --{flag}"))
        };
        let ls = || -> Result<LogStdSpec> { Ok(LogStdSpec::Output(need(&log_std, "log-std")?)) };
        let ds = match d {
            DistArg::Categorical => DistSpec::Categorical {
                logits: need(&logits, "logits")?,
            },
            DistArg::DiagGaussian => DistSpec::DiagGaussian {
                mean: need(&mean, "mean")?,
                log_std: ls()?,
                clip: false,
                log_std_range: None,
            },
            DistArg::SquashedGaussian => DistSpec::SquashedGaussian {
                mean: need(&mean, "mean")?,
                log_std: ls()?,
                log_std_range: None,
                deterministic: Default::default(),
            },
        };
        let mut base = s.take().unwrap_or(ImportSpec::new(ds.clone()));
        base.distribution = ds;
        s = Some(base);
    }
    let mut s =
        s.context("say what the outputs mean: --spec import.json, or --dist with --logits/--mean")?;
    if value.is_some() {
        s.value = value;
    }
    if let (Some(low), Some(high)) = (low, high) {
        anyhow::ensure!(
            low.len() == high.len(),
            "--low and --high need the same number of values"
        );
        s.action = Some(policyport_format::ActionSpace::Box {
            shape: vec![low.len()],
            low: low.into_iter().map(Some).collect(),
            high: high.into_iter().map(Some).collect(),
        });
    }
    Ok(s)
}

/// The spaces of a state dict import: `--spaces` JSON, or the shape / dtype / action flags.
fn spaces_from_flags(
    spaces: Option<&std::path::Path>,
    obs_shape: Option<Vec<usize>>,
    obs_dtype: ObsDTypeArg,
    actions: Option<usize>,
    low: Option<Vec<f32>>,
    high: Option<Vec<f32>>,
) -> Result<(
    policyport_format::ObservationSpace,
    policyport_format::ActionSpace,
)> {
    use policyport_format::{ActionSpace, ObsDType, ObservationSpace};
    if let Some(p) = spaces {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Spaces {
            observation: ObservationSpace,
            action: ActionSpace,
        }
        let s: Spaces = serde_json::from_slice(&read(p)?)
            .with_context(|| format!("parsing {}", p.display()))?;
        return Ok((s.observation, s.action));
    }
    let shape = obs_shape.context(
        "give the spaces: --spaces spaces.json, or --obs-shape (and --actions or --low/--high)",
    )?;
    let dtype = match obs_dtype {
        ObsDTypeArg::F32 => ObsDType::F32,
        ObsDTypeArg::U8 => ObsDType::U8,
    };
    let action = match (actions, low, high) {
        (Some(n), None, None) => ActionSpace::Discrete { n },
        (None, Some(low), Some(high)) => {
            anyhow::ensure!(
                low.len() == high.len(),
                "--low and --high need the same number of values"
            );
            ActionSpace::Box {
                shape: vec![low.len()],
                low: low.into_iter().map(Some).collect(),
                high: high.into_iter().map(Some).collect(),
            }
        }
        _ => bail!("give the actions: --actions N (Discrete), or --low and --high (Box)"),
    };
    Ok((ObservationSpace::Box { shape, dtype }, action))
}
