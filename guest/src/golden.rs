//! Scoring an artifact's golden cases: shared by every executor (the guest's backends, the libtorch host), so a
//! golden case means the same thing everywhere.

use policyport_format::sampling::ActMode;
use policyport_format::{Distribution, GoldenCase, Manifest};

use crate::session::ActOutputs;

/// A golden case runs twice: deterministic, then sampled with its (seed, step).
pub fn golden_modes(case: &GoldenCase) -> [ActMode; 2] {
    [
        ActMode::Deterministic,
        ActMode::Sample {
            seed: case.seed,
            step: case.step,
        },
    ]
}

/// What [`compare_golden`] needs to know about a policy's outputs.
#[derive(Debug, Clone, Copy)]
pub struct GoldenShape {
    pub action_len: usize,
    pub dist_params_len: usize,
    pub discrete: bool,
}

/// Score one golden case from a deterministic and a sampled act() on its observations (any executor: the guest
/// backends, the libtorch host). Named values that are distribution parameters or the value estimate are read
/// from the act() outputs; any other value is asked of `probe`.
pub fn compare_golden<E>(
    case: &GoldenCase,
    m: &Manifest,
    shape: GoldenShape,
    det: &ActOutputs,
    sampled: &ActOutputs,
    probe: &mut dyn FnMut(&str) -> Result<Vec<f32>, E>,
) -> Result<GoldenReport, E> {
    let (k, p) = (shape.action_len, shape.dist_params_len);
    let mut report = GoldenReport {
        name: case.name.clone(),
        tolerance: case.tolerance,
        ..Default::default()
    };
    let out = sampled;
    for (name, expected) in &case.values {
        let got: Vec<f32> = if m.value.as_deref() == Some(name.as_str()) {
            out.value.clone()
        } else if let Some((col, width)) = dist_column(&m.distribution, name, k, p) {
            (0..case.batch)
                .flat_map(|r| out.dist_params[r * p + col..r * p + col + width].to_vec())
                .collect()
        } else {
            probe(name)?
        };
        report.values.push((name.clone(), rel_err(&got, expected)));
    }
    // Empty expected actions mean "not recorded" (e.g. reduced-precision storage, where argmax may flip).
    for (want, got_d, got_c, mismatches, err) in [
        (
            &case.sampled_actions,
            &out.discrete,
            &out.continuous,
            &mut report.sampled_mismatches,
            &mut report.sampled_action_err,
        ),
        (
            &case.deterministic_actions,
            &det.discrete,
            &det.continuous,
            &mut report.deterministic_mismatches,
            &mut report.deterministic_action_err,
        ),
    ] {
        if want.is_empty() {
            continue;
        }
        if shape.discrete {
            *mismatches = count_mismatch(got_d, want);
        } else {
            *err = rel_err(got_c, want);
        }
    }
    report.passed = report.values.iter().all(|(_, e)| *e <= case.tolerance)
        && report.sampled_mismatches == 0
        && report.deterministic_mismatches == 0
        && report.sampled_action_err <= case.tolerance
        && report.deterministic_action_err <= case.tolerance;
    Ok(report)
}

/// (column offset, width) of a distribution value inside a `dist_params` row of width `p`.
fn dist_column(d: &Distribution, name: &str, k: usize, p: usize) -> Option<(usize, usize)> {
    let values = d.param_values();
    match d {
        Distribution::Categorical { .. }
        | Distribution::MultiCategorical { .. }
        | Distribution::QValues { .. }
        | Distribution::Deterministic { .. } => (values[0] == name).then_some((0, p)),
        _ => values.iter().position(|v| *v == name).map(|i| (i * k, k)),
    }
}

/// Outcome of one golden case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GoldenReport {
    pub name: String,
    pub tolerance: f64,
    /// (value name, max relative error).
    pub values: Vec<(String, f64)>,
    pub sampled_mismatches: usize,
    pub deterministic_mismatches: usize,
    pub sampled_action_err: f64,
    pub deterministic_action_err: f64,
    pub passed: bool,
}

/// max |a − b| / max(max |b|, 1e-12): error relative to the reference tensor's largest magnitude (SPEC.md).
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-12);
    got.iter().zip(want).fold(0.0f64, |m, (g, w)| {
        let e = (*g as f64 - w).abs();
        if e.is_nan() { f64::INFINITY } else { m.max(e) }
    }) / scale
}

fn count_mismatch(got: &[i64], want: &[f64]) -> usize {
    if got.len() != want.len() {
        return want.len().max(1);
    }
    got.iter()
        .zip(want)
        .filter(|(g, w)| **g as f64 != **w)
        .count()
}
