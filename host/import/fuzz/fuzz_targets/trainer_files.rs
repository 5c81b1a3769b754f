#![no_main]
//! Every reader of trainers' files on arbitrary bytes: a typed error or a result, never a panic, an abort or a
//! hang. Seeds: the committed SB3 archives, CleanRL checkpoints and VecNormalize pickle.
use libfuzzer_sys::fuzz_target;
use policyport_import::{CleanrlLayout, StorageDType, compile_cleanrl, compile_sb3, pickle, torchfile};

fuzz_target!(|data: &[u8]| {
    if let Ok(pk) = pickle::parse(data) {
        for i in 0..pk.nodes.len().min(64) {
            let _ = policyport_import::npy_pickle::array(&pk, i);
        }
    }
    let _ = policyport_import::detect_model(data);
    let _ = torchfile::read_state_dict(data);
    let _ = compile_sb3(data, None, "fuzz", None, StorageDType::F32);
    let _ = policyport_import::sb3::read_vecnormalize(data);
    let obs = policyport_format::ObservationSpace::Box { shape: vec![4], dtype: policyport_format::ObsDType::F32 };
    let act = policyport_format::ActionSpace::Discrete { n: 2 };
    let _ = compile_cleanrl(data, CleanrlLayout::Ppo, obs, act, "fuzz", None, StorageDType::F32);
});
