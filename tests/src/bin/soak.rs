//! Concurrency and soak (issue 15, outside CI): one shared `CompiledPolicy` per backend, 8 threads each with its
//! own `Session`, up to `--acts` act() calls per thread (default 1 000 000) within `--seconds` per backend and
//! model, every answer compared with a single-threaded run, and the process's resident memory sampled: after
//! warm-up it must not grow.
//!
//! Each thread cycles through the same `PERIOD` steps: step `i % PERIOD` of sampling stream (seed 11), with
//! episode starts on every env at the cycle's first step, so a recurrent policy's state restarts and every
//! cycle must reproduce the single-threaded cycle exactly (actions, values, distribution parameters bit for bit).
//!
//! `cargo build --release --workspace --all-targets --features "$PP_FEATURES"` builds it (no extra crate graph);
//! `bash tests/scripts/soak.sh` runs it. Exit code 1 on any mismatch, error or memory growth.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use policyport::{ActMode, CompiledPolicy, EnvIds, Observations, Request};
use policyport_conformance::{backends, compile_fixture, load, load_fixture};

const THREADS: u64 = 8;
const PERIOD: u64 = 32;
const BATCH: usize = 4;

/// Resident set size in bytes (Linux /proc; 0 elsewhere).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// One step's outputs, bit for bit.
type Answer = (Vec<i64>, Vec<u32>, Vec<u32>, Vec<u32>);

fn step(s: &mut policyport::Session, obs: &[f32], i: u64) -> Result<Answer, String> {
    let starts = [i % PERIOD == 0; BATCH];
    let req = Request::new(
        Observations::F32(obs),
        BATCH,
        ActMode::Sample {
            seed: 11,
            step: i % PERIOD,
        },
    )
    .envs(EnvIds::Range(0))
    .episode_starts(&starts);
    let o = s.act(&req).map_err(|e| e.to_string())?;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    Ok((
        o.discrete.clone(),
        bits(&o.continuous),
        bits(&o.value),
        bits(&o.dist_params),
    ))
}

struct Report {
    acts: u64,
    mismatches: u64,
    errors: u64,
    rss_warm: u64,
    rss_end: u64,
    secs: f64,
}

fn soak(policy: &Arc<CompiledPolicy>, acts: u64, budget: Duration) -> Report {
    let obs_len = policy.manifest().observation.raw_len();
    let obs: Arc<Vec<f32>> = Arc::new(
        (0..BATCH * obs_len)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect(),
    );
    let mut single = policy.session();
    let expected: Arc<Vec<Answer>> = Arc::new(
        (0..PERIOD)
            .map(|i| step(&mut single, &obs, i).expect("single-threaded step"))
            .collect(),
    );
    let (done, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (mismatches, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (policy, obs, expected) = (policy.clone(), obs.clone(), expected.clone());
            let (done, stop, mismatches, errors) = (
                done.clone(),
                stop.clone(),
                mismatches.clone(),
                errors.clone(),
            );
            std::thread::spawn(move || {
                let mut s = policy.session();
                for i in 0..acts {
                    // Whole cycles only, so every thread ends at a cycle boundary.
                    if i % PERIOD == 0 && stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match step(&mut s, &obs, i) {
                        Ok(a) if a == expected[(i % PERIOD) as usize] => {}
                        Ok(_) => {
                            mismatches.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Warm-up: the first tenth of the budget (every session's buffers grown); then sample until the end.
    std::thread::sleep(budget / 10);
    let rss_warm = rss();
    while t0.elapsed() < budget && done.load(Ordering::Relaxed) < acts * THREADS {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("soak thread");
    }
    Report {
        acts: done.load(Ordering::Relaxed),
        mismatches: mismatches.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        rss_warm,
        rss_end: rss(),
        secs: t0.elapsed().as_secs_f64(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let acts = arg("--acts", 1_000_000);
    let budget = Duration::from_secs(arg("--seconds", 60));
    // `--backend NAME` (repeatable): only those backends (a longer run on one of them).
    let only: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--backend")
        .map(|w| w[1].as_str())
        .collect();
    let mut failed = false;
    println!(
        "| backend | model | threads x acts done | acts/s | mismatches | errors | RSS after warm-up -> end (MiB) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for model in ["mlp64", "lstm_policy"] {
        let bytes = compile_fixture(&load_fixture(model));
        for backend in backends()
            .into_iter()
            .filter(|b| only.is_empty() || only.contains(&b.name()))
        {
            let policy = match load(&bytes, backend) {
                Ok(p) => p,
                Err(e) => {
                    println!("| {backend} | {model} | load failed: {e} | | | | |");
                    failed = true;
                    continue;
                }
            };
            let r = soak(&policy, acts, budget);
            let growth = r.rss_end.saturating_sub(r.rss_warm);
            // Allocator noise is fine; growth that scales with the run is a leak.
            let grew = growth > (16 << 20).max(r.rss_warm / 20);
            failed |= r.mismatches > 0 || r.errors > 0 || grew || r.acts == 0;
            println!(
                "| {backend} | {model} | {THREADS} x {} | {:.0} | {} | {} | {:.1} -> {:.1}{} |",
                r.acts / THREADS,
                r.acts as f64 / r.secs,
                r.mismatches,
                r.errors,
                r.rss_warm as f64 / (1 << 20) as f64,
                r.rss_end as f64 / (1 << 20) as f64,
                if grew { " GREW" } else { "" }
            );
        }
    }
    if failed {
        eprintln!("soak: FAILED (mismatch, error or memory growth above)");
        std::process::exit(1);
    }
    println!("soak: ok");
}
