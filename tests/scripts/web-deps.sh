# Shared by the browser scripts (sourced after common.sh): headless Chromium from apt, node + npm packages
# (playwright-core, onnxruntime-web) in web/node_modules; `prepare_web` also builds the bundles and the CLI.
ensure_browser_deps() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if ! command -v chromium >/dev/null || ! command -v node >/dev/null; then
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium nodejs npm >/dev/null
  fi
  if [ ! -f web/node_modules/.package-lock.json ] || ! cmp -s web/package-lock.json web/node_modules/.pp-lock; then
    (cd web && npm ci --no-audit --no-fund --loglevel=error) && cp web/package-lock.json web/node_modules/.pp-lock
  fi
}

# Everything a browser script needs: Chromium, node packages, both bundles, and a runnable CLI (the one test.sh
# built, with any features; a default build when there is none).
prepare_web() {
  ensure_browser_deps
  bash tests/scripts/web-build.sh
  [ -x "$PP_BIN" ] || cargo build --release -p policyport-host --bin policyport
  cli_env
}
