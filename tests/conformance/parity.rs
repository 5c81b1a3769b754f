use policyport::{
    ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request, Session, ThreadSplit,
};
use policyport_conformance::{compile_fixture, fixture_names, load_fixture};

/// Every fixture, every backend: golden vectors (PyTorch float64 + Python Philox samples) within tolerance.
fn every_fixture_matches_pytorch_on_every_backend(backend: Backend) {
    let mut table = vec![];
    for name in fixture_names() {
        let f = load_fixture(&name);
        assert!(
            f.io.tolerance <= 1e-5,
            "{name}: tolerance {} looser than the suite's 1e-5",
            f.io.tolerance
        );
        let bytes = compile_fixture(&f);
        let p = policyport_conformance::load(&bytes, backend).unwrap();
        let reports = p.verify().unwrap();
        assert_eq!(reports.len(), f.io.cases.len());
        for r in reports {
            let worst = r.values.iter().map(|(_, e)| *e).fold(0.0, f64::max);
            table.push(format!("{name:<14} {:<6} {:<22} max rel err {worst:.2e}  sampled mismatches {}  action err {:.1e}", backend.name(), r.name, r.sampled_mismatches, r.sampled_action_err));
            assert!(r.passed, "{name} on {}: {r:?}", backend.name());
        }
    }
    println!("{}", table.join("\n"));
}
per_backend!(every_fixture_matches_pytorch_on_every_backend);

/// The same (seed, env, step) gives the same actions whatever the batch composition: a row's draw depends on
/// its env id only, so a batch of 64 agrees with 64 batches of 1 and with a permuted id list.
fn sampling_depends_on_env_id_not_on_batch_position(backend: Backend) {
    let f = load_fixture("mlp64");
    let bytes = compile_fixture(&f);
    let case = &f.io.cases[2];
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
per_backend!(sampling_depends_on_env_id_not_on_batch_position);

/// A batch bigger than the cpu executor's row block (a block of rows passes every layer before the next block;
/// 96 rows or more, `BLOCK_BYTES` in guest/src/cpu.rs) acts as its rows would one at a time, over two steps (the
/// recurrent fixtures carry each env's state from the first): the rows of every fixture, env ids 0..n. Exact on
/// the backends that run the cpu kernels (native, the sandbox: a row's numbers never depend on its neighbours);
/// the others over 9 rows, within 1e-4 with deterministic actions (their kernels may sum in another order at
/// another batch).
fn a_batch_of_many_blocks_acts_as_its_rows_one_at_a_time(backend: Backend) {
    let exact = matches!(backend, Backend::Cpu | Backend::Wasmtime);
    for name in fixture_names() {
        let f = load_fixture(&name);
        let p = policyport_conformance::load(&compile_fixture(&f), backend).unwrap();
        let case = f.io.cases.iter().max_by_key(|c| c.batch).unwrap();
        let width = case.obs.len() / case.batch;
        // Past a block or more and a partial one on the cpu kernels: every fixture here has 96-row blocks (over
        // 1.3 KB of activations a row); 3 x 288 + 9 rows cover blocks up to 288 rows for a smaller net. Fewer rows
        // elsewhere (a single act on lavapipe takes milliseconds).
        let n = match (exact, width >= 1024) {
            (true, true) => 105,
            (true, false) => 3 * 288 + 9,
            (false, _) => 9,
        };
        // The case's rows in a scrambled order (valid observations of any kind: frames, one-hots, dicts): a row
        // run with another's observation (a block's rows misplaced by any offset) shows.
        let pick = |r: usize| ((r as u64).wrapping_mul(2_654_435_761) >> 7) as usize % case.batch;
        let obs: Vec<f32> = (0..n)
            .flat_map(|r| case.obs[pick(r) * width..][..width].to_vec())
            .collect();
        let (mut whole, mut single) = (p.session(), p.session());
        for step in 0..2 {
            let mode = match exact {
                true => ActMode::Sample { seed: 5, step },
                false => ActMode::Deterministic,
            };
            let all = whole
                .act(&Request::new(Observations::F32(&obs), n, mode))
                .unwrap()
                .clone();
            for r in 0..n {
                let one = single
                    .act(
                        &Request::new(Observations::F32(&obs[r * width..][..width]), 1, mode)
                            .envs(EnvIds::Range(r as u32)),
                    )
                    .unwrap();
                let k = one.discrete.len();
                let what = format!("{name} on {}, row {r} of {n}, step {step}", backend.name());
                assert_eq!(one.discrete, all.discrete[r * k..][..k], "{what}: discrete");
                for (part, got, want) in [
                    ("continuous", &one.continuous, &all.continuous),
                    ("value", &one.value, &all.value),
                    ("dist_params", &one.dist_params, &all.dist_params),
                ] {
                    let k = got.len();
                    let want = &want[r * k..][..k];
                    match exact {
                        true => assert_eq!(got.as_slice(), want, "{what}: {part}"),
                        false => {
                            for (g, w) in got.iter().zip(want) {
                                assert!(
                                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                                    "{what}: {part} {g} vs {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
per_backend!(a_batch_of_many_blocks_acts_as_its_rows_one_at_a_time);

/// A session's output buffers are reused: a warm act() keeps their allocations.
fn outputs_are_reused_without_reallocation(backend: Backend) {
    let f = load_fixture("cartpole");
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
per_backend!(outputs_are_reused_without_reallocation);

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
            let allocs = crate::alloc_count::allocations_in(|| {
                for step in 1..50 {
                    p.act(&Request::new(Observations::F32(&obs), batch, mode(step)))
                        .unwrap();
                }
            });
            assert_eq!(
                allocs, 0,
                "{name} batch {batch}: {allocs} allocations in 49 warm act() calls"
            );
        }
    }
}

/// The plan / state split: eight threads share one `CompiledPolicy` (one copy of the weights, behind an `Arc`),
/// each with its own `Session`, and every thread gets exactly the single-threaded answers on every backend.
fn eight_threads_share_one_compiled_policy(backend: Backend) {
    fn assert_shareable<T: Send + Sync>() {}
    assert_shareable::<CompiledPolicy>();
    let f = load_fixture("mlp64");
    let bytes = compile_fixture(&f);
    let case = f.io.cases[2].clone();
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
per_backend!(eight_threads_share_one_compiled_policy);

/// `Session::set_threads`: the cpu backend split over threads gives the single thread's outputs bit for bit, for
/// every fixture (MLPs, convolutions, recurrent state with episode starts), at batch sizes that split unevenly
/// (200 rows: parts of 48, 48, 48, 48 and 8 that the 3 threads take in turn, in whatever order they get to
/// them); warm threaded act() allocates nothing. (Which backends take more than one thread: the test after this one.)
///
/// The large pixel fixtures (a row of 1 024 numbers or more: NatureCNN, IMPALA; Catch's 768 keep every size) split
/// at 17 and 26 rows only, and check allocations over fewer rows and steps: how rows are cut into parts does not
/// depend on the model (at least 8 rows a part, whole 12-row tiles from 96 rows on: the MLPs cover those sizes and
/// `pool.rs` the cutting itself), and IMPALA alone at 200 rows took 40 of this test's 59 s on the portable kernels'
/// rerun (2026-12-07, Zen 3).
#[test]
fn intra_op_threads_give_the_single_thread_answers() {
    for name in fixture_names() {
        let f = load_fixture(&name);
        let bytes = compile_fixture(&f);
        let policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
        let case = &f.io.cases[0];
        let width = case.obs.len() / case.batch;
        let pixels = width >= 1024;
        let (mut one, mut many) = (policy.session(), policy.session());
        many.set_threads(3).unwrap();
        assert_eq!(many.threads(), 3);
        // Every batch split (the default splits only where that measures faster: `measured` below).
        many.set_thread_split(ThreadSplit::Always);
        assert_eq!(many.thread_split(), ThreadSplit::Always);
        let batches: &[usize] = if pixels {
            &[1, 17, 26]
        } else {
            &[1, 17, 50, 200]
        };
        // The case's rows repeated: valid observations for any input kind (frames, one-hots, dicts).
        let rows = |n: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|r| case.obs[(r % case.batch) * width..][..width].to_vec())
                .collect()
        };
        // `steps` acts of `batch` rows on both sessions (every row `r` with `r % start_every == start_at` starting
        // an episode): the same outputs.
        let same = |one: &mut Session,
                    other: &mut Session,
                    batch: usize,
                    steps: std::ops::Range<u64>,
                    (start_every, start_at): (usize, usize),
                    what: &str| {
            let obs = rows(batch);
            let starts: Vec<bool> = (0..batch).map(|r| r % start_every == start_at).collect();
            for step in steps {
                let req = Request::new(
                    Observations::F32(&obs),
                    batch,
                    ActMode::Sample { seed: 11, step },
                )
                .episode_starts(&starts);
                let want = one.act(&req).unwrap().clone();
                let got = other.act(&req).unwrap();
                assert_eq!(got, &want, "{name}: {what}, batch {batch}, step {step}");
            }
        };
        for &batch in batches {
            same(&mut one, &mut many, batch, 0..3, (7, 3), "split");
        }
        // The measured split: its first 16 steps of a batch size split, the next 4 probe the caller alone, then
        // whichever measured faster (beside the other tests, either): 1 thread's answers throughout. (Not the
        // pixel fixtures: their acts are long, and the row cutting is the same as above.)
        if !pixels {
            // New sessions: the recurrent fixtures' state starts at zero on both.
            let (mut one, mut measured) = (policy.session(), policy.session());
            measured.set_threads(3).unwrap();
            assert_eq!(measured.thread_split(), ThreadSplit::Measured);
            same(&mut one, &mut measured, 50, 0..40, (5, 1), "measured split");
        }
        // Warm, threaded: nothing allocated on the calling thread. A new session, warmed by one act, all of it
        // beside a busy core: its parts then vary from act to act, from the warm-up on (a buffer sized by the
        // part a thread happened to take grows later; how dict_obs's chunk buffer was caught).
        let (batch, steps) = if pixels { (24, 6) } else { (64, 20) };
        let obs = rows(batch);
        let req = |step| {
            Request::new(
                Observations::F32(&obs),
                batch,
                ActMode::Sample { seed: 2, step },
            )
        };
        let allocs = crate::warm_threaded_act_allocations(
            &mut policy.session(),
            ThreadSplit::Always,
            steps,
            req,
        );
        assert_eq!(
            allocs, 0,
            "{name}: threaded act() allocated (POLICYPORT_TRACE_ALLOCS=1 prints where)"
        );
        // Measured: the caller runs whole batches too (probes, or the split measuring slower beside the busy
        // core), on buffers the split steps sized.
        let allocs = crate::warm_threaded_act_allocations(
            &mut policy.session(),
            ThreadSplit::Measured,
            if pixels { 24 } else { 30 },
            req,
        );
        assert_eq!(
            allocs, 0,
            "{name}: threaded act(), measured split, allocated (POLICYPORT_TRACE_ALLOCS=1 prints where)"
        );
        many.set_threads(1).unwrap();
        assert_eq!(many.threads(), 1);
    }
}

/// `Session::set_threads` on every backend: the cpu backend takes more than one thread, and refuses an absurd
/// count with a typed error (not a million threads); other backends accept 1 thread and refuse more with a typed
/// error. `Session::set_thread_split`: the cpu backend keeps the mode across thread counts; the others accept it
/// and keep nothing.
fn only_the_cpu_backend_takes_more_than_one_thread(backend: Backend) {
    use policyport::{BackendError, PolicyError};
    let bytes = compile_fixture(&load_fixture("mlp64"));
    let mut s = policyport_conformance::load(&bytes, backend)
        .unwrap()
        .session();
    s.set_threads(1).unwrap();
    let more = s.set_threads(2);
    if backend == Backend::Cpu {
        more.unwrap();
        assert!(matches!(
            s.set_threads(policyport::MAX_THREADS + 1),
            Err(PolicyError::Backend(BackendError::Threads(_)))
        ));
        assert_eq!(
            s.threads(),
            2,
            "a refused count leaves the session as it was"
        );
        // The thread split is the session's, set before or after its threads, and kept when they change.
        let mut t = policyport_conformance::load(&bytes, backend)
            .unwrap()
            .session();
        assert_eq!(t.thread_split(), ThreadSplit::Measured);
        t.set_thread_split(ThreadSplit::Always);
        t.set_threads(3).unwrap();
        assert_eq!(t.thread_split(), ThreadSplit::Always);
        t.set_threads(2).unwrap();
        t.set_threads(1).unwrap();
        assert_eq!(t.thread_split(), ThreadSplit::Always);
        s.set_thread_split(ThreadSplit::Always);
        assert_eq!(s.thread_split(), ThreadSplit::Always);
    } else {
        // Nothing to split: the mode is accepted and changes nothing.
        s.set_thread_split(ThreadSplit::Always);
        assert_eq!(s.thread_split(), ThreadSplit::Measured, "{backend}");
        assert!(
            matches!(
                more,
                Err(PolicyError::Backend(BackendError::Unsupported(_)))
            ),
            "{backend}: {more:?}"
        );
        assert_eq!(s.threads(), 1);
    }
}
per_backend!(only_the_cpu_backend_takes_more_than_one_thread);
