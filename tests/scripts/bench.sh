#!/usr/bin/env bash
# act() on the 64-256-256 benchmark MLP: policyport (cpu, flex, wasm sandbox, wgpu, libtorch) vs onnxruntime and
# torch eager on the same model, same invocation. Builds the same crate graph as test.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
torch_env
cargo build --release --workspace --features "$PP_FEATURES"
cargo build --profile plugin -p policyport-plugin --target wasm32-unknown-unknown
OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= "$PP_VENV/bin/python" tests/bench/bench.py --policyport "$PP_BIN" \
  --plugin "$CARGO_TARGET_DIR/wasm32-unknown-unknown/plugin/policyport_plugin.wasm" --wgpu --tch \
  --ort-native "$CARGO_TARGET_DIR/release/policyport-ort-bench" "$@"
