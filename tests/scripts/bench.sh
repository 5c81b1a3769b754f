#!/usr/bin/env bash
# act() on the 64-256-256 benchmark MLP vs onnxruntime and torch eager, same model, same invocation.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
ensure_venv
cargo build --release -p policyport-host --bin policyport
cargo build --profile plugin -p policyport-plugin --target wasm32-unknown-unknown
OPENBLAS_CORETYPE= OPENBLAS_L2_SIZE= "$PP_VENV/bin/python" tests/bench/bench.py --policyport "$PP_BIN" \
  --plugin "$CARGO_TARGET_DIR/wasm32-unknown-unknown/plugin/policyport_plugin.wasm" "$@"
