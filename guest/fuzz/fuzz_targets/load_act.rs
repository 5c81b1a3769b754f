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
use policyport::format::container::{assemble, sections};
use policyport::format::{Limits, MAGIC};
use policyport::{ActMode, Backend, CompiledPolicy, EnvIds, Observations, Request};
use serde_json::Value;

const SEEDS: &[&[u8]] = &[
    include_bytes!("../../../tests/frozen/v1.0/cartpole.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.0/ops.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.0/pendulum.bf16.policy"),
    include_bytes!("../../../tests/frozen/v1.1/layernorm_sac.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.2/sb3_multi_input_dict.f32.policy"),
];

/// Reads decisions from the fuzzer's bytes (zeros once they run out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.u32() as usize % n }
    }
    /// A number worth trying where a size, an index or a value goes.
    fn number(&mut self) -> f64 {
        const INTERESTING: &[f64] = &[
            0.0, 1.0, -1.0, 2.0, 3.0, 7.0, 64.0, 255.0, 256.0, 1e-30, 0.5, -0.5, 1e30, -1e30, 3.4e38, -3.4e38,
            4294967295.0, 4294967296.0, 16777216.0, 16777217.0, 268435456.0, 1e15, 9.007199254740992e15,
            1.8446744073709552e19, -4294967296.0,
        ];
        match self.byte() % 4 {
            0 => INTERESTING[self.below(INTERESTING.len())],
            1 => self.u32() as f64,
            2 => f32::from_bits(self.u32()) as f64,
            _ => self.byte() as f64,
        }
    }
    fn f32(&mut self) -> f32 {
        match self.byte() % 8 {
            0 => f32::from_bits(self.u32()),
            1 => [0.0, -0.0, 1e30, -1e30, f32::MAX, f32::MIN, f32::MIN_POSITIVE, 1e-40][self.below(8)],
            _ => (self.byte() as f32 - 128.0) / 16.0,
        }
    }
}

/// Every JSON path in `v` (objects and arrays, depth-first).
fn paths(v: &Value, at: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                at.push(Value::String(k.clone()));
                paths(c, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                at.push(Value::from(i));
                paths(c, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn get_mut<'v>(v: &'v mut Value, path: &[Value]) -> Option<&'v mut Value> {
    let mut cur = v;
    for p in path {
        cur = match p {
            Value::String(k) => cur.get_mut(k.as_str())?,
            Value::Number(i) => cur.get_mut(i.as_u64()? as usize)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Object(m) => m.values().for_each(|c| strings(c, out)),
        Value::Array(a) => a.iter().for_each(|c| strings(c, out)),
        _ => {}
    }
}

/// One structural edit of the manifest.
fn mutate(v: &mut Value, inp: &mut Input) {
    let mut all = vec![];
    paths(v, &mut vec![], &mut all);
    let mut names = vec![];
    strings(v, &mut names);
    let path = all[inp.below(all.len())].clone();
    let choice = inp.byte() % 8;
    let number = inp.number();
    let name = names.get(inp.below(names.len())).cloned().unwrap_or_default();
    let Some(node) = get_mut(v, &path) else { return };
    match (choice, &mut *node) {
        (0 | 1, Value::Number(_)) => {
            *node = serde_json::Number::from_f64(number).map(Value::Number).unwrap_or(Value::Null)
        }
        (2, Value::Number(_)) => *node = Value::from(number as i64),
        (0..=2, Value::String(_)) => *node = Value::String(name),
        (3, Value::Array(a)) if !a.is_empty() => {
            let i = (number as usize) % a.len();
            a.remove(i);
        }
        (4, Value::Array(a)) if !a.is_empty() => {
            let i = (number as usize) % a.len();
            let dup = a[i].clone();
            a.insert(i, dup);
        }
        (5, Value::Array(a)) => a.push(Value::from(number)),
        (6, Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth((number as usize) % m.len()).cloned().unwrap_or_default();
            m.remove(&k);
        }
        (7, _) => *node = Value::from(vec![number, number]),
        _ => *node = Value::from(number),
    }
}

/// Overwrite a few f32 words of the weights (after the safetensors header) with fuzzer values.
fn mutate_weights(w: &mut [u8], inp: &mut Input) {
    if w.len() < 8 {
        return;
    }
    let header = u64::from_le_bytes(w[..8].try_into().unwrap()).min(w.len() as u64) as usize + 8;
    let words = (w.len().saturating_sub(header)) / 4;
    for _ in 0..inp.byte() % 4 {
        if words == 0 {
            return;
        }
        let at = header + 4 * inp.below(words);
        if let Some(dst) = w.get_mut(at..at + 4) {
            dst.copy_from_slice(&inp.f32().to_le_bytes());
        }
    }
}

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
        let mode = if inp.byte() % 2 == 0 {
            ActMode::Deterministic
        } else {
            ActMode::Sample { seed: inp.u32() as u64, step: inp.u32() as u64 }
        };
        let obs = if u8_obs && inp.byte() % 2 == 0 { Observations::U8(&obs_u) } else { Observations::F32(&obs_f) };
        let mut req = Request::new(obs, batch, mode);
        req = match inp.byte() % 3 {
            0 => req.envs(EnvIds::Range(inp.u32())),
            1 => req.envs(EnvIds::List(&ids)),
            _ => req,
        };
        if inp.byte() % 2 == 0 {
            req = req.episode_starts(&starts);
        }
        if let Ok(out) = s.act(&req) {
            // An answer is finite (non-finite outputs are a typed error).
            assert!(out.continuous.iter().chain(&out.value).chain(&out.dist_params).all(|x| x.is_finite()));
            assert_eq!(out.batch, batch);
            assert_eq!(out.dist_params.len(), batch * info.dist_params_len);
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
    let mut inp = Input(data);
    // An input that is an artifact itself is the base; otherwise one of the seeds.
    let base: &[u8] = if data.starts_with(MAGIC) {
        data
    } else {
        SEEDS[inp.below(SEEDS.len())]
    };
    let Ok((m, w)) = sections(base) else { return };
    let Ok(mut manifest) = serde_json::from_slice::<Value>(m) else { return };
    let mut weights = w.to_vec();
    if base.as_ptr() == data.as_ptr() {
        // Decisions come from the tail of the input, after the artifact.
        inp = Input(&data[data.len().saturating_sub(256)..]);
    }
    for _ in 0..inp.byte() % 5 {
        mutate(&mut manifest, &mut inp);
    }
    mutate_weights(&mut weights, &mut inp);
    let Ok(m) = serde_json::to_vec(&manifest) else { return };
    exercise(&assemble(&m, &weights), &mut inp);
});
