#!/usr/bin/env bash
# The browser benchmark, headless: policyport CPU-wasm / WebGPU vs onnxruntime-web wasm / WebGPU at batch 1, 64,
# 1024 (web/bench.html), ratios printed. Args: [batches] [seconds per measurement].
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
ensure_browser_deps
bash tests/scripts/web-build.sh
# The CLI test.sh built (any features); built with defaults when there is none.
[ -x "$PP_BIN" ] || cargo build --release -p policyport-host --bin policyport
cli_env
node tests/browser/bench.mjs "$PP_BIN" "$CARGO_TARGET_DIR/browser-bench" "${1:-1,64,1024}" "${2:-1}"
