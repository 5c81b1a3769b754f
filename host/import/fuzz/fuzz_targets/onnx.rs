#![no_main]
//! The ONNX importer on arbitrary bytes (seeded with the committed fixtures' models): a typed error or an
//! artifact, never a panic.
use libfuzzer_sys::fuzz_target;
use policyport_import::{DistSpec, ImportSpec, Storage, compile_onnx};

fuzz_target!(|data: &[u8]| {
    let spec = ImportSpec {
        name: None,
        distribution: DistSpec::Categorical { logits: "logits".into() },
        value: Some("value".into()),
        observation: None,
        action: None,
        normalize: None,
        scale: None,
        input: None,
        source: None,
        recurrent: vec![],
    };
    let _ = compile_onnx(data, &spec, "fuzz", None, Storage::F32);
});
