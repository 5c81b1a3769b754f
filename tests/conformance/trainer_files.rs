//! The trainer-file rows of the hostile-input table (issue 36): damaged and malicious Stable-Baselines3 archives and
//! files of no known kind through every API that reads a trainer's file — the import crate (as the CLI and Python
//! call it: detection by content, then the importer), `policyport compile` and, from the files written here,
//! Python's `policyport.compile` (tests/python/test_api.py). Each must be a typed error naming the damage: never a
//! panic, a hang, code run, or a policy that silently lost a layer or a bound. Written to
//! `<target>/hostile-trainer-files.md`, joined with the Python column by tests/scripts/hostile_table.py.

use std::process::Command;

use policyport_import::zipread::{Zip, stored_zip};
use policyport_import::{ImportError, ModelKind, StorageDType, compile_sb3, detect_model};

/// `zip` with entry `name` replaced by `f(old bytes)`; every other entry kept (stored).
fn rewrite(zip: &[u8], name: &str, f: impl Fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let z = Zip::open(zip).unwrap();
    let entries: Vec<(String, Vec<u8>)> = z
        .names()
        .map(|n| {
            let bytes = z.get(n).unwrap().unwrap();
            let bytes = if n == name { f(bytes) } else { bytes.to_vec() };
            (n.to_string(), bytes)
        })
        .collect();
    assert!(
        entries.iter().any(|(n, _)| n == name),
        "{name} not in the zip"
    );
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    stored_zip(&refs)
}

fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(from)));
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(to);
    out.extend_from_slice(&bytes[at + from.len()..]);
    out
}

/// A state-dict pickle of dicts that each reference the one below twice through the memo: 2^60 key paths from
/// ~1 KB (issue 36: the walk used to hang).
pub(crate) fn shared_dict_bomb() -> Vec<u8> {
    let mut bomb = b"\x80\x02}q\x00(X\x01\x00\x00\x00wK\x01u".to_vec();
    for level in 1..=60u8 {
        // {'a': memo[level - 1], 'b': memo[level - 1]}, memoised as `level`.
        bomb.extend_from_slice(&[
            b'}',
            b'q',
            level,
            b'(',
            b'X',
            1,
            0,
            0,
            0,
            b'a',
            b'h',
            level - 1,
        ]);
        bomb.extend_from_slice(&[b'X', 1, 0, 0, 0, b'b', b'h', level - 1, b'u']);
    }
    bomb.push(b'.');
    bomb
}

/// The hostile files: (row name, bytes).
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let fx = policyport_conformance::fixtures_dir().join("sb3");
    let ppo = std::fs::read(fx.join("ppo_cartpole/model.zip")).unwrap();
    let sac = std::fs::read(fx.join("sac_pendulum/model.zip")).unwrap();
    let data = Zip::open(&ppo)
        .unwrap()
        .get("data")
        .unwrap()
        .unwrap()
        .to_vec();
    let pth =
        |pkl: &[u8]| stored_zip(&[("archive/data.pkl", pkl), ("archive/byteorder", b"little")]);
    let bomb = shared_dict_bomb();
    let policy_pth = Zip::open(&ppo)
        .unwrap()
        .get("policy.pth")
        .unwrap()
        .unwrap()
        .to_vec();
    let pkl_name = Zip::open(&policy_pth)
        .unwrap()
        .names()
        .find(|n| n.ends_with("/data.pkl"))
        .unwrap()
        .to_string();
    vec![
        ("empty file", vec![]),
        (
            "bytes of no known kind",
            b"\x13\x37 not a model file at all".to_vec(),
        ),
        ("SB3 model.zip cut in half", ppo[..ppo.len() / 2].to_vec()),
        (
            "SB3 archive without policy.pth",
            stored_zip(&[("data", &data)]),
        ),
        (
            "SB3 policy.pth whose pickle calls os.system",
            stored_zip(&[
                ("data", &data),
                (
                    "policy.pth",
                    &pth(b"\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03."),
                ),
            ]),
        ),
        (
            "SB3 policy.pth of shared dicts (2^60 key paths)",
            stored_zip(&[("data", &data), ("policy.pth", &pth(&bomb))]),
        ),
        (
            "SB3 policy layer renamed (policy_net.2 -> policy_net.9)",
            rewrite(&ppo, "policy.pth", |p| {
                rewrite(p, &pkl_name, |pkl| {
                    replace(
                        pkl,
                        b"mlp_extractor.policy_net.2.weight",
                        b"mlp_extractor.policy_net.9.weight",
                    )
                })
            }),
        ),
        (
            "SB3 action bound NaN",
            rewrite(&sac, "data", |d| {
                replace(d, b"\"low\": \"[-2.]\"", b"\"low\": \"[nan]\"")
            }),
        ),
    ]
}

#[test]
fn hostile_trainer_files_through_every_api_are_typed_errors() {
    let target = crate::capi::target_profile_dir();
    let dir = target.parent().unwrap().join("hostile-trainer");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cli = target.join("policyport");
    assert!(
        cli.exists(),
        "{} (the workspace build makes it)",
        cli.display()
    );
    let mut rows = vec![];
    let mut broken = vec![];
    for (name, bytes) in corpus() {
        let slug: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = dir.join(format!("{slug}.model"));
        std::fs::write(&path, &bytes).unwrap();
        // The import crate, as the CLI and Python route a file: detection by content, then the importer.
        let rust = std::panic::catch_unwind(|| match detect_model(&bytes) {
            Ok(ModelKind::Sb3Archive) => {
                compile_sb3(&bytes, None, name, None, StorageDType::F32).map(|_| ())
            }
            Ok(other) => Err(ImportError::Malformed(format!("detected as {other:?}"))),
            Err(e) => Err(e),
        });
        let rust = match rust {
            Ok(Err(e)) => {
                let variant = format!("{e:?}");
                let variant = variant.split([' ', '{', '(']).next().unwrap().to_string();
                format!("ImportError::{variant}: {}", short(&e.to_string()))
            }
            Ok(Ok(())) => {
                broken.push(format!("{name}: the importer accepted it"));
                "**ACCEPTED**".into()
            }
            Err(_) => {
                broken.push(format!("{name}: the importer panicked"));
                "**PANIC**".into()
            }
        };
        let out = Command::new(&cli)
            .arg("compile")
            .arg(&path)
            .arg("-o")
            .arg(dir.join(format!("{slug}.policy")))
            .output()
            .unwrap();
        // The CLI names the file it read; the cell names it by its file name, not this machine's path.
        let stderr = String::from_utf8_lossy(&out.stderr)
            .replace(path.to_str().unwrap(), &format!("{slug}.model"));
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error:")).collect();
        let cli_cell = match out.status.code() {
            Some(1) if errors.len() == 1 && !stderr.contains("panicked") => {
                format!(
                    "exit 1: {}",
                    short(errors[0].trim_start_matches("Error:").trim())
                )
            }
            code => {
                broken.push(format!("{name}: CLI exit {code:?}: {stderr}"));
                format!("**exit {code:?}**")
            }
        };
        rows.push(format!("| {name} | {rust} | {cli_cell} |"));
    }
    let table = format!(
        "| trainer file | Rust (`policyport_import`) | CLI (`policyport compile`) |\n|---|---|---|\n{}\n",
        rows.join("\n")
    );
    std::fs::write(
        target.parent().unwrap().join("hostile-trainer-files.md"),
        &table,
    )
    .unwrap();
    println!("{table}");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

fn short(s: &str) -> String {
    let s = s.replace('|', "/");
    if s.chars().count() > 72 {
        format!("{}…", s.chars().take(72).collect::<String>())
    } else {
        s
    }
}
