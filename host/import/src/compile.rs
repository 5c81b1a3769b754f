//! Compile: an import, golden vectors (the oracle's or the float64 reference's), the artifact writer.

use policyport_format::container::StorageDType;
use policyport_format::philox::{Stream, u01};
use policyport_format::{ObsDType, ObservationSpace, write_artifact};

use crate::reference;
use crate::{FixtureIo, ImportError, ImportSpec, golden_from_fixture, import_onnx};

/// ONNX bytes + what the outputs mean → `.policy` bytes. Golden vectors come from `golden` (oracle outputs, e.g.
/// PyTorch float64) when given, else from the float64 reference interpreter on seeded random observations.
pub fn compile_onnx(
    onnx: &[u8],
    spec: &ImportSpec,
    source: &str,
    golden: Option<&FixtureIo>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    compile_imported(import_onnx(onnx, spec, source)?, golden, storage)
}

/// A Stable-Baselines3 `model.save()` archive (and its `VecNormalize.save()` pickle) → `.policy` bytes (golden vectors as in [`compile_onnx`]).
pub fn compile_sb3(
    archive: &[u8],
    vecnormalize: Option<&[u8]>,
    source: &str,
    golden: Option<&FixtureIo>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    compile_imported(
        crate::sb3::import_sb3(archive, source, vecnormalize)?,
        golden,
        storage,
    )
}

/// A CleanRL `torch.save(agent.state_dict())` checkpoint of a known agent layout, with its spaces.
pub fn compile_cleanrl(
    checkpoint: &[u8],
    layout: crate::CleanrlLayout,
    observation: ObservationSpace,
    action: policyport_format::ActionSpace,
    source: &str,
    golden: Option<&FixtureIo>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    let imported = crate::cleanrl::import_cleanrl(checkpoint, layout, observation, action, source)?;
    compile_imported(imported, golden, storage)
}

/// An RLlib checkpoint directory (the algorithm's, its `rl_module`, or one module's) → `.policy` bytes.
pub fn compile_rllib(
    path: &std::path::Path,
    source: &str,
    golden: Option<&FixtureIo>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    let files = crate::rllib::read_rllib_checkpoint(path)?;
    compile_imported(crate::rllib::import_rllib(&files, source)?, golden, storage)
}

/// One RLModule from the bytes of its state and constructor pickles, compiled alone (no connectors, the
/// module's raw actions: [`crate::rllib::import_rllib_module`]) → `.policy` bytes. The Python package's RLlib
/// integration rebuilds an env runner's policy with this at every weight sync, with `goldens: false`: the float64
/// reference's golden vectors are for artifacts that travel (a NatureCNN-sized module spent ~0.5 s of a 0.6 s
/// rebuild computing them, measured), while an env runner's policy lives in the process that compiled it.
pub fn compile_rllib_module(
    module_state: &[u8],
    module_ctor: &[u8],
    name: &str,
    source: &str,
    storage: StorageDType,
    goldens: bool,
) -> Result<Vec<u8>, ImportError> {
    let imported = crate::rllib::import_rllib_module(module_state, module_ctor, name, source)?;
    if goldens {
        return compile_imported(imported, None, storage);
    }
    write_with_storage(imported.manifest, &imported.tensors, storage)
}

/// The shared back half of every route: golden vectors, storage precision, the writer.
pub fn compile_imported(
    imported: crate::Imported,
    golden: Option<&FixtureIo>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    let mut manifest = imported.manifest;
    manifest.golden = match golden {
        Some(io) => golden_from_fixture(&manifest, io)?,
        None => {
            let cases: Vec<(String, Vec<f32>, usize, u64, u64, u32)> =
                [(1usize, 7u64, 0u64, 0u32), (4, 42, 100, 3)]
                    .iter()
                    .map(|&(batch, seed, step, env_offset)| {
                        (
                            format!("reference_batch{batch}"),
                            random_obs(&manifest.observation, batch, seed),
                            batch,
                            seed,
                            step,
                            env_offset,
                        )
                    })
                    .collect();
            reference::make_golden(&manifest, &imported.tensors, &cases)
                .map_err(ImportError::Golden)?
        }
    };
    // Golden tolerances assume f32 weights; reduced storage widens them to its rounding.
    if storage != StorageDType::F32 {
        let tol = if storage == StorageDType::F16 {
            1e-2
        } else {
            5e-2
        };
        manifest.golden.iter_mut().for_each(|g| {
            g.tolerance = g.tolerance.max(tol);
            g.sampled_actions.clear();
            g.deterministic_actions.clear();
        });
    }
    write_with_storage(manifest, &imported.tensors, storage)
}

fn write_with_storage(
    manifest: policyport_format::Manifest,
    tensors: &std::collections::BTreeMap<String, policyport_format::container::Tensor>,
    storage: StorageDType,
) -> Result<Vec<u8>, ImportError> {
    Ok(write_artifact(&manifest, tensors, &|_| storage)?)
}

/// Seeded observations that fit a space (standard normal-ish floats, bytes, or valid discrete ids).
pub fn random_obs(space: &ObservationSpace, batch: usize, seed: u64) -> Vec<f32> {
    let raw = space.raw_len();
    // Per element of a row: its dtype (a dict's parts each have their own).
    let u8_at: Vec<bool> = match space {
        ObservationSpace::Dict { spaces } => spaces
            .iter()
            .flat_map(|e| std::iter::repeat_n(e.dtype == ObsDType::U8, e.shape.iter().product()))
            .collect(),
        _ => vec![space.raw_dtype() == ObsDType::U8; raw],
    };
    (0..raw * batch)
        .map(|i| {
            let mut s = Stream::new(seed, i as u32, 0xFFFF_FFFF);
            let (a, b) = (u01(s.word(0)).max(1e-7), u01(s.word(1)));
            match space {
                ObservationSpace::Discrete { n } => ((a * *n as f32).floor()).min(*n as f32 - 1.0),
                _ if u8_at[i % raw] => (a * 256.0).floor().min(255.0),
                _ => (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos(),
            }
        })
        .collect()
}
