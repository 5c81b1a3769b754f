#!/usr/bin/env bash
# Build the browser bundles and serve the demo: http://127.0.0.1:8080/ (benchmark: /bench.html). Args go to
# `policyport serve-web` (e.g. --port 9000).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/web-deps.sh"
prepare_web
exec "$PP_BIN" serve-web --root web "$@"
