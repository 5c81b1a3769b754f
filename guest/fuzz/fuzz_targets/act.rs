//! act() on valid policies with everything else from the fuzzer: batch, env ids (ranges near u32::MAX, lists
//! with duplicates), observations (NaN, infinities, huge values, wrong counts, u8 where f32 is expected and back),
//! episode-start flags of any length, modes, then reset / state reads / max_envs changes. The policies load once
//! (the frozen files of every format version, plus every `.policy` in `$POLICYPORT_FUZZ_POLICIES` — the CI
//! passes its compiled fixtures there, recurrent ones included) and their sessions live across inputs, so state
//! carries over as it does in a game loop. Never a panic; answers are finite and of the promised sizes.
#![no_main]

use std::cell::RefCell;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use policyport::{Backend, CompiledPolicy, Observations, Request, Session};
use policyport_fuzz::{Input, SEEDS, check_answer, extra_policies};

fn policies() -> Vec<Arc<CompiledPolicy>> {
    let mut bytes: Vec<Vec<u8>> = SEEDS.iter().map(|b| b.to_vec()).collect();
    bytes.extend(extra_policies());
    bytes.iter().filter_map(|b| CompiledPolicy::load(b, Backend::Cpu).ok()).collect()
}

thread_local! {
    static SESSIONS: RefCell<Vec<Session>> = RefCell::new(policies().iter().map(|p| p.session()).collect());
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    SESSIONS.with(|s| {
        let mut sessions = s.borrow_mut();
        if sessions.is_empty() {
            return;
        }
        let n = sessions.len();
        let s = &mut sessions[inp.byte() as usize % n];
        let policy = s.policy().clone();
        let raw_len = policy.manifest().observation.raw_len();
        let info = policy.info();
        for _ in 0..1 + inp.byte() % 4 {
            let batch = match inp.byte() % 16 {
                0 => inp.u32() as usize,
                1 => 0,
                2 => 64 + inp.byte() as usize,
                b => b as usize % 6 + 1,
            };
            let want = batch.saturating_mul(raw_len).min(1 << 17);
            let count = match inp.byte() % 16 {
                0 => want + 1,
                1 => want.saturating_sub(1),
                _ => want,
            };
            let fill = inp.f32_special();
            let obs_f: Vec<f32> = (0..count).map(|i| if i < 64 { inp.f32_special() } else { fill }).collect();
            let obs_u: Vec<u8> = (0..count).map(|i| if i < 64 { inp.byte() } else { 7 }).collect();
            let ids: Vec<u32> = (0..batch.min(300))
                .map(|_| match inp.byte() % 4 {
                    0 => inp.u32(),
                    1 => u32::MAX - inp.byte() as u32,
                    _ => inp.byte() as u32,
                })
                .collect();
            let starts: Vec<bool> = (0..batch.min(300) + inp.byte() as usize % 2).map(|_| inp.byte() % 2 == 0).collect();
            let mode = inp.mode();
            let obs = if inp.byte() % 4 == 0 { Observations::U8(&obs_u) } else { Observations::F32(&obs_f) };
            let req = inp.envs_and_starts(Request::new(obs, batch, mode), &ids, &starts, true);
            if let Ok(out) = s.act(&req) {
                check_answer(out, batch, &info);
            }
            match inp.byte() % 8 {
                0 => {
                    let _ = s.reset(&ids);
                }
                1 => {
                    let _ = s.state(inp.byte() as usize % 4, inp.u32() % 300);
                }
                2 => s.set_max_envs(inp.u32() as usize % (1 << 17)),
                _ => {}
            }
        }
    });
});
