//! Structure-aware fuzzing of the whole runtime path: artifact bytes -> read -> validate -> load (lowering,
//! packing, warm-up act) -> act() -> reset / state / verify. Never a panic, never an abort, never a hang.
//!
//! The input drives edits of real artifacts (the frozen files of every format version: an MLP, the op zoo with
//! convolutions and pooling, a bf16 Gaussian, a LayerNorm SAC, a Dict observation), not only raw bytes: random
//! bytes almost never pass the checksums and the JSON grammar, so a byte-level fuzzer stops at the reader. Edits
//! replace JSON numbers with boundary values, strings with other names from the same manifest, drop or repeat
//! array elements, and overwrite weights with huge or non-finite numbers — the shapes of the issue-15 classes
//! (sizes that wrap, steps before one_hot, mismatched broadcasts, memory bombs, non-finite outputs). An input
//! that is itself an artifact (the corpus holds compiled fixtures) is mutated the same way.
//! Then a few act() calls with a batch, env ids (a range or a list, duplicates allowed), observations (boundary
//! floats, u8 where the space takes bytes), episode starts and a mode, all from the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use policyport::format::Limits;
use policyport::{Backend, CompiledPolicy, Observations, Request};
use policyport_fuzz::{Input, check_answer, edited_artifact};

fn exercise(bytes: &[u8], inp: &mut Input) {
    // A tighter memory budget than the default keeps the fuzzer within its RSS limit; the budget's own
    // arithmetic is what is under test.
    let limits = Limits { max_memory_bytes: 256 << 20, ..Limits::default() };
    let Ok(policy) = CompiledPolicy::load_with_limits(bytes, Backend::Cpu, limits) else { return };
    let info = policy.info();
    let raw_len = policy.manifest().observation.raw_len();
    let u8_obs = policy.manifest().observation.raw_dtype() == policyport::format::ObsDType::U8;
    let mut s = policy.session();
    if inp.byte() % 8 == 0 {
        s.set_max_envs(inp.u32() as usize);
    }
    for _ in 0..1 + inp.byte() % 3 {
        let batch = match inp.byte() % 16 {
            0 => inp.u32() as usize,
            1 => 0,
            b => b as usize % 5 + 1,
        };
        // Observations for `batch` rows (or a wrong count), capped so a huge batch cannot allocate here.
        let n = (batch.saturating_mul(raw_len)).min(1 << 16);
        let n = if inp.byte() % 16 == 0 { n.saturating_sub(1) } else { n };
        let obs_f: Vec<f32> = (0..n).map(|_| inp.f32()).collect();
        let obs_u: Vec<u8> = (0..n).map(|_| inp.byte()).collect();
        let ids: Vec<u32> = (0..batch.min(64)).map(|_| if inp.byte() % 2 == 0 { inp.byte() as u32 } else { inp.u32() }).collect();
        let starts: Vec<bool> = (0..batch.min(64)).map(|_| inp.byte() % 3 == 0).collect();
        let mode = inp.mode();
        let obs = if u8_obs && inp.byte() % 2 == 0 { Observations::U8(&obs_u) } else { Observations::F32(&obs_f) };
        let req = inp.envs_and_starts(Request::new(obs, batch, mode), &ids, &starts, true);
        if let Ok(out) = s.act(&req) {
            check_answer(out, batch, &info);
        }
        match inp.byte() % 4 {
            0 => {
                let _ = s.reset(&ids);
            }
            1 => {
                let _ = s.state(inp.byte() as usize % 3, inp.u32() % 70);
            }
            _ => {}
        }
    }
    if inp.byte() % 8 == 0 {
        let _ = policy.verify();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((artifact, mut inp)) = edited_artifact(data, 4, |i: &mut Input| i.f32()) else { return };
    exercise(&artifact, &mut inp);
});
