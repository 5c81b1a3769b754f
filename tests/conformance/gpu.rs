//! The wgpu backend beyond the shared suite: a handful of dispatches per act(), batch sizes from 1 to 65536 with
//! the CPU backend's answers, and the `auto` choice. Built without the suite's `wgpu` feature these tests are
//! *ignored* with that reason (reported as skipped, never as passed); test.sh builds with it, and under CI any
//! skip fails the run.

use policyport::{ActMode, ActOutputs, Backend, EnvIds, Observations, Policy};
use policyport_conformance::{backends, compile_fixture, load_fixture};

fn wgpu_here() -> bool {
    backends().contains(&Backend::Wgpu)
}

/// act() on wgpu issues exactly the dispatches the program reports, and that is a handful (fused dense layers,
/// the head concatenation, the sampler), not one per op.
#[test]
#[cfg_attr(not(feature = "wgpu"), ignore = "built without the wgpu backend (feature wgpu)")]
fn act_costs_a_handful_of_dispatches() {
    let mut report = vec![];
    for name in ["mlp64", "pendulum", "ops"] {
        let bytes = compile_fixture(&load_fixture(name));
        let mut p = Policy::load_on(&bytes, Backend::Wgpu).unwrap();
        let per_act = p.info().dispatches_per_act.expect("a gpu program");
        let obs = vec![0.1f32; 8 * p.info().obs_len];
        let mut out = ActOutputs::default();
        let before = policyport::wgpu_dispatches_issued();
        p.act(
            Observations::F32(&obs),
            8,
            ActMode::Sample { seed: 1, step: 2 },
            EnvIds::Range(0),
            None,
            &mut out,
        )
        .unwrap();
        let issued = policyport::wgpu_dispatches_issued() - before;
        report.push(format!("{name}: {issued} dispatches per act()"));
        assert_eq!(issued, per_act, "{name}");
        let nodes: usize = p.manifest().modules.iter().map(|m| m.nodes.len()).sum();
        assert!(
            issued < nodes + 3,
            "{name}: {issued} dispatches for {nodes} ops"
        );
    }
    // The benchmark MLP: 4 fused dense layers (2 with tanh), one concatenation of logits+value, one sampler.
    let bytes = compile_fixture(&load_fixture("mlp64"));
    assert!(
        Policy::load_on(&bytes, Backend::Wgpu)
            .unwrap()
            .info()
            .dispatches_per_act
            .unwrap()
            <= 6
    );
    println!("{}", report.join("\n"));
}

/// Every batch size (small and tiled kernels, 2-D elementwise grids) gives the CPU backend's actions exactly and
/// its parameters within 1e-5.
#[test]
#[cfg_attr(not(feature = "wgpu"), ignore = "built without the wgpu backend (feature wgpu)")]
fn batch_sizes_from_1_to_65536_match_the_cpu_backend() {
    for name in ["mlp64", "pendulum"] {
        let bytes = compile_fixture(&load_fixture(name));
        let mut gpu = Policy::load_on(&bytes, Backend::Wgpu).unwrap();
        let mut cpu = Policy::load_on(&bytes, Backend::Cpu).unwrap();
        let obs_len = cpu.info().obs_len;
        for batch in [1usize, 3, 47, 48, 64, 1000, 65536] {
            let obs = policyport_host::random_obs(&cpu.manifest().observation, batch, batch as u64);
            let (mut a, mut b) = (ActOutputs::default(), ActOutputs::default());
            let mode = ActMode::Sample {
                seed: 5,
                step: batch as u64,
            };
            assert_eq!(obs.len(), batch * obs_len);
            cpu.act(
                Observations::F32(&obs),
                batch,
                mode,
                EnvIds::Range(3),
                None,
                &mut a,
            )
            .unwrap();
            gpu.act(
                Observations::F32(&obs),
                batch,
                mode,
                EnvIds::Range(3),
                None,
                &mut b,
            )
            .unwrap();
            assert_eq!(
                (a.discrete.len(), a.continuous.len(), a.dist_params.len(), a.value.len()),
                (b.discrete.len(), b.continuous.len(), b.dist_params.len(), b.value.len()),
                "{name} batch {batch}: output lengths"
            );
            assert!(!a.dist_params.is_empty(), "{name} batch {batch}: nothing to compare");
            let mismatches = a
                .discrete
                .iter()
                .zip(&b.discrete)
                .filter(|(x, y)| x != y)
                .count();
            assert_eq!(mismatches, 0, "{name} batch {batch}");
            let scale = a.dist_params.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            for (x, y) in a
                .dist_params
                .iter()
                .zip(&b.dist_params)
                .chain(a.value.iter().zip(&b.value))
            {
                assert!(
                    (x - y).abs() <= 1e-5 * scale.max(1.0),
                    "{name} batch {batch}: {x} vs {y}"
                );
            }
            let cscale = a.continuous.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            for (x, y) in a.continuous.iter().zip(&b.continuous) {
                assert!(
                    (x - y).abs() <= 1e-5 * cscale.max(1.0),
                    "{name} batch {batch}: {x} vs {y}"
                );
            }
        }
    }
}

/// `auto` measures both backends at the caller's batch size, keeps the faster, and says why.
#[test]
fn auto_picks_the_faster_backend_and_says_why() {
    let bytes = compile_fixture(&load_fixture("mlp64"));
    let p = Policy::load_auto(&bytes, 1).unwrap();
    let info = p.info();
    let why = info.selection.clone().unwrap();
    println!("{why}");
    assert!(
        why.contains("cpu") && why.contains(&format!("-> {}", info.backend)),
        "{why}"
    );
    if wgpu_here() {
        assert!(why.contains("wgpu"), "{why}");
    }
}

/// Recurrent state on wgpu lives on the device between steps: gathered and scattered there (2 dispatches per
/// state per act), read back only when asked; clones are independent; reset zeroes device rows; a batch naming one
/// env twice is refused.
#[test]
#[cfg_attr(not(feature = "wgpu"), ignore = "built without the wgpu backend (feature wgpu)")]
fn recurrent_state_stays_on_the_device() {
    let (bytes, _) = crate::recurrent::elman();
    let mut gpu = Policy::load_on(&bytes, Backend::Wgpu).unwrap();
    let mut cpu = Policy::load_on(&bytes, Backend::Cpu).unwrap();
    let mut sg = policyport::RecurrentState::new(&gpu, 4);
    let mut sc = policyport::RecurrentState::new(&cpu, 4);
    let obs = [0.5f32, -0.2, 0.1, 0.3, 0.3, -0.7];
    let (mut a, mut b) = (ActOutputs::default(), ActOutputs::default());
    let det = ActMode::Deterministic;
    let before = policyport::wgpu_dispatches_issued();
    for _ in 0..3 {
        gpu.act(
            Observations::F32(&obs),
            2,
            det,
            EnvIds::List(&[3, 1]),
            Some(&mut sg),
            &mut a,
        )
        .unwrap();
        cpu.act(
            Observations::F32(&obs),
            2,
            det,
            EnvIds::List(&[3, 1]),
            Some(&mut sc),
            &mut b,
        )
        .unwrap();
    }
    assert_eq!(
        policyport::wgpu_dispatches_issued() - before,
        3 * gpu.info().dispatches_per_act.unwrap()
    );
    let snapshot = sg.clone();
    gpu.act(
        Observations::F32(&obs),
        2,
        det,
        EnvIds::List(&[3, 1]),
        Some(&mut sg),
        &mut a,
    )
    .unwrap();
    cpu.act(
        Observations::F32(&obs),
        2,
        det,
        EnvIds::List(&[3, 1]),
        Some(&mut sc),
        &mut b,
    )
    .unwrap();
    for env in 0..4u32 {
        let (g, c) = (
            sg.get(0, env).unwrap().to_vec(),
            sc.get(0, env).unwrap().to_vec(),
        );
        assert_eq!(g.len(), c.len(), "env {env}: state lengths");
        assert!(!g.is_empty());
        for (x, y) in g.iter().zip(&c) {
            assert!((x - y).abs() < 1e-5, "env {env}: {g:?} vs {c:?}");
        }
    }
    let mut snapshot = snapshot;
    assert_ne!(
        snapshot.get(0, 3).unwrap(),
        sg.get(0, 3).unwrap().to_vec().as_slice(),
        "clone is independent"
    );
    sg.reset(&[3]).unwrap();
    assert_eq!(sg.get(0, 3).unwrap(), &[0.0; 4]);
    assert_ne!(sg.get(0, 1).unwrap(), &[0.0; 4]);
    assert!(matches!(
        gpu.act(
            Observations::F32(&obs),
            2,
            det,
            EnvIds::List(&[2, 2]),
            Some(&mut sg),
            &mut a
        ),
        Err(policyport::PolicyError::EnvIds(_))
    ));
}
