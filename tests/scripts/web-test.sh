#!/usr/bin/env bash
# The browser tests alone (test.sh runs them too): tests/browser/run.mjs in headless Chromium against
# `policyport serve-web`.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
prepare_web
# The lean CLI (its own small graph, as test.sh does: see PP_LEAN_BIN in common.sh) for the suite's ~95 processes.
cargo build --profile demo -p policyport-cli --bin policyport --no-default-features
node tests/browser/run.mjs "$PP_LEAN_BIN" "${POLICYPORT_WEB_OUT:-$CARGO_TARGET_DIR/browser-test}"
