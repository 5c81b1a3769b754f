#!/usr/bin/env bash
# The browser tests alone (test.sh runs them too): build both bundles, then tests/browser/run.mjs in headless
# Chromium against `policyport serve-web`. Needs the CLI built (release) first.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
ensure_browser_deps
bash tests/scripts/web-build.sh
[ -x "$PP_BIN" ] || cargo build --release -p policyport-host --bin policyport
cli_env
node tests/browser/run.mjs "$PP_BIN" "${POLICYPORT_WEB_OUT:-$CARGO_TARGET_DIR/browser-test}"
