//! Differential: every executor this build has gives the same answer or the same typed error, for the same
//! (possibly edited) artifact and the same requests.
//!
//! The executors: the native cpu kernels at this CPU's best instruction set (AVX-512 / AVX2+FMA), the same
//! kernels at the portable baseline (`POLICYPORT_CPU_BASELINE`, no FMA: another rounding of every dot product),
//! and burn flex when built with `--features flex` (another implementation of every op). The artifact is a seed
//! or corpus artifact with up to two manifest edits (the load_act edits) and a few weights overwritten with
//! moderate values; then up to three act() calls (batch, env ids, observations, episode starts, mode from the
//! input) go to one session per executor, so recurrent state is compared across steps too.
//!
//! What counts as the same:
//! - load: all succeed, or all fail with equal errors (validation runs before any executor, so equal is exact);
//! - act(): equal errors (a `NonFiniteOutput` by kind: which row overflows first may differ), or answers within
//!   float rounding of each other: |a - b| <= 1e-2 * (1 + max(|a|, |b|)). Weights and observations are moderate
//!   (|x| <= 8), so rounding stays far below that; a wrong index, broadcast, stride or state row does not;
//! - an answer next to a `NonFiniteOutput`: only when the answer itself is near float32's end (> 1e30), and
//!   the input ends there (the executors' states may differ from then on);
//! - discrete actions: equal, unless the logits explain the difference (a near-tie of the two chosen actions'
//!   logits in deterministic mode; in sampling mode any difference of the distribution parameters, since the
//!   uniform draw may fall between two slightly different CDFs).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use policyport::format::{ActionSpace, Limits};
use policyport::{ActMode, ActOutputs, Backend, CompiledPolicy, Observations, PolicyError, Request};
use policyport_fuzz::{Input, edited_artifact};

/// One executor of the comparison.
#[derive(Debug, Clone, Copy)]
enum Executor {
    CpuBest,
    CpuBaseline,
    #[cfg(feature = "flex")]
    Flex,
}

const EXECUTORS: &[Executor] = &[
    Executor::CpuBest,
    Executor::CpuBaseline,
    #[cfg(feature = "flex")]
    Executor::Flex,
];

fn load(bytes: &[u8], e: Executor) -> Result<Arc<CompiledPolicy>, PolicyError> {
    let limits = Limits { max_memory_bytes: 256 << 20, ..Limits::default() };
    match e {
        Executor::CpuBest => CompiledPolicy::load_with_limits(bytes, Backend::Cpu, limits),
        Executor::CpuBaseline => {
            // The cpu executor picks its instruction set when it is built (at load), from this variable.
            // SAFETY: a fuzz target runs its inputs on one thread, and nothing else reads the environment here.
            unsafe { std::env::set_var("POLICYPORT_CPU_BASELINE", "1") };
            let p = CompiledPolicy::load_with_limits(bytes, Backend::Cpu, limits);
            unsafe { std::env::remove_var("POLICYPORT_CPU_BASELINE") };
            p
        }
        #[cfg(feature = "flex")]
        Executor::Flex => CompiledPolicy::load_with_limits(bytes, Backend::Flex, limits),
    }
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-2 * (1.0 + a.abs().max(b.abs()))
}

fn same_error(a: &PolicyError, b: &PolicyError) -> bool {
    match (a, b) {
        (PolicyError::NonFiniteOutput { .. }, PolicyError::NonFiniteOutput { .. }) => true,
        _ => a == b,
    }
}

/// The logit ranges of each action component (empty for continuous actions).
fn logit_segments(action: &ActionSpace) -> Vec<usize> {
    match action {
        ActionSpace::Discrete { n } => vec![*n],
        ActionSpace::MultiDiscrete { nvec } => nvec.clone(),
        ActionSpace::Box { .. } => vec![],
    }
}

fn compare(what: &str, a: &ActOutputs, b: &ActOutputs, action: &ActionSpace, mode: ActMode) {
    assert_eq!(a.batch, b.batch, "{what}: batch");
    for (name, x, y) in [
        ("value", &a.value, &b.value),
        ("dist_params", &a.dist_params, &b.dist_params),
        ("continuous", &a.continuous, &b.continuous),
    ] {
        assert_eq!(x.len(), y.len(), "{what}: {name} lengths");
        for (i, (&p, &q)) in x.iter().zip(y).enumerate() {
            assert!(close(p, q), "{what}: {name}[{i}] {p} vs {q}");
        }
    }
    assert_eq!(a.discrete.len(), b.discrete.len(), "{what}: discrete lengths");
    if a.discrete == b.discrete {
        return;
    }
    let segments = logit_segments(action);
    let per_row: usize = segments.iter().sum();
    for (i, (&p, &q)) in a.discrete.iter().zip(&b.discrete).enumerate() {
        if p == q {
            continue;
        }
        let (row, component) = (i / segments.len().max(1), i % segments.len().max(1));
        let offset = row * per_row + segments[..component].iter().sum::<usize>();
        let explained = match mode {
            ActMode::Deterministic => [&a.dist_params, &b.dist_params].iter().all(|l| {
                let (lp, lq) = (l.get(offset + p as usize), l.get(offset + q as usize));
                matches!((lp, lq), (Some(&x), Some(&y)) if close(x, y))
            }),
            ActMode::Sample { .. } => {
                let range = offset..offset + segments[component];
                a.dist_params.get(range.clone()) != b.dist_params.get(range)
            }
        };
        assert!(explained, "{what}: discrete action {i}: {p} vs {q}, logits {:?} vs {:?}", a.dist_params, b.dist_params);
    }
}

fn near_overflow(o: &ActOutputs) -> bool {
    o.value.iter().chain(&o.dist_params).chain(&o.continuous).any(|x| x.abs() > 1e30)
}

fuzz_target!(|data: &[u8]| {
    let Some((artifact, mut inp)) = edited_artifact(data, 2, |i: &mut Input| i.f32_moderate()) else { return };
    let loaded: Vec<_> = EXECUTORS.iter().map(|&e| (e, load(&artifact, e))).collect();
    let (first, rest) = loaded.split_first().unwrap();
    for (e, r) in rest {
        match (&first.1, r) {
            (Ok(_), Ok(_)) => {}
            (Err(x), Err(y)) => assert!(same_error(x, y), "load: {:?} {x} vs {e:?} {y}", first.0),
            (Ok(_), Err(y)) => panic!("load: {:?} ok, {e:?} {y}", first.0),
            (Err(x), Ok(_)) => panic!("load: {:?} {x}, {e:?} ok", first.0),
        }
    }
    let Ok(policy) = &first.1 else { return };
    let action = policy.manifest().action.clone();
    let raw_len = policy.manifest().observation.raw_len();
    let u8_obs = policy.manifest().observation.raw_dtype() == policyport::format::ObsDType::U8;
    let mut sessions: Vec<_> = loaded.iter().map(|(e, p)| (*e, p.as_ref().unwrap().session())).collect();
    for step in 0..1 + inp.byte() % 3 {
        let batch = match inp.byte() % 8 {
            0 => 0,
            1 => 64 + inp.byte() as usize % 8,
            b => b as usize,
        };
        let n = batch * raw_len;
        let n = if inp.byte() % 32 == 0 { n + 1 } else { n };
        let obs_f: Vec<f32> = (0..n).map(|_| inp.f32_moderate()).collect();
        let obs_u: Vec<u8> = (0..n).map(|_| inp.byte()).collect();
        let ids: Vec<u32> = (0..batch).map(|_| inp.byte() as u32 % 80).collect();
        let starts: Vec<bool> = (0..batch).map(|_| inp.byte() % 3 == 0).collect();
        let mode = if inp.byte() % 2 == 0 {
            ActMode::Deterministic
        } else {
            ActMode::Sample { seed: inp.u32() as u64, step: step as u64 }
        };
        let obs = if u8_obs && inp.byte() % 2 == 0 { Observations::U8(&obs_u) } else { Observations::F32(&obs_f) };
        let req = inp.envs_and_starts(Request::new(obs, batch, mode), &ids, &starts, false);
        let results: Vec<_> = sessions.iter_mut().map(|(e, s)| (*e, s.act(&req).cloned())).collect();
        let (first, rest) = results.split_first().unwrap();
        for (e, r) in rest {
            let what = format!("act {step}: {:?} vs {e:?}", first.0);
            match (&first.1, r) {
                (Ok(a), Ok(b)) => compare(&what, a, b, &action, mode),
                (Err(x), Err(y)) => assert!(same_error(x, y), "{what}: {x} vs {y}"),
                // Rounding decided which side of float32's end a value fell on; the states may now differ.
                (Ok(a), Err(PolicyError::NonFiniteOutput { .. })) if near_overflow(a) => return,
                (Err(PolicyError::NonFiniteOutput { .. }), Ok(b)) if near_overflow(b) => return,
                (Ok(_), Err(y)) => panic!("{what}: ok vs {y}"),
                (Err(x), Ok(_)) => panic!("{what}: {x} vs ok"),
            }
        }
        if inp.byte() % 4 == 0 {
            let reset: Vec<_> = sessions.iter_mut().map(|(_, s)| s.reset(&ids[..ids.len().min(4)])).collect();
            assert!(reset.windows(2).all(|w| w[0] == w[1]), "reset: {reset:?}");
        }
    }
});
