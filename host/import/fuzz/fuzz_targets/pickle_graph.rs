#![no_main]
//! Structure-aware: the fuzzer's bytes are a program that writes a *valid* pickle rich in what hostile trainer
//! files use — memo puts and gets of already-built dicts and lists (shared references, nested: issue 36's 2^60
//! paths), dicts filled after memoisation, tensors `_rebuild_tensor_v2` over a small storage with fuzzer-chosen
//! sizes and strides (stride 0 included), `_rebuild_parameter`, `OrderedDict()` calls — so mutations explore the
//! readers' walks instead of dying in the opcode parser. The pickle goes in as a `torch.save` zip (the state-dict
//! walk), as an SB3 archive's `policy.pth`, and bare (the pickle reader, NumPy arrays in it, `detect_model`).
//! Every reader must answer in bounded time and memory with a result or a typed error.
use libfuzzer_sys::fuzz_target;
use policyport_import::zipread::stored_zip;
use policyport_import::{StorageDType, compile_sb3, detect_model, npy_pickle, pickle, torchfile};

fn bin_unicode(p: &mut Vec<u8>, s: &str) {
    p.push(b'X');
    p.extend_from_slice(&(s.len() as u32).to_le_bytes());
    p.extend_from_slice(s.as_bytes());
}

/// The pickle the program `data` writes (protocol 2). The stack discipline is kept by the generator (every op
/// leaves the stack as the grammar expects), so the result always parses up to the readers' own checks.
fn program(data: &[u8]) -> Vec<u8> {
    let mut p = b"\x80\x02".to_vec();
    let mut memo: u8 = 0; // memo slots written so far
    let mut depth = 0usize; // open dicts (a MARK pushed after each)
    // The root: a dict left open for SETITEMS.
    p.extend_from_slice(b"}q\x00(");
    memo += 1;
    depth += 1;
    let mut key = 0u32;
    let mut it = data.iter().copied();
    while let Some(op) = it.next() {
        let arg = it.next().unwrap_or(0);
        // Each op pushes one (key, value) pair into the innermost open dict, or closes / opens one.
        match op % 8 {
            0 | 1 => {
                // A value: a memoised object again (a shared reference).
                if memo > 0 {
                    bin_unicode(&mut p, &format!("k{key}"));
                    key += 1;
                    p.extend_from_slice(&[b'h', arg % memo]);
                }
            }
            2 => {
                // Open a nested dict as the next value (memoised, filled later: Python's order).
                if depth < 60 && memo < 250 {
                    bin_unicode(&mut p, &format!("k{key}"));
                    key += 1;
                    p.extend_from_slice(&[b'}', b'q', memo, b'(']);
                    memo += 1;
                    depth += 1;
                }
            }
            3 => {
                // Close the innermost dict (its SETITEMS), unless it is the root.
                if depth > 1 {
                    p.push(b'u');
                    depth -= 1;
                }
            }
            4 | 5 => {
                // A tensor over storage "0" (4 floats): size and stride from the program, stride 0 included.
                bin_unicode(&mut p, &format!("k{key}"));
                key += 1;
                let size = u32::from(arg) * u32::from(it.next().unwrap_or(1)) * 64;
                let stride = it.next().unwrap_or(1) % 3;
                p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((");
                bin_unicode(&mut p, "storage");
                p.extend_from_slice(b"ctorch\nFloatStorage\n");
                bin_unicode(&mut p, "0");
                bin_unicode(&mut p, "cpu");
                p.extend_from_slice(b"K\x04tQK\x00J");
                p.extend_from_slice(&size.to_le_bytes());
                p.extend_from_slice(&[0x85, b'K', stride, 0x85, 0x89, b'}', b't', b'R']);
                if op % 8 == 5 && memo < 250 {
                    p.extend_from_slice(&[b'q', memo]);
                    memo += 1;
                }
            }
            6 => {
                // A list of two shared references (memoised).
                if memo > 0 && memo < 250 {
                    bin_unicode(&mut p, &format!("k{key}"));
                    key += 1;
                    p.extend_from_slice(&[b']', b'q', memo, b'(', b'h', arg % memo, b'h', arg / 2 % memo, b'e']);
                    memo += 1;
                }
            }
            _ => {
                // An OrderedDict() call as the value, filled by the next pairs until closed.
                if depth < 60 && memo < 250 {
                    bin_unicode(&mut p, &format!("k{key}"));
                    key += 1;
                    p.extend_from_slice(b"ccollections\nOrderedDict\n)R");
                    p.extend_from_slice(&[b'q', memo, b'(']);
                    memo += 1;
                    depth += 1;
                }
            }
        }
    }
    for _ in 0..depth {
        p.push(b'u');
    }
    p.push(b'.');
    p
}

fuzz_target!(|data: &[u8]| {
    let pkl = program(data);
    if let Ok(pk) = pickle::parse(&pkl) {
        for i in 0..pk.nodes.len().min(64) {
            let _ = npy_pickle::array(&pk, i);
        }
    }
    let storage = [0u8; 16];
    let torch = stored_zip(&[("archive/data.pkl", &pkl), ("archive/data/0", &storage)]);
    let _ = detect_model(&torch);
    let _ = torchfile::read_state_dict(&torch);
    let sb3 = stored_zip(&[("data", b"{}"), ("policy.pth", &torch)]);
    let _ = compile_sb3(&sb3, None, "fuzz", None, StorageDType::F32);
});
