//! Per-tick cost of driving N agents through one policy (issue 35's benchmark; numbers, never a timed test):
//! a bare `Session::act` of the batch, the agents layer (N observations staged by id, one act), and the Bevy
//! plugin (the Act set of a headless app whose agents are entities), median µs per tick over ~0.3 s each.
//!
//!     cargo run -p policyport-bevy --example tick_bench --release -- --policy p.policy --agents 1,100,1000,10000
//!
//! Prints one JSON line per (path, agents). tests/scripts/engine-bench.sh runs it next to the C# binding and
//! onnxruntime's batch-1 loop and prints the ratios.

use std::time::Instant;

use bevy_app::{App, Update};
use bevy_ecs::prelude::*;
use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request};
use policyport_agents::{AgentId, Agents, AgentsConfig};
use policyport_bevy::{Agent, Observation, Policies, PolicyportPlugin, PolicyportSet};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Median seconds of `f` over repeated calls for about `budget` seconds (at least 5 calls).
fn median(budget: f64, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut v = vec![];
    while v.len() < 5 || (start.elapsed().as_secs_f64() < budget && v.len() < 10_000) {
        let t0 = Instant::now();
        f();
        v.push(t0.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[derive(Component)]
struct Source(Vec<f32>);

#[derive(Resource, Default)]
struct ActTimer(Option<Instant>, Vec<f64>);

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
    let bytes = std::fs::read(&path)?;
    let policy = CompiledPolicy::load(&bytes, Backend::Cpu)?;
    let obs_len = policy.info().obs_len;
    let name = policy.manifest().name.clone();
    for &n in &counts {
        // Observations 0..255 (valid for float and uint8 policies alike).
        let obs: Vec<f32> = (0..n * obs_len)
            .map(|i| ((i * 7919) % 256) as f32)
            .collect();
        let emit = |path: &str, s: f64| {
            println!(
                "{}",
                format_args!(
                    "{{\"policy\": \"{name}\", \"path\": \"{path}\", \"agents\": {n}, \"us_per_tick\": {:.2}}}",
                    s * 1e6
                )
            );
        };
        // 1. A bare Session::act of the batch; 1b. the same act with the request the agents layer sends (an env
        // id per row, episode-start flags), so the agents layer's own cost is told apart from the request's.
        let env_ids: Vec<u32> = (0..n as u32).rev().collect();
        let starts = vec![false; n];
        for (path, with_ids) in [("session_act", false), ("session_act_ids", true)] {
            if !run("session") {
                break;
            }
            let mut session = policy.session();
            let mut step = 0u64;
            emit(
                path,
                median(budget, || {
                    step += 1;
                    let req = Request::new(
                        Observations::F32(&obs),
                        n,
                        ActMode::Sample { seed: 1, step },
                    );
                    let req = match with_ids {
                        true => req.envs(EnvIds::List(&env_ids)).episode_starts(&starts),
                        false => req,
                    };
                    session.act(&req).unwrap();
                }),
            );
        }
        // 2. The agents layer: N observations by id (in reverse order), one act.
        if !run("agents") && !run("bevy") {
            continue;
        }
        let mut agents = Agents::native(policy.clone(), AgentsConfig::default());
        let ids: Vec<AgentId> = (0..n).map(|_| agents.spawn().unwrap()).collect();
        if run("agents") {
            emit(
                "agents",
                median(budget, || {
                    for (k, id) in ids.iter().enumerate().rev() {
                        agents
                            .observe(*id, &obs[k * obs_len..(k + 1) * obs_len])
                            .unwrap();
                    }
                    agents.act().unwrap();
                }),
            );
        }
        if !run("bevy") {
            continue;
        }
        // 3. The Bevy plugin: entities with an Observation copied from a component, the Act set timed.
        let mut app = App::new();
        app.add_plugins(PolicyportPlugin::in_schedule(Update));
        app.init_resource::<ActTimer>();
        let h = app
            .world_mut()
            .resource_mut::<Policies>()
            .add(Agents::native(policy.clone(), AgentsConfig::default()));
        app.add_systems(
            Update,
            (
                observe.in_set(PolicyportSet::Observe),
                (|mut t: ResMut<ActTimer>| t.0 = Some(Instant::now()))
                    .after(PolicyportSet::Observe)
                    .before(PolicyportSet::Act),
                (|mut t: ResMut<ActTimer>| {
                    if let Some(s) = t.0.take() {
                        t.1.push(s.elapsed().as_secs_f64());
                    }
                })
                .after(PolicyportSet::Act)
                .before(PolicyportSet::Apply),
            ),
        );
        for k in 0..n {
            app.world_mut().spawn((
                Agent::new(h),
                Observation::default(),
                Source(obs[k * obs_len..(k + 1) * obs_len].to_vec()),
            ));
        }
        let update = median(budget, || app.update());
        let mut acts = app.world().resource::<ActTimer>().1.clone();
        acts.sort_by(f64::total_cmp);
        emit("bevy_act_set", acts[acts.len() / 2]);
        emit("bevy_update", update);
    }
    Ok(())
}
