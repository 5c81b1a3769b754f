//! NumPy arrays and scalars inside pickles (as `ndarray.__reduce__` writes them): `_reconstruct(ndarray, (0,),
//! b'b')` followed by `BUILD (version, shape, dtype, fortran, data)`, the dtype itself `dtype('f8', False, True)` +
//! `BUILD (3, '<', ...)`; scalars `scalar(dtype, bytes)`; NumPy 2 under protocol 5 `_frombuffer(bytearray, dtype,
//! shape, 'C')`. Decoded to f64 values with their shape, checked.

use crate::pickle::{Node, Pickle};

/// A decoded array: row-major values and the shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

fn dtype_of(pk: &Pickle, i: usize) -> Result<(String, bool), String> {
    if pk
        .call_name(i)
        .as_deref()
        .is_none_or(|n| !n.ends_with(".dtype"))
    {
        return Err("array dtype is not a numpy.dtype".into());
    }
    let Node::Call { args, state, .. } = pk.get(i) else {
        unreachable!()
    };
    let kind = pk
        .items(*args)
        .and_then(|a| a.first())
        .and_then(|k| pk.str(*k))
        .ok_or("dtype without a type code")?
        .to_string();
    // State (3, '<' | '>' | '|' | '=', ...): the byte order.
    let big = state
        .and_then(|s| pk.items(s))
        .and_then(|s| s.get(1))
        .and_then(|o| pk.str(*o))
        .is_some_and(|o| o == ">");
    Ok((kind, big))
}

fn decode(kind: &str, big: bool, raw: &[u8]) -> Result<Vec<f64>, String> {
    macro_rules! each {
        ($t:ty, $n:expr) => {
            raw.chunks_exact($n)
                .map(|c| {
                    let b: [u8; $n] = c.try_into().unwrap();
                    (if big {
                        <$t>::from_be_bytes(b)
                    } else {
                        <$t>::from_le_bytes(b)
                    }) as f64
                })
                .collect()
        };
    }
    Ok(match kind {
        "f8" => each!(f64, 8),
        "f4" => each!(f32, 4),
        "i8" => each!(i64, 8),
        "i4" => each!(i32, 4),
        "u8" => each!(u64, 8),
        "u4" => each!(u32, 4),
        "f2" => raw
            .chunks_exact(2)
            .map(|c| {
                let b: [u8; 2] = c.try_into().unwrap();
                (if big {
                    half::f16::from_be_bytes(b)
                } else {
                    half::f16::from_le_bytes(b)
                })
                .to_f64()
            })
            .collect(),
        "b1" | "u1" => raw.iter().map(|b| *b as f64).collect(),
        "i1" => raw.iter().map(|b| *b as i8 as f64).collect(),
        other => return Err(format!("numpy dtype '{other}' is not read")),
    })
}

fn elem_size(kind: &str) -> usize {
    kind.get(1..).and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// An array's shape tuple.
fn shape_of(pk: &Pickle, i: usize) -> Result<Vec<usize>, String> {
    pk.items(i)
        .ok_or("ndarray shape is not a tuple")?
        .iter()
        .map(|d| {
            pk.int(*d)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| "bad ndarray dim".to_string())
        })
        .collect()
}

/// An `ndarray` (or a NumPy scalar, as a 0-d array) at node `i`.
pub fn array(pk: &Pickle, i: usize) -> Result<Array, String> {
    match pk.call_name(i).as_deref() {
        Some("numpy.core.multiarray.scalar" | "numpy._core.multiarray.scalar") => {
            let Node::Call { args, .. } = pk.get(i) else {
                unreachable!()
            };
            let a = pk
                .items(*args)
                .filter(|a| a.len() == 2)
                .ok_or("scalar without (dtype, bytes)")?;
            let (kind, big) = dtype_of(pk, a[0])?;
            let Node::Bytes(raw) = pk.get(a[1]) else {
                return Err("scalar data is not bytes".into());
            };
            if raw.len() != elem_size(&kind) {
                return Err(format!("scalar of {} bytes for dtype {kind}", raw.len()));
            }
            Ok(Array {
                shape: vec![],
                data: decode(&kind, big, raw)?,
            })
        }
        Some("numpy.core.multiarray._reconstruct" | "numpy._core.multiarray._reconstruct") => {
            let Node::Call { state, .. } = pk.get(i) else {
                unreachable!()
            };
            let st = state
                .and_then(|s| pk.items(s))
                .filter(|s| s.len() == 5)
                .ok_or("ndarray without its (version, shape, dtype, fortran, data) state")?;
            let shape = shape_of(pk, st[1])?;
            let (kind, big) = dtype_of(pk, st[2])?;
            if pk.int(st[3]).unwrap_or(0) != 0 {
                return Err("Fortran-ordered arrays are not read".into());
            }
            let Node::Bytes(raw) = pk.get(st[4]) else {
                return Err("ndarray data is not raw bytes (an object array?)".into());
            };
            let n = shape
                .iter()
                .try_fold(1usize, |a, d| a.checked_mul(*d))
                .ok_or("ndarray size overflows")?;
            if n.checked_mul(elem_size(&kind)) != Some(raw.len()) {
                return Err(format!(
                    "ndarray of shape {shape:?} ({kind}) holds {} bytes",
                    raw.len()
                ));
            }
            Ok(Array {
                shape,
                data: decode(&kind, big, raw)?,
            })
        }
        Some("numpy.core.numeric._frombuffer" | "numpy._core.numeric._frombuffer") => {
            // Protocol 5: `_frombuffer(buffer, dtype, shape, order)`, the buffer in-band (BYTEARRAY8).
            let Node::Call { args, .. } = pk.get(i) else {
                unreachable!()
            };
            let a = pk
                .items(*args)
                .filter(|a| a.len() == 4)
                .ok_or("_frombuffer without (buffer, dtype, shape, order)")?;
            let Node::Bytes(raw) = pk.get(a[0]) else {
                return Err("_frombuffer data is not raw bytes".into());
            };
            let (kind, big) = dtype_of(pk, a[1])?;
            let shape = shape_of(pk, a[2])?;
            if pk.str(a[3]) != Some("C") {
                return Err("only C-ordered arrays are read".into());
            }
            let n = shape
                .iter()
                .try_fold(1usize, |a, d| a.checked_mul(*d))
                .ok_or("ndarray size overflows")?;
            if n.checked_mul(elem_size(&kind)) != Some(raw.len()) {
                return Err(format!(
                    "ndarray of shape {shape:?} ({kind}) holds {} bytes",
                    raw.len()
                ));
            }
            Ok(Array {
                shape,
                data: decode(&kind, big, raw)?,
            })
        }
        _ => match pk.get(i) {
            Node::Float(f) => Ok(Array {
                shape: vec![],
                data: vec![*f],
            }),
            Node::Int(v) => Ok(Array {
                shape: vec![],
                data: vec![*v as f64],
            }),
            _ => Err("not a numpy array or number".into()),
        },
    }
}

/// The attribute dict of an object pickled as `cls.__new__(cls)` + `BUILD state` (or `__reduce_ex__` through
/// `copyreg._reconstructor`): key → node.
pub fn attributes(pk: &Pickle, i: usize) -> Option<Vec<(&str, usize)>> {
    let Node::Call { state: Some(s), .. } = pk.get(i) else {
        return None;
    };
    match pk.get(*s) {
        Node::Dict(items) => Some(
            items
                .iter()
                .filter_map(|(k, v)| pk.str(*k).map(|k| (k, *v)))
                .collect(),
        ),
        _ => None,
    }
}
