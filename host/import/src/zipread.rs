//! The zip archives trainers write (PyTorch's `torch.save` format, Stable-Baselines3's `model.save()`): entries are
//! stored uncompressed by both writers, so this reader lists the central directory (zip64 included) and hands out
//! stored entries as slices of the input; a compressed entry is a typed error saying so. Every offset and size is
//! checked against the input before use.

use std::collections::BTreeMap;

use crate::ImportError;

fn bad(detail: impl Into<String>) -> ImportError {
    ImportError::Malformed(format!("zip: {}", detail.into()))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, ImportError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, ImportError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, ImportError> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| bad(format!("truncated at byte {at}")))
}

fn to_usize(v: u64) -> Result<usize, ImportError> {
    usize::try_from(v).map_err(|_| bad("offset does not fit in memory"))
}

struct Entry {
    method: u16,
    data: std::ops::Range<usize>,
}

/// A zip archive's entries by name.
pub struct Zip<'a> {
    bytes: &'a [u8],
    entries: BTreeMap<String, Entry>,
}

/// Does this look like a zip archive (local file header magic)?
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

impl<'a> Zip<'a> {
    pub fn open(bytes: &'a [u8]) -> Result<Self, ImportError> {
        // End of central directory: 22 bytes + a comment of at most 65535.
        let min = bytes.len().saturating_sub(22 + 65_535);
        let eocd = (min..=bytes.len().saturating_sub(22))
            .rev()
            .find(|&i| bytes[i..].starts_with(b"PK\x05\x06"))
            .ok_or_else(|| bad("no end-of-central-directory record (not a zip archive?)"))?;
        let mut count = u16_at(bytes, eocd + 10)? as u64;
        let mut cd_size = u32_at(bytes, eocd + 12)? as u64;
        let mut cd_offset = u32_at(bytes, eocd + 16)? as u64;
        if (count == 0xFFFF || cd_offset == 0xFFFF_FFFF || cd_size == 0xFFFF_FFFF) && eocd >= 20 {
            // Zip64: the locator sits just before the classic record and points to the zip64 record.
            let loc = eocd - 20;
            if bytes[loc..].starts_with(b"PK\x06\x07") {
                let rec = to_usize(u64_at(bytes, loc + 8)?)?;
                if !bytes
                    .get(rec..)
                    .is_some_and(|s| s.starts_with(b"PK\x06\x06"))
                {
                    return Err(bad("zip64 record missing"));
                }
                count = u64_at(bytes, rec + 32)?;
                cd_size = u64_at(bytes, rec + 40)?;
                cd_offset = u64_at(bytes, rec + 48)?;
            }
        }
        let cd_start = to_usize(cd_offset)?;
        let cd_end = cd_start
            .checked_add(to_usize(cd_size)?)
            .filter(|e| *e <= bytes.len())
            .ok_or_else(|| bad("central directory outside the file"))?;
        // Each central entry takes at least 46 bytes: a count larger than that is a lie.
        if count > (cd_end - cd_start) as u64 / 46 {
            return Err(bad(format!(
                "{count} entries cannot fit the central directory"
            )));
        }
        let mut entries = BTreeMap::new();
        let mut at = cd_start;
        for _ in 0..count {
            if !bytes[at..cd_end].starts_with(b"PK\x01\x02") {
                return Err(bad(format!("bad central directory entry at byte {at}")));
            }
            let method = u16_at(bytes, at + 10)?;
            let mut csize = u32_at(bytes, at + 20)? as u64;
            let mut usize_ = u32_at(bytes, at + 24)? as u64;
            let name_len = u16_at(bytes, at + 28)? as usize;
            let extra_len = u16_at(bytes, at + 30)? as usize;
            let comment_len = u16_at(bytes, at + 32)? as usize;
            let mut local = u32_at(bytes, at + 42)? as u64;
            let name_at = at + 46;
            let extra_at = name_at + name_len;
            let next = extra_at + extra_len + comment_len;
            if next > cd_end {
                return Err(bad("central directory entry overruns the directory"));
            }
            let name = String::from_utf8_lossy(&bytes[name_at..extra_at]).into_owned();
            // Zip64 extra field (0x0001): the 64-bit values, in order, of whichever fields were 0xFFFFFFFF.
            let mut e = extra_at;
            while e + 4 <= extra_at + extra_len {
                let id = u16_at(bytes, e)?;
                let len = u16_at(bytes, e + 2)? as usize;
                if id == 1 {
                    let mut f = e + 4;
                    for v in [&mut usize_, &mut csize, &mut local] {
                        if *v == 0xFFFF_FFFF && f + 8 <= e + 4 + len {
                            *v = u64_at(bytes, f)?;
                            f += 8;
                        }
                    }
                }
                e += 4 + len;
            }
            let local = to_usize(local)?;
            if !bytes
                .get(local..)
                .is_some_and(|s| s.starts_with(b"PK\x03\x04"))
            {
                return Err(bad(format!("entry '{name}': no local header")));
            }
            let data_start = local
                .checked_add(30)
                .and_then(|v| v.checked_add(u16_at(bytes, local + 26).ok()? as usize))
                .and_then(|v| v.checked_add(u16_at(bytes, local + 28).ok()? as usize))
                .ok_or_else(|| bad("local header overflows"))?;
            let data_end = data_start
                .checked_add(to_usize(csize)?)
                .filter(|e| *e <= bytes.len())
                .ok_or_else(|| bad(format!("entry '{name}' runs past the end of the file")))?;
            if method == 0 && csize != usize_ {
                return Err(bad(format!(
                    "stored entry '{name}' has two different sizes"
                )));
            }
            entries.insert(
                name,
                Entry {
                    method,
                    data: data_start..data_end,
                },
            );
            at = next;
        }
        Ok(Zip { bytes, entries })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|s| s.as_str())
    }

    /// The bytes of a stored entry; `None` if there is no such entry.
    pub fn get(&self, name: &str) -> Option<Result<&'a [u8], ImportError>> {
        self.entries.get(name).map(|e| {
            if e.method != 0 {
                return Err(ImportError::Unsupported {
                    what: format!("zip entry '{name}' is compressed (method {})", e.method),
                    hint: "PyTorch and Stable-Baselines3 store entries uncompressed; re-save the file with them"
                        .into(),
                });
            }
            Ok(&self.bytes[e.data.clone()])
        })
    }
}

/// An archive of uncompressed (stored) entries, CRCs left zero (this reader does not check them): what tests and
/// tools build hostile or minimal archives with. Sizes past 4 GiB are not written.
pub fn stored_zip(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = vec![];
    let mut central = vec![];
    for (name, data) in entries {
        let offset = out.len() as u32;
        let mut h = vec![];
        h.extend_from_slice(b"PK\x03\x04");
        h.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        h.extend_from_slice(&0u32.to_le_bytes()); // crc (not checked)
        h.extend_from_slice(&(data.len() as u32).to_le_bytes());
        h.extend_from_slice(&(data.len() as u32).to_le_bytes());
        h.extend_from_slice(&(name.len() as u16).to_le_bytes());
        h.extend_from_slice(&0u16.to_le_bytes());
        h.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        let mut c = vec![];
        c.extend_from_slice(b"PK\x01\x02");
        c.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        c.extend_from_slice(&0u32.to_le_bytes());
        c.extend_from_slice(&(data.len() as u32).to_le_bytes());
        c.extend_from_slice(&(data.len() as u32).to_le_bytes());
        c.extend_from_slice(&(name.len() as u16).to_le_bytes());
        c.extend_from_slice(&[0; 12]);
        c.extend_from_slice(&offset.to_le_bytes());
        c.extend_from_slice(name.as_bytes());
        central.extend_from_slice(&c);
    }
    let cd_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}
