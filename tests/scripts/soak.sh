#!/usr/bin/env bash
# Concurrency + soak (issue 15; outside CI, bounded): 8 threads sharing one compiled policy per backend (cpu, flex,
# wgpu on lavapipe, the wasm plugin, libtorch), up to 1 M act() each within --seconds per backend and model,
# answers equal to a single-threaded run, resident memory flat after warm-up. Run after test.sh (same crate graph).
# Usage: bash tests/scripts/soak.sh [--acts N] [--seconds S] [--backend NAME]...   (defaults: 1000000, 60, all)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_cargo
torch_env
ensure_wasm_target
ensure_lavapipe
cargo build --profile "$PP_PROFILE" --workspace --all-targets --features "$PP_FEATURES"
cargo build --profile plugin -p policyport-plugin --target wasm32-unknown-unknown
"$PP_OUT/soak" "$@"
