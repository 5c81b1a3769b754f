# Shared by the browser scripts (sourced after common.sh): `prepare_web` installs what is missing (Chromium, node,
# npm, the pinned npm packages: see ensure_browser_deps in deps.sh), builds both bundles and a runnable CLI.

# Everything a browser script needs: Chromium, node packages, both bundles, and a runnable CLI (the one test.sh
# built, with any features; a default build when there is none).
prepare_web() {
  ensure_browser_deps
  bash tests/scripts/web-build.sh
  [ -x "$PP_BIN" ] || cargo build --profile "$PP_PROFILE" -p policyport-cli --bin policyport
  cli_env
}
