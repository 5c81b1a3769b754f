//! Fuzz the artifact reader: whole files (container checks), and manifests behind valid checksums (so the
//! fuzzer reaches JSON decoding and validation instead of stopping at the checksum). Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policyport_format::container::{assemble, sections};
use policyport_format::{Limits, read_artifact, validate};

fuzz_target!(|data: &[u8]| {
    if let Ok(art) = read_artifact(data) {
        let _ = validate(&art, &Limits::default());
        if let Ok((m, w)) = sections(data) {
            // Splice: this file's weights under a mutated copy of its own manifest.
            let mut mm = m.to_vec();
            if let Some(b) = mm.get_mut(data.len() % m.len().max(1)) {
                *b = data[data.len() / 2];
            }
            if let Ok(art) = read_artifact(&assemble(&mm, w)) {
                let _ = validate(&art, &Limits::default());
            }
        }
    }
    // Raw bytes as a manifest with empty weights.
    if let Ok(art) = read_artifact(&assemble(data, b"\x02\x00\x00\x00\x00\x00\x00\x00{}")) {
        let _ = validate(&art, &Limits::default());
    }
});
