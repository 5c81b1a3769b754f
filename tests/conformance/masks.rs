//! Action masks and the other per-request head controls (format 1.4), on every backend:
//!
//! - sb3-contrib MaskablePPO archives (tests/fixtures/sb3/maskable_ppo_*: written by sb3-contrib itself, with
//!   `masks.json` from the same script) compile, record that masks are expected, and under random masks give the
//!   Philox-sampled and deterministic actions of SPEC.md §4, the actions of sb3-contrib's own
//!   `predict(action_masks=..., deterministic=True)`, and the log-probabilities of its `MaskableCategorical`;
//!   RLlib's example `ActionMaskingTorchRLModule` (tests/fixtures/rllib/ppo_action_masking) likewise, against
//!   RLlib's `forward_inference` under the masks and its `TorchCategorical` over the masked logits;
//! - over 10^5 seeded draws per backend no forbidden action is ever chosen (categorical, multi-categorical and
//!   epsilon-greedy heads), and every backend draws the same actions bit for bit;
//! - a mask that does not fit (length, a component with nothing allowed, a continuous head) and an epsilon that
//!   does not (out of [0, 1], a head without Q values) are typed errors that change nothing.

use policyport::format::{MASKED_LOGIT, RowControls};
use policyport::{
    ActMode, ActOutputs, Backend, EnvIds, HeadControlError, Observations, PolicyError, Request,
};
use policyport_conformance::fixtures_dir;
use policyport_import::{FixtureCase, FixtureIo, StorageDType, compile_rllib, compile_sb3};
use serde::Deserialize;

#[derive(Deserialize)]
struct MaskFile {
    tolerance: f64,
    nvec: Vec<usize>,
    cases: Vec<MaskCase>,
}

#[derive(Deserialize)]
struct MaskCase {
    name: String,
    batch: usize,
    obs: Vec<f32>,
    mask: Vec<u8>,
    seed: u64,
    step: u64,
    logits: Vec<f64>,
    value: Vec<f64>,
    sampled_actions: Vec<i64>,
    deterministic_actions: Vec<i64>,
    trainer_actions: Vec<f64>,
    log_prob: Vec<f64>,
}

fn sb3(name: &str) -> Vec<u8> {
    let dir = fixtures_dir().join("sb3").join(name);
    let zip = std::fs::read(dir.join("model.zip")).unwrap();
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    compile_sb3(&zip, None, name, Some(&io), StorageDType::F32)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// RLlib's example action-masking module: its Dict's `observations` are the artifact's observation, its
/// `action_mask` the request's mask.
fn rllib(name: &str) -> Vec<u8> {
    let dir = fixtures_dir().join("rllib").join(name);
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    compile_rllib(&dir.join("checkpoint"), name, Some(&io), StorageDType::F32)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A deterministic stream of masks for the 10^5-draw checks (xorshift; no dependency on the runtime's Philox).
struct Bits(u64);
impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// `rows` rows of masks over `segments`, each component keeping one allowed action at least.
    fn masks(&mut self, rows: usize, segments: &[usize]) -> Vec<bool> {
        let mut out = Vec::with_capacity(rows * segments.iter().sum::<usize>());
        for _ in 0..rows {
            for &n in segments {
                let start = out.len();
                out.extend((0..n).map(|_| self.next() % 3 == 0));
                if !out[start..].iter().any(|f| *f) {
                    let i = (self.next() % n as u64) as usize;
                    out[start + i] = true;
                }
            }
        }
        out
    }
}

fn maskable_ppo_reproduces_sb3_contrib_under_masks_on_every_backend(backend: Backend) {
    for (source, name) in [
        ("sb3", "maskable_ppo_discrete"),
        ("sb3", "maskable_ppo_multidiscrete"),
        ("rllib", "ppo_action_masking"),
    ] {
        let bytes = if source == "sb3" {
            sb3(name)
        } else {
            rllib(name)
        };
        let file: MaskFile = serde_json::from_slice(
            &std::fs::read(fixtures_dir().join(source).join(name).join("masks.json")).unwrap(),
        )
        .unwrap();
        let p = policyport_conformance::load(&bytes, backend).unwrap();
        assert!(
            p.manifest().action_masks,
            "{name}: the artifact records masks"
        );
        let head = p.head().clone();
        assert_eq!(head.segments, file.nvec, "{name}");
        let per_row = head.mask_len();
        let mut s = p.session();
        for c in &file.cases {
            let what = format!("{name} on {} case {}", backend.name(), c.name);
            let mask: Vec<bool> = c.mask.iter().map(|m| *m != 0).collect();
            let obs = Observations::F32(&c.obs);
            let det = s
                .act(&Request::new(obs, c.batch, ActMode::Deterministic).action_mask(&mask))
                .unwrap()
                .clone();
            assert_eq!(
                det.discrete, c.deterministic_actions,
                "{what}: deterministic"
            );
            policyport_conformance::assert_trainer_actions(&det, &c.trainer_actions, &what);
            let mode = ActMode::Sample {
                seed: c.seed,
                step: c.step,
            };
            let out = s
                .act(&Request::new(obs, c.batch, mode).action_mask(&mask))
                .unwrap()
                .clone();
            assert_eq!(out.discrete, c.sampled_actions, "{what}: sampled");
            // Allowed logits as the trainer's float64 modules computed them; forbidden ones at the minimum.
            let scale = c.logits.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
            for (i, (g, w)) in out.dist_params.iter().zip(&c.logits).enumerate() {
                if mask[i] {
                    assert!(
                        (*g as f64 - w).abs() / scale <= file.tolerance,
                        "{what}: logit {i}"
                    );
                } else {
                    assert_eq!(*g, MASKED_LOGIT, "{what}: masked logit {i}");
                }
            }
            let vscale = c.value.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
            for (g, w) in out.value.iter().zip(&c.value) {
                assert!(
                    (*g as f64 - w).abs() / vscale <= file.tolerance,
                    "{what}: value"
                );
            }
            // sb3-contrib's MaskableCategorical log-probabilities of the sampled actions.
            let k = head.action_len;
            for r in 0..c.batch {
                let controls = RowControls {
                    mask: Some(&mask[r * per_row..(r + 1) * per_row]),
                    epsilon: None,
                };
                let lp = head
                    .log_prob_with(
                        &out.dist_params[r * per_row..(r + 1) * per_row],
                        &out.discrete[r * k..(r + 1) * k],
                        &[],
                        &controls,
                    )
                    .unwrap();
                assert!(
                    (lp as f64 - c.log_prob[r]).abs() <= 1e-5 * c.log_prob[r].abs().max(1.0),
                    "{what}: log-prob row {r}: {lp} vs sb3-contrib's {}",
                    c.log_prob[r]
                );
            }
        }
        // Without a mask the policy acts unmasked, as sb3-contrib's predict without action_masks does.
        let c = &file.cases[0];
        let plain = s
            .act(&Request::new(
                Observations::F32(&c.obs),
                c.batch,
                ActMode::Deterministic,
            ))
            .unwrap();
        let unmasked: Vec<i64> = (0..c.batch)
            .flat_map(|r| {
                let mut off = 0;
                file.nvec
                    .iter()
                    .map(|n| {
                        let row = &c.logits[r * per_row + off..r * per_row + off + n];
                        off += n;
                        let mut best = 0;
                        for (i, v) in row.iter().enumerate() {
                            if *v > row[best] {
                                best = i;
                            }
                        }
                        best as i64
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            plain.discrete,
            unmasked,
            "{name} on {}: unmasked",
            backend.name()
        );
    }
}
per_backend!(maskable_ppo_reproduces_sb3_contrib_under_masks_on_every_backend);

/// 10^5 draws per backend and head: no forbidden action, ever, and the same draws on every backend (each backend's
/// draws equal the cpu backend's).
fn no_masked_action_is_ever_chosen_in_100000_draws_on_every_backend(backend: Backend) {
    let batch = 1000;
    for name in [
        "maskable_ppo_discrete",
        "maskable_ppo_multidiscrete",
        "dqn_cartpole",
    ] {
        let bytes = sb3(name);
        let dir = fixtures_dir().join("sb3").join(name);
        let io: FixtureIo =
            serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
        let case = &io.cases[0];
        let per_env = case.obs.len() / case.batch;
        let obs: Vec<f32> = (0..batch)
            .flat_map(|r| {
                let c = &io.cases[r % io.cases.len()];
                let row = r % c.batch;
                c.obs[row * per_env..(row + 1) * per_env].to_vec()
            })
            .collect();
        let drawn = masked_draws(name, &bytes, &obs, batch, backend);
        if backend != Backend::Cpu {
            assert!(
                masked_draws(name, &bytes, &obs, batch, Backend::Cpu) == drawn,
                "{name}: {} draws differently from the cpu backend",
                backend.name()
            );
        }
    }
}
per_backend!(no_masked_action_is_ever_chosen_in_100000_draws_on_every_backend);

/// 100 steps of `batch` seeded draws under random masks on `backend`, each asserted to choose an allowed action
/// (and every action chosen at least once); the draws, for comparison across backends.
fn masked_draws(
    name: &str,
    bytes: &[u8],
    obs: &[f32],
    batch: usize,
    backend: Backend,
) -> Vec<Vec<i64>> {
    let p = policyport_conformance::load(bytes, backend).unwrap();
    let head = p.head().clone();
    let per_row = head.mask_len();
    let k = head.action_len;
    let mut s = p.session();
    let mut bits = Bits(0x9E37_79B9_7F4A_7C15);
    let mut drawn = vec![];
    let mut counts = vec![0usize; per_row];
    for step in 0..100u64 {
        let mask = bits.masks(batch, &head.segments);
        let mut req = Request::new(
            Observations::F32(obs),
            batch,
            ActMode::Sample { seed: 5, step },
        )
        .envs(EnvIds::Range(step as u32 * 7))
        .action_mask(&mask);
        if name == "dqn_cartpole" {
            // Explore every time: uniform among the allowed actions.
            req = req.epsilon(1.0);
        }
        let out = s.act(&req).unwrap();
        for r in 0..batch {
            let mut off = 0;
            for (j, n) in head.segments.iter().enumerate() {
                let a = out.discrete[r * k + j];
                assert!(
                    (0..*n as i64).contains(&a) && mask[r * per_row + off + a as usize],
                    "{name} on {}: step {step} row {r} chose forbidden action {a}",
                    backend.name()
                );
                counts[off + a as usize] += 1;
                off += n;
            }
        }
        drawn.push(out.discrete.clone());
    }
    // Every action is reachable when allowed (the draws are not stuck on one index).
    assert!(counts.iter().all(|c| *c > 0), "{name}: {counts:?}");
    drawn
}

/// Masks and epsilon that do not fit are typed errors, and a refused call leaves the session as it was.
fn head_controls_that_do_not_fit_are_typed_errors_that_change_nothing(backend: Backend) {
    let masked = sb3("maskable_ppo_multidiscrete");
    let td3 = sb3("td3_pendulum");
    let dqn = sb3("dqn_cartpole");
    let p = policyport_conformance::load(&masked, backend).unwrap();
    let head = p.head().clone();
    let per_row = head.mask_len();
    let obs_len = p.manifest().observation.raw_len();
    let obs = vec![1.0f32; 2 * obs_len];
    let mut s = p.session();
    let good = vec![true; 2 * per_row];
    let mode = ActMode::Sample { seed: 1, step: 2 };
    let before: ActOutputs = s
        .act(&Request::new(Observations::F32(&obs), 2, mode).action_mask(&good))
        .unwrap()
        .clone();
    let short = vec![true; 2 * per_row - 1];
    let mut none_in_second = good.clone();
    // Row 1, component 1 (after the first segment): nothing allowed.
    let seg0 = head.segments[0];
    for f in &mut none_in_second[per_row + seg0..2 * per_row] {
        *f = false;
    }
    for (mask, want) in [
        (
            &short[..],
            HeadControlError::MaskLength {
                found: 2 * per_row - 1,
                batch: 2,
                per_row,
            },
        ),
        (
            &none_in_second[..],
            HeadControlError::NoAllowedAction { row: 1, segment: 1 },
        ),
    ] {
        let e = s
            .act(&Request::new(Observations::F32(&obs), 2, mode).action_mask(mask))
            .unwrap_err();
        assert_eq!(e, PolicyError::HeadControl(want), "on {}", backend.name());
        assert_eq!(*s.outputs(), before, "a refused call changed the outputs");
    }
    let e = s
        .act(&Request::new(Observations::F32(&obs), 2, mode).epsilon(0.5))
        .unwrap_err();
    assert_eq!(
        e,
        PolicyError::HeadControl(HeadControlError::EpsilonWithoutQValues)
    );
    // A continuous head has nothing to mask.
    let p = policyport_conformance::load(&td3, backend).unwrap();
    let obs = vec![0.5f32; p.manifest().observation.raw_len()];
    let e = p
        .session()
        .act(&Request::new(Observations::F32(&obs), 1, mode).action_mask(&[true]))
        .unwrap_err();
    assert_eq!(
        e,
        PolicyError::HeadControl(HeadControlError::MaskOnContinuous)
    );
    // Epsilon outside [0, 1] (NaN included).
    let p = policyport_conformance::load(&dqn, backend).unwrap();
    let obs = vec![0.1f32; p.manifest().observation.raw_len()];
    for eps in [-0.1f32, 1.5, f32::NAN] {
        let e = p
            .session()
            .act(&Request::new(Observations::F32(&obs), 1, mode).epsilon(eps))
            .unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::HeadControl(HeadControlError::Epsilon { .. })
            ),
            "{eps}: {e}"
        );
    }
}
per_backend!(head_controls_that_do_not_fit_are_typed_errors_that_change_nothing);

/// The epsilon override and the artifact's epsilon: 0 is always greedy, 1 never depends on the Q values, and the
/// same draws on every backend (device samplers take the override through the host's draw): each backend's draws
/// equal the cpu backend's.
fn epsilon_override_is_greedy_at_zero_and_identical_on_every_backend(backend: Backend) {
    let bytes = sb3("dqn_cnn_frames");
    let dir = fixtures_dir().join("sb3").join("dqn_cnn_frames");
    let io: FixtureIo =
        serde_json::from_slice(&std::fs::read(dir.join("io.json")).unwrap()).unwrap();
    let case = io.cases.iter().max_by_key(|c| c.batch).unwrap();
    let drawn = epsilon_draws(&bytes, case, backend);
    if backend != Backend::Cpu {
        assert!(
            epsilon_draws(&bytes, case, Backend::Cpu) == drawn,
            "{} draws differently",
            backend.name()
        );
    }
}
per_backend!(epsilon_override_is_greedy_at_zero_and_identical_on_every_backend);

/// 50 steps on `backend` of epsilon 0 (asserted greedy), epsilon 1 and the artifact's epsilon: the draws of the
/// last two, for comparison across backends.
fn epsilon_draws(bytes: &[u8], case: &FixtureCase, backend: Backend) -> Vec<Vec<i64>> {
    let p = policyport_conformance::load(bytes, backend).unwrap();
    let mut s = p.session();
    let obs = Observations::F32(&case.obs);
    let greedy = s
        .act(&Request::new(obs, case.batch, ActMode::Deterministic))
        .unwrap()
        .discrete
        .clone();
    let mut drawn = vec![];
    for step in 0..50u64 {
        let mode = ActMode::Sample { seed: 9, step };
        let zero = s
            .act(&Request::new(obs, case.batch, mode).epsilon(0.0))
            .unwrap()
            .discrete
            .clone();
        assert_eq!(zero, greedy, "epsilon 0 on {}", backend.name());
        let one = s
            .act(&Request::new(obs, case.batch, mode).epsilon(1.0))
            .unwrap()
            .discrete
            .clone();
        let artifact = s
            .act(&Request::new(obs, case.batch, mode))
            .unwrap()
            .discrete
            .clone();
        drawn.push(one);
        drawn.push(artifact);
    }
    drawn
}
