#!/usr/bin/env bash
# The browser benchmark, headless: policyport CPU-wasm / WebGPU vs onnxruntime-web wasm / WebGPU at batch 1, 64,
# 1024 (web/bench.html), ratios printed. Args: [batches] [seconds per measurement].
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
prepare_web
node tests/browser/bench.mjs "$PP_BIN" "$CARGO_TARGET_DIR/browser-bench" "${1:-1,64,1024}" "${2:-1}"
