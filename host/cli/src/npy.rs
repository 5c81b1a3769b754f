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
    // Parsed with strip_prefix / split_once, never byte-indexed: an empty or non-ASCII field panicked.
    let descr = field("descr").ok_or_else(|| err("no descr"))?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split_once('\''))
        .map(|(d, _)| d)
        .ok_or_else(|| err("descr"))?;
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(err("fortran order is not supported"));
    }
    let shape_txt = field("shape").ok_or_else(|| err("no shape"))?;
    let shape_txt = shape_txt
        .strip_prefix('(')
        .and_then(|t| t.split_once(')'))
        .map(|(t, _)| t)
        .ok_or_else(|| err("shape"))?;
    let shape: Vec<usize> = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| err("shape entry")))
        .collect::<Result<_, _>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err("shape overflows"))?;
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
        // Masks and episode starts (`np.bool_`, or integer flags).
        "|b1" => data.iter().map(|b| (*b != 0) as u8 as f32).collect(),
        "<i8" => data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        "<i4" => data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        d => {
            return Err(NpyError(format!(
                "dtype {d} (use float32, float64, uint8, bool, int32 or int64)"
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Headers that panicked the reader (byte slicing of empty / non-ASCII fields, an overflowing shape).
    #[test]
    fn malformed_headers_are_typed_errors() {
        for header in [
            "{'descr':",
            "{'descr': '",
            "{'descr': 'é<f4', 'shape': (2,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': é), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }",
        ] {
            let mut v = b"\x93NUMPY\x01\x00".to_vec();
            v.extend_from_slice(&(header.len() as u16).to_le_bytes());
            v.extend_from_slice(header.as_bytes());
            assert!(read_npy(&v).is_err(), "{header}");
        }
    }

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(header.len() as u16).to_le_bytes());
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn reads_what_numpy_writes() {
        let f32s: Vec<u8> = [1.0f32, -2.5, 3.0, 0.0, 4.0, 5.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            read_npy(&npy("<f4", "(2, 3)", &f32s)).unwrap(),
            (vec![2, 3], vec![1.0, -2.5, 3.0, 0.0, 4.0, 5.5])
        );
        let f64s: Vec<u8> = [0.5f64, 1.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read_npy(&npy("<f8", "(2,)", &f64s)).unwrap(),
            (vec![2], vec![0.5, 1.5])
        );
        assert_eq!(
            read_npy(&npy("|u1", "(1, 2)", &[7, 255])).unwrap(),
            (vec![1, 2], vec![7.0, 255.0])
        );
        // Masks and episode starts: NumPy bools and integer flags.
        assert_eq!(
            read_npy(&npy("|b1", "(1, 3)", &[1, 0, 1])).unwrap(),
            (vec![1, 3], vec![1.0, 0.0, 1.0])
        );
        let i64s: Vec<u8> = [3i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read_npy(&npy("<i8", "(2,)", &i64s)).unwrap(),
            (vec![2], vec![3.0, -1.0])
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(read_npy(b"not npy").is_err());
        assert!(read_npy(&npy(">f4", "(1,)", &[0; 4])).is_err());
        assert!(read_npy(&npy("<i2", "(1,)", &[0; 2])).is_err());
        assert!(read_npy(&npy("<f4", "(2, 3)", &[0; 8])).is_err());
        let mut fortran = npy("<f4", "(1,)", &[0; 4]);
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        assert!(matches!(read_npy(&fortran), Err(NpyError(m)) if m.contains("fortran")));
        assert!(read_npy(&npy("<f4", "(1,)", &[0; 4])[..12]).is_err());
    }
}
