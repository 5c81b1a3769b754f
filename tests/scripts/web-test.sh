#!/usr/bin/env bash
# The browser tests alone (test.sh runs them too): tests/browser/run.mjs in headless Chromium against
# `policyport serve-web`.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
prepare_web
node tests/browser/run.mjs "$PP_BIN" "${POLICYPORT_WEB_OUT:-$CARGO_TARGET_DIR/browser-test}"
