//! `policyport bench` and `bench-torch`: act() timed at given batch sizes, one JSON line per batch (the
//! benchmarks that print ratios against peers measured in the same run call these; see tests/bench/).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use policyport::{ActMode, Backend, CompiledPolicy, Observations, Request};

use super::{load_policy, read};

/// `policyport bench`'s arguments.
#[derive(Args)]
pub struct BenchArgs {
    pub artifact: PathBuf,
    #[arg(long, default_value = "1,64,1024")]
    pub batches: String,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
    /// Minimum seconds per batch size.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Run inside the wasm sandbox with this plugin (policyport_plugin.wasm) instead of natively.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// With --plugin: lend the sandbox this host's native dense kernel (policyport_wasmtime::WasmLimits::lend_dense).
    #[arg(long)]
    pub lend_dense: bool,
    /// Intra-op threads of the session (cpu backend; 0: one per core). 1 is the default everywhere.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// With --threads: split each batch only while that measures faster than one thread (measured, the
    /// default everywhere), or every batch big enough (always). See policyport::ThreadSplit.
    #[arg(long, value_enum, default_value = "measured")]
    pub split: SplitArg,
    /// The cpu backend's dense-layer precision: f32 (default) or bf16 (needs AVX512-BF16; see
    /// policyport::Precision; f16 is a typed error there).
    #[arg(long, default_value = "f32")]
    pub precision: policyport::Precision,
}

/// `policyport bench-torch`'s arguments.
#[derive(Args)]
pub struct BenchTorchArgs {
    pub artifact: PathBuf,
    #[arg(long, default_value = "1,64,1024")]
    pub batches: String,
    /// cpu, cuda, cuda:N
    #[arg(long, default_value = "cpu")]
    pub device: policyport_torch::TorchDevice,
    /// f32, f16, bf16
    #[arg(long, default_value = "f32")]
    pub precision: policyport_torch::Precision,
    #[arg(long, value_enum, default_value = "eager")]
    pub launch: LaunchArg,
    /// Threads libtorch may use on CPU.
    #[arg(long, default_value_t = 1)]
    pub threads: i32,
    /// Where eager mode samples. CUDA graphs always sample on the device.
    #[arg(long, value_enum, default_value = "host")]
    pub sampling: SamplingArg,
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
}

/// `bench --split`: policyport::ThreadSplit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SplitArg {
    Measured,
    Always,
}

/// `bench-torch --launch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchArg {
    /// One libtorch call per op.
    Eager,
    /// CUDA graphs, one per batch bucket.
    Graphs,
}

/// `bench-torch --sampling`: where eager mode samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SamplingArg {
    /// The guest's sampler, on the host.
    Host,
    /// Philox as libtorch ops, on the device.
    Device,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let BenchArgs {
        artifact,
        batches,
        backend,
        seconds,
        plugin,
        lend_dense,
        threads,
        split,
        precision,
    } = args;
    if lend_dense && plugin.is_none() {
        bail!("--lend-dense lends the kernel to the wasm sandbox: give --plugin too");
    }
    if precision != policyport::Precision::F32 && (backend != Backend::Cpu || plugin.is_some()) {
        bail!("--precision is the native cpu backend's (--backend cpu, no --plugin)");
    }
    let bytes = read(&artifact)?;
    let policy = match (&plugin, precision) {
        (Some(p), _) => {
            let rt = policyport_wasmtime::WasmRuntime::new(&read(p)?)?;
            let limits = policyport_wasmtime::WasmLimits {
                lend_dense,
                ..Default::default()
            };
            policyport_wasmtime::load(&rt, &bytes, limits)?
        }
        (None, policyport::Precision::F32) => load_policy(&bytes, backend)?,
        (None, _) => CompiledPolicy::load_cpu(&bytes, policyport::CpuOptions { precision })?,
    };
    let mut session = policy.session();
    session.set_threads(threads)?;
    session.set_thread_split(match split {
        SplitArg::Measured => policyport::ThreadSplit::Measured,
        SplitArg::Always => policyport::ThreadSplit::Always,
    });
    let threads = session.threads();
    let raw_len = policy.info().obs_len;
    let runtime = match &plugin {
        Some(_) if lend_dense => "policyport-wasm-lent".to_string(),
        Some(_) => "policyport-wasm".to_string(),
        None if precision != policyport::Precision::F32 => {
            format!("policyport-{}-{}", backend.name(), precision.name())
        }
        None => format!("policyport-{}", backend.name()),
    };
    for b in batches.split(',') {
        let batch: usize = b.trim().parse().context("--batches")?;
        let obs = BenchObs::new(&policy.manifest().observation, batch);
        let mut step = 0u64;
        let median = median_us(seconds, |_| {
            let mode = ActMode::Sample { seed: 1, step };
            step += 1;
            session.act(&Request::new(obs.get(), batch, mode))?;
            Ok(())
        })?;
        // The native cpu backend's instruction set (the plugin's kernels are its own: SIMD128).
        let kernels = (plugin.is_none() && backend == Backend::Cpu).then(policyport::cpu_kernels);
        println!(
            "{}",
            serde_json::json!({"runtime": runtime, "batch": batch, "obs_len": raw_len, "us_per_act": median, "threads": threads, "split": format!("{split:?}").to_lowercase(),
                "dispatches_per_act": policy.info().dispatches_per_act, "kernels": kernels})
        );
    }
    Ok(())
}

pub fn bench_torch(args: BenchTorchArgs) -> Result<()> {
    torch(&read(&args.artifact)?, &args)
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

fn torch(bytes: &[u8], args: &BenchTorchArgs) -> Result<()> {
    use policyport_torch::{Launch, Sampling, TorchOptions};
    let BenchTorchArgs {
        batches,
        device,
        precision,
        launch,
        threads,
        sampling,
        seconds,
        ..
    } = args;
    let (device, precision, launch, threads, sampling, seconds) =
        (*device, *precision, *launch, *threads, *sampling, *seconds);
    let sampling = match sampling {
        SamplingArg::Host => Sampling::Host,
        SamplingArg::Device => Sampling::Device,
    };
    let launch = match launch {
        LaunchArg::Eager => Launch::Eager,
        LaunchArg::Graphs => Launch::CudaGraphs,
    };
    let sizes: Vec<usize> = batches
        .split(',')
        .map(|b| b.trim().parse().context("--batches"))
        .collect::<Result<_>>()?;
    let max = sizes.iter().copied().max().unwrap_or(1);
    policyport_torch::set_cpu_threads(threads);
    let t0 = Instant::now();
    let opts = TorchOptions {
        device,
        precision,
        launch,
        sampling,
        max_batch: max,
        buckets: (launch == Launch::CudaGraphs).then(|| sizes.clone()),
        num_envs: max,
    };
    let mut session = policyport_torch::load(bytes, &opts)?.session();
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let info = policyport_torch::info(&session, &opts);
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
        let mut step = 0u64;
        let us = median_us(seconds, |_| {
            step += 1;
            session.act(&Request::new(
                obs.get(),
                batch,
                ActMode::Sample { seed: 1, step },
            ))?;
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
