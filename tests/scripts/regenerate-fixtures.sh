#!/usr/bin/env bash
# Retrain / re-export every fixture from scratch (seeded), then re-bless the inspect snapshots.
#   bash tests/scripts/regenerate-fixtures.sh            # the ONNX fixtures, SB3 archives and CleanRL checkpoints
#   bash tests/scripts/regenerate-fixtures.sh nature_cnn # some ONNX fixtures only
#   bash tests/scripts/regenerate-fixtures.sh rllib      # the RLlib checkpoints only (their own venv)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rllib_fixtures() {
  # Ray pins gymnasium 1.2 (stable-baselines3 2.9 wants 1.4): a venv of its own next to the main one.
  local venv="${PP_VENV}-rllib"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/requirements-rllib.txt
  RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 "$venv/bin/python" tests/fixtures/generate_rllib.py
}
if [ "${1:-}" = rllib ]; then
  rllib_fixtures
  exit
fi
ensure_venv
# The trainers themselves (stable-baselines3, gymnasium) are needed only here, not by the tests.
"$PP_VENV/bin/pip" install -q -r tests/requirements-fixtures.txt
PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate.py "$@"
if [ $# = 0 ]; then
  PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate_sb3.py
  PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate_cleanrl.py
  rllib_fixtures
fi
torch_env
POLICYPORT_BLESS=1 cargo test --profile "$PP_PROFILE" --workspace --features "$PP_FEATURES" --test conformance -- inspect_summaries
