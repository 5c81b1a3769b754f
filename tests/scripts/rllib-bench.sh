#!/usr/bin/env bash
# RLlib PPO sampling: torch inference vs policyport on the same env runners (tests/bench/rllib_bench.py; issue 17's
# number). Packs and installs the wheel from the workspace build like python-test.sh; pass --models / --envs /
# --seconds through.
# Benchmarks build the `release` profile (what users get), not the test command's `suite` (Cargo.toml).
PP_PROFILE="${PP_PROFILE:-release}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_py_venv
torch_env
cargo build --profile "$PP_PROFILE" --workspace --features "$PP_FEATURES"
lib="$PP_OUT/lib_native.so"
wheel=$("$PP_PYVENV/bin/python" host/python/pack_wheel.py --lib "$lib" --out "$CARGO_TARGET_DIR/wheels")
"$PP_PYVENV/bin/pip" install -q --force-reinstall --no-deps "$wheel"
cd "$ROOT/tests/bench"
RAY_AUTH_MODE=disabled "$PP_PYVENV/bin/python" rllib_bench.py "$@"
