//! Golden vectors from a fixture script's `io.json` (PyTorch float64 outputs keyed by role).

use std::collections::BTreeMap;

use policyport_format::{Distribution, GoldenCase, LogStd, Manifest};
use serde::Deserialize;

use crate::ImportError;

/// Golden vectors as the fixture scripts write them (`io.json`): PyTorch float64 outputs keyed by role.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureIo {
    pub tolerance: f64,
    pub cases: Vec<FixtureCase>,
    #[serde(default)]
    pub eval: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FixtureCase {
    pub name: String,
    pub batch: usize,
    pub obs: Vec<f32>,
    pub seed: u64,
    pub step: u64,
    pub env_offset: u32,
    pub expected: BTreeMap<String, Vec<f64>>,
}

/// Map fixture cases (keys `logits`, `q_values`, `actor` (a deterministic actor's output before rescaling),
/// `mean`, `log_std`, `value`, `sampled_actions`, `deterministic_actions`)
/// onto the manifest's value names.
pub fn golden_from_fixture(
    manifest: &Manifest,
    io: &FixtureIo,
) -> Result<Vec<GoldenCase>, ImportError> {
    let mut out = vec![];
    for c in &io.cases {
        let mut values = BTreeMap::new();
        let take = |k: &str| c.expected.get(k).cloned();
        let missing = |k: &str| ImportError::Golden(format!("case '{}' lacks '{k}'", c.name));
        match &manifest.distribution {
            Distribution::Categorical { logits } | Distribution::MultiCategorical { logits } => {
                values.insert(
                    logits.clone(),
                    take("logits").ok_or_else(|| missing("logits"))?,
                );
            }
            Distribution::QValues { q, .. } => {
                values.insert(
                    q.clone(),
                    take("q_values").ok_or_else(|| missing("q_values"))?,
                );
            }
            Distribution::Deterministic { action, .. } => {
                values.insert(
                    action.clone(),
                    take("actor").ok_or_else(|| missing("actor"))?,
                );
            }
            Distribution::DiagGaussian { mean, log_std, .. }
            | Distribution::SquashedGaussian { mean, log_std, .. } => {
                values.insert(mean.clone(), take("mean").ok_or_else(|| missing("mean"))?);
                if let (LogStd::Value { value }, Some(v)) = (log_std, take("log_std")) {
                    values.insert(value.clone(), v);
                }
            }
        }
        if let (Some(v), Some(e)) = (&manifest.value, take("value")) {
            values.insert(v.clone(), e);
        }
        out.push(GoldenCase {
            name: c.name.clone(),
            batch: c.batch,
            obs: c.obs.clone(),
            seed: c.seed,
            step: c.step,
            env_offset: c.env_offset,
            tolerance: io.tolerance,
            values,
            sampled_actions: take("sampled_actions").ok_or_else(|| missing("sampled_actions"))?,
            deterministic_actions: take("deterministic_actions")
                .ok_or_else(|| missing("deterministic_actions"))?,
        });
    }
    Ok(out)
}
