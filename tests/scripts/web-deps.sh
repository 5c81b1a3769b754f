# Shared by the browser scripts (sourced after common.sh): headless Chromium from apt, node + npm packages
# (playwright-core, onnxruntime-web) in web/node_modules.
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
