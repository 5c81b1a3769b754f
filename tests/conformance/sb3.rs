//! Stable-Baselines3 archives (`model.save()`, written by SB3 itself in tests/fixtures/generate_sb3.py: PPO, A2C-style
//! actor-critics, SAC, DQN, TD3, DDPG and sb3-contrib's RecurrentPPO, QR-DQN, TQC, MaskablePPO) compile
//! with nothing but the archive and reproduce SB3 on every backend: the distribution parameters and value within
//! 1e-5 of SB3's modules run in float64, Philox samples equal to the Python sampler's, and the deterministic
//! actions SB3's own `predict(obs, deterministic=True)` returned.

use policyport::Backend;
use policyport_conformance::fixtures_dir;
use policyport_import::{FixtureIo, ImportError, StorageDType, compile_sb3};

fn archives() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixtures_dir().join("sb3"))
        .expect("tests/fixtures/sb3")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model.zip").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn read(name: &str, file: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join("sb3").join(name).join(file)).unwrap()
}

/// Every SB3 fixture the suite names is there (an empty directory must not pass), and compiles without the
/// oracle's cases too: the compiler then embeds the float64 reference's, from the same archive alone.
#[test]
fn every_sb3_archive_is_present_and_compiles_alone() {
    let names = archives();
    for want in [
        "ppo_cartpole",
        "sac_pendulum",
        "ppo_cnn_frames",
        "ppo_grid_multidiscrete",
        "ppo_pendulum_vecnormalize",
        "recurrent_ppo_cartpole",
        "recurrent_ppo_pendulum_shared_2layers",
        "recurrent_ppo_cnn_frames",
        "ppo_multi_input_dict",
        "dqn_cartpole",
        "qrdqn_cartpole",
        "dqn_cnn_frames",
        "td3_pendulum",
        "ddpg_mountaincar",
        "tqc_pendulum",
        "maskable_ppo_discrete",
        "maskable_ppo_multidiscrete",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "sb3 fixture {want} missing: {names:?}"
        );
    }
    for name in &names {
        let zip = read(name, "model.zip");
        let vn = std::fs::read(
            fixtures_dir()
                .join("sb3")
                .join(name)
                .join("vecnormalize.pkl"),
        )
        .ok();
        compile_sb3(&zip, vn.as_deref(), name, None, StorageDType::F32)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn every_sb3_archive_reproduces_sb3_on_every_backend(backend: Backend) {
    let names = archives();
    let mut table = vec![];
    for name in &names {
        let zip = read(name, "model.zip");
        let io: FixtureIo = serde_json::from_slice(&read(name, "io.json")).unwrap();
        let trainer: serde_json::Value =
            serde_json::from_slice(&read(name, "trainer.json")).unwrap();
        let vn_path = fixtures_dir()
            .join("sb3")
            .join(name)
            .join("vecnormalize.pkl");
        let vn = std::fs::read(&vn_path).ok();
        let bytes = compile_sb3(
            &zip,
            vn.as_deref(),
            &format!("sb3/{name}/model.zip"),
            Some(&io),
            StorageDType::F32,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = policyport_conformance::load(&bytes, backend)
            .unwrap_or_else(|e| panic!("{name} on {}: {e}", backend.name()));
        for r in p.verify().unwrap() {
            let worst = r.values.iter().map(|(_, e)| *e).fold(0.0, f64::max);
            table.push(format!(
                "{name:<24} {:<8} {:<22} max rel err {worst:.2e}  sampled mismatches {}",
                backend.name(),
                r.name,
                r.sampled_mismatches
            ));
            assert!(r.passed, "{name} on {}: {r:?}", backend.name());
        }
        // SB3's own predict(deterministic=True), float32 end to end.
        policyport_conformance::assert_trainer_cases(
            &p,
            &io,
            &trainer,
            &format!("{name} on {}", backend.name()),
        );
    }
    println!("{}", table.join("\n"));
}
per_backend!(every_sb3_archive_reproduces_sb3_on_every_backend);

/// A stored-entry zip (the import crate's writer), to build hostile archives.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    policyport_import::zipread::stored_zip(entries)
}

/// Hostile archives: a policy.pth whose pickle names a code-executing global, truncations at every length of a
/// real archive's head, a lying central directory, missing entries, a tensor view outside its storage. Each is a
/// typed error, never a panic, never code run.
#[test]
fn hostile_sb3_archives_are_typed_errors() {
    let real = read("ppo_cartpole", "model.zip");
    assert!(policyport_import::sb3::is_sb3_archive(&real));
    // The real 'data' entry, reused in the forged archives.
    let data = policyport_import::zipread::Zip::open(&real)
        .unwrap()
        .get("data")
        .unwrap()
        .unwrap()
        .to_vec();
    // os.system through the state dict's pickle.
    let evil_pkl = b"\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.";
    let evil_pth = zip_of(&[
        ("archive/data.pkl", evil_pkl),
        ("archive/byteorder", b"little"),
    ]);
    let evil = zip_of(&[("data", &data), ("policy.pth", &evil_pth)]);
    match compile_sb3(&evil, None, "evil", None, StorageDType::F32).unwrap_err() {
        ImportError::Pickle(policyport_import::pickle::PickleError::ForbiddenGlobal {
            module,
            name,
        }) => {
            assert_eq!((module.as_str(), name.as_str()), ("posix", "system"))
        }
        other => panic!("{other}"),
    }
    // A tensor whose view runs past its 4-byte storage.
    let oob_pkl = b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQK\x00K\x40\x85K\x01\x85\x89NtRu.";
    let oob = zip_of(&[
        ("data", &data),
        (
            "policy.pth",
            &zip_of(&[("archive/data.pkl", oob_pkl), ("archive/data/0", &[0u8; 4])]),
        ),
    ]);
    let e = compile_sb3(&oob, None, "oob", None, StorageDType::F32).unwrap_err();
    assert!(e.to_string().contains("outside its storage"), "{e}");
    // Issue 36: a state dict of dicts that each reference the one below twice (2^60 key paths) used to hang
    // the importer; its walk is now counted and refused at once.
    let bomb = crate::trainer_files::shared_dict_bomb();
    let bomb = zip_of(&[
        ("data", &data),
        ("policy.pth", &zip_of(&[("archive/data.pkl", &bomb)])),
    ]);
    let t0 = std::time::Instant::now();
    match compile_sb3(&bomb, None, "bomb", None, StorageDType::F32).unwrap_err() {
        ImportError::Pickle(policyport_import::pickle::PickleError::SharedExpansion { .. }) => {}
        other => panic!("want SharedExpansion, got {other}"),
    }
    assert!(t0.elapsed().as_secs() < 10, "{:?}", t0.elapsed());
    // Missing pieces.
    for (label, z) in [
        ("no policy.pth", zip_of(&[("data", &data)])),
        (
            "data not JSON",
            zip_of(&[("data", b"\x80\x02."), ("policy.pth", &evil_pth)]),
        ),
    ] {
        assert!(
            compile_sb3(&z, None, label, None, StorageDType::F32).is_err(),
            "{label}"
        );
    }
    // Every truncation of the real archive, and a few flipped bytes in its central directory.
    for cut in (0..real.len())
        .step_by(997)
        .chain([real.len() - 1, real.len() - 22])
    {
        let _ = compile_sb3(&real[..cut], None, "cut", None, StorageDType::F32).unwrap_err();
    }
    let eocd = real.len() - 22;
    for at in [eocd + 10, eocd + 12, eocd + 16] {
        let mut z = real.clone();
        z[at] ^= 0xff;
        z[at + 1] ^= 0x7f;
        let _ = compile_sb3(&z, None, "flipped", None, StorageDType::F32).unwrap_err();
    }
}

/// A VecNormalize pickle is read without running it: a forged one naming os.system is refused by name, and one
/// whose statistics do not fit the observations is a typed error.
#[test]
fn hostile_vecnormalize_pickles_are_typed_errors() {
    let zip = read("ppo_pendulum_vecnormalize", "model.zip");
    let evil =
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.";
    let e = compile_sb3(&zip, Some(evil), "x", None, StorageDType::F32).unwrap_err();
    assert!(e.to_string().contains("os.system"), "{e}");
    // The CartPole archive (4 observations) with Pendulum's statistics (3).
    let vn = read("ppo_pendulum_vecnormalize", "vecnormalize.pkl");
    let e = compile_sb3(
        &read("ppo_cartpole", "model.zip"),
        Some(&vn),
        "x",
        None,
        StorageDType::F32,
    )
    .unwrap_err();
    assert!(e.to_string().contains("3 statistics"), "{e}");
    for cut in (0..vn.len()).step_by(37) {
        assert!(compile_sb3(&zip, Some(&vn[..cut]), "x", None, StorageDType::F32).is_err());
    }
}
