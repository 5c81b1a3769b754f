//! What the fuzz targets share: the frozen artifacts they start from, the reader of fuzzer decisions, the
//! structure-aware edits of an artifact's manifest and weights, and the loading of extra policies
//! (`$POLICYPORT_FUZZ_POLICIES`).

use policyport::format::MAGIC;
use policyport::{ActMode, ActOutputs, EnvIds, PolicyInfo, Request};
use policyport::format::container::{assemble, sections};
use serde_json::Value;

/// The frozen files of every format version: an MLP, the op zoo with convolutions and pooling, a bf16 Gaussian,
/// a LayerNorm SAC, a Dict observation.
pub const SEEDS: &[&[u8]] = &[
    include_bytes!("../../../tests/frozen/v1.0/cartpole.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.0/ops.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.0/pendulum.bf16.policy"),
    include_bytes!("../../../tests/frozen/v1.1/layernorm_sac.f32.policy"),
    include_bytes!("../../../tests/frozen/v1.2/sb3_multi_input_dict.f32.policy"),
];

/// Reads decisions from the fuzzer's bytes (zeros once they run out).
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.u32() as usize % n }
    }
    /// A number worth trying where a size, an index or a value goes.
    pub fn number(&mut self) -> f64 {
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
    pub fn f32(&mut self) -> f32 {
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
pub fn mutate(v: &mut Value, inp: &mut Input) {
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
pub fn mutate_weights(w: &mut [u8], inp: &mut Input, value: fn(&mut Input) -> f32) {
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
            dst.copy_from_slice(&value(inp).to_le_bytes());
        }
    }
}

impl Input<'_> {
    /// Observation-like values, special ones included (NaN, infinities, the float range's ends).
    pub fn f32_special(&mut self) -> f32 {
        match self.byte() % 8 {
            0 => f32::from_bits(self.u32()),
            1 => [0.0, -0.0, 1e30, -1e30, f32::MAX, f32::MIN, f32::NAN, f32::INFINITY][self.byte() as usize % 8],
            2 => self.byte() as f32,
            _ => (self.byte() as f32 - 128.0) / 32.0,
        }
    }
    /// A value in [-8, 8) in steps of 1/16: a weight or an observation that overflows nothing.
    pub fn f32_moderate(&mut self) -> f32 {
        (self.byte() as f32 - 128.0) / 16.0
    }
}

/// Structure-aware edit of an artifact: the base is the input itself when it is an artifact (the corpus holds
/// compiled fixtures), else one of [`SEEDS`]; then up to `max_edits` manifest edits and a few weight words
/// overwritten with `weight(inp)`. Returns the edited artifact and the reader positioned at the decisions left.
pub fn edited_artifact<'a>(data: &'a [u8], max_edits: u8, weight: fn(&mut Input) -> f32) -> Option<(Vec<u8>, Input<'a>)> {
    let mut inp = Input(data);
    let base: &[u8] = if data.starts_with(MAGIC) { data } else { SEEDS[inp.below(SEEDS.len())] };
    let (m, w) = sections(base).ok()?;
    let mut manifest = serde_json::from_slice::<Value>(m).ok()?;
    let mut weights = w.to_vec();
    if base.as_ptr() == data.as_ptr() {
        // Decisions come from the tail of the input, after the artifact.
        inp = Input(&data[data.len().saturating_sub(256)..]);
    }
    for _ in 0..inp.byte() % (max_edits + 1) {
        mutate(&mut manifest, &mut inp);
    }
    mutate_weights(&mut weights, &mut inp, weight);
    let m = serde_json::to_vec(&manifest).ok()?;
    Some((assemble(&m, &weights), inp))
}

/// The `.policy` files (under 1 MiB) in `$POLICYPORT_FUZZ_POLICIES`, in name order: the CI passes its compiled
/// fixtures there (recurrent ones included).
pub fn extra_policies() -> Vec<Vec<u8>> {
    let Some(dir) = std::env::var_os("POLICYPORT_FUZZ_POLICIES") else { return vec![] };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "policy") && std::fs::metadata(p).is_ok_and(|m| m.len() < 1 << 20))
        .collect();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

impl Input<'_> {
    /// Deterministic, or sampling with a fuzzer-chosen seed and step.
    pub fn mode(&mut self) -> ActMode {
        if self.byte() % 2 == 0 {
            ActMode::Deterministic
        } else {
            ActMode::Sample { seed: self.u32() as u64, step: self.u32() as u64 }
        }
    }

    /// `req` with env ids (a range from anywhere in u32 when `any_range`, else from 0..256; the list `ids`; or
    /// none) and perhaps the episode starts `starts`, as the input decides.
    pub fn envs_and_starts<'r>(&mut self, mut req: Request<'r>, ids: &'r [u32], starts: &'r [bool], any_range: bool) -> Request<'r> {
        req = match self.byte() % 3 {
            0 => req.envs(EnvIds::Range(if any_range { self.u32() } else { self.byte() as u32 })),
            1 => req.envs(EnvIds::List(ids)),
            _ => req,
        };
        if self.byte() % 2 == 0 {
            req = req.episode_starts(starts);
        }
        req
    }
}

/// What every answer promises: its batch, the sizes `info` gives, and finite numbers (non-finite outputs are a
/// typed error).
pub fn check_answer(out: &ActOutputs, batch: usize, info: &PolicyInfo) {
    assert_eq!(out.batch, batch);
    assert_eq!(out.dist_params.len(), batch * info.dist_params_len);
    assert!(out.continuous.iter().chain(&out.value).chain(&out.dist_params).all(|x| x.is_finite()));
}
