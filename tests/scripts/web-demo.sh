#!/usr/bin/env bash
# Build the browser bundles and serve the demo: http://127.0.0.1:8080/ (benchmark: /bench.html).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
ensure_browser_deps
bash tests/scripts/web-build.sh
# The CLI test.sh built (any features); built with defaults when there is none.
[ -x "$PP_BIN" ] || cargo build --release -p policyport-host --bin policyport
cli_env
exec "$PP_BIN" serve-web --root web "$@"
