//! The `policyport` command line: compile, inspect, run, rollout, verify, demo, trace, serve-web, bench. Each
//! subcommand's arguments and code live in its module under `cmd/`; this file parses and dispatches.

mod cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};
use cmd::{act, bench, compile, demo};
use policyport_import::inspect;

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
    Compile(compile::CompileArgs),
    /// Print what an artifact holds.
    Inspect(act::InspectArgs),
    /// Act on observations from a .npy or .json file ([batch, obs...]); prints JSON.
    Run(act::RunArgs),
    /// Step a policy (recurrent or not) over a rollout of observations `[T, batch, *observation shape]` (.npy),
    /// with per-step episode starts and masks, carrying the recurrent state between steps; prints one JSON line
    /// per step (actions, value, distribution parameters, and with --state the state after the step).
    Rollout(act::RolloutArgs),
    /// Check the artifact's golden vectors on a backend.
    Verify(act::VerifyArgs),
    /// Compile the bundled trained policies and run them in the Rust environments.
    Demo(demo::DemoArgs),
    /// Step many envs with one batched act() per tick and record every observation and action (JSON): the
    /// native reference the browser tests compare against (same seeds, same env code).
    Trace(demo::TraceArgs),
    /// Serve the browser demo (web/) with the bundled trained policies compiled in memory: the demo at /, the
    /// benchmark page at /bench.html. Build the wasm bundles first: bash tests/scripts/web-build.sh.
    ServeWeb(demo::ServeWebArgs),
    /// Time act() at given batch sizes; prints one JSON line per batch.
    Bench(bench::BenchArgs),
    /// Time act() on the libtorch executor (needs the `tch` feature): one JSON line per batch.
    BenchTorch(bench::BenchTorchArgs),
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
        Cmd::Compile(args) => compile::run(args),
        Cmd::Inspect(args) => act::inspect(args),
        Cmd::Run(args) => act::run(args),
        Cmd::Rollout(args) => act::rollout(args),
        Cmd::Verify(args) => act::verify(args),
        Cmd::Demo(args) => demo::demo(args),
        Cmd::Trace(args) => demo::trace(args),
        Cmd::ServeWeb(args) => demo::serve_web(args),
        Cmd::Bench(args) => bench::bench(args),
        Cmd::BenchTorch(args) => bench::bench_torch(args),
    }
}
