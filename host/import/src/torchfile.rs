//! PyTorch state dicts as `torch.save` writes them (the zip format of PyTorch ≥ 1.6): `<prefix>/data.pkl` is a
//! pickle of an `OrderedDict` of tensors, each `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
//! ...)` whose storage is a persistent reference `('storage', torch.FloatStorage, key, location, numel)` to the
//! raw bytes in `<prefix>/data/<key>`. Read without executing anything ([`crate::pickle`]); every offset, size
//! and stride is checked against its storage.

use std::collections::BTreeMap;

use policyport_format::container::Tensor;

use crate::ImportError;
use crate::pickle::{self, MAX_DEPTH, Node, Pickle, Walk};
use crate::zipread::Zip;

/// Elements one tensor may have (the artifact's own limit).
const MAX_ELEMS: u64 = 1 << 28;

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("torch file: {}", detail.into()))
}

/// Every floating-point (and integer, converted) tensor of a `torch.save`d state dict, by its dotted key; nested
/// dicts (a checkpoint `{"model": state_dict, ...}`) are flattened with `.`.
pub fn read_state_dict(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, ImportError> {
    let zip = Zip::open(bytes)?;
    let pkl_name = zip
        .names()
        .find(|n| n.ends_with("data.pkl") && n.matches('/').count() == 1)
        .map(str::to_string)
        .ok_or_else(|| bad("no <archive>/data.pkl entry (a legacy, pre-1.6 torch.save file?)"))?;
    let prefix = pkl_name.trim_end_matches("data.pkl").to_string();
    if let Some(order) = zip.get(&format!("{prefix}byteorder")) {
        let order = order?;
        if order != b"little" {
            return Err(bad(format!(
                "byte order '{}' (only little-endian files are read)",
                String::from_utf8_lossy(order)
            )));
        }
    }
    let pk = pickle::parse(zip.get(&pkl_name).expect("listed")?).map_err(ImportError::Pickle)?;
    let mut out = BTreeMap::new();
    let mut walk = Budget {
        walk: Walk::new(pickle::MAX_WALK, "the state dict's keys"),
        // A tensor holds at most its storage's elements, and storages are bytes of this file; tied weights (one
        // tensor under two keys) are allowed once over. Views that repeat elements past that (stride-0 expands of
        // a tiny storage under many keys) would be gigabytes from kilobytes.
        elems_left: 2 * bytes.len() as u64 + (1 << 20),
    };
    collect(
        &pk,
        &zip,
        &prefix,
        pk.root,
        String::new(),
        0,
        &mut walk,
        &mut out,
    )?;
    if out.is_empty() {
        return Err(bad("no tensors in the file"));
    }
    Ok(out)
}

fn dict_items(pk: &Pickle, i: usize) -> Option<&[(usize, usize)]> {
    match pk.get(i) {
        Node::Dict(items) => Some(items),
        Node::Call { items, .. }
            if pk.call_name(i).as_deref() == Some("collections.OrderedDict") =>
        {
            Some(items)
        }
        _ => None,
    }
}

/// What one state dict's walk may still visit and produce.
struct Budget {
    walk: Walk,
    elems_left: u64,
}

#[allow(clippy::too_many_arguments)]
fn collect(
    pk: &Pickle,
    zip: &Zip,
    prefix: &str,
    node: usize,
    key: String,
    depth: usize,
    budget: &mut Budget,
    out: &mut BTreeMap<String, Tensor>,
) -> Result<(), ImportError> {
    if depth > MAX_DEPTH {
        return Err(bad("nesting deeper than 64"));
    }
    budget.walk.step().map_err(ImportError::Pickle)?;
    if let Some(items) = dict_items(pk, node) {
        for (k, v) in items {
            let name = match pk.get(*k) {
                Node::Str(s) => s.clone(),
                Node::Int(i) => i.to_string(),
                _ => continue,
            };
            let full = if key.is_empty() {
                name
            } else {
                format!("{key}.{name}")
            };
            collect(pk, zip, prefix, *v, full, depth + 1, budget, out)?;
        }
        return Ok(());
    }
    match pk.call_name(node).as_deref() {
        Some("torch._utils._rebuild_tensor_v2" | "torch._utils._rebuild_tensor") => {
            let t = rebuild(pk, zip, prefix, node, &key, budget.elems_left)?;
            budget.elems_left -= t.data.len() as u64;
            out.insert(key.clone(), t);
        }
        Some("torch._utils._rebuild_parameter") => {
            let Node::Call { args, .. } = pk.get(node) else {
                unreachable!()
            };
            let inner = pk
                .items(*args)
                .and_then(|a| a.first().copied())
                .ok_or_else(|| bad(format!("'{key}': parameter without data")))?;
            collect(pk, zip, prefix, inner, key, depth + 1, budget, out)?;
        }
        // Other entries of a checkpoint (step counters, hyper-parameters) are not weights.
        _ => {}
    }
    Ok(())
}

fn rebuild(
    pk: &Pickle,
    zip: &Zip,
    prefix: &str,
    node: usize,
    key: &str,
    elems_left: u64,
) -> Result<Tensor, ImportError> {
    let Node::Call { args, .. } = pk.get(node) else {
        unreachable!()
    };
    let a = pk.items(*args).filter(|a| a.len() >= 4).ok_or_else(|| {
        bad(format!(
            "'{key}': tensor without storage, offset, size, stride"
        ))
    })?;
    let Node::Persistent(pid) = pk.get(a[0]) else {
        return Err(bad(format!(
            "'{key}': storage is not a persistent reference"
        )));
    };
    let p = pk
        .items(*pid)
        .filter(|p| p.len() >= 5)
        .ok_or_else(|| bad(format!("'{key}': malformed storage reference")))?;
    let dtype = match pk.get(p[1]) {
        Node::Global(_, n) => n.clone(),
        _ => return Err(bad(format!("'{key}': storage type is not a torch storage"))),
    };
    let skey = pk
        .str(p[2])
        .ok_or_else(|| bad(format!("'{key}': storage key is not a string")))?;
    let raw = zip
        .get(&format!("{prefix}data/{skey}"))
        .ok_or_else(|| bad(format!("'{key}': storage data/{skey} is missing")))??;
    let elem = match dtype.as_str() {
        "FloatStorage" | "IntStorage" => 4,
        "DoubleStorage" | "LongStorage" => 8,
        "HalfStorage" | "BFloat16Storage" | "ShortStorage" => 2,
        "ByteStorage" | "CharStorage" | "BoolStorage" => 1,
        other => return Err(bad(format!("'{key}': storage type {other}"))),
    };
    let numel = raw.len() / elem;
    let ints = |i: usize, what: &str| -> Result<Vec<u64>, ImportError> {
        let items = match pk.get(i) {
            Node::Tuple(v) | Node::List(v) => v.clone(),
            _ => return Err(bad(format!("'{key}': {what} is not a tuple"))),
        };
        items
            .iter()
            .map(|x| {
                pk.int(*x)
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| bad(format!("'{key}': {what} holds a non-integer")))
            })
            .collect()
    };
    let offset = pk
        .int(a[1])
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| bad(format!("'{key}': bad storage offset")))?;
    let size = ints(a[2], "size")?;
    let stride = ints(a[3], "stride")?;
    if size.len() != stride.len() {
        return Err(bad(format!(
            "'{key}': size {size:?} and stride {stride:?} differ in rank"
        )));
    }
    let total = size
        .iter()
        .try_fold(1u64, |acc, d| acc.checked_mul(*d))
        .filter(|n| *n <= MAX_ELEMS)
        .ok_or_else(|| ImportError::Unsupported {
            what: format!("tensor '{key}' of size {size:?}"),
            hint: "tensors are limited to 2^28 elements".into(),
        })?;
    if total > elems_left {
        return Err(bad(format!(
            "'{key}': {total} elements would take the file's tensors past twice the file's size (views repeating \
             a storage's elements under many keys)"
        )));
    }
    // The last element read must lie in the storage.
    if total > 0 {
        let last = size
            .iter()
            .zip(&stride)
            .try_fold(offset, |acc, (d, s)| {
                acc.checked_add((d - 1).checked_mul(*s)?)
            })
            .filter(|l| *l < numel as u64)
            .ok_or_else(|| {
                bad(format!(
                    "'{key}': view outside its storage of {numel} elements"
                ))
            })?;
        let _ = last;
    }
    let read = |i: usize| -> f32 {
        let b = &raw[i * elem..(i + 1) * elem];
        match dtype.as_str() {
            "FloatStorage" => f32::from_le_bytes(b.try_into().unwrap()),
            "DoubleStorage" => f64::from_le_bytes(b.try_into().unwrap()) as f32,
            "HalfStorage" => half::f16::from_le_bytes(b.try_into().unwrap()).to_f32(),
            "BFloat16Storage" => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f32(),
            "LongStorage" => i64::from_le_bytes(b.try_into().unwrap()) as f32,
            "IntStorage" => i32::from_le_bytes(b.try_into().unwrap()) as f32,
            "ShortStorage" => i16::from_le_bytes(b.try_into().unwrap()) as f32,
            "CharStorage" => b[0] as i8 as f32,
            _ => b[0] as f32,
        }
    };
    let total = total as usize;
    let mut data = Vec::with_capacity(total);
    let rank = size.len();
    let mut idx = vec![0u64; rank];
    for _ in 0..total {
        let at = offset + idx.iter().zip(&stride).map(|(i, s)| i * s).sum::<u64>();
        data.push(read(at as usize));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < size[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Tensor::new(
        size.iter().map(|d| *d as usize).collect(),
        data,
    ))
}

/// Is this a safetensors file: an 8-byte little-endian header length, then that many bytes of a JSON object
/// (`{` … `}`, space-padded)? (Its first byte may be 0x80, like a pickle's PROTO opcode: this check comes first.)
pub fn is_safetensors(bytes: &[u8]) -> bool {
    if bytes.len() < 10 {
        return false;
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if n < 2 || n > (bytes.len() - 8) as u64 {
        return false;
    }
    let header = &bytes[8..8 + n as usize];
    header[0] == b'{' && header.iter().rev().find(|b| **b != b' ') == Some(&b'}')
}

/// Every floating-point tensor of a safetensors state dict (F32, F16, BF16, F64 read as f32), by key. Integer
/// tensors (step counters, `num_batches_tracked`) are left out: no layout reads them. Offsets and sizes are
/// checked by the safetensors reader; element counts against the artifact's limit here.
pub fn read_safetensors(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, ImportError> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| ImportError::Malformed(format!("safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        if numel.is_none_or(|n| n > MAX_ELEMS) {
            return Err(ImportError::Malformed(format!(
                "safetensors file: tensor '{name}' of shape {shape:?} is too large"
            )));
        }
        let data = view.data();
        let vals: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
                .collect(),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            _ => continue,
        };
        out.insert(name, Tensor::new(shape, vals));
    }
    Ok(out)
}

/// A state dict from either file a PyTorch user saves: `torch.save` (zip + pickle) or safetensors.
pub fn read_any_state_dict(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>, ImportError> {
    if is_safetensors(bytes) {
        read_safetensors(bytes)
    } else {
        read_state_dict(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::PickleError;
    use crate::zipread::stored_zip;

    /// `len` as pickle BINUNICODE.
    fn s(text: &str) -> Vec<u8> {
        let mut v = vec![b'X'];
        v.extend_from_slice(&(text.len() as u32).to_le_bytes());
        v.extend_from_slice(text.as_bytes());
        v
    }

    /// `_rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 1), 0, (n,), (stride,), False, {})`.
    fn tensor(n: i32, stride: u8) -> Vec<u8> {
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n(".to_vec();
        p.extend(b"(".iter().chain(&s("storage")).copied());
        p.extend_from_slice(b"ctorch\nFloatStorage\n");
        p.extend(s("0").into_iter().chain(s("cpu")));
        p.extend_from_slice(b"K\x01tQK\x00J");
        p.extend_from_slice(&n.to_le_bytes());
        p.extend_from_slice(&[0x85, b'K', stride, 0x85, 0x89, b'}', b't', b'R']);
        p
    }

    fn torch_file(pkl: &[u8]) -> Vec<u8> {
        stored_zip(&[
            ("archive/data.pkl", pkl),
            ("archive/data/0", &1.5f32.to_le_bytes()),
        ])
    }

    #[test]
    fn a_plain_state_dict_reads() {
        let mut p = b"\x80\x02}(".to_vec();
        p.extend(s("w"));
        p.extend(tensor(1, 1));
        p.extend_from_slice(b"u.");
        let sd = read_state_dict(&torch_file(&p)).unwrap();
        assert_eq!(sd["w"].data, [1.5]);
    }

    /// Issue 36: dicts that each reference the one below twice (memo BINGETs) are 2^60 key paths; the walk used to
    /// follow them all (a hang). Now the visits are counted and the file is refused with a typed error, at once.
    #[test]
    fn a_pickle_bomb_of_shared_dicts_is_a_typed_error_not_a_hang() {
        let mut p = b"\x80\x02}q\x00(".to_vec();
        p.extend(s("w"));
        p.extend(tensor(1, 1));
        p.push(b'u');
        for level in 1..=60u8 {
            p.extend_from_slice(&[b'}', b'q', level, b'(']);
            p.extend(s("a"));
            p.extend_from_slice(&[b'h', level - 1]);
            p.extend(s("b"));
            p.extend_from_slice(&[b'h', level - 1, b'u']);
        }
        p.push(b'.');
        let t0 = std::time::Instant::now();
        let err = read_state_dict(&torch_file(&p)).unwrap_err();
        assert!(
            matches!(
                err,
                ImportError::Pickle(PickleError::SharedExpansion { .. })
            ),
            "{err}"
        );
        assert!(t0.elapsed().as_secs() < 10, "took {:?}", t0.elapsed());
    }

    /// Stride-0 views of a one-element storage under several keys: each is a legal view, together they are
    /// gigabytes from a file of bytes. Refused past twice the file's size (tied weights still read).
    #[test]
    fn views_repeating_a_storage_past_the_file_size_are_refused() {
        let mut p = b"\x80\x02}(".to_vec();
        for key in ["a", "b", "c"] {
            p.extend(s(key));
            p.extend(tensor(1 << 20, 0));
        }
        p.extend_from_slice(b"u.");
        let err = read_state_dict(&torch_file(&p)).unwrap_err();
        assert!(err.to_string().contains("twice the file's size"), "{err}");
        // One such view alone (2^20 elements, inside the allowance) is read: expands are legal views.
        let mut p = b"\x80\x02}(".to_vec();
        p.extend(s("a"));
        p.extend(tensor(1 << 20, 0));
        p.extend_from_slice(b"u.");
        assert_eq!(
            read_state_dict(&torch_file(&p)).unwrap()["a"].data.len(),
            1 << 20
        );
    }
}
