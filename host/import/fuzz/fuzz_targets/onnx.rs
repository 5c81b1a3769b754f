#![no_main]
//! The ONNX importer on arbitrary bytes (seeded with the committed fixtures' models): a typed error or an
//! artifact, never a panic.
use libfuzzer_sys::fuzz_target;
use policyport_import::{DistSpec, ImportSpec, StorageDType, compile_onnx};

fuzz_target!(|data: &[u8]| {
    let spec = ImportSpec {
        value: Some("value".into()),
        ..ImportSpec::new(DistSpec::Categorical { logits: "logits".into() })
    };
    let _ = compile_onnx(data, &spec, "fuzz", None, StorageDType::F32);
});
