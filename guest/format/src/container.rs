//! The `.policy` container: fixed header, JSON manifest, safetensors weights, SHA-256 checksums.
//!
//! ```text
//! offset size  field
//!      0    8  magic b"POLICYPT"
//!      8    2  format major (u16 LE) — readers refuse a major or minor newer than their own
//!     10    2  format minor (u16 LE)
//!     12    4  header length (u32 LE), 96 in v1.0; readers skip bytes they do not know up to it
//!     16    8  manifest length M (u64 LE)
//!     24    8  weights length W (u64 LE)
//!     32   32  SHA-256 of the manifest bytes
//!     64   32  SHA-256 of the weights bytes
//!     96    M  manifest, UTF-8 JSON (see manifest.rs)
//!      …       zero padding up to the next multiple of 64
//!      …    W  weights, a safetensors blob (F32, F16 or BF16 tensors)
//! ```
//! The file ends exactly after the weights; trailing bytes are an error.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::error::FormatError;
use crate::manifest::Manifest;

pub const MAGIC: &[u8; 8] = b"POLICYPT";
pub const FORMAT_MAJOR: u16 = 1;
/// 1.1 added the ops `exp clip reshape transpose conv2d max_pool2d layer_norm` (SPEC.md §3), 1.2 dict
/// observations, 1.3 a squashed Gaussian's `deterministic: clipped_mean` (RLlib's SAC). The writer stamps
/// the lowest minor a file needs ([`Manifest::required_minor`]), so a policy that uses only 1.0 ops still loads in
/// a 1.0 runtime already shipped in a game.
pub const FORMAT_MINOR: u16 = 4;
const HEADER_LEN: usize = 96;
const ALIGN: usize = 64;

/// How a tensor is stored in the file (the importer's `--storage`). Readers always hand out f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDType {
    F32,
    F16,
    BF16,
}

impl StorageDType {
    pub const ALL: [StorageDType; 3] = [StorageDType::F32, StorageDType::F16, StorageDType::BF16];

    pub fn name(self) -> &'static str {
        match self {
            StorageDType::F32 => "f32",
            StorageDType::F16 => "f16",
            StorageDType::BF16 => "bf16",
        }
    }
}

/// A storage name that is not `f32`, `f16` or `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown storage '{0}' (f32, f16, bf16)")]
pub struct UnknownStorage(pub String);

impl std::str::FromStr for StorageDType {
    type Err = UnknownStorage;
    fn from_str(s: &str) -> Result<Self, UnknownStorage> {
        StorageDType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownStorage(s.to_string()))
    }
}

/// A weight tensor as the runtimes see it: f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "tensor data does not match its shape"
        );
        Tensor { shape, data }
    }
}

/// A decoded artifact: the manifest and every weight tensor (converted to f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    pub manifest: Manifest,
    pub tensors: BTreeMap<String, Tensor>,
    /// (major, minor) the file was written with.
    pub version: (u16, u16),
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
/// `x` rounded up to the alignment; `None` on overflow (hostile lengths near `u64::MAX`, found by cargo fuzz).
fn align_up(x: u64) -> Option<u64> {
    x.div_ceil(ALIGN as u64).checked_mul(ALIGN as u64)
}

/// Decode and checksum an artifact. This checks the container only; call [`crate::validate`] on the result
/// before executing it (the runtimes do both in `Policy::load`).
pub fn read_artifact(bytes: &[u8]) -> Result<Artifact, FormatError> {
    let have = bytes.len() as u64;
    if bytes.len() < 16 {
        if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            return Err(FormatError::BadMagic {
                found: bytes[..8].to_vec(),
                expected: MAGIC.to_vec(),
            });
        }
        return Err(FormatError::Truncated {
            what: "the header",
            needed: HEADER_LEN as u64,
            have,
        });
    }
    if &bytes[..8] != MAGIC {
        return Err(FormatError::BadMagic {
            found: bytes[..8].to_vec(),
            expected: MAGIC.to_vec(),
        });
    }
    let (major, minor) = (read_u16(bytes, 8), read_u16(bytes, 10));
    if major != FORMAT_MAJOR || minor > FORMAT_MINOR {
        return Err(FormatError::UnsupportedVersion {
            found_major: major,
            found_minor: minor,
            reader_major: FORMAT_MAJOR,
            reader_minor: FORMAT_MINOR,
        });
    }
    let header_len = read_u32(bytes, 12) as u64;
    if header_len < HEADER_LEN as u64 {
        return Err(FormatError::BadHeader(format!(
            "header length {header_len} < {HEADER_LEN}"
        )));
    }
    if have < header_len {
        return Err(FormatError::Truncated {
            what: "the header",
            needed: header_len,
            have,
        });
    }
    let manifest_len = read_u64(bytes, 16);
    let weights_len = read_u64(bytes, 24);
    let manifest_end = header_len
        .checked_add(manifest_len)
        .ok_or_else(|| FormatError::BadHeader("manifest length overflows".into()))?;
    let weights_start = align_up(manifest_end)
        .ok_or_else(|| FormatError::BadHeader("manifest length overflows".into()))?;
    let end = weights_start
        .checked_add(weights_len)
        .ok_or_else(|| FormatError::BadHeader("weights length overflows".into()))?;
    if have < end {
        return Err(FormatError::Truncated {
            what: "the manifest and weights",
            needed: end,
            have,
        });
    }
    if have > end {
        return Err(FormatError::BadHeader(format!(
            "{} trailing bytes after the weights",
            have - end
        )));
    }
    let manifest_bytes = &bytes[header_len as usize..manifest_end as usize];
    let weights_bytes = &bytes[weights_start as usize..end as usize];
    if Sha256::digest(manifest_bytes).as_slice() != &bytes[32..64] {
        return Err(FormatError::ChecksumMismatch {
            section: "manifest",
        });
    }
    if Sha256::digest(weights_bytes).as_slice() != &bytes[64..96] {
        return Err(FormatError::ChecksumMismatch { section: "weights" });
    }
    let manifest: Manifest =
        serde_json::from_slice(manifest_bytes).map_err(|e| manifest_error(manifest_bytes, e))?;
    if let Some((op, since)) = manifest.newest_op()
        && since > minor
    {
        return Err(FormatError::OpNewerThanFile {
            op,
            since: (FORMAT_MAJOR, since),
            file: (major, minor),
        });
    }
    if manifest.observation.since_minor() > minor {
        return Err(FormatError::OpNewerThanFile {
            op: "observation kind 'dict'".into(),
            since: (FORMAT_MAJOR, manifest.observation.since_minor()),
            file: (major, minor),
        });
    }
    if manifest.distribution.since_minor() > minor {
        return Err(FormatError::OpNewerThanFile {
            op: manifest.distribution.feature_name().into(),
            since: (FORMAT_MAJOR, manifest.distribution.since_minor()),
            file: (major, minor),
        });
    }
    if manifest.action_masks && minor < 4 {
        return Err(FormatError::OpNewerThanFile {
            op: "'action_masks'".into(),
            since: (FORMAT_MAJOR, 4),
            file: (major, minor),
        });
    }
    let tensors = decode_weights(weights_bytes)?;
    Ok(Artifact {
        manifest,
        tensors,
        version: (major, minor),
    })
}

/// Name an unknown op precisely (which node, which module) instead of serde's generic "unknown variant".
fn manifest_error(bytes: &[u8], e: serde_json::Error) -> FormatError {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
        let known: Vec<&str> = crate::manifest::Op::KNOWN.split(' ').collect();
        for m in v["modules"].as_array().into_iter().flatten() {
            for n in m["nodes"].as_array().into_iter().flatten() {
                if let Some(kind) = n["op"]["kind"].as_str() {
                    if !known.contains(&kind) {
                        return FormatError::UnknownOp {
                            op: kind.into(),
                            node: n["name"].as_str().unwrap_or("?").into(),
                            module: m["name"].as_str().unwrap_or("?").into(),
                            known: crate::manifest::Op::KNOWN,
                        };
                    }
                }
            }
        }
    }
    FormatError::BadManifest(e.to_string())
}

/// Lay out a container around already-encoded sections (checksums computed here). The writer uses it; tests
/// and fuzzers use it to build files whose container is valid but whose contents are hostile.
pub fn assemble(manifest_bytes: &[u8], weights_bytes: &[u8]) -> Vec<u8> {
    assemble_versioned(manifest_bytes, weights_bytes, FORMAT_MINOR)
}

/// [`assemble`] stamping format minor `minor` (the writer stamps the lowest one the manifest needs).
pub fn assemble_versioned(manifest_bytes: &[u8], weights_bytes: &[u8], minor: u16) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(HEADER_LEN + manifest_bytes.len() + ALIGN + weights_bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_MAJOR.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(manifest_bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&(weights_bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(manifest_bytes));
    out.extend_from_slice(&Sha256::digest(weights_bytes));
    out.extend_from_slice(manifest_bytes);
    out.resize(
        align_up(out.len() as u64).expect("in-memory length") as usize,
        0,
    );
    out.extend_from_slice(weights_bytes);
    out
}

/// Split a container into its (manifest, weights) sections after checking it (tests re-assemble edited files).
pub fn sections(bytes: &[u8]) -> Result<(&[u8], &[u8]), FormatError> {
    read_artifact(bytes)?;
    let m = read_u64(bytes, 16) as usize;
    let w = read_u64(bytes, 24) as usize;
    let ws = align_up((HEADER_LEN + m) as u64).expect("checked by read_artifact") as usize;
    Ok((&bytes[HEADER_LEN..HEADER_LEN + m], &bytes[ws..ws + w]))
}

fn decode_weights(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, FormatError> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes).map_err(|e| FormatError::BadWeights(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            other => {
                return Err(FormatError::BadTensorDtype {
                    name,
                    dtype: format!("{other:?}"),
                });
            }
        };
        if data.len() != shape.iter().product::<usize>() {
            return Err(FormatError::BadWeights(format!(
                "tensor '{name}' data does not match shape {shape:?}"
            )));
        }
        out.insert(name, Tensor { shape, data });
    }
    Ok(out)
}

/// Encode an artifact. `storage` picks the on-disk dtype per tensor (default F32). The manifest is validated
/// first: the writer never produces a file a reader would refuse.
pub fn write_artifact(
    manifest: &Manifest,
    tensors: &BTreeMap<String, Tensor>,
    storage: &dyn Fn(&str) -> StorageDType,
) -> Result<Vec<u8>, FormatError> {
    let artifact = Artifact {
        manifest: manifest.clone(),
        tensors: tensors.clone(),
        version: (FORMAT_MAJOR, FORMAT_MINOR),
    };
    // Validate against what a reader will see (after f16/bf16 rounding).
    let mut stored = artifact;
    for (name, t) in stored.tensors.iter_mut() {
        match storage(name) {
            StorageDType::F32 => {}
            StorageDType::F16 => t
                .data
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
            StorageDType::BF16 => t
                .data
                .iter_mut()
                .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
        }
    }
    crate::validate::validate(&stored, &crate::validate::Limits::default())?;
    encode_unvalidated(manifest, tensors, storage)
}

/// Encode an artifact **without validating it**: for tests and fuzzers that must hand readers what a hostile
/// writer would (every reader validates; [`write_artifact`] is the writer to use).
pub fn encode_unvalidated(
    manifest: &Manifest,
    tensors: &BTreeMap<String, Tensor>,
    storage: &dyn Fn(&str) -> StorageDType,
) -> Result<Vec<u8>, FormatError> {
    let manifest_bytes =
        serde_json::to_vec(manifest).map_err(|e| FormatError::BadManifest(e.to_string()))?;
    let encoded: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| {
            let (dtype, bytes) = match storage(name) {
                StorageDType::F32 => (
                    safetensors::Dtype::F32,
                    t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
                StorageDType::F16 => (
                    safetensors::Dtype::F16,
                    t.data
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
                ),
                StorageDType::BF16 => (
                    safetensors::Dtype::BF16,
                    t.data
                        .iter()
                        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                        .collect(),
                ),
            };
            (name.clone(), dtype, t.shape.clone(), bytes)
        })
        .collect();
    let views = encoded
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| FormatError::BadWeights(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let weights_bytes =
        safetensors::serialize(views, None).map_err(|e| FormatError::BadWeights(e.to_string()))?;

    Ok(assemble_versioned(
        &manifest_bytes,
        &weights_bytes,
        manifest.required_minor(),
    ))
}
