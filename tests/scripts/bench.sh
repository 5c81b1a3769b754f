#!/usr/bin/env bash
# act() on the 64-256-256 benchmark MLP: policyport (cpu, flex, wasm sandbox, wgpu, libtorch) vs onnxruntime and
# torch eager on the same model, same invocation. Builds the test command's features in the `release` profile
# (what users get; PP_PROFILE=suite reuses test.sh's build for a quick look, its dependencies' compile-time crates at
# opt-level 0 do not change act() but do change the first call).
# Benchmarks build the `release` profile (what users get), not the test command's `suite` (Cargo.toml).
PP_PROFILE="${PP_PROFILE:-release}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
torch_env
cargo build --profile "$PP_PROFILE" --workspace --features "$PP_FEATURES"
cargo build --profile plugin -p policyport-plugin --target wasm32-unknown-unknown
OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= "$PP_VENV/bin/python" tests/bench/bench.py --policyport "$PP_BIN" \
  --plugin "$CARGO_TARGET_DIR/wasm32-unknown-unknown/plugin/policyport_plugin.wasm" --wgpu --tch \
  --ort-native "$PP_OUT/policyport-ort-bench" "$@"
