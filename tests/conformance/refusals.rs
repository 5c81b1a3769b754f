//! One table of refused calls, `tests/expected/refusals.json`, driven through every Rust-side API: the `Session`
//! on every backend (the sandbox's, `on_wasmtime`, among them), and the C ABI natively and in the sandbox. Python
//! (`tests/python/test_api.py`) and the browser (`tests/browser/run.mjs`) read the same table. Each refused call
//! must report the table's [`ErrorKind`] (the one classification every boundary maps from; issue 37) and change
//! nothing: the recurrent state of every env stays bit-identical, and the next good call answers bit for bit what
//! a session that never saw the refusals answers (issue 36: "a refused call changes nothing", for every API).

use policyport::{ActMode, Backend, EnvIds, ErrorKind, Observations, Request};
use policyport_capi::*;
use serde::Deserialize;

#[derive(Deserialize)]
pub(crate) struct Table {
    pub policy: String,
    pub obs_len: usize,
    pub actions: usize,
    pub good: Vec<Good>,
    pub load: Vec<Load>,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub(crate) struct Good {
    pub obs: Vec<f32>,
    pub env_ids: Vec<u32>,
}

#[derive(Deserialize)]
pub(crate) struct Load {
    pub name: String,
    pub bytes: String,
    pub kind: String,
}

#[derive(Deserialize)]
pub(crate) struct Case {
    pub name: String,
    /// `null` is NaN (JSON has none).
    pub obs: Vec<Option<f32>>,
    pub batch: usize,
    pub env_ids: Option<Vec<u32>>,
    pub episode_starts: Option<Vec<u8>>,
    pub action_mask: Option<Vec<u8>>,
    pub epsilon: Option<f32>,
    pub kind: String,
    /// APIs that cannot express the call ("c": the C ABI takes every length from the batch).
    #[serde(default)]
    pub not_in: Vec<String>,
}

impl Case {
    fn obs(&self) -> Vec<f32> {
        self.obs.iter().map(|v| v.unwrap_or(f32::NAN)).collect()
    }
    fn starts(&self) -> Option<Vec<bool>> {
        self.episode_starts
            .as_ref()
            .map(|s| s.iter().map(|b| *b != 0).collect())
    }
    fn mask(&self) -> Option<Vec<bool>> {
        self.action_mask
            .as_ref()
            .map(|s| s.iter().map(|b| *b != 0).collect())
    }

    /// `f` on this case's deterministic request (its observations, env ids, flags, mask and epsilon).
    fn with_request<R>(&self, f: impl FnOnce(&Request<'_>) -> R) -> R {
        let obs = self.obs();
        let starts = self.starts();
        let mask = self.mask();
        let mut req = Request::new(Observations::F32(&obs), self.batch, ActMode::Deterministic);
        if let Some(ids) = &self.env_ids {
            req = req.envs(EnvIds::List(ids));
        }
        req.episode_starts = starts.as_deref();
        req.action_mask = mask.as_deref();
        req.epsilon = self.epsilon;
        f(&req)
    }
}

pub(crate) fn table() -> (Table, Vec<u8>) {
    let dir = policyport_conformance::package_dir().join("expected");
    let table: Table =
        serde_json::from_slice(&std::fs::read(dir.join("refusals.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join(&table.policy)).unwrap();
    assert!(
        table.cases.iter().any(|c| c.kind == "observation")
            && table.cases.iter().any(|c| c.kind == "call")
    );
    for g in &table.good {
        assert_eq!(
            g.obs.len(),
            g.env_ids.len() * table.obs_len,
            "a good call of the table"
        );
    }
    (table, bytes)
}

fn kind_named(name: &str) -> ErrorKind {
    ErrorKind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .unwrap_or_else(|| panic!("refusals.json names an unknown kind {name:?}"))
}

/// Deterministic logits of a good request on a session: bit patterns, compared exactly.
fn good_bits(s: &mut policyport::Session, g: &Good) -> Vec<u32> {
    let out = s
        .act(
            &Request::new(
                Observations::F32(&g.obs),
                g.env_ids.len(),
                ActMode::Deterministic,
            )
            .envs(EnvIds::List(&g.env_ids)),
        )
        .unwrap();
    out.dist_params.iter().map(|v| v.to_bits()).collect()
}

fn state_bits(s: &mut policyport::Session, envs: &[u32]) -> Vec<u32> {
    let tensors = s
        .policy()
        .manifest()
        .recurrent
        .as_ref()
        .unwrap()
        .states
        .len();
    let mut bits = vec![];
    for k in 0..tensors {
        for &e in envs {
            bits.extend(s.state(k, e).unwrap().iter().map(|v| v.to_bits()));
        }
    }
    bits
}

fn refused_calls_report_one_kind_and_change_nothing_on_every_backend(backend: Backend) {
    let (t, bytes) = table();
    for l in &t.load {
        let e = policyport_conformance::load(l.bytes.as_bytes(), backend).unwrap_err();
        assert_eq!(e.kind(), kind_named(&l.kind), "{backend:?} {}: {e}", l.name);
    }
    let policy = policyport_conformance::load(&bytes, backend).unwrap();
    let control = {
        let mut s = policy.session();
        good_bits(&mut s, &t.good[0]);
        good_bits(&mut s, &t.good[1])
    };
    let mut s = policy.session();
    good_bits(&mut s, &t.good[0]);
    let envs = [0u32, 1, 2];
    let state = state_bits(&mut s, &envs);
    for c in &t.cases {
        let e = c
            .with_request(|req| s.act(req).map(|_| ()))
            .expect_err(&format!("{backend:?} {}: accepted", c.name));
        assert_eq!(e.kind(), kind_named(&c.kind), "{backend:?} {}: {e}", c.name);
        assert_eq!(
            state_bits(&mut s, &envs),
            state,
            "{backend:?} {}: the refused call changed the state",
            c.name
        );
    }
    assert_eq!(
        good_bits(&mut s, &t.good[1]),
        control,
        "{backend:?}: the next good call differs from a session that saw no refusal"
    );
}
per_backend!(refused_calls_report_one_kind_and_change_nothing_on_every_backend);

/// The kind of a C status (the statuses a policy error maps to; `status_of_kind` in the C ABI).
fn kind_of_status(s: PpStatus) -> Option<ErrorKind> {
    match s {
        PpStatus::InvalidArtifact => Some(ErrorKind::Artifact),
        PpStatus::BadObservation => Some(ErrorKind::Observation),
        PpStatus::BadCall => Some(ErrorKind::Call),
        PpStatus::State => Some(ErrorKind::State),
        PpStatus::Backend => Some(ErrorKind::Backend),
        PpStatus::TooLarge => Some(ErrorKind::TooLarge),
        PpStatus::NonFiniteOutput => Some(ErrorKind::NonFinite),
        PpStatus::Sandbox => Some(ErrorKind::Sandbox),
        _ => None,
    }
}

/// One `pp_policy_act_ids` call, deterministic, `dist_params` out.
unsafe fn c_act(
    p: *mut PpPolicy,
    obs: &[f32],
    batch: usize,
    ids: &[u32],
    starts: Option<&[u8]>,
    mask: Option<&[u8]>,
    epsilon: Option<f32>,
    dist: &mut Vec<f32>,
    actions: usize,
) -> PpStatus {
    dist.clear();
    dist.resize(batch.max(1) * actions, -7.0);
    // A zero batch still gets valid pointers: only the batch may be what is refused.
    let one = [0.0f32; 3];
    let obs = if obs.is_empty() { &one[..] } else { obs };
    let id0 = [0u32];
    let ids = if ids.is_empty() { &id0[..] } else { ids };
    unsafe {
        pp_policy_act_ids(
            p,
            obs.as_ptr(),
            batch,
            ids.as_ptr(),
            0,
            0,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            dist.as_mut_ptr(),
            starts.map_or(std::ptr::null(), |s| s.as_ptr()),
            mask.map_or(std::ptr::null(), |m| m.as_ptr()),
            epsilon.unwrap_or(f32::NAN),
        )
    }
}

#[test]
fn refused_calls_through_the_c_abi_report_the_same_kinds_natively_and_in_the_sandbox() {
    let (t, bytes) = table();
    let expressible: Vec<&Case> = t
        .cases
        .iter()
        .filter(|c| !c.not_in.iter().any(|a| a == "c"))
        .collect();
    assert!(expressible.len() >= 5, "the C ABI runs most of the table");
    for sandboxed in [false, true] {
        let route = if sandboxed { "sandbox" } else { "native" };
        for l in &t.load {
            let mut p: *mut PpPolicy = std::ptr::null_mut();
            let status = unsafe {
                if sandboxed {
                    let path = std::ffi::CString::new(crate::capi::plugin_path().to_str().unwrap())
                        .unwrap();
                    pp_policy_load_wasm(
                        l.bytes.as_ptr(),
                        l.bytes.len(),
                        path.as_ptr(),
                        0,
                        60_000,
                        &mut p,
                    )
                } else {
                    pp_policy_load(
                        l.bytes.as_ptr(),
                        l.bytes.len(),
                        PpBackend::Cpu as u32,
                        &mut p,
                    )
                }
            };
            assert_eq!(
                kind_of_status(status),
                Some(kind_named(&l.kind)),
                "{route} {}",
                l.name
            );
            assert!(p.is_null());
        }
        let mut dist = vec![];
        let good = |p, g: &Good, dist: &mut Vec<f32>| {
            let s = unsafe {
                c_act(
                    p,
                    &g.obs,
                    g.env_ids.len(),
                    &g.env_ids,
                    None,
                    None,
                    None,
                    dist,
                    t.actions,
                )
            };
            assert_eq!(s, PpStatus::Ok, "{route}");
            dist.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        unsafe {
            let control = crate::capi::c_load(&bytes, sandboxed);
            good(control, &t.good[0], &mut dist);
            let want = good(control, &t.good[1], &mut dist);
            pp_policy_free(control);

            let p = crate::capi::c_load(&bytes, sandboxed);
            good(p, &t.good[0], &mut dist);
            for c in &expressible {
                let status = c_act(
                    p,
                    &c.obs(),
                    c.batch,
                    c.env_ids.as_deref().unwrap_or(&[]),
                    c.episode_starts.as_deref(),
                    c.action_mask.as_deref(),
                    c.epsilon,
                    &mut dist,
                    t.actions,
                );
                assert_eq!(
                    kind_of_status(status),
                    Some(kind_named(&c.kind)),
                    "{route} {}: {status:?}",
                    c.name
                );
                assert!(
                    dist.iter().all(|v| *v == -7.0),
                    "{route} {}: a refused call wrote outputs",
                    c.name
                );
            }
            assert_eq!(
                good(p, &t.good[1], &mut dist),
                want,
                "{route}: the next good call differs from a handle that saw no refusal"
            );
            pp_policy_free(p);
        }
    }
}

/// Issue 36 item 5: an act() inside the memory budget that the machine cannot hold. burn's flex and wgpu backends
/// allocate infallibly (an abort inside burn); the policy reserves their estimate first, and the cpu backend's
/// buffers grow fallibly. An env id near u32::MAX in a session allowed 2^32 envs asks for recurrent state of
/// 2^32 envs x the LSTM's state (512 GiB: more than this machine's memory and swap, checked first, so the
/// allocator refuses it): a typed `too_large` refusal, and the session acts on as before. One test per built-in
/// backend (`per_builtin_backend!`: cpu, flex, wgpu, loaded with `CompiledPolicy::load_with_limits`).
fn an_act_the_machine_cannot_hold_is_a_typed_refusal_on_every_builtin_backend(backend: Backend) {
    // SB3's RecurrentPPO fixture: 128 bytes of LSTM state per env, so 2^32 envs are 512 GiB.
    let dir = policyport_conformance::fixtures_dir().join("sb3/recurrent_ppo_cartpole");
    let bytes = policyport_import::compile_sb3(
        &std::fs::read(dir.join("model.zip")).unwrap(),
        None,
        "recurrent_ppo_cartpole",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    let limits = policyport_format::validate::Limits {
        max_memory_bytes: u64::MAX,
        ..Default::default()
    };
    // The request must be more than the machine can give, or the allocator would grant it (and the act touch it).
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let machine = (kib("MemTotal:") + kib("SwapTotal:")) * 1024;
    assert!(
        machine > 0 && machine < 1 << 38,
        "this machine holds {machine} bytes of memory and swap: the test's 512 GiB request would not be refused"
    );
    let policy = policyport::CompiledPolicy::load_with_limits(&bytes, backend, limits).unwrap();
    let obs_len = policy.info().obs_len;
    let obs: Vec<f32> = (0..obs_len).map(|i| (i as f32 * 0.3).sin()).collect();
    let act = |s: &mut policyport::Session, env: u32| {
        s.act(
            &Request::new(Observations::F32(&obs), 1, ActMode::Deterministic)
                .envs(EnvIds::List(&[env])),
        )
        .map(|o| {
            o.dist_params
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<u32>>()
        })
    };
    let mut control = policy.session();
    act(&mut control, 3).unwrap();
    let want = act(&mut control, 3).unwrap();
    let mut s = policy.session();
    s.set_max_envs(1 << 32);
    act(&mut s, 3).unwrap();
    let e = act(&mut s, u32::MAX - 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{backend:?}: {e}");
    assert!(
        matches!(e, policyport::PolicyError::Allocation { bytes, .. } if bytes > 1 << 38),
        "{backend:?}: {e}"
    );
    assert_eq!(
        act(&mut s, 3).unwrap(),
        want,
        "{backend:?}: the refusal changed the session"
    );
}
per_builtin_backend!(an_act_the_machine_cannot_hold_is_a_typed_refusal_on_every_builtin_backend);
