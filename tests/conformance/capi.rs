use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use policyport::{ActMode, Backend, CompiledPolicy, Observations, Request};
use policyport_capi::*;
use policyport_conformance::{compile_fixture, load_fixture};

fn last_error() -> String {
    unsafe { CStr::from_ptr(pp_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn target_profile_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

#[test]
fn c_abi_errors_are_typed_and_never_panic() {
    let bytes = compile_fixture(&load_fixture("cartpole"));
    let mut p: *mut PpPolicy = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            pp_policy_load(b"junk".as_ptr(), 4, PpBackend::Cpu as u32, &mut p),
            PpStatus::InvalidArtifact
        );
        assert!(last_error().contains("truncated"), "{}", last_error());
        assert_eq!(
            pp_policy_load(
                bytes.as_ptr(),
                bytes.len(),
                PpBackend::Cpu as u32,
                std::ptr::null_mut()
            ),
            PpStatus::NullPointer
        );
        assert_eq!(
            pp_policy_load(std::ptr::null(), 10, PpBackend::Cpu as u32, &mut p),
            PpStatus::NullPointer
        );
        assert_eq!(
            pp_policy_load(bytes.as_ptr(), bytes.len(), PpBackend::Cpu as u32, &mut p),
            PpStatus::Ok
        );
        let mut info = PpInfo::default();
        assert_eq!(pp_policy_info(p, &mut info), PpStatus::Ok);
        assert_eq!(
            (
                info.obs_len,
                info.action_len,
                info.discrete,
                info.has_value,
                info.sandboxed
            ),
            (4, 1, 1, 1, 0)
        );
        let nan = [0.0f32, f32::NAN, 0.0, 0.0];
        let mut a = [0i64; 1];
        let st = pp_policy_act(
            p,
            nan.as_ptr(),
            1,
            0,
            1,
            1,
            1,
            a.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null(),
        );
        assert_eq!(st, PpStatus::BadObservation);
        assert!(last_error().contains("non-finite"));
        let ok = [0.01f32, 0.0, 0.02, 0.0];
        // Sentinels no policy writes: the call must overwrite both (a zeroed action was indistinguishable from
        // "nothing written" for CartPole, whose actions are 0 and 1).
        a[0] = -1;
        let mut v = [f32::NAN; 1];
        let st = pp_policy_act(
            p,
            ok.as_ptr(),
            1,
            0,
            1,
            1,
            1,
            a.as_mut_ptr(),
            std::ptr::null_mut(),
            v.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null(),
        );
        assert_eq!(st, PpStatus::Ok);
        let mut native = CompiledPolicy::load(&bytes, Backend::Cpu)
            .unwrap()
            .session();
        let want = native
            .act(&Request::new(
                Observations::F32(&ok),
                1,
                ActMode::Sample { seed: 1, step: 1 },
            ))
            .unwrap();
        assert_eq!(
            a.as_slice(),
            want.discrete.as_slice(),
            "C ABI action = the runtime's"
        );
        assert_eq!(
            v.as_slice(),
            want.value.as_slice(),
            "C ABI value = the runtime's"
        );
        assert_eq!(
            pp_policy_act(
                p,
                ok.as_ptr(),
                0,
                0,
                0,
                0,
                0,
                a.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null()
            ),
            PpStatus::BadCall
        );
        // Misaligned buffers and a huge batch with episode-start flags: typed statuses, checked before any
        // slice is made from the caller's pointers (these were undefined behaviour / an out-of-bounds read).
        let raw = [0u8; 64];
        // An odd address: never aligned for f32.
        let misaligned = raw.as_ptr().wrapping_add(1 - raw.as_ptr() as usize % 2) as *const f32;
        let st = pp_policy_act(
            p,
            misaligned,
            1,
            0,
            0,
            0,
            0,
            a.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null(),
        );
        assert_eq!(st, PpStatus::BadCall);
        assert!(last_error().contains("aligned"), "{}", last_error());
        let flags = [1u8; 1];
        let st = pp_policy_act(
            p,
            ok.as_ptr(),
            usize::MAX / 2,
            0,
            0,
            0,
            0,
            a.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            flags.as_ptr(),
        );
        assert_eq!(st, PpStatus::BadCall);
        assert_eq!(pp_policy_reset(p, [3u32].as_ptr(), 1), PpStatus::Ok);
        // Intra-op threads: on, off, a typed refusal for an absurd count, a null policy.
        assert_eq!(pp_policy_set_threads(p, 2), PpStatus::Ok);
        assert_eq!(pp_policy_set_threads(p, 1_000_000), PpStatus::Backend);
        assert!(last_error().contains("threads"), "{}", last_error());
        // How the threads are used: the two modes, a typed refusal for another code, a null policy.
        assert_eq!(
            pp_policy_set_thread_split(p, PP_THREAD_SPLIT_ALWAYS),
            PpStatus::Ok
        );
        assert_eq!(
            pp_policy_set_thread_split(p, PP_THREAD_SPLIT_MEASURED),
            PpStatus::Ok
        );
        assert_eq!(pp_policy_set_thread_split(p, 2), PpStatus::BadCall);
        assert!(last_error().contains("thread split 2"), "{}", last_error());
        assert_eq!(
            pp_policy_set_thread_split(std::ptr::null_mut(), 0),
            PpStatus::NullPointer
        );
        assert_eq!(pp_policy_set_threads(p, 1), PpStatus::Ok);
        assert_eq!(
            pp_policy_set_threads(std::ptr::null_mut(), 2),
            PpStatus::NullPointer
        );
        pp_policy_free(p);
        pp_policy_free(std::ptr::null_mut());
        assert_eq!(
            pp_policy_info(std::ptr::null(), &mut info),
            PpStatus::NullPointer
        );
        // The sandboxed route: a missing plugin file is an I/O error, a bad artifact a typed one.
        let missing = c"/nonexistent/policyport_plugin.wasm";
        assert_eq!(
            pp_policy_load_wasm(bytes.as_ptr(), bytes.len(), missing.as_ptr(), 0, 0, &mut p),
            PpStatus::Io
        );
    }
}

/// The backend is a code, not a Rust enum, at the boundary: an unknown one is a typed BadCall (as an enum
/// parameter it was undefined behaviour before any check); `PP_BACKEND_CPU_BF16` loads the bf16 kernels where
/// the CPU has AVX512-BF16 (values within bf16 tolerance of f32, and not bit-identical: bf16 ran) and is a typed
/// Backend error elsewhere.
#[test]
fn c_abi_backend_codes_unknown_refused_and_bf16_on_request() {
    let bytes = compile_fixture(&load_fixture("cartpole"));
    let value_of = |p: *mut PpPolicy| -> f32 {
        let ok = [0.01f32, 0.2, 0.02, -0.3];
        let (mut a, mut v) = ([-1i64; 1], [f32::NAN; 1]);
        // SAFETY: the buffers hold one env's observation, action and value.
        let st = unsafe {
            pp_policy_act(
                p,
                ok.as_ptr(),
                1,
                0,
                1,
                1,
                1,
                a.as_mut_ptr(),
                std::ptr::null_mut(),
                v.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null(),
            )
        };
        assert_eq!(st, PpStatus::Ok, "{}", last_error());
        v[0]
    };
    unsafe {
        let mut p: *mut PpPolicy = std::ptr::null_mut();
        for code in [3u32, 7, u32::MAX] {
            assert_eq!(
                pp_policy_load(bytes.as_ptr(), bytes.len(), code, &mut p),
                PpStatus::BadCall
            );
            assert!(
                last_error().contains(&format!("backend {code}")),
                "{}",
                last_error()
            );
            assert!(p.is_null());
        }
        assert_eq!(
            pp_policy_load(bytes.as_ptr(), bytes.len(), PpBackend::Cpu as u32, &mut p),
            PpStatus::Ok
        );
        let f32_value = value_of(p);
        pp_policy_free(p);
        p = std::ptr::null_mut();
        let st = pp_policy_load(
            bytes.as_ptr(),
            bytes.len(),
            PpBackend::CpuBf16 as u32,
            &mut p,
        );
        if crate::cpu_bf16::bf16_expected() {
            assert_eq!(st, PpStatus::Ok, "{}", last_error());
            let bf16_value = value_of(p);
            pp_policy_free(p);
            assert!(
                (bf16_value - f32_value).abs() <= 1e-2 * (1.0 + f32_value.abs()),
                "bf16 {bf16_value} vs f32 {f32_value}"
            );
            assert_ne!(
                bf16_value.to_bits(),
                f32_value.to_bits(),
                "the bf16 kernels did not run"
            );
        } else {
            assert_eq!(st, PpStatus::Backend);
            assert!(last_error().contains("avx512_bf16"), "{}", last_error());
            assert!(p.is_null());
        }
    }
}

/// The C example, built with the system C compiler against the cbindgen header and the cdylib, runs the
/// trained CartPole policy natively and inside the wasm sandbox.
/// Compile `host/capi/examples/<name>.c` against the built library (warnings are errors) into `dir`.
pub(crate) fn compile_c_example(name: &str, dir: &Path) -> std::path::PathBuf {
    let lib_dir = target_profile_dir();
    let header_dir = Path::new(HEADER).parent().unwrap();
    let example =
        policyport_conformance::package_dir().join(format!("../host/capi/examples/{name}.c"));
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(&example)
        .arg(format!("-I{}", header_dir.display()))
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lpolicyport_capi", "-lm", "-o"])
        .arg(&exe)
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "C example {name}.c failed to compile");
    exe
}

#[test]
fn c_example_runs_cartpole_natively_and_sandboxed() {
    let dir = std::env::temp_dir().join(format!("policyport-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let artifact = dir.join("cartpole.policy");
    std::fs::write(&artifact, compile_fixture(&load_fixture("cartpole"))).unwrap();
    let lib_dir = target_profile_dir();
    assert!(
        lib_dir.join("libpolicyport_capi.so").exists(),
        "build the workspace first (cdylib missing in {})",
        lib_dir.display()
    );
    let exe = compile_c_example("cartpole", &dir);
    let run = |args: &[&Path]| {
        let out = Command::new(&exe).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        println!("{}", text.trim());
        let mean: f64 = text
            .split("mean return ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        mean
    };
    let native = run(&[&artifact]);
    assert!(native >= 475.0, "native mean return {native}");
    let plugin = target_profile_dir()
        .parent()
        .unwrap()
        .join("wasm32-unknown-unknown/plugin/policyport_plugin.wasm");
    let sandboxed = run(&[&artifact, &plugin]);
    assert_eq!(
        native, sandboxed,
        "the sandboxed policy must play the same episodes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The C example for recurrent and pixel policies (host/capi/examples/rollout.c), natively and sandboxed: the
/// SB3 RecurrentPPO CnnLstmPolicy (NatureCNN on uint8 frames, then an LSTM) stepped through its rollout with the
/// rollout's episode starts as `episode_starts`, and CleanRL's Atari LSTM: every step's actions are the trainer's
/// own, every value within 1e-5 of the trainer's network run over the sequence.
#[test]
fn c_rollout_example_steps_recurrent_pixel_policies_like_their_trainers() {
    let dir = std::env::temp_dir().join(format!("policyport-c-rollout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile_c_example("rollout", &dir);
    let plugin = target_profile_dir()
        .parent()
        .unwrap()
        .join("wasm32-unknown-unknown/plugin/policyport_plugin.wasm");
    let fixtures = policyport_conformance::fixtures_dir();
    let sb3 = fixtures.join("sb3/recurrent_ppo_cnn_frames");
    let bytes = policyport_import::compile_sb3(
        &std::fs::read(sb3.join("model.zip")).unwrap(),
        None,
        "sb3/recurrent_ppo_cnn_frames",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    let cl = fixtures.join("cleanrl/ppo_atari_lstm");
    let spaces: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cl.join("spaces.json")).unwrap()).unwrap();
    let atari = policyport_import::compile_cleanrl(
        &std::fs::read(cl.join("agent.pt")).unwrap(),
        policyport_import::CleanrlLayout::AtariLstm,
        serde_json::from_value(spaces["observation"].clone()).unwrap(),
        serde_json::from_value(spaces["action"].clone()).unwrap(),
        "cleanrl/ppo_atari_lstm",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    for (name, bytes, seq) in [
        ("sb3_cnn_lstm", bytes, sb3.join("sequence.json")),
        ("cleanrl_atari_lstm", atari, cl.join("sequence.json")),
    ] {
        let rollout: serde_json::Value =
            serde_json::from_slice(&std::fs::read(seq).unwrap()).unwrap();
        let envs = rollout["envs"].as_u64().unwrap() as usize;
        let steps = rollout["steps"].as_array().unwrap();
        let obs_len = steps[0]["obs"].as_array().unwrap().len() / envs;
        let mut text = format!("{envs} {} {obs_len}\n", steps.len());
        for s in steps {
            for f in s["episode_starts"].as_array().unwrap() {
                text += if f.as_bool().unwrap() { "1 " } else { "0 " };
            }
            for v in s["obs"].as_array().unwrap() {
                text += &format!("{} ", v.as_f64().unwrap() as f32);
            }
            text += "\n";
        }
        let (art, input) = (
            dir.join(format!("{name}.policy")),
            dir.join(format!("{name}.txt")),
        );
        std::fs::write(&art, &bytes).unwrap();
        std::fs::write(&input, text).unwrap();
        let mut outputs = vec![];
        for extra in [None, Some(&plugin)] {
            let mut cmd = Command::new(&exe);
            cmd.arg(&art).arg(&input);
            if let Some(p) = extra {
                cmd.arg(p);
            }
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), steps.len(), "{name}");
            for (t, (line, s)) in lines.iter().zip(steps).enumerate() {
                let (acts, vals) = line.split_once('|').unwrap();
                let got: Vec<f64> = acts
                    .split_whitespace()
                    .map(|a| a.parse().unwrap())
                    .collect();
                let want: Vec<f64> = serde_json::from_value(s["trainer_actions"].clone()).unwrap();
                assert_eq!(
                    got,
                    want,
                    "{name} step {t} ({}): actions",
                    if extra.is_some() {
                        "sandboxed"
                    } else {
                        "native"
                    }
                );
                let got: Vec<f64> = vals
                    .split_whitespace()
                    .map(|v| v.parse().unwrap())
                    .collect();
                let want: Vec<f64> =
                    serde_json::from_value(s["expected"]["value"].clone()).unwrap();
                let scale = want.iter().fold(1e-12f64, |m, v| m.max(v.abs()));
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() / scale <= 1e-5,
                        "{name} step {t}: value {g} vs {w}"
                    );
                }
            }
            outputs.push(text);
        }
        // Same actions natively and sandboxed (values agree to the kernels' rounding: AVX vs SIMD128 sums).
        let actions = |t: &str| {
            t.lines()
                .map(|l| l.split('|').next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            actions(&outputs[0]),
            actions(&outputs[1]),
            "{name}: the sandboxed policy must play the same steps"
        );
        println!(
            "{name}: {} steps x {envs} envs, native and sandboxed, the trainer's actions at every step",
            steps.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// ABI version 5's `pp_policy_act_masked`: the same masked actions as the Rust session, forbidden logits at
/// -FLT_MAX, a mask with a component allowing nothing refused with `PP_STATUS_BAD_CALL` and the caller's buffers
/// untouched, an epsilon on a policy without Q values refused; the sandboxed route gives the same bits.
#[test]
fn c_abi_act_masked_applies_masks_like_the_session() {
    let dir = policyport_conformance::fixtures_dir().join("sb3/maskable_ppo_multidiscrete");
    let zip = std::fs::read(dir.join("model.zip")).unwrap();
    let bytes = policyport_import::compile_sb3(
        &zip,
        None,
        "maskable",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    let compiled = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
    let head = compiled.head().clone();
    let (per_row, k) = (head.mask_len(), head.action_len);
    let batch = 6;
    let obs: Vec<f32> = (0..batch).map(|r| (r % 7) as f32).collect();
    let mask_bytes: Vec<u8> = (0..batch * per_row)
        .map(|i| ((i * 7 + 3) % 3 != 0) as u8)
        .collect();
    let flags: Vec<bool> = mask_bytes.iter().map(|b| *b != 0).collect();
    let want = compiled
        .session()
        .act(
            &Request::new(
                Observations::F32(&obs),
                batch,
                ActMode::Sample { seed: 3, step: 4 },
            )
            .action_mask(&flags),
        )
        .unwrap()
        .clone();
    let mut p: *mut PpPolicy = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            pp_policy_load(bytes.as_ptr(), bytes.len(), PpBackend::Cpu as u32, &mut p),
            PpStatus::Ok
        );
        let mut a = vec![0i64; batch * k];
        let mut dist = vec![0f32; batch * per_row];
        let act = |p, mask: *const u8, a: &mut [i64], dist: &mut [f32], eps: f32| {
            pp_policy_act_masked(
                p,
                obs.as_ptr(),
                batch,
                0,
                1,
                3,
                4,
                a.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                dist.as_mut_ptr(),
                std::ptr::null(),
                mask,
                eps,
            )
        };
        assert_eq!(
            act(p, mask_bytes.as_ptr(), &mut a, &mut dist, f32::NAN),
            PpStatus::Ok
        );
        assert_eq!(a, want.discrete);
        assert_eq!(dist, want.dist_params);
        assert!(dist.iter().zip(&flags).all(|(d, f)| *f || *d == -f32::MAX));
        // Row 2's first component allows nothing: refused, nothing written.
        let mut bad = mask_bytes.clone();
        for b in &mut bad[2 * per_row..2 * per_row + head.segments[0]] {
            *b = 0;
        }
        let (mut a2, mut d2) = (vec![-7i64; batch * k], vec![-7f32; batch * per_row]);
        assert_eq!(
            act(p, bad.as_ptr(), &mut a2, &mut d2, f32::NAN),
            PpStatus::BadCall
        );
        assert!(last_error().contains("row 2"), "{}", last_error());
        assert!(a2.iter().all(|v| *v == -7) && d2.iter().all(|v| *v == -7.0));
        // An epsilon on a policy without Q values is a bad call too.
        assert_eq!(
            act(p, std::ptr::null(), &mut a2, &mut d2, 0.5),
            PpStatus::BadCall
        );
        pp_policy_free(p);
        // The sandboxed route (plugin ABI 6's pp_act_masked): the same masked draws, the same refusals.
        let plugin = target_profile_dir()
            .parent()
            .unwrap()
            .join("wasm32-unknown-unknown/plugin/policyport_plugin.wasm");
        let plugin = std::ffi::CString::new(plugin.to_str().unwrap()).unwrap();
        let mut w: *mut PpPolicy = std::ptr::null_mut();
        assert_eq!(
            pp_policy_load_wasm(
                bytes.as_ptr(),
                bytes.len(),
                plugin.as_ptr(),
                0,
                60_000,
                &mut w
            ),
            PpStatus::Ok,
            "{}",
            last_error()
        );
        let (mut a3, mut d3) = (vec![0i64; batch * k], vec![0f32; batch * per_row]);
        assert_eq!(
            act(w, mask_bytes.as_ptr(), &mut a3, &mut d3, f32::NAN),
            PpStatus::Ok,
            "{}",
            last_error()
        );
        assert_eq!(a3, want.discrete, "sandboxed masked actions");
        // Forbidden logits exactly at f32's minimum; allowed ones as the native kernels' (the sandbox's SIMD128
        // kernels sum in another order than the native family under test: equal to rounding, not bit for bit).
        for (i, (s, n)) in d3.iter().zip(&want.dist_params).enumerate() {
            if flags[i] {
                assert!(
                    (s - n).abs() <= 1e-5 * n.abs().max(1.0),
                    "logit {i}: {s} vs {n}"
                );
            } else {
                assert_eq!(*s, -f32::MAX, "masked logit {i}");
            }
        }
        let (mut a4, mut d4) = (vec![-7i64; batch * k], vec![-7f32; batch * per_row]);
        assert_eq!(
            act(w, bad.as_ptr(), &mut a4, &mut d4, f32::NAN),
            PpStatus::BadCall
        );
        assert!(a4.iter().all(|v| *v == -7) && d4.iter().all(|v| *v == -7.0));
        pp_policy_free(w);
    }
}

/// The plugin module test.sh builds (`policyport_plugin.wasm`).
pub(crate) fn plugin_path() -> PathBuf {
    target_profile_dir()
        .parent()
        .unwrap()
        .join("wasm32-unknown-unknown/plugin/policyport_plugin.wasm")
}

/// Run the compiled `examples/agents.c` on `artifact` (32 agents, 1 200 ticks; in the sandbox if `sandboxed`):
/// its stdout (the returns line, then the summary line).
pub(crate) fn run_agents_example(exe: &Path, artifact: &Path, sandboxed: bool) -> String {
    let mut cmd = Command::new(exe);
    cmd.arg(artifact);
    if sandboxed {
        cmd.arg(plugin_path());
    }
    let out = cmd
        .args(["--agents", "32", "--ticks", "1200"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Load `bytes` through the C ABI, natively (cpu) or in the sandbox (60 s deadline).
pub(crate) unsafe fn c_load(bytes: &[u8], sandboxed: bool) -> *mut PpPolicy {
    let mut p: *mut PpPolicy = std::ptr::null_mut();
    unsafe {
        if sandboxed {
            let path = std::ffi::CString::new(plugin_path().to_str().unwrap()).unwrap();
            assert_eq!(
                pp_policy_load_wasm(
                    bytes.as_ptr(),
                    bytes.len(),
                    path.as_ptr(),
                    0,
                    60_000,
                    &mut p
                ),
                PpStatus::Ok,
                "{}",
                last_error()
            );
        } else {
            assert_eq!(
                pp_policy_load(bytes.as_ptr(), bytes.len(), PpBackend::Cpu as u32, &mut p),
                PpStatus::Ok
            );
        }
    }
    p
}

/// Load the CartPole fixture through the C ABI, natively or in the sandbox, and turn it into agents.
unsafe fn c_agents(bytes: &[u8], sandboxed: bool, seed: u64) -> *mut PpAgents {
    unsafe {
        let p = c_load(bytes, sandboxed);
        let mut a: *mut PpAgents = std::ptr::null_mut();
        assert_eq!(pp_agents_new(p, seed, 1, 0, &mut a), PpStatus::Ok);
        a
    }
}

/// The C ABI's agents (ABI 6) on both routes: the PyTorch policy's seeded CartPole returns through
/// `pp_agents_tick` in a rotating order (agent env ids = episode numbers, tick = step), typed errors for stale ids,
/// null pointers and a tick with a bad id (which stages nothing); then the C example (`examples/agents.c`: 32
/// agents respawning for 1 200 ticks, one despawned and replaced midway) plays the same episodes natively and in
/// the sandbox.
#[test]
fn c_abi_agents_reach_the_pytorch_returns_and_the_c_example_runs_on_both_routes() {
    let f = load_fixture("cartpole");
    let eval = f.io.eval.clone().unwrap();
    let bytes = compile_fixture(&f);
    let want: Vec<f64> = serde_json::from_value(eval["sampled_returns"].clone()).unwrap();
    let (env_seed, policy_seed) = (
        eval["env_seed"].as_u64().unwrap(),
        eval["policy_seed"].as_u64().unwrap(),
    );
    use policyport_cli::envs::{CartPole, Env};
    for sandboxed in [false, true] {
        unsafe {
            let a = c_agents(&bytes, sandboxed, policy_seed);
            // The agents layer itself on the same route, fed the same ticks: the C ABI adds nothing.
            let config = policyport_agents::AgentsConfig {
                seed: policy_seed,
                values: true,
                ..Default::default()
            };
            let mut twin = if sandboxed {
                let limits = policyport_wasmtime::WasmLimits::default();
                policyport_agents::Agents::new(
                    policyport_wasmtime::load(
                        &policyport_conformance::plugin_runtime(),
                        &bytes,
                        limits,
                    )
                    .unwrap(),
                    config,
                )
            } else {
                policyport_agents::Agents::new(
                    CompiledPolicy::load(&bytes, Backend::Cpu).unwrap(),
                    config,
                )
            };
            let n = want.len();
            let mut ids = vec![0u64; n];
            let mut twin_ids = vec![];
            for id in ids.iter_mut() {
                assert_eq!(pp_agents_spawn(a, id), PpStatus::Ok);
                twin_ids.push(twin.spawn().unwrap());
                assert_eq!(twin_ids.last().unwrap().to_bits(), *id);
            }
            let mut envs: Vec<CartPole> = (0..n as u32)
                .map(|e| CartPole::reset(env_seed, e))
                .collect();
            let mut returns = vec![0.0; n];
            let mut running: Vec<usize> = (0..n).collect();
            for t in 0..CartPole::MAX_STEPS {
                if running.is_empty() {
                    break;
                }
                let shift = t % running.len();
                running.rotate_left(shift);
                let tick_ids: Vec<u64> = running.iter().map(|&e| ids[e]).collect();
                let mut obs = vec![0f32; running.len() * 4];
                for (k, &e) in running.iter().enumerate() {
                    envs[e].observe(&mut obs[k * 4..(k + 1) * 4]);
                }
                let mut actions = vec![-1i64; running.len()];
                let mut values = vec![0f32; running.len()];
                assert_eq!(
                    pp_agents_tick(
                        a,
                        tick_ids.as_ptr(),
                        tick_ids.len(),
                        obs.as_ptr(),
                        std::ptr::null(),
                        actions.as_mut_ptr(),
                        std::ptr::null_mut(),
                        values.as_mut_ptr()
                    ),
                    PpStatus::Ok,
                    "{}",
                    last_error()
                );
                for (k, &e) in running.iter().enumerate() {
                    twin.observe(twin_ids[e], &obs[k * 4..(k + 1) * 4]).unwrap();
                }
                let tick = twin.act().unwrap();
                for (k, &e) in running.iter().enumerate() {
                    assert_eq!(
                        tick.discrete(twin_ids[e]).unwrap()[0],
                        actions[k],
                        "tick {t}"
                    );
                    assert_eq!(
                        tick.value(twin_ids[e]).unwrap().to_bits(),
                        values[k].to_bits()
                    );
                }
                let mut still = vec![];
                for (&e, act) in running.iter().zip(&actions) {
                    let (r, done) = envs[e].step(*act, &[]);
                    returns[e] += r;
                    if done {
                        assert_eq!(pp_agents_despawn(a, ids[e]), PpStatus::Ok);
                        twin.despawn(twin_ids[e]).unwrap();
                    } else {
                        still.push(e);
                    }
                }
                running = still;
            }
            assert_eq!(returns, want, "sandboxed {sandboxed}");

            // Typed errors: a stale id, null pointers, a tick naming a stale id among live ones.
            let mut info = PpAgentsInfo::default();
            assert_eq!(pp_agents_info(a, &mut info), PpStatus::Ok);
            let live = running.len() as u32; // every episode solved: still alive at step 500
            assert_eq!(
                (info.obs_len, info.action_len, info.mask_len, info.alive),
                (4, 1, 2, live)
            );
            let mut dead = 0u64;
            assert_eq!(pp_agents_spawn(a, &mut dead), PpStatus::Ok);
            assert_eq!(pp_agents_despawn(a, dead), PpStatus::Ok);
            assert_eq!(pp_agents_respawn(a, dead), PpStatus::BadCall);
            assert!(last_error().contains("not alive"), "{}", last_error());
            assert_eq!(
                pp_agents_spawn(std::ptr::null_mut(), ids.as_mut_ptr()),
                PpStatus::NullPointer
            );
            assert_eq!(
                pp_agents_spawn(a, std::ptr::null_mut()),
                PpStatus::NullPointer
            );
            let mut fresh = [0u64; 2];
            assert_eq!(pp_agents_spawn(a, &mut fresh[0]), PpStatus::Ok);
            assert_eq!(pp_agents_spawn(a, &mut fresh[1]), PpStatus::Ok);
            let obs = [0.01f32; 12];
            let bad = [fresh[0], dead, fresh[1]];
            let mut acted = usize::MAX;
            assert_eq!(
                pp_agents_tick(
                    a,
                    bad.as_ptr(),
                    3,
                    obs.as_ptr(),
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                PpStatus::BadCall
            );
            // Nothing stayed staged: the next act() has no one to act for.
            assert_eq!(pp_agents_act(a, &mut acted), PpStatus::Ok);
            assert_eq!(acted, 0);
            assert_eq!(
                pp_agents_observe(a, fresh[0], obs.as_ptr(), 3, std::ptr::null(), 0),
                PpStatus::BadObservation
            );
            assert_eq!(
                pp_agents_observe(a, fresh[0], obs.as_ptr(), 4, std::ptr::null(), 0),
                PpStatus::Ok
            );
            assert_eq!(pp_agents_act(a, &mut acted), PpStatus::Ok);
            assert_eq!(acted, 1);
            let mut action = -1i64;
            assert_eq!(
                pp_agents_action(
                    a,
                    fresh[0],
                    &mut action,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                PpStatus::Ok
            );
            assert!(action == 0 || action == 1);
            assert_eq!(
                pp_agents_action(
                    a,
                    fresh[1],
                    &mut action,
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                PpStatus::BadCall,
                "fresh[1] did not act"
            );
            pp_agents_free(a);
            pp_agents_free(std::ptr::null_mut());
        }
    }

    // The C example, natively and sandboxed: the same episodes (the same printed returns). SB3's briefly trained
    // CartPole PPO, whose episodes end anywhere from a few steps to 500 (the bundled policy lasts 500 every time).
    let dir = std::env::temp_dir().join(format!("policyport-c-agents-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let artifact = dir.join("cartpole.policy");
    let sb3 = policyport_conformance::fixtures_dir().join("sb3/ppo_cartpole/model.zip");
    let sb3 = policyport_import::compile_sb3(
        &std::fs::read(sb3).unwrap(),
        None,
        "ppo_cartpole",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    std::fs::write(&artifact, &sb3).unwrap();
    let exe = compile_c_example("agents", &dir);
    let native = run_agents_example(&exe, &artifact, false);
    let sandboxed = run_agents_example(&exe, &artifact, true);
    println!("{}", native.lines().last().unwrap());
    assert_eq!(
        native.replace("native", "X"),
        sandboxed.replace("sandboxed", "X")
    );
    let mean: f64 = native
        .split("mean return ")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let finished: usize = native
        .split("ticks, ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        finished >= 100 && mean >= 100.0,
        "{finished} episodes, mean {mean}"
    );
    let returns: std::collections::BTreeSet<&str> =
        native.lines().next().unwrap().split(' ').skip(1).collect();
    assert!(returns.len() > 20, "varied episodes: {returns:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pp_policy_act_ids` (ABI 6): rows name their env ids, on both routes: the session's answers for the same id
/// list (sampling streams by id, not by row); a recurrent policy refuses an id named twice; a null list is a
/// typed error.
#[test]
fn c_abi_act_ids_takes_one_env_id_per_row_on_both_routes() {
    let dir = policyport_conformance::fixtures_dir()
        .join("sb3")
        .join("recurrent_ppo_cartpole");
    let bytes = policyport_import::compile_sb3(
        &std::fs::read(dir.join("model.zip")).unwrap(),
        None,
        "recurrent_ppo_cartpole",
        None,
        policyport_import::StorageDType::F32,
    )
    .unwrap();
    let obs: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
    let ids = [5u32, 2, 9];
    let reference = {
        let mut s = CompiledPolicy::load(&bytes, Backend::Cpu)
            .unwrap()
            .session();
        s.act(
            &Request::new(
                Observations::F32(&obs),
                3,
                ActMode::Sample { seed: 4, step: 11 },
            )
            .envs(policyport::EnvIds::List(&ids)),
        )
        .unwrap()
        .clone()
    };
    for sandboxed in [false, true] {
        unsafe {
            let p = c_load(&bytes, sandboxed);
            let (mut actions, mut values) = ([0i64; 3], [0f32; 3]);
            let act = |p, ids: *const u32, actions: &mut [i64; 3], values: &mut [f32; 3]| {
                pp_policy_act_ids(
                    p,
                    obs.as_ptr(),
                    3,
                    ids,
                    1,
                    4,
                    11,
                    actions.as_mut_ptr(),
                    std::ptr::null_mut(),
                    values.as_mut_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    std::ptr::null(),
                    f32::NAN,
                )
            };
            assert_eq!(
                act(p, ids.as_ptr(), &mut actions, &mut values),
                PpStatus::Ok,
                "{}",
                last_error()
            );
            assert_eq!(
                actions.to_vec(),
                reference.discrete,
                "sandboxed {sandboxed}"
            );
            for (g, w) in values.iter().zip(&reference.value) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "sandboxed {sandboxed}: {g} vs {w}"
                );
            }
            let twice = [5u32, 2, 5];
            assert_eq!(
                act(p, twice.as_ptr(), &mut actions, &mut values),
                PpStatus::BadCall
            );
            assert!(last_error().contains('5'), "{}", last_error());
            assert_eq!(
                act(p, std::ptr::null(), &mut actions, &mut values),
                PpStatus::NullPointer
            );
            pp_policy_free(p);
        }
    }
}
