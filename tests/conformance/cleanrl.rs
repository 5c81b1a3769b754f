//! CleanRL checkpoints (`torch.save(agent.state_dict())` of CleanRL's own agent classes, written in
//! tests/fixtures/generate_cleanrl.py) compile with `--layout` and the spaces, and reproduce the agent on every
//! backend: logits / mean / log-std / value within 1e-5 of the agent run in float64, Philox samples equal to the
//! Python sampler's. A wrong layout or wrong spaces is a typed error naming the key or shape that does not fit.

use policyport::Backend;
use policyport_conformance::fixtures_dir;
use policyport_format::{ActionSpace, ObservationSpace};
use policyport_import::{CleanrlLayout, FixtureIo, StorageDType, compile_cleanrl};

struct Case {
    dir: &'static str,
    layout: CleanrlLayout,
}

const CASES: [Case; 5] = [
    Case {
        dir: "ppo_cartpole",
        layout: CleanrlLayout::Ppo,
    },
    Case {
        dir: "ppo_continuous_hopper",
        layout: CleanrlLayout::PpoContinuous,
    },
    Case {
        dir: "ppo_atari_breakout",
        layout: CleanrlLayout::Atari,
    },
    Case {
        dir: "ppo_atari_lstm",
        layout: CleanrlLayout::AtariLstm,
    },
    Case {
        dir: "sac_actor",
        layout: CleanrlLayout::Sac,
    },
];

fn read(dir: &str, file: &str) -> Vec<u8> {
    std::fs::read(fixtures_dir().join("cleanrl").join(dir).join(file)).unwrap()
}

fn spaces(dir: &str) -> (ObservationSpace, ActionSpace) {
    let v: serde_json::Value = serde_json::from_slice(&read(dir, "spaces.json")).unwrap();
    (
        serde_json::from_value(v["observation"].clone()).unwrap(),
        serde_json::from_value(v["action"].clone()).unwrap(),
    )
}

fn every_cleanrl_checkpoint_reproduces_its_agent_on_every_backend(backend: Backend) {
    let mut table = vec![];
    for c in &CASES {
        let (obs, act) = spaces(c.dir);
        let io: FixtureIo = serde_json::from_slice(&read(c.dir, "io.json")).unwrap();
        let bytes = compile_cleanrl(
            &read(c.dir, "agent.pt"),
            c.layout,
            obs,
            act,
            c.dir,
            Some(&io),
            StorageDType::F32,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.dir));
        let p = policyport_conformance::load(&bytes, backend)
            .unwrap_or_else(|e| panic!("{} on {}: {e}", c.dir, backend.name()));
        for r in p.verify().unwrap() {
            let worst = r.values.iter().map(|(_, e)| *e).fold(0.0, f64::max);
            table.push(format!(
                "{:<24} {:<8} {:<22} max rel err {worst:.2e}",
                c.dir,
                backend.name(),
                r.name
            ));
            assert!(r.passed, "{} on {}: {r:?}", c.dir, backend.name());
        }
    }
    println!("{}", table.join("\n"));
}
per_backend!(every_cleanrl_checkpoint_reproduces_its_agent_on_every_backend);

#[test]
fn a_wrong_layout_or_wrong_spaces_is_a_typed_error() {
    let pt = read("ppo_cartpole", "agent.pt");
    let (obs, act) = spaces("ppo_cartpole");
    for layout in [
        CleanrlLayout::PpoContinuous,
        CleanrlLayout::Atari,
        CleanrlLayout::Sac,
    ] {
        let e = compile_cleanrl(
            &pt,
            layout,
            obs.clone(),
            act.clone(),
            "x",
            None,
            StorageDType::F32,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("CleanRL checkpoint"),
            "{layout:?}: {e}"
        );
    }
    let wrong_obs = ObservationSpace::Box {
        shape: vec![5],
        dtype: policyport_format::ObsDType::F32,
    };
    let e = compile_cleanrl(
        &pt,
        CleanrlLayout::Ppo,
        wrong_obs,
        act.clone(),
        "x",
        None,
        StorageDType::F32,
    )
    .unwrap_err();
    assert!(e.to_string().contains("actor.0.weight"), "{e}");
    let e = compile_cleanrl(
        &pt,
        CleanrlLayout::Ppo,
        obs,
        ActionSpace::Discrete { n: 3 },
        "x",
        None,
        StorageDType::F32,
    )
    .unwrap_err();
    assert!(e.to_string().contains("2 outputs"), "{e}");
    // Not a state dict at all.
    assert!(
        compile_cleanrl(
            b"PK\x03\x04junk",
            CleanrlLayout::Ppo,
            spaces("ppo_cartpole").0,
            ActionSpace::Discrete { n: 2 },
            "x",
            None,
            StorageDType::F32
        )
        .is_err()
    );
}

/// The same state dict saved as safetensors (`safetensors.torch.save_file(agent.state_dict(), ...)`) compiles to
/// the very same artifact as its `torch.save` file, for every layout; a truncated or lying safetensors header is
/// a typed error.
#[test]
fn a_safetensors_state_dict_compiles_like_its_torch_save_file() {
    for c in &CASES {
        let pt = read(c.dir, "agent.pt");
        let sd = policyport_import::torchfile::read_state_dict(&pt).unwrap();
        let st = safetensors_of(&sd);
        assert!(policyport_import::state_dict_like(&st) && !policyport_import::pickle_like(&st));
        let (obs, act) = spaces(c.dir);
        let from_pt = compile_cleanrl(
            &pt,
            c.layout,
            obs.clone(),
            act.clone(),
            c.dir,
            None,
            StorageDType::F32,
        )
        .unwrap();
        let from_st = compile_cleanrl(
            &st,
            c.layout,
            obs.clone(),
            act.clone(),
            c.dir,
            None,
            StorageDType::F32,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.dir));
        assert!(
            from_pt == from_st,
            "{}: the safetensors route wrote a different artifact",
            c.dir
        );
        for cut in [9, 20, st.len() / 2, st.len() - 1] {
            let e = compile_cleanrl(
                &st[..cut],
                c.layout,
                obs.clone(),
                act.clone(),
                c.dir,
                None,
                StorageDType::F32,
            );
            assert!(e.is_err(), "{} cut at {cut}", c.dir);
        }
    }
    // A header claiming more bytes than the file has.
    let mut lying = 1_000_000u64.to_le_bytes().to_vec();
    lying.extend_from_slice(b"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    let (obs, act) = spaces("ppo_cartpole");
    assert!(
        compile_cleanrl(
            &lying,
            CleanrlLayout::Ppo,
            obs,
            act,
            "x",
            None,
            StorageDType::F32
        )
        .is_err()
    );
}

type StateDict = std::collections::BTreeMap<String, policyport_format::container::Tensor>;

/// A state dict as safetensors bytes.
fn safetensors_of(sd: &StateDict) -> Vec<u8> {
    let views: Vec<(String, Vec<usize>, Vec<u8>)> = sd
        .iter()
        .map(|(k, t)| {
            (
                k.clone(),
                t.shape.clone(),
                t.data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    safetensors::serialize(
        views.iter().map(|(k, s, b)| {
            (
                k.as_str(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .unwrap(),
            )
        }),
        None,
    )
    .unwrap()
}

/// Issue 36: a CleanRL agent with its actor missing compiled into a policy whose logits were the raw observation
/// (when the widths happened to fit), an actor with an index gap or a renamed layer lost that layer, and a weight
/// no layer reads was ignored, each without a word. Each is now a typed error naming the key.
#[test]
fn a_missing_gapped_or_renamed_cleanrl_layer_is_a_typed_error_not_dropped() {
    let pt = read("ppo_cartpole", "agent.pt");
    let sd = policyport_import::torchfile::read_state_dict(&pt).unwrap();
    let (obs, act) = spaces("ppo_cartpole");
    let compile = |sd: &StateDict| {
        compile_cleanrl(
            &safetensors_of(sd),
            CleanrlLayout::Ppo,
            obs.clone(),
            act.clone(),
            "edited",
            None,
            StorageDType::F32,
        )
    };
    compile(&sd).expect("the unedited state dict compiles");
    let edits: [(&str, Box<dyn Fn(&mut StateDict)>, &str); 4] = [
        (
            "actor missing",
            Box::new(|sd: &mut StateDict| sd.retain(|k, _| !k.starts_with("actor."))),
            "no 'actor.0.weight'",
        ),
        (
            "actor.2 removed (a gap before actor.4)",
            Box::new(|sd: &mut StateDict| sd.retain(|k, _| !k.starts_with("actor.2."))),
            "'actor.4.",
        ),
        (
            "actor.2 renamed",
            Box::new(|sd: &mut StateDict| {
                for f in ["weight", "bias"] {
                    let t = sd.remove(&format!("actor.2.{f}")).unwrap();
                    sd.insert(format!("actor.two.{f}"), t);
                }
            }),
            "'actor.two.",
        ),
        (
            "a layer no importer reads (a residual branch, say)",
            Box::new(|sd: &mut StateDict| {
                let t = sd["critic.0.weight"].clone();
                sd.insert("residual.0.weight".into(), t);
            }),
            "not read by any layer",
        ),
    ];
    for (what, edit, want) in edits {
        let mut e = sd.clone();
        edit(&mut e);
        let err = compile(&e).expect_err(what).to_string();
        assert!(err.contains(want), "{what}: want '{want}' in: {err}");
    }
}
