#!/usr/bin/env bash
# Retrain / re-export every fixture from scratch (seeded), then re-bless the inspect snapshots.
#   bash tests/scripts/regenerate-fixtures.sh            # the ONNX fixtures, SB3 archives and CleanRL checkpoints
#   bash tests/scripts/regenerate-fixtures.sh nature_cnn # some ONNX fixtures only
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_venv
# The trainers themselves (stable-baselines3, gymnasium) are needed only here, not by the tests.
"$PP_VENV/bin/pip" install -q -r tests/requirements-fixtures.txt
PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate.py "$@"
if [ $# = 0 ]; then
  PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate_sb3.py
  PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate_cleanrl.py
fi
torch_env
POLICYPORT_BLESS=1 cargo test --release --workspace --features "$PP_FEATURES" --test conformance -- inspect_summaries
