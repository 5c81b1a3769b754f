//! onnxruntime timed natively: the peer of `policyport bench` in tests/bench/bench.py (see README.md).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, Tensor, TensorElementType};

#[derive(Parser)]
struct Args {
    /// onnxruntime's shared library (the pip wheel's onnxruntime/capi/libonnxruntime.so.*).
    #[arg(long, required_unless_present = "fma_peak")]
    lib: Option<String>,
    #[arg(long, required_unless_present = "fma_peak")]
    model: Option<String>,
    /// Instead: measure one core's f32 FMA peak (GFLOP/s) with the widest vector FMA this CPU has, the floor the
    /// benchmark's "fraction of peak" is set against.
    #[arg(long)]
    fma_peak: bool,
    #[arg(long, default_value = "1,64,1024")]
    batches: String,
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Feed outputs 2, 3, ... back as inputs 1, 2, ... on the next call (recurrent state).
    #[arg(long)]
    recurrent: bool,
    /// onnxruntime's intra-op threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// A deterministic input value stream (no rand dependency): a 64-bit LCG's top bits.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly standard normal (sum of 12 uniforms).
    fn normal(&mut self) -> f32 {
        ((0..12).map(|_| self.next()).sum::<f64>() - 6.0) as f32
    }
}

fn make_input(
    ty: TensorElementType,
    shape: &[i64],
    batch: usize,
    rng: &mut Lcg,
) -> Result<DynValue> {
    let shape: Vec<i64> = shape
        .iter()
        .map(|&d| if d < 0 { batch as i64 } else { d })
        .collect();
    let n: usize = shape.iter().map(|&d| d as usize).product();
    Ok(match ty {
        TensorElementType::Float32 => {
            Tensor::from_array((shape, (0..n).map(|_| rng.normal()).collect::<Vec<f32>>()))?
                .into_dyn()
        }
        TensorElementType::Uint8 => Tensor::from_array((
            shape,
            (0..n)
                .map(|_| (rng.next() * 256.0) as u8)
                .collect::<Vec<u8>>(),
        ))?
        .into_dyn(),
        other => bail!("input type {other:?}: only float32 and uint8 inputs are generated"),
    })
}

/// One core's f32 FMA throughput: independent accumulator chains (more than FMA latency × issue width), no memory
/// traffic. `None` without FMA.
fn fma_peak_gflops(seconds: f64) -> Option<(f64, &'static str)> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        /// 12 zmm chains (4-cycle latency x 2 ports = 8 needed). Not more: with 24 (an earlier version) LLVM
        /// kept only some of the chains in registers and cycled the rest through the stack every iteration, and
        /// the loop under-read the core by a third (154 GFLOP/s on a Zen 5 where onnxruntime's SGEMM ran at 205).
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn zmm(iters: u64) -> f32 {
            let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(1.0); 12];
            for _ in 0..iters {
                for c in acc.iter_mut() {
                    *c = _mm512_fmadd_ps(*c, a, b);
                }
            }
            acc.iter().map(|c| _mm512_reduce_add_ps(*c)).sum()
        }
        /// 12 ymm chains (16 registers).
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn ymm(iters: u64) -> f32 {
            let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); 12];
            for _ in 0..iters {
                for c in acc.iter_mut() {
                    *c = _mm256_fmadd_ps(*c, a, b);
                }
            }
            let mut out = [0.0f32; 8];
            let mut sum = 0.0;
            for c in acc {
                // SAFETY: `out` holds 8 floats.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), c) };
                sum += out.iter().sum::<f32>();
            }
            sum
        }
        let (flop_per_iter, name, run): (f64, &str, fn(u64) -> f32) =
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was detected.
                (12.0 * 16.0 * 2.0, "AVX-512 FMA", |n| unsafe { zmm(n) })
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the features were detected.
                (12.0 * 8.0 * 2.0, "AVX2 FMA", |n| unsafe { ymm(n) })
            } else {
                return None;
            };
        let mut n = 1u64 << 16;
        let mut best = 0.0f64;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds {
            let t0 = Instant::now();
            std::hint::black_box(run(std::hint::black_box(n)));
            let dt = t0.elapsed().as_secs_f64();
            if dt < 0.01 {
                n *= 2;
                continue;
            }
            best = best.max(n as f64 * flop_per_iter / dt / 1e9);
        }
        Some((best, name))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = seconds;
        None
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.fma_peak {
        let peak = fma_peak_gflops(args.seconds.max(0.2));
        println!(
            "{}",
            serde_json::json!({"fma_peak_gflops": peak.map(|p| p.0), "isa": peak.map(|p| p.1)})
        );
        return Ok(());
    }
    let (lib, model) = (
        args.lib.clone().unwrap_or_default(),
        args.model.clone().unwrap_or_default(),
    );
    let env = ort::init_from(&lib)
        .with_context(|| format!("loading onnxruntime from {lib}"))?
        .build()?;
    // The builder's errors carry the builder (not Send): keep their message.
    fn msg<T>(e: ort::Error<T>) -> anyhow::Error {
        anyhow::anyhow!("{e}")
    }
    let mut session = Session::builder(&env)?
        .with_intra_threads(args.threads)
        .map_err(msg)?
        .with_inter_threads(1)
        .map_err(msg)?
        .with_parallel_execution(false)
        .map_err(msg)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(msg)?
        .commit_from_file(&model)
        .map_err(msg)
        .with_context(|| format!("loading {model}"))?;
    let inputs: Vec<(TensorElementType, Vec<i64>)> = session
        .inputs()
        .iter()
        .map(|i| {
            let t = i.dtype();
            Ok((
                t.tensor_type().context("a non-tensor input")?,
                t.tensor_shape().context("a non-tensor input")?.to_vec(),
            ))
        })
        .collect::<Result<_>>()?;
    let output_names: Vec<String> = session
        .outputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    if args.recurrent && output_names.len() < inputs.len() + 1 {
        bail!(
            "--recurrent: {} outputs cannot feed inputs 1..{}",
            output_names.len(),
            inputs.len()
        );
    }
    let mut rng = Lcg(7);
    for b in args.batches.split(',') {
        let batch: usize = b.trim().parse().context("--batches")?;
        let mut values: Vec<DynValue> = inputs
            .iter()
            .map(|(ty, shape)| make_input(*ty, shape, batch, &mut rng))
            .collect::<Result<_>>()?;
        let mut run = |n: u64, values: &mut Vec<DynValue>| -> Result<f64> {
            let t0 = Instant::now();
            for _ in 0..n {
                let feed: Vec<SessionInputValue<'_>> =
                    values.iter().map(SessionInputValue::from).collect();
                let mut out = session.run(feed.as_slice())?;
                if args.recurrent {
                    for (k, name) in output_names
                        .iter()
                        .enumerate()
                        .skip(2)
                        .take(values.len() - 1)
                    {
                        values[k - 1] = out.remove(name).context("a state output")?;
                    }
                }
                std::hint::black_box(&out);
            }
            Ok(t0.elapsed().as_secs_f64())
        };
        run(3, &mut values)?;
        let mut n = 1u64;
        while run(n, &mut values)? < 0.02 {
            n *= 2;
        }
        let blocks = ((args.seconds / run(n, &mut values)?).ceil() as usize).clamp(3, 200);
        let mut per_call: Vec<f64> = (0..blocks)
            .map(|_| run(n, &mut values).map(|s| s / n as f64 * 1e6))
            .collect::<Result<_>>()?;
        per_call.sort_by(f64::total_cmp);
        println!(
            "{}",
            serde_json::json!({"runtime": "onnxruntime-native", "batch": batch, "us_per_run": per_call[per_call.len() / 2],
                "threads": args.threads})
        );
    }
    Ok(())
}
