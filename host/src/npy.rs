//! Minimal reader for `.npy` arrays (float32/float64/uint8, C order), for `policyport run --obs x.npy`.

use thiserror::Error;

#[derive(Debug, Error)]
#[error("bad .npy file: {0}")]
pub struct NpyError(String);

/// Returns (shape, values as f32).
pub fn read_npy(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>), NpyError> {
    let err = |m: &str| NpyError(m.to_string());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(err("missing magic"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => return Err(NpyError(format!("version {v}"))),
    };
    let header = std::str::from_utf8(
        bytes
            .get(start..start + hlen)
            .ok_or_else(|| err("truncated header"))?,
    )
    .map_err(|_| err("header is not text"))?;
    let field = |k: &str| -> Option<&str> {
        let i = header.find(&format!("'{k}'"))? + k.len() + 2;
        Some(header[i..].trim_start_matches([':', ' ']))
    };
    let descr = field("descr").ok_or_else(|| err("no descr"))?;
    let descr = &descr[1..descr[1..].find('\'').ok_or_else(|| err("descr"))? + 1];
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(err("fortran order is not supported"));
    }
    let shape_txt = field("shape").ok_or_else(|| err("no shape"))?;
    let shape_txt = &shape_txt[1..shape_txt.find(')').ok_or_else(|| err("shape"))?];
    let shape: Vec<usize> = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| err("shape entry")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let data = &bytes[start + hlen..];
    let vals: Vec<f32> = match descr {
        "<f4" => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "<f8" => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        "|u1" => data.iter().map(|b| *b as f32).collect(),
        d => {
            return Err(NpyError(format!(
                "dtype {d} (use float32, float64 or uint8)"
            )));
        }
    };
    if vals.len() != n {
        return Err(NpyError(format!(
            "{} values for shape {shape:?}",
            vals.len()
        )));
    }
    Ok((shape, vals))
}
