//! `policyport inspect`, `run`, `rollout` and `verify`: an artifact read, acted on and checked.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request};
use policyport_cli::npy;
use policyport_format::{Limits, read_artifact, validate};
use policyport_import::inspect;

use super::{load_policy, read};

/// `policyport inspect`'s arguments.
#[derive(Args)]
pub struct InspectArgs {
    pub artifact: PathBuf,
    /// Print the manifest as JSON instead.
    #[arg(long)]
    pub json: bool,
}

/// `policyport run`'s arguments.
#[derive(Args)]
pub struct RunArgs {
    pub artifact: PathBuf,
    /// `[batch, *observation shape]` (a .npy's shape is checked in full), or JSON rows.
    #[arg(long)]
    pub obs: PathBuf,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
    /// Sample with this seed (default: deterministic actions).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub step: u64,
    #[arg(long, default_value_t = 0)]
    pub env_offset: u32,
    /// Action masks, `[batch, n]` flags (n = one per logit / Q value; .npy of bool or numbers, or JSON rows
    /// of 0/1 or true/false): forbidden actions are never chosen.
    #[arg(long)]
    pub mask: Option<PathBuf>,
    /// A Q-value policy's exploration rate for this call (sampled mode) instead of the artifact's.
    #[arg(long)]
    pub epsilon: Option<f32>,
}

/// `policyport rollout`'s arguments.
#[derive(Args)]
pub struct RolloutArgs {
    pub artifact: PathBuf,
    /// `[T, batch, *observation shape]` observations (.npy).
    #[arg(long)]
    pub obs: PathBuf,
    /// `[T, batch]` episode starts (.npy of bool or 0/1): a row's state is zeroed before its step.
    #[arg(long)]
    pub starts: Option<PathBuf>,
    /// `[T, batch, n]` action masks (.npy of bool or 0/1).
    #[arg(long)]
    pub mask: Option<PathBuf>,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
    /// Sample with this seed (step t draws with step number t); default: deterministic actions.
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub env_offset: u32,
    /// Print every state tensor of the batch's envs after each step.
    #[arg(long)]
    pub state: bool,
}

/// `policyport verify`'s arguments.
#[derive(Args)]
pub struct VerifyArgs {
    pub artifact: PathBuf,
    #[arg(long, default_value = "cpu")]
    pub backend: Backend,
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let InspectArgs { artifact, json } = args;
    let bytes = read(&artifact)?;
    let art = read_artifact(&bytes)?;
    let plan = validate(&art, &Limits::default())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&art.manifest)?);
    } else {
        print!(
            "{}",
            inspect::terminal_safe(&inspect::summary(&art, &plan, bytes.len()))
        );
    }
    Ok(())
}

pub fn run(args: RunArgs) -> Result<()> {
    let RunArgs {
        artifact,
        obs,
        backend,
        seed,
        step,
        env_offset,
        mask,
        epsilon,
    } = args;
    let policy = load_policy(&read(&artifact)?, backend)?;
    let mut session = policy.session();
    let raw = read(&obs)?;
    let (shape, data) = if obs.extension().is_some_and(|e| e == "npy") {
        let (shape, data) = npy::read_npy(&raw)?;
        // The header's shape, in full: the same count of numbers in another layout is refused, but
        // for a channels-first image policy (SB3's CnnPolicy) the env's channels-last frames are
        // transposed, as SB3's predict does.
        let (batch, layout) = policyport::layout_of_shape(&policy.manifest().observation, &shape)
            .map_err(policyport::PolicyError::from)?;
        (vec![batch], layout.into_policy_layout(data, batch))
    } else {
        let v: Vec<Vec<f32>> =
            serde_json::from_slice(&raw).context("obs JSON must be [[..], [..]]")?;
        // Every row one env's observation: ragged rows ([[1,2,3],[4]]) were concatenated and re-cut
        // into rows of the policy's width, silently.
        let want = policy.info().obs_len;
        if let Some((i, r)) = v.iter().enumerate().find(|(_, r)| r.len() != want) {
            bail!(
                "obs JSON row {i} has {} numbers; this policy takes {want} per env",
                r.len()
            );
        }
        (vec![v.len()], v.concat())
    };
    let batch = shape.first().copied().unwrap_or(1).max(1);
    let mode = seed.map_or(ActMode::Deterministic, |seed| ActMode::Sample {
        seed,
        step,
    });
    let flags = mask
        .map(|m| read_mask(&m, batch, policy.head().mask_len()))
        .transpose()?;
    let mut req =
        Request::new(Observations::F32(&data), batch, mode).envs(EnvIds::Range(env_offset));
    if let Some(f) = &flags {
        req = req.action_mask(f);
    }
    if let Some(e) = epsilon {
        req = req.epsilon(e);
    }
    let out = session.act(&req)?;
    let actions = if out.discrete.is_empty() {
        serde_json::json!(out.continuous)
    } else {
        serde_json::json!(out.discrete)
    };
    println!(
        "{}",
        serde_json::json!({"batch": batch, "actions": actions, "value": out.value, "dist_params": out.dist_params})
    );
    Ok(())
}

pub fn verify(args: VerifyArgs) -> Result<()> {
    let VerifyArgs { artifact, backend } = args;
    let policy = load_policy(&read(&artifact)?, backend)?;
    let reports = policy.verify()?;
    let mut ok = true;
    for r in &reports {
        let vals: Vec<String> = r
            .values
            .iter()
            .map(|(n, e)| format!("{n}: {e:.2e}"))
            .collect();
        println!(
            "{:<4} {:<28} rel err [{}] (tol {:.0e}); sampled mismatches {}, deterministic mismatches {}{}",
            if r.passed { "ok" } else { "FAIL" },
            r.name,
            vals.join(", "),
            r.tolerance,
            r.sampled_mismatches,
            r.deterministic_mismatches,
            if r.sampled_action_err > 0.0 {
                format!(
                    ", action err {:.2e}",
                    r.sampled_action_err.max(r.deterministic_action_err)
                )
            } else {
                String::new()
            }
        );
        ok &= r.passed;
    }
    if reports.is_empty() {
        bail!("artifact has no golden vectors");
    }
    if !ok {
        bail!("golden vectors failed on {}", backend.name());
    }
    Ok(())
}

pub fn rollout(args: RolloutArgs) -> Result<()> {
    let RolloutArgs {
        artifact,
        obs,
        starts,
        mask,
        backend,
        seed,
        env_offset,
        state,
    } = args;
    steps(
        &load_policy(&read(&artifact)?, backend)?,
        &obs,
        starts.as_deref(),
        mask.as_deref(),
        seed,
        env_offset,
        state,
    )
}

/// Action masks from a .npy (`[batch, n]`, bool or numbers: non-zero allows) or JSON rows (0/1 or booleans),
/// as `batch x n` flags; the shape is checked here, what the flags allow by the runtime.
fn read_mask(path: &Path, batch: usize, per_row: usize) -> Result<Vec<bool>> {
    let raw = read(path)?;
    if path.extension().is_some_and(|e| e == "npy") {
        let (shape, data) = npy::read_npy(&raw)?;
        if shape != [batch, per_row] {
            bail!(
                "mask of shape {shape:?}; this call needs [{batch}, {per_row}] (batch, one flag per action)"
            );
        }
        return Ok(data.iter().map(|v| *v != 0.0).collect());
    }
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_slice(&raw)
        .context("mask JSON must be [[..], [..]] of 0/1 or booleans")?;
    if rows.len() != batch || rows.iter().any(|r| r.len() != per_row) {
        bail!("mask JSON must have {batch} rows of {per_row} flags");
    }
    rows.iter()
        .flatten()
        .map(|v| match v {
            serde_json::Value::Bool(b) => Ok(*b),
            serde_json::Value::Number(n) if n.as_f64() == Some(0.0) => Ok(false),
            serde_json::Value::Number(n) if n.as_f64() == Some(1.0) => Ok(true),
            other => bail!("mask flag {other} is not 0, 1, true or false"),
        })
        .collect()
}

/// `policyport rollout`: one session stepped over `[T, batch, ...]` observations (see [`RolloutArgs`]).
fn steps(
    policy: &std::sync::Arc<CompiledPolicy>,
    obs: &Path,
    starts: Option<&Path>,
    mask: Option<&Path>,
    seed: Option<u64>,
    env_offset: u32,
    print_state: bool,
) -> Result<()> {
    let (shape, data) = npy::read_npy(&read(obs)?)?;
    let Some((&t_len, step_shape)) = shape.split_first() else {
        bail!("rollout observations need a [T, batch, ...] shape, got {shape:?}");
    };
    let (batch, layout) = policyport::layout_of_shape(&policy.manifest().observation, step_shape)
        .map_err(policyport::PolicyError::from)?;
    let data = layout.into_policy_layout(data, t_len * batch);
    let per_step = data.len() / t_len.max(1);
    let flags = |path: Option<&Path>, width: usize, what: &str| -> Result<Option<Vec<bool>>> {
        let Some(p) = path else { return Ok(None) };
        let (s, d) = npy::read_npy(&read(p)?)?;
        let want: Vec<usize> = [t_len, batch]
            .into_iter()
            .chain((width > 0).then_some(width))
            .collect();
        if s != want {
            bail!("{what} of shape {s:?}; this rollout needs {want:?}");
        }
        Ok(Some(d.iter().map(|v| *v != 0.0).collect()))
    };
    let starts = flags(starts, 0, "episode starts")?;
    let per_row = policy.head().mask_len();
    let masks = flags(mask, per_row.max(1), "masks")?;
    let mut session = policy.session();
    let ids: Vec<u32> = (0..batch as u32).map(|r| env_offset + r).collect();
    for t in 0..t_len {
        let mode = seed.map_or(ActMode::Deterministic, |seed| ActMode::Sample {
            seed,
            step: t as u64,
        });
        let mut req = Request::new(
            Observations::F32(&data[t * per_step..(t + 1) * per_step]),
            batch,
            mode,
        )
        .envs(EnvIds::Range(env_offset));
        if let Some(s) = &starts {
            req = req.episode_starts(&s[t * batch..(t + 1) * batch]);
        }
        if let Some(m) = &masks {
            req = req.action_mask(&m[t * batch * per_row..(t + 1) * batch * per_row]);
        }
        let out = session
            .act(&req)
            .with_context(|| format!("rollout step {t}"))?;
        let actions = if out.discrete.is_empty() {
            serde_json::json!(out.continuous)
        } else {
            serde_json::json!(out.discrete)
        };
        let mut line = serde_json::json!({"step": t, "batch": batch, "actions": actions,
            "value": out.value, "dist_params": out.dist_params});
        if print_state && session.num_envs() > 0 {
            line["state"] = serde_json::json!(session.states_of(&ids)?);
        }
        println!("{line}");
    }
    Ok(())
}
