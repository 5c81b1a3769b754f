//! `policyport demo`, `trace` and `serve-web`: the bundled trained policies run natively, traced for the browser
//! tests, and served to the browser demo.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use policyport::{ActMode, Backend, Request};
use policyport_cli::demo::{observations, run_episodes};
use policyport_cli::envs::{CartPole, Catch, EnvObs, Pendulum};
use policyport_import::{FixtureIo, ImportSpec, StorageDType, compile_onnx};

use super::{load_policy, read, write_atomically};

/// `policyport demo`'s arguments.
#[derive(Args)]
pub struct DemoArgs {
    #[arg(long, default_value_t = 32)]
    pub episodes: u32,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
    /// Where to write the compiled artifacts.
    #[arg(long, default_value = "target/policyport-demo")]
    pub out_dir: PathBuf,
}

/// `policyport trace`'s arguments.
#[derive(Args)]
pub struct TraceArgs {
    pub artifact: PathBuf,
    /// cartpole, pendulum or catch
    #[arg(long)]
    pub env: String,
    #[arg(long, default_value_t = 256)]
    pub envs: usize,
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub env_seed: u64,
    #[arg(long, default_value_t = 7)]
    pub policy_seed: u64,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
    /// Leave the observations out of the trace (a pixel env's frames are large): actions, values and returns only.
    #[arg(long)]
    pub no_obs: bool,
    #[arg(short, long)]
    pub out: PathBuf,
}

/// `policyport serve-web`'s arguments.
#[derive(Args)]
pub struct ServeWebArgs {
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// The web/ directory of a checkout.
    #[arg(long, default_value = "web")]
    pub root: PathBuf,
}

pub fn demo(args: DemoArgs) -> Result<()> {
    let DemoArgs {
        episodes,
        backend,
        out_dir,
    } = args;
    run_demo(episodes, backend, &out_dir)
}

pub fn trace(args: TraceArgs) -> Result<()> {
    let TraceArgs {
        artifact,
        env,
        envs,
        steps,
        env_seed,
        policy_seed,
        backend,
        no_obs,
        out,
    } = args;
    trace_envs(
        &read(&artifact)?,
        env.parse().map_err(anyhow::Error::msg)?,
        envs,
        steps,
        (env_seed, policy_seed),
        (backend, !no_obs),
        &out,
    )
}

pub fn serve_web(args: ServeWebArgs) -> Result<()> {
    let ServeWebArgs { port, bind, root } = args;
    serve(&bind, port, &root)
}

struct Bundled {
    name: &'static str,
    onnx: &'static [u8],
    spec: &'static [u8],
    io: &'static [u8],
}

/// The three trained policies of the demos (CartPole, Pendulum, the Catch pixel game), plus the benchmark MLP
/// (64-256-256, untrained) the browser benchmark compares against onnxruntime-web.
const BENCH_MODEL: Bundled = Bundled {
    name: "mlp64",
    onnx: include_bytes!("../../../../tests/fixtures/mlp64/policy.onnx"),
    spec: include_bytes!("../../../../tests/fixtures/mlp64/import.json"),
    io: include_bytes!("../../../../tests/fixtures/mlp64/io.json"),
};

const BUNDLED: [Bundled; 3] = [
    Bundled {
        name: "cartpole",
        onnx: include_bytes!("../../../../tests/fixtures/cartpole/policy.onnx"),
        spec: include_bytes!("../../../../tests/fixtures/cartpole/import.json"),
        io: include_bytes!("../../../../tests/fixtures/cartpole/io.json"),
    },
    Bundled {
        name: "pendulum",
        onnx: include_bytes!("../../../../tests/fixtures/pendulum/policy.onnx"),
        spec: include_bytes!("../../../../tests/fixtures/pendulum/import.json"),
        io: include_bytes!("../../../../tests/fixtures/pendulum/io.json"),
    },
    Bundled {
        name: "catch",
        onnx: include_bytes!("../../../../tests/fixtures/catch/policy.onnx"),
        spec: include_bytes!("../../../../tests/fixtures/catch/import.json"),
        io: include_bytes!("../../../../tests/fixtures/catch/io.json"),
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
    sb3_zip: include_bytes!("../../../../tests/fixtures/sb3/recurrent_ppo_cnn_frames/model.zip"),
    rollout: include_bytes!(
        "../../../../tests/fixtures/sb3/recurrent_ppo_cnn_frames/sequence.json"
    ),
};

fn compile_bundled(b: &Bundled) -> Result<Vec<u8>> {
    let spec: ImportSpec = serde_json::from_slice(b.spec)?;
    let io: FixtureIo = serde_json::from_slice(b.io)?;
    Ok(compile_onnx(
        b.onnx,
        &spec,
        &format!("tests/fixtures/{}/policy.onnx", b.name),
        Some(&io),
        StorageDType::F32,
    )?)
}

fn trace_envs(
    bytes: &[u8],
    kind: policyport_cli::envs::EnvKind,
    n: usize,
    steps: usize,
    (env_seed, policy_seed): (u64, u64),
    (backend, with_obs): (Backend, bool),
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
        let acts = session.act(&Request::new(
            observations(env.observations()),
            n,
            ActMode::Sample {
                seed: policy_seed,
                step: t as u64,
            },
        ))?;
        if with_obs {
            obs.push(match env.observations() {
                EnvObs::F32(x) => serde_json::to_value(x)?,
                EnvObs::U8(x) => serde_json::to_value(x)?,
            });
        }
        env.step(&acts.discrete, &acts.continuous)
            .map_err(anyhow::Error::msg)?;
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
        "pixels": kind.pixels(),
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

fn serve(bind: &str, port: u16, root: &Path) -> Result<()> {
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
        policyport_import::compile_sb3(
            REPLAY.sb3_zip,
            None,
            REPLAY.source,
            None,
            StorageDType::F32,
        )?,
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

fn run_demo(episodes: u32, backend: Backend, out_dir: &Path) -> Result<()> {
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
            StorageDType::F32,
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
                "catch" => run_episodes::<Catch>(&mut session, n, env_seed, policy_seed, sampled)?,
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
            // Catch: a perfect player scores 38, a random one about -26.
            if b.name == "catch" && stats.mean_return() < 30.0 {
                failures.push(format!("catch mean return {:.1} < 30", stats.mean_return()));
            }
        }
    }
    if !failures.is_empty() {
        bail!("demo failed:\n  {}", failures.join("\n  "));
    }
    println!("demo ok");
    Ok(())
}
