#!/usr/bin/env bash
# Retrain / re-export every fixture from scratch (seeded), then re-bless the inspect snapshots.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_venv
PYTHONUNBUFFERED=1 "$PP_VENV/bin/python" tests/fixtures/generate.py "$@"
POLICYPORT_BLESS=1 cargo test --release -p policyport-conformance -- inspect_summaries
