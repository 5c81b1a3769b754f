use policyport::Backend;
use policyport_cli::demo::{EpisodeStats, run_episodes_batched};
use policyport_cli::envs::{CartPole, Catch, Env, Pendulum};
use policyport_conformance::{compile_fixture, load_fixture};

/// Replay a trained fixture's evaluation episodes on backend `b`; `check(key, backend, want, got)` per mode.
fn replay<E: Env>(fixture: &str, b: Backend, check: impl Fn(&str, &str, &[f64], &EpisodeStats)) {
    replay_first::<E>(fixture, b, usize::MAX, check)
}

/// [`replay`] of the first `max` episodes alone (each episode's resets and sampling streams depend on its number
/// only, so the first `max` of a batch of `max` are the first `max` of the whole evaluation).
fn replay_first<E: Env>(
    fixture: &str,
    b: Backend,
    max: usize,
    check: impl Fn(&str, &str, &[f64], &EpisodeStats),
) {
    let f = load_fixture(fixture);
    let eval = f.io.eval.clone().unwrap();
    let bytes = compile_fixture(&f);
    let mut p = policyport_conformance::load(&bytes, b).unwrap().session();
    for (sampled, key) in [(true, "sampled_returns"), (false, "deterministic_returns")] {
        let mut want: Vec<f64> = serde_json::from_value(eval[key].clone()).unwrap();
        want.truncate(max);
        let seeds = (
            eval["env_seed"].as_u64().unwrap(),
            eval["policy_seed"].as_u64().unwrap(),
        );
        // All episodes as one batch per time step (the same sampling streams as one by one).
        let got = run_episodes_batched::<E>(&mut p, want.len() as u32, seeds.0, seeds.1, sampled)
            .unwrap();
        check(key, b.name(), &want, &got);
    }
}

/// The compiled CartPole policy replays the PyTorch policy's seeded evaluation episodes (same resets, same
/// Philox draws): identical returns, episode by episode, and the task solved.
fn cartpole_replays_the_pytorch_episodes(b: Backend) {
    replay::<CartPole>("cartpole", b, |key, backend, want, got| {
        assert_eq!(got.returns, want, "{key} on {backend}");
        assert!(got.mean_return() >= 475.0);
    });
}
per_backend!(cartpole_replays_the_pytorch_episodes);

/// Continuous control: actions are computed in f32 here and f64 in the script, so trajectories may drift by
/// rounding; returns must agree closely.
fn pendulum_matches_the_pytorch_returns(b: Backend) {
    replay::<Pendulum>("pendulum", b, |key, backend, want, got| {
        let want_mean = want.iter().sum::<f64>() / want.len() as f64;
        let rel = (got.mean_return() - want_mean).abs() / want_mean.abs();
        assert!(
            rel < 0.02,
            "{key} on {backend}: {} vs {want_mean}",
            got.mean_return()
        );
        let close = got
            .returns
            .iter()
            .zip(want)
            .filter(|(a, b)| (*a - *b).abs() <= 1e-3 * b.abs().max(1.0))
            .count();
        assert!(
            close * 10 >= want.len() * 9,
            "{key}: only {close}/{} episodes agree",
            want.len()
        );
    });
}
per_backend!(pendulum_matches_the_pytorch_returns);

/// The pixel policy (a CNN on Catch's uint8 frames, the browser demo's): the PyTorch policy's seeded episodes
/// replayed from the env's own frames, identical episode by episode, and the game played well (a perfect player
/// scores 38, a random one about -26).
///
/// On wgpu the first 8 of the 32 episodes (both modes, every step of each): where the suite runs, wgpu's device is
/// Mesa's lavapipe, which runs the CNN's shaders on the CPU at ~300 ms of CPU per 32-row act; all 32 took 63 s of
/// wall and 120 s of CPU alone (2026-12-07, Zen 3), the suite's longest test by far. The other backends, and the
/// CNN fixtures' golden batches on wgpu (parity, frozen artifacts), check the same convolutions.
fn catch_replays_the_pytorch_episodes(b: Backend) {
    let max = if b == Backend::Wgpu { 8 } else { usize::MAX };
    replay_first::<Catch>("catch", b, max, |key, backend, want, got| {
        assert_eq!(got.returns, want, "{key} on {backend}");
        assert!(
            got.mean_return() >= 30.0,
            "{key} on {backend}: {}",
            got.mean_return()
        );
    });
}
per_backend!(catch_replays_the_pytorch_episodes);
