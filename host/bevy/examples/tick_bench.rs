//! Per-tick cost of driving N agents through one policy (issue 35's benchmark; numbers, never a timed test):
//! a bare `Session::act` of the batch, the agents layer (N observations staged by id, one act), and the Bevy
//! plugin (the Act set of a headless app whose agents are entities, timed by a system on each side of it; less
//! an empty pair of the same timing systems, the act system's own cost), median µs per tick over ~0.3 s each, the
//! paths ticked in turn (so they share whatever the machine does meanwhile, and each runs after the others
//! touched their memory, as a game's systems do).
//!
//!     cargo run -p policyport-bevy --example tick_bench --release -- --policy p.policy --agents 1,100,1000,10000 \
//!         --threads 2
//!
//! Prints one JSON line per (path, agents, threads). Built with policyport-bevy's `bench-timing` feature, the Bevy
//! lines include the act system's parts timed inside it (`bevy_in_*`) and its overhead against the act of the same
//! tick (`bevy_in_overhead`, the act being `bevy_in_act`). tests/scripts/engine-bench.sh runs it next to the C# binding and
//! onnxruntime's batch-1 loop and prints the ratios.

use std::time::Instant;

use bevy_app::{App, Update};
use bevy_ecs::prelude::*;
use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request, ThreadSplit};
use policyport_agents::{AgentId, Agents, AgentsConfig};
use policyport_bevy::{Agent, Observation, Policies, PolicyportPlugin, PolicyportSet};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[derive(Component)]
struct Source(Vec<f32>);

/// A span of the schedule timed by two systems: the last tick's length in seconds, and when the running one
/// started. `M` names the span: [`ActSet`] or [`EmptyPair`].
#[derive(Resource)]
struct Span<M: Send + Sync + 'static> {
    last: Option<f64>,
    started: Option<Instant>,
    _span: std::marker::PhantomData<M>,
}

impl<M: Send + Sync + 'static> Default for Span<M> {
    fn default() -> Self {
        Span {
            last: None,
            started: None,
            _span: std::marker::PhantomData,
        }
    }
}

/// The span around the Act set.
struct ActSet;

/// Two timing systems with nothing between them (after the Apply set): what the timing itself costs (the first
/// system's return, the executor's step, the second one's parameter fetch and clock read), taken from the Act
/// set's span to give the act system's own cost in the schedule.
struct EmptyPair;

fn span_start<M: Send + Sync + 'static>(mut s: ResMut<Span<M>>) {
    s.started = Some(Instant::now());
}

fn span_end<M: Send + Sync + 'static>(mut s: ResMut<Span<M>>) {
    if let Some(t) = s.started.take() {
        s.last = Some(t.elapsed().as_secs_f64());
    }
}

fn observe(mut q: Query<(&Source, &mut Observation)>) {
    for (s, mut o) in q.iter_mut() {
        o.0.clear();
        o.0.extend_from_slice(&s.0);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = arg(&args, "--policy").ok_or("--policy FILE")?;
    let counts: Vec<usize> = arg(&args, "--agents")
        .unwrap_or_else(|| "1,100,1000,10000".into())
        .split(',')
        .map(|v| v.trim().parse())
        .collect::<Result<_, _>>()?;
    let budget: f64 = arg(&args, "--seconds").map_or(Ok(0.3), |v| v.parse())?;
    // `--paths session,agents,bevy` (default all): one path alone, e.g. under a profiler.
    let paths = arg(&args, "--paths").unwrap_or_else(|| "session,agents,bevy".into());
    let run = |p: &str| paths.split(',').any(|x| x.trim() == p);
    // `--threads 2` (default 1): the bare act and the Bevy Act set again with the session's act() split over that
    // many threads (`Session::set_threads`, `Agents::set_threads`); those lines carry `"threads": 2`.
    let threads: usize = arg(&args, "--threads").map_or(Ok(1), |v| v.parse())?;
    // `--gap-us 2000`: the Bevy app sleeps that long after each tick (outside the timed Act set), as a game's
    // frame does; back to back (0, the default) a worker thread is still awake at the next tick.
    let gap_us: u64 = arg(&args, "--gap-us").map_or(Ok(0), |v| v.parse())?;
    // `--split always`: with --threads, every batch split (`ThreadSplit::Always`) rather than only where that
    // measures faster than one thread (`measured`, the default).
    let split = match arg(&args, "--split") {
        None => ThreadSplit::Measured,
        Some(name) => ThreadSplit::from_name(&name)
            .ok_or_else(|| format!("--split {name}: measured or always"))?,
    };
    // `--values`: every path computes the value estimate too (`AgentsConfig::values`); by default none does, as
    // a game acting with a policy does not (the engines' own exports leave the critic out). The bare act with the
    // value is measured beside it either way (`session_act_with_value`).
    let values = args.iter().any(|a| a == "--values");
    // What one clock read costs here: the act system's five (`bench-timing`) are taken from its overhead.
    let clock_read = {
        let t0 = Instant::now();
        let mut last = t0;
        for _ in 0..100_000 {
            last = std::hint::black_box(Instant::now());
        }
        (last - t0).as_secs_f64() / 100_000.0
    };
    let bytes = std::fs::read(&path)?;
    let policy = CompiledPolicy::load(&bytes, Backend::Cpu)?;
    let obs_len = policy.info().obs_len;
    let name = policy.manifest().name.clone();
    for &n in &counts {
        // Observations 0..255 (valid for float and uint8 policies alike).
        let obs: Vec<f32> = (0..n * obs_len)
            .map(|i| ((i * 7919) % 256) as f32)
            .collect();
        let env_ids: Vec<u32> = (0..n as u32).rev().collect();
        let starts = vec![false; n];
        // One thread first, the paths interleaved; then (with --threads) the split act: a worker spinning after
        // its part would share the machine with the one-thread paths.
        for t in std::iter::once(1).chain((threads > 1).then_some(threads)) {
            let mut paths: Vec<TickFn<'_>> = vec![];
            // 1. A bare Session::act of the batch; 1b. the same act with the request the agents layer sends (an
            // env id per row, episode-start flags), so the agents layer's own cost is told apart from the
            // request's.
            if run("session") {
                for (path, with_ids, with_value) in [
                    ("session_act", false, values),
                    ("session_act_ids", true, values),
                    ("session_act_with_value", false, true),
                ] {
                    if (with_ids || path == "session_act_with_value") && t > 1 {
                        continue;
                    }
                    let mut session = policy.session();
                    session.set_threads(t)?;
                    session.set_thread_split(split);
                    let mut step = 0u64;
                    let (obs, env_ids, starts) = (&obs, &env_ids, &starts);
                    paths.push(Box::new(move |out| {
                        step += 1;
                        let req = Request::new(
                            Observations::F32(obs),
                            n,
                            ActMode::Sample { seed: 1, step },
                        );
                        let req = match with_ids {
                            true => req.envs(EnvIds::List(env_ids)).episode_starts(starts),
                            false => req,
                        };
                        let req = match with_value {
                            true => req,
                            false => req.skip_value(),
                        };
                        let t0 = Instant::now();
                        session.act(&req).unwrap();
                        out.push((path, t0.elapsed().as_secs_f64()));
                    }));
                }
            }
            // 2. The agents layer: N observations by id (in reverse order), one act.
            if run("agents") && t == 1 {
                let config = AgentsConfig {
                    values,
                    ..Default::default()
                };
                let mut agents = Agents::new(policy.clone(), config);
                let ids: Vec<AgentId> = (0..n).map(|_| agents.spawn().unwrap()).collect();
                let obs = &obs;
                paths.push(Box::new(move |out| {
                    let t0 = Instant::now();
                    for (k, id) in ids.iter().enumerate().rev() {
                        agents
                            .observe(*id, &obs[k * obs_len..(k + 1) * obs_len])
                            .unwrap();
                    }
                    agents.act().unwrap();
                    out.push(("agents", t0.elapsed().as_secs_f64()));
                }));
            }
            // 3. The Bevy plugin: entities with an Observation copied from a component, the Act set timed.
            if run("bevy") {
                let mut app = bevy_app(&policy, &obs, n, t, split, values)?;
                paths.push(Box::new(move |out| {
                    let t0 = Instant::now();
                    app.update();
                    let update = t0.elapsed().as_secs_f64();
                    let act = app.world_mut().resource_mut::<Span<ActSet>>().last.take();
                    let empty = app
                        .world_mut()
                        .resource_mut::<Span<EmptyPair>>()
                        .last
                        .take();
                    if let Some(act) = act {
                        out.push(("bevy_act_set", act));
                    }
                    if let (Some(act), Some(empty)) = (act, empty) {
                        out.push(("bevy_timer_pair", empty));
                        out.push(("bevy_act_system", act - empty));
                        // Built with policyport-bevy's `bench-timing` feature (engine-bench.sh): the act system's
                        // parts timed inside it, and its overhead against the act of the same tick.
                        if let Some(parts) = policyport_bevy::bench_timing::last() {
                            out.push(("bevy_in_act", parts.act));
                            out.push(("bevy_in_staging", parts.staging));
                            out.push(("bevy_in_actions", parts.actions));
                            out.push((
                                "bevy_in_overhead",
                                act - empty - parts.act - 5.0 * clock_read,
                            ));
                        }
                    }
                    out.push(("bevy_update", update));
                    if gap_us > 0 {
                        std::thread::sleep(std::time::Duration::from_micros(gap_us));
                    }
                }));
            }
            // Split acts one path at a time: each has its own worker, and two spinning workers would compete for
            // the cores (as two threaded policies in one game would: `RowPool::run` keeps that from costing more
            // than one thread, but it is not what this row measures).
            let mut results: Vec<(&'static str, f64)> = match t {
                1 => interleaved(budget, &mut paths),
                _ => paths
                    .iter_mut()
                    .flat_map(|p| interleaved(budget, std::slice::from_mut(p)))
                    .collect(),
            };
            // The bare act alone too, back to back (its memory stays in cache): the reference for paths measured
            // in processes of their own (the C# binding, Godot), which run back to back as well.
            if t == 1 && run("session") {
                let alone = interleaved(budget, &mut paths[..1]);
                results.extend(
                    alone
                        .into_iter()
                        .map(|(_, secs)| ("session_act_alone", secs)),
                );
            }
            for (path, secs) in results {
                println!(
                    "{}",
                    format_args!(
                        "{{\"policy\": \"{name}\", \"path\": \"{path}\", \"agents\": {n}, \"threads\": {t}, \"split\": \"{split:?}\", \"us_per_tick\": {:.2}}}",
                        secs * 1e6
                    )
                );
            }
        }
    }
    Ok(())
}

/// One tick of a measured path: it appends (path, seconds) for what it timed.
type TickFn<'a> = Box<dyn FnMut(&mut Vec<(&'static str, f64)>) + 'a>;

/// Median seconds per path of `paths` ticked in turn, round after round, for about `budget` seconds per path (at
/// least 5 rounds, after one untimed): interleaved, so that whatever drifts during the run (the clock, the other
/// tenants of a VM) drifts for every path alike and the ratios between paths hold.
fn interleaved(budget: f64, paths: &mut [TickFn<'_>]) -> Vec<(&'static str, f64)> {
    let mut scratch = vec![];
    for f in paths.iter_mut() {
        f(&mut scratch);
    }
    let mut samples: Vec<(&'static str, Vec<f64>)> = vec![];
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < 5
        || (start.elapsed().as_secs_f64() < budget * paths.len() as f64 && rounds < 10_000)
    {
        for f in paths.iter_mut() {
            scratch.clear();
            f(&mut scratch);
            for &(path, secs) in &scratch {
                match samples.iter_mut().find(|(p, _)| *p == path) {
                    Some((_, v)) => v.push(secs),
                    None => samples.push((path, vec![secs])),
                }
            }
        }
        rounds += 1;
    }
    samples
        .into_iter()
        .map(|(path, mut v)| {
            v.sort_by(f64::total_cmp);
            (path, v[v.len() / 2])
        })
        .collect()
}

/// A headless Bevy app whose `n` entities' Observations are copied from a component each tick, with systems just
/// before and after the Act set that time it (into `Span<ActSet>`) and an empty pair of the same systems after the
/// Apply set (`Span<EmptyPair>`); the policy's act split over `threads`.
fn bevy_app(
    policy: &std::sync::Arc<CompiledPolicy>,
    obs: &[f32],
    n: usize,
    threads: usize,
    split: ThreadSplit,
    values: bool,
) -> Result<App, Box<dyn std::error::Error>> {
    let obs_len = policy.info().obs_len;
    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    app.init_resource::<Span<ActSet>>()
        .init_resource::<Span<EmptyPair>>();
    let config = AgentsConfig {
        values,
        ..Default::default()
    };
    let mut agents = Agents::new(policy.clone(), config);
    agents.set_threads(threads)?;
    agents.set_thread_split(split);
    let h = app.world_mut().resource_mut::<Policies>().add(agents);
    app.add_systems(
        Update,
        (
            observe.in_set(PolicyportSet::Observe),
            span_start::<ActSet>
                .after(PolicyportSet::Observe)
                .before(PolicyportSet::Act),
            span_end::<ActSet>
                .after(PolicyportSet::Act)
                .before(PolicyportSet::Apply),
            (span_start::<EmptyPair>, span_end::<EmptyPair>)
                .chain()
                .after(PolicyportSet::Apply),
        ),
    );
    for k in 0..n {
        app.world_mut().spawn((
            Agent::new(h),
            Observation::default(),
            Source(obs[k * obs_len..(k + 1) * obs_len].to_vec()),
        ));
    }
    Ok(app)
}
