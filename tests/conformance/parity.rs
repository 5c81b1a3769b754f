use policyport::{ActMode, CompiledPolicy, EnvIds, Observations, Request};
use policyport_conformance::{backends, compile_fixture, fixture_names, load_fixture};

/// Every fixture, every backend: golden vectors (PyTorch float64 + Python Philox samples) within tolerance.
#[test]
fn every_fixture_matches_pytorch_on_every_backend() {
    let mut table = vec![];
    for name in fixture_names() {
        let f = load_fixture(&name);
        assert!(
            f.io.tolerance <= 1e-5,
            "{name}: tolerance {} looser than the suite's 1e-5",
            f.io.tolerance
        );
        let bytes = compile_fixture(&f);
        for backend in backends() {
            let p = policyport_conformance::load(&bytes, backend).unwrap();
            let reports = p.verify().unwrap();
            assert_eq!(reports.len(), f.io.cases.len());
            for r in reports {
                let worst = r.values.iter().map(|(_, e)| *e).fold(0.0, f64::max);
                table.push(format!("{name:<14} {:<6} {:<22} max rel err {worst:.2e}  sampled mismatches {}  action err {:.1e}", backend.name(), r.name, r.sampled_mismatches, r.sampled_action_err));
                assert!(r.passed, "{name} on {}: {r:?}", backend.name());
            }
        }
    }
    println!("{}", table.join("\n"));
}

/// The same (seed, env, step) gives the same actions whatever the batch composition: a row's draw depends on
/// its env id only, so a batch of 64 agrees with 64 batches of 1 and with a permuted id list.
#[test]
fn sampling_depends_on_env_id_not_on_batch_position() {
    let f = load_fixture("mlp64");
    let bytes = compile_fixture(&f);
    let case = &f.io.cases[2];
    for backend in backends() {
        let mut p = policyport_conformance::load(&bytes, backend)
            .unwrap()
            .session();
        let mode = ActMode::Sample {
            seed: case.seed,
            step: case.step,
        };
        let all = p
            .act(&Request::new(
                Observations::F32(&case.obs),
                case.batch,
                mode,
            ))
            .unwrap()
            .clone();
        for r in 0..case.batch {
            let one = p
                .act(
                    &Request::new(Observations::F32(&case.obs[r * 64..(r + 1) * 64]), 1, mode)
                        .envs(EnvIds::Range(r as u32)),
                )
                .unwrap();
            assert_eq!(one.discrete[0], all.discrete[r], "row {r}");
        }
        // Reverse the rows and their ids together: same action per env.
        let ids: Vec<u32> = (0..case.batch as u32).rev().collect();
        let obs: Vec<f32> = ids
            .iter()
            .flat_map(|&i| case.obs[i as usize * 64..(i as usize + 1) * 64].to_vec())
            .collect();
        let rev = p
            .act(&Request::new(Observations::F32(&obs), case.batch, mode).envs(EnvIds::List(&ids)))
            .unwrap();
        for (r, &id) in ids.iter().enumerate() {
            assert_eq!(rev.discrete[r], all.discrete[id as usize]);
        }
        // A different step gives different draws somewhere in 64 envs.
        let other = p
            .act(&Request::new(
                Observations::F32(&case.obs),
                case.batch,
                ActMode::Sample {
                    seed: case.seed,
                    step: case.step + 1,
                },
            ))
            .unwrap();
        assert_ne!(other.discrete, all.discrete);
    }
}

/// A session's output buffers are reused: a warm act() keeps their allocations.
#[test]
fn outputs_are_reused_without_reallocation() {
    let f = load_fixture("cartpole");
    for backend in backends() {
        let mut p = policyport_conformance::load(&compile_fixture(&f), backend)
            .unwrap()
            .session();
        let obs = vec![0.01f32; 4 * 8];
        let out = p
            .act(&Request::new(
                Observations::F32(&obs),
                8,
                ActMode::Deterministic,
            ))
            .unwrap();
        let ptrs = (
            out.discrete.as_ptr(),
            out.value.as_ptr(),
            out.dist_params.as_ptr(),
        );
        for step in 0..10 {
            p.act(&Request::new(
                Observations::F32(&obs),
                8,
                ActMode::Sample { seed: 1, step },
            ))
            .unwrap();
        }
        let out = p.outputs();
        assert_eq!(
            ptrs,
            (
                out.discrete.as_ptr(),
                out.value.as_ptr(),
                out.dist_params.as_ptr()
            )
        );
        assert_eq!(
            (out.discrete.len(), out.value.len(), out.dist_params.len()),
            (8, 8, 16)
        );
    }
}

/// The native CPU backend's warm act() allocates nothing: buffers, outputs and scratch are reused.
#[test]
fn warm_cpu_act_does_not_allocate() {
    for name in ["mlp64", "pendulum"] {
        let f = load_fixture(&name);
        let policy = CompiledPolicy::load(&compile_fixture(&f), policyport::Backend::Cpu).unwrap();
        let mut p = policy.session();
        let raw = policy.info().obs_len;
        for batch in [1usize, 64] {
            let obs: Vec<f32> = (0..batch * raw).map(|i| (i as f32 * 0.01).sin()).collect();
            let mode = |step| ActMode::Sample { seed: 5, step };
            p.act(&Request::new(Observations::F32(&obs), batch, mode(0)))
                .unwrap();
            let before = crate::alloc_count::count();
            for step in 1..50 {
                p.act(&Request::new(Observations::F32(&obs), batch, mode(step)))
                    .unwrap();
            }
            let allocs = crate::alloc_count::count() - before;
            assert_eq!(
                allocs, 0,
                "{name} batch {batch}: {allocs} allocations in 49 warm act() calls"
            );
        }
    }
}

/// The plan / state split: eight threads share one `CompiledPolicy` (one copy of the weights, behind an `Arc`),
/// each with its own `Session`, and every thread gets exactly the single-threaded answers on every backend.
#[test]
fn eight_threads_share_one_compiled_policy() {
    fn assert_shareable<T: Send + Sync>() {}
    assert_shareable::<CompiledPolicy>();
    let f = load_fixture("mlp64");
    let bytes = compile_fixture(&f);
    let case = f.io.cases[2].clone();
    for backend in backends() {
        let policy = policyport_conformance::load(&bytes, backend).unwrap();
        let mut single = policy.session();
        let expected: Vec<Vec<i64>> = (0..20u64)
            .map(|step| {
                let mode = ActMode::Sample { seed: 3, step };
                single
                    .act(&Request::new(
                        Observations::F32(&case.obs),
                        case.batch,
                        mode,
                    ))
                    .unwrap()
                    .discrete
                    .clone()
            })
            .collect();
        let expected = std::sync::Arc::new(expected);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (policy, expected, obs) = (policy.clone(), expected.clone(), case.obs.clone());
                std::thread::spawn(move || {
                    let mut s = policy.session();
                    for i in 0..20u64 {
                        let step = (i + t * 3) % 20;
                        let mode = ActMode::Sample { seed: 3, step };
                        let out = s
                            .act(&Request::new(Observations::F32(&obs), obs.len() / 64, mode))
                            .unwrap();
                        assert_eq!(
                            out.discrete, expected[step as usize],
                            "thread {t} step {step}"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // One policy, one copy of its weights: the sessions hold references, and all of them are gone now.
        drop(single);
        assert_eq!(std::sync::Arc::strong_count(&policy), 1, "{backend:?}");
    }
}
