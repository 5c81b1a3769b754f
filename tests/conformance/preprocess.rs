//! Every preprocessing step acts as its definition on every backend. The host preprocessor (cpu, flex, the
//! plugin), the wgpu preprocessing kernel and the libtorch ops are built from one resolved plan
//! (`policyport_format::PreprocessPlan`); these policies read the preprocessing back through their logits, so a
//! backend that scales, normalises, clips or one-hot-expands differently fails here by name. (No fixture had a
//! one-hot observation: discrete observations were only ever checked by refusal tests.)

use policyport::{ActMode, Backend, Observations, Request};
use serde_json::json;

use crate::bad_input::{dense, hostile_artifact, policy_json};

/// `dist_params` of a deterministic act: the logits, which these policies make the preprocessed observation
/// (an identity dense layer) or a weight column (a one-hot row times the weights).
fn logits_of(backend: Backend, bytes: &[u8], obs: Observations<'_>, batch: usize) -> Vec<f32> {
    let policy = policyport_conformance::load(bytes, backend)
        .unwrap_or_else(|e| panic!("load on {backend:?}: {e}"));
    let mut session = policy.session();
    session
        .act(&Request::new(obs, batch, ActMode::Deterministic))
        .unwrap_or_else(|e| panic!("act on {backend:?}: {e}"))
        .dist_params
        .clone()
}

fn assert_close(backend: Backend, found: &[f32], want: &[f64], what: &str) {
    assert_eq!(
        found.len(),
        want.len(),
        "{what} on {backend:?}: {found:?} vs {want:?}"
    );
    for (i, (f, w)) in found.iter().zip(want).enumerate() {
        assert!(
            (*f as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what} on {backend:?}: logit {i} is {f}, want {w} (all: {found:?})"
        );
    }
}

fn identity(n: usize) -> Vec<f32> {
    (0..n * n)
        .map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })
        .collect()
}

fn one_hot_observations_select_a_weight_column(backend: Backend) {
    // Discrete(4) observations, one-hot expanded, times a [3, 4] weight: each row's logits are column k.
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let bytes = hostile_artifact(
        policy_json(
            json!({"kind": "discrete", "n": 4}),
            json!([{"kind": "one_hot", "n": 4}]),
            json!([dense("obs", "w", "logits")]),
            json!({"kind": "discrete", "n": 3}),
            json!({"kind": "categorical", "logits": "logits"}),
        ),
        &[("w", vec![3, 4], w.clone())],
    );
    let obs = [2.0f32, 0.0, 3.0, 1.0, 3.0];
    let want: Vec<f64> = obs
        .iter()
        .flat_map(|&k| {
            (0..3)
                .map(|o| w[o * 4 + k as usize] as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    let got = logits_of(backend, &bytes, Observations::F32(&obs), obs.len());
    assert_close(backend, &got, &want, "one_hot");
}
per_backend!(one_hot_observations_select_a_weight_column);

fn scale_normalize_and_clip_act_as_defined(backend: Backend) {
    // Box(3) f32 and Box(3) u8 observations: x * 0.5, then clamp((x - mean) / std, -2, 2), then an identity
    // dense layer. Values chosen so some rows clip on each side and others do not.
    let (mean, std) = ([0.25f32, -1.0, 4.0], [0.5f32, 2.0, 0.25]);
    for (dtype, scale) in [("f32", 0.5f64), ("u8", 1.0 / 255.0)] {
        let bytes = hostile_artifact(
            policy_json(
                json!({"kind": "box", "shape": [3], "dtype": dtype}),
                json!([
                    {"kind": "scale", "factor": scale},
                    {"kind": "normalize", "mean": "m", "std": "s", "clip": 2.0}
                ]),
                json!([dense("obs", "w", "logits")]),
                json!({"kind": "discrete", "n": 3}),
                json!({"kind": "categorical", "logits": "logits"}),
            ),
            &[
                ("w", vec![3, 3], identity(3)),
                ("m", vec![3], mean.to_vec()),
                ("s", vec![3], std.to_vec()),
            ],
        );
        let raw: [u8; 12] = [0, 7, 255, 30, 128, 200, 1, 2, 3, 90, 45, 12];
        let x: Vec<f32> = raw.iter().map(|&b| b as f32).collect();
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let z = (v as f64 * (scale as f32) as f64 - mean[i % 3] as f64) / std[i % 3] as f64;
                z.clamp(-2.0, 2.0)
            })
            .collect();
        let got = match dtype {
            "u8" => logits_of(backend, &bytes, Observations::U8(&raw), 4),
            _ => logits_of(backend, &bytes, Observations::F32(&x), 4),
        };
        assert_close(
            backend,
            &got,
            &want,
            &format!("scale + normalize + clip ({dtype})"),
        );
        // The case checks both sides of the clip: some values clipped, some not.
        assert!(want.iter().any(|z| z.abs() == 2.0) && want.iter().any(|z| z.abs() < 2.0));
    }
}
per_backend!(scale_normalize_and_clip_act_as_defined);
