//! The `policyport` command line: compile, inspect, run, verify, demo, trace, serve-web, bench.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use policyport::{ActMode, ActOutputs, Backend, CompiledPolicy, EnvIds, Observations, Request};
use policyport_cli::demo::run_episodes;
use policyport_cli::envs::{CartPole, Pendulum};
use policyport_cli::npy;
use policyport_format::{Limits, read_artifact, validate};
use policyport_import::{
    DistSpec, FixtureIo, ImportSpec, LogStdSpec, Storage, compile_onnx, inspect,
};

#[derive(Parser)]
#[command(
    name = "policyport",
    version,
    about = "Compile trained RL policies into portable artifacts and run them fast"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Import a policy and write a .policy artifact: an ONNX model (with --spec or flags saying what its outputs
    /// mean), or a Stable-Baselines3 archive (`model.save()`'s .zip: nothing else needed).
    Compile {
        model: PathBuf,
        #[arg(short, long)]
        out: PathBuf,
        /// Import spec (JSON): distribution, outputs, spaces, normalisation. Flags below override it.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Output naming conventions: `logits-value` (categorical over "logits", critic "value"),
        /// `gaussian` (diagonal Gaussian over "mean" and "log_std", critic "value"), `squashed` (SAC actor:
        /// tanh-squashed Gaussian over "mean" and "log_std"). Other flags override a preset.
        #[arg(long)]
        preset: Option<String>,
        /// categorical | diag-gaussian | squashed-gaussian
        #[arg(long)]
        dist: Option<String>,
        #[arg(long)]
        logits: Option<String>,
        #[arg(long)]
        mean: Option<String>,
        /// A graph output or initializer holding the log-std.
        #[arg(long)]
        log_std: Option<String>,
        #[arg(long)]
        value: Option<String>,
        /// Continuous action bounds, comma-separated (one per action element).
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        low: Option<Vec<f32>>,
        #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
        high: Option<Vec<f32>>,
        /// Oracle outputs to embed as golden vectors (io.json from the fixture scripts).
        #[arg(long)]
        golden: Option<PathBuf>,
        /// Weight storage: f32, f16, bf16.
        #[arg(long, default_value = "f32")]
        storage: Storage,
        /// For a PyTorch state dict: the agent that wrote it (cleanrl-ppo, cleanrl-ppo-continuous,
        /// cleanrl-atari, cleanrl-atari-lstm, cleanrl-sac).
        #[arg(long)]
        layout: Option<policyport_import::CleanrlLayout>,
        /// For a state dict: the spaces as JSON, `{"observation": {...}, "action": {...}}` (SPEC.md's spaces).
        #[arg(long)]
        spaces: Option<PathBuf>,
        /// For a state dict: the observation shape, comma-separated (instead of --spaces).
        #[arg(long, value_delimiter = ',')]
        obs_shape: Option<Vec<usize>>,
        /// For a state dict: f32 or u8 observations.
        #[arg(long, default_value = "f32")]
        obs_dtype: String,
        /// For a state dict: Discrete(N) actions (or --low/--high for a Box).
        #[arg(long)]
        actions: Option<usize>,
        /// For an SB3 archive: the `VecNormalize.save()` pickle of the env it was trained in (observation
        /// statistics become the policy's normalisation step).
        #[arg(long)]
        vecnormalize: Option<PathBuf>,
    },
    /// Print what an artifact holds.
    Inspect {
        artifact: PathBuf,
        /// Print the manifest as JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Act on observations from a .npy or .json file ([batch, obs...]); prints JSON.
    Run {
        artifact: PathBuf,
        /// `[batch, *observation shape]` (a .npy's shape is checked in full), or JSON rows.
        #[arg(long)]
        obs: PathBuf,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        /// Sample with this seed (default: deterministic actions).
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, default_value_t = 0)]
        step: u64,
        #[arg(long, default_value_t = 0)]
        env_offset: u32,
        /// Action masks, `[batch, n]` flags (n = one per logit / Q value; .npy of bool or numbers, or JSON rows
        /// of 0/1 or true/false): forbidden actions are never chosen.
        #[arg(long)]
        mask: Option<PathBuf>,
        /// A Q-value policy's exploration rate for this call (sampled mode) instead of the artifact's.
        #[arg(long)]
        epsilon: Option<f32>,
    },
    /// Step a policy (recurrent or not) over a rollout of observations `[T, batch, *observation shape]` (.npy),
    /// with per-step episode starts and masks, carrying the recurrent state between steps; prints one JSON line
    /// per step (actions, value, distribution parameters, and with --state the state after the step).
    Rollout {
        artifact: PathBuf,
        /// `[T, batch, *observation shape]` observations (.npy).
        #[arg(long)]
        obs: PathBuf,
        /// `[T, batch]` episode starts (.npy of bool or 0/1): a row's state is zeroed before its step.
        #[arg(long)]
        starts: Option<PathBuf>,
        /// `[T, batch, n]` action masks (.npy of bool or 0/1).
        #[arg(long)]
        mask: Option<PathBuf>,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        /// Sample with this seed (step t draws with step number t); default: deterministic actions.
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, default_value_t = 0)]
        env_offset: u32,
        /// Print every state tensor of the batch's envs after each step.
        #[arg(long)]
        state: bool,
    },
    /// Check the artifact's golden vectors on a backend.
    Verify {
        artifact: PathBuf,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
    },
    /// Compile the bundled trained policies and run them in the Rust environments.
    Demo {
        #[arg(long, default_value_t = 32)]
        episodes: u32,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        /// Where to write the compiled artifacts.
        #[arg(long, default_value = "target/policyport-demo")]
        out_dir: PathBuf,
    },
    /// Step many envs with one batched act() per tick and record every observation and action (JSON): the
    /// native reference the browser tests compare against (same seeds, same env code).
    Trace {
        artifact: PathBuf,
        /// cartpole or pendulum
        #[arg(long)]
        env: String,
        #[arg(long, default_value_t = 256)]
        envs: usize,
        #[arg(long, default_value_t = 100)]
        steps: usize,
        #[arg(long, default_value_t = 1)]
        env_seed: u64,
        #[arg(long, default_value_t = 7)]
        policy_seed: u64,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        #[arg(short, long)]
        out: PathBuf,
    },
    /// Serve the browser demo (web/) with the bundled trained policies compiled in memory: the demo at /, the
    /// benchmark page at /bench.html. Build the wasm bundles first: bash tests/scripts/web-build.sh.
    ServeWeb {
        #[arg(long, default_value_t = 8080)]
        port: u16,
        #[arg(long, default_value = "127.0.0.1")]
        bind: String,
        /// The web/ directory of a checkout.
        #[arg(long, default_value = "web")]
        root: PathBuf,
    },
    /// Time act() at given batch sizes; prints one JSON line per batch.
    Bench {
        artifact: PathBuf,
        #[arg(long, default_value = "1,64,1024")]
        batches: String,
        #[arg(long, default_value = "cpu")]
        backend: Backend,
        /// Minimum seconds per batch size.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Run inside the wasm sandbox with this plugin (policyport_plugin.wasm) instead of natively.
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// With --plugin: lend the sandbox this host's native dense kernel (policyport_wasmtime::WasmLimits::lend_dense).
        #[arg(long)]
        lend_dense: bool,
        /// Intra-op threads of the session (cpu backend; 0: one per core). 1 is the default everywhere.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// The cpu backend's dense-layer precision: f32 (default) or bf16 (needs AVX512-BF16; see
        /// policyport::CpuPrecision).
        #[arg(long, default_value = "f32")]
        precision: policyport::CpuPrecision,
    },
    /// Time act() on the libtorch executor (needs the `tch` feature): one JSON line per batch.
    BenchTorch {
        artifact: PathBuf,
        #[arg(long, default_value = "1,64,1024")]
        batches: String,
        /// cpu, cuda, cuda:N
        #[arg(long, default_value = "cpu")]
        device: policyport_torch::TorchDevice,
        /// f32, f16, bf16
        #[arg(long, default_value = "f32")]
        precision: policyport_torch::Precision,
        /// eager or graphs (CUDA graphs)
        #[arg(long, default_value = "eager")]
        launch: String,
        /// Threads libtorch may use on CPU.
        #[arg(long, default_value_t = 1)]
        threads: i32,
        /// Where eager mode samples: host (the guest's sampler) or device (Philox as libtorch ops). CUDA graphs
        /// always sample on the device.
        #[arg(long, default_value = "host")]
        sampling: String,
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
    },
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

/// Every failure ends the same way: one `Error:` line on stderr (the cause chain joined with ": ", names from
/// the file escaped so they cannot drive the terminal) and exit code 1.
fn main() {
    if let Err(e) = run() {
        eprintln!(
            "Error: {}",
            inspect::terminal_safe(&format!("{e:#}")).replace('\n', " ")
        );
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Compile {
            model,
            out,
            spec,
            preset,
            dist,
            logits,
            mean,
            log_std,
            value,
            low,
            high,
            golden,
            storage,
            layout,
            spaces,
            obs_shape,
            obs_dtype,
            actions,
            vecnormalize,
        } => {
            let io: Option<FixtureIo> = match &golden {
                Some(p) => Some(
                    serde_json::from_slice(&read(p)?)
                        .with_context(|| format!("parsing {}", p.display()))?,
                ),
                None => None,
            };
            if model.is_dir() {
                anyhow::ensure!(
                    policyport_import::rllib::is_rllib_checkpoint(&model),
                    "{} is a directory but not an RLlib checkpoint (no rllib_checkpoint.json, module_state.pkl or \
                     metadata.json + class_and_ctor_args.pkl); give a model file or what algo.save() wrote",
                    model.display()
                );
                anyhow::ensure!(
                    spec.is_none()
                        && preset.is_none()
                        && dist.is_none()
                        && layout.is_none()
                        && vecnormalize.is_none(),
                    "{} is an RLlib checkpoint: it says what its outputs mean; drop --spec/--preset/--dist/--layout/--vecnormalize",
                    model.display()
                );
                let bytes = policyport_import::compile_rllib(
                    &model,
                    &model.display().to_string(),
                    io.as_ref(),
                    storage,
                )?;
                write_atomically(&out, &bytes)?;
                println!(
                    "wrote {} ({} bytes) from an RLlib checkpoint",
                    out.display(),
                    bytes.len()
                );
                return Ok(());
            }
            let model_bytes = read(&model)?;
            // By content: a damaged file is named as what it is, never sent down the ONNX route.
            let kind = policyport_import::detect_model(&model_bytes)
                .with_context(|| format!("reading {}", model.display()))?;
            if kind == policyport_import::ModelKind::Sb3Archive {
                // Everything is in the archive: spaces, architecture, weights.
                anyhow::ensure!(
                    spec.is_none() && preset.is_none() && dist.is_none(),
                    "{} is a Stable-Baselines3 archive: it says what its outputs mean, drop --spec/--preset/--dist",
                    model.display()
                );
                let vn = vecnormalize.as_deref().map(read).transpose()?;
                let bytes = policyport_import::compile_sb3(
                    &model_bytes,
                    vn.as_deref(),
                    &model.display().to_string(),
                    io.as_ref(),
                    storage,
                )?;
                write_atomically(&out, &bytes)?;
                println!(
                    "wrote {} ({} bytes) from a Stable-Baselines3 archive",
                    out.display(),
                    bytes.len()
                );
                return Ok(());
            }
            if kind == policyport_import::ModelKind::StateDict {
                let Some(layout) = layout else {
                    bail!(
                        "{} is a PyTorch state dict (torch.save or safetensors): it holds no architecture. Say which agent wrote \
                         it with --layout cleanrl-ppo|cleanrl-ppo-continuous|cleanrl-atari|cleanrl-atari-lstm|cleanrl-sac and give the \
                         spaces (--spaces spaces.json, or --obs-shape/--obs-dtype with --actions N or --low/--high)",
                        model.display()
                    );
                };
                let (observation, action) = spaces_from_flags(
                    spaces.as_deref(),
                    obs_shape,
                    &obs_dtype,
                    actions,
                    low,
                    high,
                )?;
                let bytes = policyport_import::compile_cleanrl(
                    &model_bytes,
                    layout,
                    observation,
                    action,
                    &model.display().to_string(),
                    io.as_ref(),
                    storage,
                )?;
                write_atomically(&out, &bytes)?;
                println!(
                    "wrote {} ({} bytes) from a CleanRL checkpoint",
                    out.display(),
                    bytes.len()
                );
                return Ok(());
            }
            anyhow::ensure!(
                vecnormalize.is_none(),
                "--vecnormalize goes with a Stable-Baselines3 archive; {} is not one",
                model.display()
            );
            anyhow::ensure!(
                layout.is_none(),
                "--layout is for PyTorch state dicts; {} is not one",
                model.display()
            );
            let (mut dist, mut logits, mut mean, mut log_std, mut value) =
                (dist, logits, mean, log_std, value);
            let name = |n: &str| Some(n.to_string());
            match preset.as_deref() {
                None => {}
                Some("logits-value") => {
                    dist = dist.or(name("categorical"));
                    logits = logits.or(name("logits"));
                    value = value.or(name("value"));
                }
                Some(p @ ("gaussian" | "squashed")) => {
                    dist = dist.or(name(if p == "gaussian" {
                        "diag-gaussian"
                    } else {
                        "squashed-gaussian"
                    }));
                    mean = mean.or(name("mean"));
                    log_std = log_std.or(name("log_std"));
                    if p == "gaussian" {
                        value = value.or(name("value"));
                    }
                }
                Some(other) => {
                    bail!("unknown --preset '{other}' (logits-value, gaussian, squashed)")
                }
            }
            let mut s: Option<ImportSpec> = match &spec {
                Some(p) => Some(
                    serde_json::from_slice(&read(p)?)
                        .with_context(|| format!("parsing {}", p.display()))?,
                ),
                None => None,
            };
            if let Some(d) = dist.as_deref() {
                let need = |o: &Option<String>, flag: &str| {
                    o.clone()
                        .with_context(|| format!("--dist {d} needs --{flag}"))
                };
                let ls =
                    || -> Result<LogStdSpec> { Ok(LogStdSpec::Output(need(&log_std, "log-std")?)) };
                let ds = match d {
                    "categorical" => DistSpec::Categorical {
                        logits: need(&logits, "logits")?,
                    },
                    "diag-gaussian" => DistSpec::DiagGaussian {
                        mean: need(&mean, "mean")?,
                        log_std: ls()?,
                        clip: false,
                        log_std_range: None,
                    },
                    "squashed-gaussian" => DistSpec::SquashedGaussian {
                        mean: need(&mean, "mean")?,
                        log_std: ls()?,
                        log_std_range: None,
                        deterministic: Default::default(),
                    },
                    other => bail!(
                        "unknown --dist '{other}' (categorical, diag-gaussian, squashed-gaussian)"
                    ),
                };
                let mut base = s.take().unwrap_or(ImportSpec::new(ds.clone()));
                base.distribution = ds;
                s = Some(base);
            }
            let mut s = s.context(
                "say what the outputs mean: --spec import.json, or --dist with --logits/--mean",
            )?;
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
            let bytes = compile_onnx(
                &model_bytes,
                &s,
                &model.display().to_string(),
                io.as_ref(),
                storage,
            )?;
            write_atomically(&out, &bytes)?;
            println!("wrote {} ({} bytes)", out.display(), bytes.len());
        }
        Cmd::Inspect { artifact, json } => {
            let bytes = read(&artifact)?;
            let art = read_artifact(&bytes)?;
            let plan = validate(&art, &Limits::default())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&art.manifest)?);
            } else {
                print!(
                    "{}",
                    inspect::terminal_safe(&inspect::summary(&art, &plan, bytes.len()))
                );
            }
        }
        Cmd::Run {
            artifact,
            obs,
            backend,
            seed,
            step,
            env_offset,
            mask,
            epsilon,
        } => {
            let policy = load_policy(&read(&artifact)?, backend)?;
            let mut session = policy.session();
            let raw = read(&obs)?;
            let (shape, data) = if obs.extension().is_some_and(|e| e == "npy") {
                let (shape, data) = npy::read_npy(&raw)?;
                // The header's shape, in full: the same count of numbers in another layout is refused, but
                // for a channels-first image policy (SB3's CnnPolicy) the env's channels-last frames are
                // transposed, as SB3's predict does.
                let (batch, layout) =
                    policyport::layout_of_shape(&policy.manifest().observation, &shape)
                        .map_err(policyport::PolicyError::from)?;
                (vec![batch], layout.into_policy_layout(data, batch))
            } else {
                let v: Vec<Vec<f32>> =
                    serde_json::from_slice(&raw).context("obs JSON must be [[..], [..]]")?;
                // Every row one env's observation: ragged rows ([[1,2,3],[4]]) were concatenated and re-cut
                // into rows of the policy's width, silently.
                let want = policy.info().obs_len;
                if let Some((i, r)) = v.iter().enumerate().find(|(_, r)| r.len() != want) {
                    bail!(
                        "obs JSON row {i} has {} numbers; this policy takes {want} per env",
                        r.len()
                    );
                }
                (vec![v.len()], v.concat())
            };
            let batch = shape.first().copied().unwrap_or(1).max(1);
            let mode = seed.map_or(ActMode::Deterministic, |seed| ActMode::Sample {
                seed,
                step,
            });
            let flags = mask
                .map(|m| read_mask(&m, batch, policy.head().mask_len()))
                .transpose()?;
            let mut req =
                Request::new(Observations::F32(&data), batch, mode).envs(EnvIds::Range(env_offset));
            if let Some(f) = &flags {
                req = req.action_mask(f);
            }
            if let Some(e) = epsilon {
                req = req.epsilon(e);
            }
            let out = session.act(&req)?;
            let actions = if out.discrete.is_empty() {
                serde_json::json!(out.continuous)
            } else {
                serde_json::json!(out.discrete)
            };
            println!(
                "{}",
                serde_json::json!({"batch": batch, "actions": actions, "value": out.value, "dist_params": out.dist_params})
            );
        }
        Cmd::Rollout {
            artifact,
            obs,
            starts,
            mask,
            backend,
            seed,
            env_offset,
            state,
        } => rollout(
            &load_policy(&read(&artifact)?, backend)?,
            &obs,
            starts.as_deref(),
            mask.as_deref(),
            seed,
            env_offset,
            state,
        )?,
        Cmd::Verify { artifact, backend } => {
            let policy = load_policy(&read(&artifact)?, backend)?;
            let reports = policy.verify()?;
            let mut ok = true;
            for r in &reports {
                let vals: Vec<String> = r
                    .values
                    .iter()
                    .map(|(n, e)| format!("{n}: {e:.2e}"))
                    .collect();
                println!(
                    "{:<4} {:<28} rel err [{}] (tol {:.0e}); sampled mismatches {}, deterministic mismatches {}{}",
                    if r.passed { "ok" } else { "FAIL" },
                    r.name,
                    vals.join(", "),
                    r.tolerance,
                    r.sampled_mismatches,
                    r.deterministic_mismatches,
                    if r.sampled_action_err > 0.0 {
                        format!(
                            ", action err {:.2e}",
                            r.sampled_action_err.max(r.deterministic_action_err)
                        )
                    } else {
                        String::new()
                    }
                );
                ok &= r.passed;
            }
            if reports.is_empty() {
                bail!("artifact has no golden vectors");
            }
            if !ok {
                bail!("golden vectors failed on {}", backend.name());
            }
        }
        Cmd::Demo {
            episodes,
            backend,
            out_dir,
        } => demo(episodes, backend, &out_dir)?,
        Cmd::Trace {
            artifact,
            env,
            envs,
            steps,
            env_seed,
            policy_seed,
            backend,
            out,
        } => trace(
            &read(&artifact)?,
            env.parse().map_err(anyhow::Error::msg)?,
            envs,
            steps,
            (env_seed, policy_seed),
            backend,
            &out,
        )?,
        Cmd::ServeWeb { port, bind, root } => serve_web(&bind, port, &root)?,
        Cmd::BenchTorch {
            artifact,
            batches,
            device,
            precision,
            launch,
            threads,
            sampling,
            seconds,
        } => bench_torch(
            &read(&artifact)?,
            &batches,
            device,
            precision,
            &launch,
            threads,
            &sampling,
            seconds,
        )?,
        Cmd::Bench {
            artifact,
            batches,
            backend,
            seconds,
            plugin,
            lend_dense,
            threads,
            precision,
        } => {
            if lend_dense && plugin.is_none() {
                bail!("--lend-dense lends the kernel to the wasm sandbox: give --plugin too");
            }
            if precision != policyport::CpuPrecision::F32
                && (backend != Backend::Cpu || plugin.is_some())
            {
                bail!("--precision is the native cpu backend's (--backend cpu, no --plugin)");
            }
            let bytes = read(&artifact)?;
            let policy = match precision {
                policyport::CpuPrecision::F32 => load_policy(&bytes, backend)?,
                _ => CompiledPolicy::load_cpu(&bytes, policyport::CpuOptions { precision })?,
            };
            let mut session = policy.session();
            session.set_threads(threads)?;
            let threads = session.threads();
            let raw_len = policy.info().obs_len;
            let mut sandboxed = match &plugin {
                Some(p) => {
                    let rt = policyport_wasmtime::WasmRuntime::new(&read(p)?)?;
                    let limits = policyport_wasmtime::WasmLimits {
                        lend_dense,
                        ..Default::default()
                    };
                    Some(policyport_wasmtime::WasmPolicy::load(&rt, &bytes, limits)?)
                }
                None => None,
            };
            let runtime = match &plugin {
                Some(_) if lend_dense => "policyport-wasm-lent".to_string(),
                Some(_) => "policyport-wasm".to_string(),
                None if precision != policyport::CpuPrecision::F32 => {
                    format!("policyport-{}-{}", backend.name(), precision.name())
                }
                None => format!("policyport-{}", backend.name()),
            };
            for b in batches.split(',') {
                let batch: usize = b.trim().parse().context("--batches")?;
                let obs = BenchObs::new(&policy.manifest().observation, batch);
                let mut out = ActOutputs::default();
                let mut step = 0u64;
                let mut run = |n: u64, session: &mut policyport::Session| -> Result<f64> {
                    let t0 = Instant::now();
                    for _ in 0..n {
                        let mode = ActMode::Sample { seed: 1, step };
                        match sandboxed.as_mut() {
                            Some(w) => w.act(&Request::new(obs.get(), batch, mode), &mut out)?,
                            None => {
                                session.act(&Request::new(obs.get(), batch, mode))?;
                            }
                        }
                        step += 1;
                    }
                    Ok(t0.elapsed().as_secs_f64())
                };
                run(3, &mut session)?;
                // Calibrate, then time repeated blocks and keep the median per-call time.
                let mut n = 1u64;
                while run(n, &mut session)? < 0.05 {
                    n *= 2;
                }
                let blocks = ((seconds / (run(n, &mut session)?)).ceil() as usize).clamp(3, 50);
                let mut per_call: Vec<f64> = (0..blocks)
                    .map(|_| run(n, &mut session).map(|s| s / n as f64 * 1e6))
                    .collect::<Result<_>>()?;
                per_call.sort_by(|a, b| a.total_cmp(b));
                let median = per_call[per_call.len() / 2];
                // The native cpu backend's instruction set (the plugin's kernels are its own: SIMD128).
                let kernels =
                    (plugin.is_none() && backend == Backend::Cpu).then(policyport::cpu_kernels);
                println!(
                    "{}",
                    serde_json::json!({"runtime": runtime, "batch": batch, "obs_len": raw_len, "us_per_act": median, "threads": threads,
                        "dispatches_per_act": policy.info().dispatches_per_act, "kernels": kernels})
                );
            }
        }
    }
    Ok(())
}

/// A benchmark's random observations, in the element type users pass: a uint8 space (Atari frames) as bytes,
/// as SB3 and RLlib hand them over and as onnxruntime's bench feeds its uint8 input. Fed as f32 (before
/// 2026-12-03), NatureCNN's observation alone was 4x the bytes to check and copy: 7.2 MB per act at batch 64.
struct BenchObs {
    f32: Vec<f32>,
    u8: Option<Vec<u8>>,
}

impl BenchObs {
    fn new(space: &policyport::format::ObservationSpace, batch: usize) -> Self {
        let f32 = policyport_import::random_obs(space, batch, 1);
        let u8 = (space.raw_dtype() == policyport::format::ObsDType::U8)
            .then(|| f32.iter().map(|v| *v as u8).collect());
        BenchObs { f32, u8 }
    }

    fn get(&self) -> Observations<'_> {
        match &self.u8 {
            Some(b) => Observations::U8(b),
            None => Observations::F32(&self.f32),
        }
    }
}

/// Median µs per call of `f` (calibrated blocks of back-to-back calls for about `seconds`).
fn median_us(seconds: f64, mut f: impl FnMut(u64) -> Result<()>) -> Result<f64> {
    let mut run = |n: u64| -> Result<f64> {
        let t0 = Instant::now();
        for _ in 0..n {
            f(n)?;
        }
        Ok(t0.elapsed().as_secs_f64())
    };
    run(3)?;
    let mut n = 1u64;
    while run(n)? < 0.05 {
        n *= 2;
    }
    let blocks = ((seconds / run(n)?).ceil() as usize).clamp(3, 50);
    let mut per_call: Vec<f64> = (0..blocks)
        .map(|_| run(n).map(|s| s / n as f64 * 1e6))
        .collect::<Result<_>>()?;
    per_call.sort_by(|a, b| a.total_cmp(b));
    Ok(per_call[per_call.len() / 2])
}

fn bench_torch(
    bytes: &[u8],
    batches: &str,
    device: policyport_torch::TorchDevice,
    precision: policyport_torch::Precision,
    launch: &str,
    threads: i32,
    sampling: &str,
    seconds: f64,
) -> Result<()> {
    use policyport_torch::{Launch, Sampling, TorchOptions, TorchPolicy};
    let sampling = match sampling {
        "host" => Sampling::Host,
        "device" => Sampling::Device,
        other => bail!("--sampling {other}: host or device"),
    };
    let launch = match launch {
        "eager" => Launch::Eager,
        "graphs" => Launch::CudaGraphs,
        other => bail!("--launch {other}: eager or graphs"),
    };
    let sizes: Vec<usize> = batches
        .split(',')
        .map(|b| b.trim().parse().context("--batches"))
        .collect::<Result<_>>()?;
    let max = sizes.iter().copied().max().unwrap_or(1);
    policyport_torch::set_cpu_threads(threads);
    let t0 = Instant::now();
    let mut policy = TorchPolicy::load(
        bytes,
        &TorchOptions {
            device,
            precision,
            launch,
            sampling,
            max_batch: max,
            buckets: (launch == Launch::CudaGraphs).then(|| sizes.clone()),
            num_envs: max,
        },
    )?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let info = policy.info();
    let runtime = format!(
        "policyport-tch-{}-{}{}",
        if launch == Launch::Eager {
            "eager"
        } else {
            "graphs"
        },
        precision.name(),
        if launch == Launch::Eager && sampling == Sampling::Device {
            "-devsample"
        } else {
            ""
        }
    );
    let space = policy_observation(bytes)?;
    for batch in sizes {
        let obs = BenchObs::new(&space, batch);
        let mut out = ActOutputs::default();
        let mut step = 0u64;
        let us = median_us(seconds, |_| {
            step += 1;
            policy.act(
                &Request::new(obs.get(), batch, ActMode::Sample { seed: 1, step }),
                &mut out,
            )?;
            Ok(())
        })?;
        println!(
            "{}",
            serde_json::json!({"runtime": runtime, "device": info.device, "batch": batch, "obs_len": info.obs_len,
                "us_per_act": us, "load_ms": load_ms})
        );
    }
    Ok(())
}

fn policy_observation(bytes: &[u8]) -> Result<policyport::format::ObservationSpace> {
    Ok(policyport::format::read_artifact(bytes)?
        .manifest
        .observation)
}

struct Bundled {
    name: &'static str,
    onnx: &'static [u8],
    spec: &'static [u8],
    io: &'static [u8],
}

/// The two trained policies of the demos, plus the benchmark MLP (64-256-256, untrained) the browser benchmark
/// compares against onnxruntime-web.
const BENCH_MODEL: Bundled = Bundled {
    name: "mlp64",
    onnx: include_bytes!("../../../tests/fixtures/mlp64/policy.onnx"),
    spec: include_bytes!("../../../tests/fixtures/mlp64/import.json"),
    io: include_bytes!("../../../tests/fixtures/mlp64/io.json"),
};

const BUNDLED: [Bundled; 2] = [
    Bundled {
        name: "cartpole",
        onnx: include_bytes!("../../../tests/fixtures/cartpole/policy.onnx"),
        spec: include_bytes!("../../../tests/fixtures/cartpole/import.json"),
        io: include_bytes!("../../../tests/fixtures/cartpole/io.json"),
    },
    Bundled {
        name: "pendulum",
        onnx: include_bytes!("../../../tests/fixtures/pendulum/policy.onnx"),
        spec: include_bytes!("../../../tests/fixtures/pendulum/import.json"),
        io: include_bytes!("../../../tests/fixtures/pendulum/io.json"),
    },
];

/// A policy the browser demo replays a trainer's rollout with (no environment of its own in the page).
struct Replay {
    name: &'static str,
    source: &'static str,
    sb3_zip: &'static [u8],
    rollout: &'static [u8],
}

/// sb3-contrib RecurrentPPO `CnnLstmPolicy` on uint8 frames (NatureCNN, then an LSTM with per-env state): the
/// demo's pixel and recurrent policy. `sequence.json` is the trainer's rollout over two envs with episode
/// boundaries on 40x40 RGB frames (random, as the fixture env draws them), recorded by
/// tests/fixtures/generate_sb3.py.
const REPLAY: Replay = Replay {
    name: "sb3_cnn_lstm",
    source: "tests/fixtures/sb3/recurrent_ppo_cnn_frames/model.zip",
    sb3_zip: include_bytes!("../../../tests/fixtures/sb3/recurrent_ppo_cnn_frames/model.zip"),
    rollout: include_bytes!("../../../tests/fixtures/sb3/recurrent_ppo_cnn_frames/sequence.json"),
};

/// The spaces of a state dict import: `--spaces` JSON, or the shape / dtype / action flags.
fn spaces_from_flags(
    spaces: Option<&std::path::Path>,
    obs_shape: Option<Vec<usize>>,
    obs_dtype: &str,
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
        "f32" => ObsDType::F32,
        "u8" => ObsDType::U8,
        other => bail!("--obs-dtype {other}: f32 or u8"),
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

/// Write to a fresh temporary file next to `out` (`create_new`: never an existing file, never through a
/// symlink), sync it, and rename it over `out`: a crash never leaves a partial file under `out`'s name, and a
/// failed write leaves no temporary file behind.
fn write_atomically(out: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{nanos}",
        out.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, out)
                .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn compile_bundled(b: &Bundled) -> Result<Vec<u8>> {
    let spec: ImportSpec = serde_json::from_slice(b.spec)?;
    let io: FixtureIo = serde_json::from_slice(b.io)?;
    Ok(compile_onnx(
        b.onnx,
        &spec,
        &format!("tests/fixtures/{}/policy.onnx", b.name),
        Some(&io),
        Storage::F32,
    )?)
}

fn trace(
    bytes: &[u8],
    kind: policyport_cli::envs::EnvKind,
    n: usize,
    steps: usize,
    (env_seed, policy_seed): (u64, u64),
    backend: Backend,
    out: &Path,
) -> Result<()> {
    use policyport_cli::envs::VecEnv;
    let policy = load_policy(bytes, backend)?;
    let mut session = policy.session();
    let info = policy.info();
    if info.obs_len != kind.obs_len() {
        bail!(
            "{:?} observations have {} numbers, this policy takes {}",
            kind,
            kind.obs_len(),
            info.obs_len
        );
    }
    let mut env = VecEnv::new(kind, n, env_seed);
    let (mut obs, mut actions, mut values) = (vec![], vec![], vec![]);
    for t in 0..steps {
        let o = env.observations().to_vec();
        let acts = session.act(&Request::new(
            Observations::F32(&o),
            n,
            ActMode::Sample {
                seed: policy_seed,
                step: t as u64,
            },
        ))?;
        env.step(&acts.discrete, &acts.continuous)
            .map_err(anyhow::Error::msg)?;
        obs.push(o);
        actions.push(if kind.discrete() {
            serde_json::to_value(&acts.discrete)?
        } else {
            serde_json::to_value(&acts.continuous)?
        });
        values.push(acts.value.clone());
    }
    let doc = serde_json::json!({
        "env": format!("{kind:?}").to_lowercase(),
        "envs": n,
        "steps": steps,
        "env_seed": env_seed,
        "policy_seed": policy_seed,
        "backend": backend.name(),
        "discrete": kind.discrete(),
        "obs": obs,
        "actions": actions,
        "value": values,
        "finished_returns": env.finished_returns(),
    });
    write_atomically(out, &serde_json::to_vec(&doc)?)?;
    println!(
        "trace: {n} {kind:?} envs x {steps} steps on {} -> {} ({} episodes finished)",
        backend.name(),
        out.display(),
        env.finished_returns().len()
    );
    Ok(())
}

fn serve_web(bind: &str, port: u16, root: &Path) -> Result<()> {
    for bundle in ["cpu", "webgpu"] {
        if !root
            .join(format!("pkg/{bundle}/policyport_web.js"))
            .exists()
        {
            eprintln!(
                "note: {}/pkg/{bundle} is missing: build the bundles with `bash tests/scripts/web-build.sh`",
                root.display()
            );
        }
    }
    if !root.join("index.html").exists() {
        bail!(
            "{} has no index.html: pass --root <checkout>/web",
            root.display()
        );
    }
    let mut memory = std::collections::BTreeMap::new();
    for b in BUNDLED.iter().chain([&BENCH_MODEL]) {
        memory.insert(format!("/policies/{}.policy", b.name), compile_bundled(b)?);
        memory.insert(format!("/models/{}.onnx", b.name), b.onnx.to_vec());
    }
    // The demo's pixel + recurrent policy: the SB3 archive compiled as `policyport compile model.zip` would,
    // and the trainer's own rollout (frames, episode starts, actions, values, logits) that the page replays.
    memory.insert(
        format!("/policies/{}.policy", REPLAY.name),
        policyport_import::compile_sb3(REPLAY.sb3_zip, None, REPLAY.source, None, Storage::F32)?,
    );
    memory.insert(
        format!("/replays/{}.json", REPLAY.name),
        REPLAY.rollout.to_vec(),
    );
    let shaders: Vec<serde_json::Value> = policyport_shaders::all_sources()
        .into_iter()
        .map(|(name, source)| serde_json::json!({ "name": name, "source": source }))
        .collect();
    memory.insert("/shaders.json".into(), serde_json::to_vec(&shaders)?);
    let listener = std::net::TcpListener::bind((bind, port))
        .with_context(|| format!("binding {bind}:{port}"))?;
    let addr = listener.local_addr()?;
    println!(
        "serving {} on http://{addr}/ (demo) and http://{addr}/bench.html (benchmark); Ctrl-C stops",
        root.display()
    );
    policyport_cli::serve::serve(
        listener,
        policyport_cli::serve::Site {
            root: root.to_path_buf(),
            memory,
        },
    )?;
    Ok(())
}

/// Load on any backend: the built-in ones through the runtime, `torch` through the libtorch crate (its default
/// options: CPU, f32, eager; `bench-torch` has the others). A backend this build lacks is a typed error.
/// Action masks from a .npy (`[batch, n]`, bool or numbers: non-zero allows) or JSON rows (0/1 or booleans),
/// as `batch x n` flags; the shape is checked here, what the flags allow by the runtime.
fn read_mask(path: &Path, batch: usize, per_row: usize) -> Result<Vec<bool>> {
    let raw = read(path)?;
    if path.extension().is_some_and(|e| e == "npy") {
        let (shape, data) = npy::read_npy(&raw)?;
        if shape != [batch, per_row] {
            bail!(
                "mask of shape {shape:?}; this call needs [{batch}, {per_row}] (batch, one flag per action)"
            );
        }
        return Ok(data.iter().map(|v| *v != 0.0).collect());
    }
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_slice(&raw)
        .context("mask JSON must be [[..], [..]] of 0/1 or booleans")?;
    if rows.len() != batch || rows.iter().any(|r| r.len() != per_row) {
        bail!("mask JSON must have {batch} rows of {per_row} flags");
    }
    rows.iter()
        .flatten()
        .map(|v| match v {
            serde_json::Value::Bool(b) => Ok(*b),
            serde_json::Value::Number(n) if n.as_f64() == Some(0.0) => Ok(false),
            serde_json::Value::Number(n) if n.as_f64() == Some(1.0) => Ok(true),
            other => bail!("mask flag {other} is not 0, 1, true or false"),
        })
        .collect()
}

/// `policyport rollout`: one session stepped over `[T, batch, ...]` observations (see [`Cmd::Rollout`]).
fn rollout(
    policy: &std::sync::Arc<CompiledPolicy>,
    obs: &Path,
    starts: Option<&Path>,
    mask: Option<&Path>,
    seed: Option<u64>,
    env_offset: u32,
    print_state: bool,
) -> Result<()> {
    let (shape, data) = npy::read_npy(&read(obs)?)?;
    let Some((&t_len, step_shape)) = shape.split_first() else {
        bail!("rollout observations need a [T, batch, ...] shape, got {shape:?}");
    };
    let (batch, layout) = policyport::layout_of_shape(&policy.manifest().observation, step_shape)
        .map_err(policyport::PolicyError::from)?;
    let data = layout.into_policy_layout(data, t_len * batch);
    let per_step = data.len() / t_len.max(1);
    let flags = |path: Option<&Path>, width: usize, what: &str| -> Result<Option<Vec<bool>>> {
        let Some(p) = path else { return Ok(None) };
        let (s, d) = npy::read_npy(&read(p)?)?;
        let want: Vec<usize> = [t_len, batch]
            .into_iter()
            .chain((width > 0).then_some(width))
            .collect();
        if s != want {
            bail!("{what} of shape {s:?}; this rollout needs {want:?}");
        }
        Ok(Some(d.iter().map(|v| *v != 0.0).collect()))
    };
    let starts = flags(starts, 0, "episode starts")?;
    let per_row = policy.head().mask_len();
    let masks = flags(mask, per_row.max(1), "masks")?;
    let mut session = policy.session();
    let ids: Vec<u32> = (0..batch as u32).map(|r| env_offset + r).collect();
    for t in 0..t_len {
        let mode = seed.map_or(ActMode::Deterministic, |seed| ActMode::Sample {
            seed,
            step: t as u64,
        });
        let mut req = Request::new(
            Observations::F32(&data[t * per_step..(t + 1) * per_step]),
            batch,
            mode,
        )
        .envs(EnvIds::Range(env_offset));
        if let Some(s) = &starts {
            req = req.episode_starts(&s[t * batch..(t + 1) * batch]);
        }
        if let Some(m) = &masks {
            req = req.action_mask(&m[t * batch * per_row..(t + 1) * batch * per_row]);
        }
        let out = session
            .act(&req)
            .with_context(|| format!("rollout step {t}"))?;
        let actions = if out.discrete.is_empty() {
            serde_json::json!(out.continuous)
        } else {
            serde_json::json!(out.discrete)
        };
        let mut line = serde_json::json!({"step": t, "batch": batch, "actions": actions,
            "value": out.value, "dist_params": out.dist_params});
        if print_state && session.num_envs() > 0 {
            line["state"] = serde_json::json!(session.states_of(&ids)?);
        }
        println!("{line}");
    }
    Ok(())
}

fn load_policy(bytes: &[u8], backend: Backend) -> Result<std::sync::Arc<CompiledPolicy>> {
    Ok(match backend {
        Backend::Torch => policyport_torch::load(bytes, &Default::default())?,
        _ => CompiledPolicy::load(bytes, backend)?,
    })
}

fn demo(episodes: u32, backend: Backend, out_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(out_dir)?;
    let mut failures = vec![];
    for b in &BUNDLED {
        let spec: ImportSpec = serde_json::from_slice(b.spec)?;
        let io: FixtureIo = serde_json::from_slice(b.io)?;
        let eval = io
            .eval
            .clone()
            .context("bundled fixture has no eval section")?;
        let t0 = Instant::now();
        let bytes = compile_onnx(
            b.onnx,
            &spec,
            &format!("tests/fixtures/{}/policy.onnx", b.name),
            Some(&io),
            Storage::F32,
        )?;
        let path = out_dir.join(format!("{}.policy", b.name));
        write_atomically(&path, &bytes)?;
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let policy = load_policy(&std::fs::read(&path)?, backend)?;
        let mut session = policy.session();
        let load_ms = t1.elapsed().as_secs_f64() * 1e3;
        let env_seed = eval["env_seed"].as_u64().context("env_seed")?;
        let policy_seed = eval["policy_seed"].as_u64().context("policy_seed")?;
        let torch_sampled: Vec<f64> = serde_json::from_value(eval["sampled_returns"].clone())?;
        let torch_det: Vec<f64> = serde_json::from_value(eval["deterministic_returns"].clone())?;
        let n = episodes.min(torch_sampled.len() as u32);
        println!(
            "== {} ({}): compiled in {compile_ms:.1} ms -> {} ({} bytes), loaded on {} in {load_ms:.1} ms",
            b.name,
            eval["env"].as_str().unwrap_or("?"),
            path.display(),
            bytes.len(),
            backend.name()
        );
        for (sampled, torch) in [(true, &torch_sampled), (false, &torch_det)] {
            let stats = match b.name {
                "cartpole" => {
                    run_episodes::<CartPole>(&mut session, n, env_seed, policy_seed, sampled)?
                }
                _ => run_episodes::<Pendulum>(&mut session, n, env_seed, policy_seed, sampled)?,
            };
            let torch_mean = torch[..n as usize].iter().sum::<f64>() / n as f64;
            let same = stats
                .returns
                .iter()
                .zip(torch.iter())
                .filter(|(a, b)| (*a - *b).abs() <= 1e-6 * b.abs().max(1.0))
                .count();
            let rel = (stats.mean_return() - torch_mean).abs() / torch_mean.abs().max(1.0);
            println!(
                "   {:<13} mean return {:>8.2} over {n} episodes (PyTorch policy: {:>8.2}; {same}/{n} episodes identical)   act() p50 {:.1} us, p99 {:.1} us over {} steps",
                if sampled { "sampled" } else { "deterministic" },
                stats.mean_return(),
                torch_mean,
                stats.latency_percentile(0.5),
                stats.latency_percentile(0.99),
                stats.steps
            );
            // The demo's promise: the same behaviour as the PyTorch policy (episodes replay bit-for-bit up to
            // float rounding in continuous control), and CartPole solved.
            if rel > 0.02 {
                failures.push(format!(
                    "{} {}: mean return {:.2} differs from PyTorch's {:.2}",
                    b.name,
                    if sampled { "sampled" } else { "deterministic" },
                    stats.mean_return(),
                    torch_mean
                ));
            }
            if b.name == "cartpole" && stats.mean_return() < 475.0 {
                failures.push(format!(
                    "cartpole mean return {:.1} < 475",
                    stats.mean_return()
                ));
            }
        }
    }
    if !failures.is_empty() {
        bail!("demo failed:\n  {}", failures.join("\n  "));
    }
    println!("demo ok");
    Ok(())
}
