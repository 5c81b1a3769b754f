# Every install step the project scripts take, in one place (sourced after common.sh, not run).
#
# The rule for each `ensure_*`: look for the one thing that is needed, install only that, each piece on its own,
# and say what was installed and why -- or, when it cannot be installed, what is missing and what to do, then fail.
# Nothing is reinstalled when it is already there, so every step is safe to run on every run (CI re-runs on the
# same machine, a developer's machine with half of it installed by hand, a brand-new machine).
#
# Why each piece is separate (issue 12): on a machine whose node comes from nodesource (it ships its own npm),
# `apt-get install chromium nodejs npm` is refused as a whole because Debian's `npm` conflicts with that `nodejs`;
# CI only passed where Chromium had been installed by hand. Installing only what `command -v` cannot find avoids
# touching a working node at all.
#
# POLICYPORT_DEPS_LOG (default $CARGO_TARGET_DIR/deps.log) collects the package managers' own output; a failing
# install prints its tail.

PP_TOOLS="${POLICYPORT_TOOLS:-$HOME/.cache/policyport/tools}"
PP_DEPS_LOG="${POLICYPORT_DEPS_LOG:-$CARGO_TARGET_DIR/deps.log}"
PP_APT_UPDATED=0

# What the scripts installed in this run, printed by `deps_summary`: kept in a file, so installs made by the scripts
# test.sh calls (web-build.sh, csharp-test.sh, godot3-test.sh, the background installs) are listed too. test.sh
# starts it empty (`PP_INSTALLED_LOG` exported); a script run on its own lists its own.
PP_INSTALLED_LOG="${PP_INSTALLED_LOG:-}"
PP_INSTALLED=()
pp_installed() {
  PP_INSTALLED+=("$1")
  if [ -n "$PP_INSTALLED_LOG" ]; then
    echo "$1" >>"$PP_INSTALLED_LOG"
  fi
}

_deps_log_tail() {
  echo "---- last lines of $PP_DEPS_LOG ----" >&2
  tail -n 25 "$PP_DEPS_LOG" >&2 || true
  echo "----" >&2
}

# apt_install WHY PACKAGE...: installs exactly these Debian packages (and what they depend on), nothing else.
apt_install() {
  local why=$1
  shift
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  mkdir -p "$(dirname "$PP_DEPS_LOG")"
  echo "== installing $* from Debian's packages: $why"
  if ! command -v apt-get >/dev/null; then
    echo "ERROR: $* missing ($why) and this machine has no apt-get: install $* by hand" >&2
    return 1
  fi
  if [ "$PP_APT_UPDATED" = 0 ]; then
    if ! $sudo apt-get update -qq >>"$PP_DEPS_LOG" 2>&1; then
      echo "ERROR: apt-get update failed (needed for $*)" >&2
      _deps_log_tail
      return 1
    fi
    PP_APT_UPDATED=1
  fi
  if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >>"$PP_DEPS_LOG" 2>&1; then
    echo "ERROR: apt-get install $* failed ($why); apt said:" >&2
    _deps_log_tail
    return 1
  fi
  pp_installed "$* (apt: $why)"
}

# Mono (Debian's mcs, C# 7.2, and the runtime) for the C# binding's tests (host/csharp).
ensure_mono() {
  if ! command -v mcs >/dev/null || ! command -v mono >/dev/null; then
    apt_install "the C# binding's tests (host/csharp: mcs + mono)" mono-mcs mono-runtime
  fi
}

# Godot 3.2's headless server (Debian's godot3-server: the only Godot these machines can install) for the Godot 3
# GDNative runner's real-engine scene (host/godot3, tests/scripts/godot3-test.sh).
ensure_godot3() {
  if ! command -v godot3-server >/dev/null; then
    apt_install "the Godot 3 headless scene (host/godot3: the GDNative PolicyRunner in a real engine)" godot3-server
  fi
}

# Mesa lavapipe (Vulkan on the CPU) for the wgpu backend's tests.
ensure_lavapipe() {
  if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    apt_install "Vulkan on the CPU (Mesa lavapipe) for the wgpu backend's tests" mesa-vulkan-drivers libvulkan1
  fi
  # Mesa's WSI wants a runtime dir even for compute-only use (else a warning per device open).
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$CARGO_TARGET_DIR/xdg-runtime}"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
}

# Headless Chromium for tests/browser (Debian's package: no browser download, which this workplace forbids).
ensure_chromium() {
  if [ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ]; then
    return 0
  fi
  if ! command -v chromium >/dev/null; then
    apt_install "headless Chromium for the browser tests (tests/browser/run.mjs)" chromium
  fi
  chromium --version >/dev/null 2>&1 || { echo "ERROR: chromium is installed but 'chromium --version' fails" >&2; return 1; }
}

# node (>= 20, for playwright-core 1.65) and npm. Each only when absent: a node that is already there
# (nodesource's, nvm's, Debian's) is used as it is; Debian's npm is installed only when there is no npm at all.
# A node older than 20 (Debian 12's nodejs is 18) is not replaced: node $PP_NODE_VERSION from the npm registry
# (package node-linux-<arch>, the official binaries) is installed under $PP_TOOLS and put first on PATH for this
# run (found again by later runs, not reinstalled).
PP_NODE_VERSION=20.20.2
ensure_node() {
  if ! command -v node >/dev/null; then
    apt_install "node for the browser tests and the benchmark page" nodejs
  fi
  if ! command -v npm >/dev/null; then
    if ! apt_install "npm for the browser tests' packages (web/package-lock.json)" npm; then
      echo "ERROR: there is a node ($(command -v node), $(node --version)) but no npm, and Debian's npm cannot be" >&2
      echo "       installed beside it (it conflicts with node builds that ship their own npm, e.g. nodesource's)." >&2
      echo "       Install the npm that belongs to that node, then re-run." >&2
      return 1
    fi
  fi
  if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
    local arch
    case "$(uname -m)" in
      x86_64) arch=x64 ;;
      aarch64) arch=arm64 ;;
      *) echo "ERROR: node $(node --version) is older than 20 and no node-linux package for $(uname -m)" >&2; return 1 ;;
    esac
    local dir="$PP_TOOLS/node-$PP_NODE_VERSION"
    local bin="$dir/node_modules/node-linux-$arch/bin"
    if [ ! -x "$bin/node" ]; then
      echo "== node $(node --version) at $(command -v node) is older than 20 (playwright-core needs 20+):"
      echo "   installing node $PP_NODE_VERSION from the npm registry (node-linux-$arch) under $dir"
      if ! npm install --prefix "$dir" --no-save --no-audit --no-fund --loglevel=error "node-linux-$arch@$PP_NODE_VERSION"; then
        echo "ERROR: could not install node-linux-$arch@$PP_NODE_VERSION from the npm registry" >&2
        return 1
      fi
      pp_installed "node $PP_NODE_VERSION under $dir (npm package node-linux-$arch: the machine's node is older than 20)"
    fi
    export PATH="$bin:$PATH"
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$major" -lt 20 ]; then
    echo "ERROR: node $(node --version) at $(command -v node) is older than 20 (playwright-core needs 20+)" >&2
    return 1
  fi
}

# The pinned npm packages (playwright-core, onnxruntime-web) in web/node_modules, re-installed only when
# web/package-lock.json changed.
ensure_node_modules() {
  if [ ! -f web/node_modules/.package-lock.json ] || ! cmp -s web/package-lock.json web/node_modules/.pp-lock; then
    echo "== npm ci in web/ (playwright-core, onnxruntime-web as pinned in web/package-lock.json)"
    # Not `npm ci && cp ...`: bash's errexit skips a failing command on the left of `&&`, and a failed install
    # was then reported as installed (caught by fresh-check.sh).
    if ! (cd web && npm ci --no-audit --no-fund --loglevel=error); then
      echo "ERROR: npm ci in web/ failed (registry unreachable, or a TLS proxy whose CA npm does not trust:" >&2
      echo "       NODE_EXTRA_CA_CERTS / npm's cafile)" >&2
      return 1
    fi
    cp web/package-lock.json web/node_modules/.pp-lock
    pp_installed "web/node_modules (npm ci)"
  fi
}

ensure_browser_deps() {
  ensure_chromium
  ensure_node
  ensure_node_modules
}

ensure_wasm_target() {
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    echo "== rustup target add wasm32-unknown-unknown (the plugin and the browser bundles)"
    rustup target add wasm32-unknown-unknown
    pp_installed "rust target wasm32-unknown-unknown (rustup)"
  fi
}

# The standard library's source, for the browser bundle with wasm threads: std must be rebuilt with atomics
# (`-Z build-std`; the rustup wasm32 std is built without them). ~3 MB from rustup.
ensure_rust_src() {
  if [ ! -d "$(rustc --print sysroot)/lib/rustlib/src/rust/library/std" ]; then
    echo "== rustup component add rust-src (std rebuilt with atomics for the wasm threads bundle)"
    rustup component add rust-src
    pp_installed "rust-src component (rustup)"
  fi
}

# aarch64 Linux under emulation, for the NEON kernels (the CI machine is x86-64): Rust's aarch64 standard library,
# Debian's cross linker with its C library, and qemu-user to run the binaries (~15 s and ~150 MB from apt). Then
# `aarch64_env` points cargo at them: `cargo test --target aarch64-unknown-linux-gnu` runs its tests under qemu.
ensure_aarch64_cross() {
  if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    echo "== rustup target add aarch64-unknown-linux-gnu (the NEON kernels, run under qemu)"
    rustup target add aarch64-unknown-linux-gnu
    pp_installed "rust target aarch64-unknown-linux-gnu (rustup)"
  fi
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null ||
    [ ! -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ]; then
    apt_install "linking and running aarch64 binaries (the NEON kernels' tests)" \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
  fi
}

aarch64_env() {
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
  PP_AARCH64_RUN=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
}

# wasm-bindgen-cli at exactly the version of the wasm-bindgen crate in Cargo.toml (they must match), under
# $PP_TOOLS so it does not shadow another version on PATH.
ensure_wasm_bindgen() {
  local version
  version=$(awk -F'"' '/^wasm-bindgen = / {print $2}' "$ROOT/Cargo.toml" | tr -d '=')
  PP_WASM_BINDGEN="$PP_TOOLS/bin/wasm-bindgen"
  if [ ! -x "$PP_WASM_BINDGEN" ] || [ "$("$PP_WASM_BINDGEN" --version | awk '{print $2}')" != "$version" ]; then
    echo "== installing wasm-bindgen-cli $version under $PP_TOOLS (must equal the wasm-bindgen crate; ~3-8 min, once)"
    # Not --locked: its lockfile names a webpki-roots the registry here does not carry. Only the `wasm-bindgen`
    # binary, without the default `rustls-tls` feature (the test runner's TLS stack, which the scripts never run),
    # at opt-level 1: 3.5 instead of 4.5 CPU-minutes on the 2-core Zen 3 VM (it builds beside the main build on
    # the same two cores), and the same bundles byte for byte (the WebGPU one in 2.2 s instead of 2.1).
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo install wasm-bindgen-cli --version "=$version" --root "$PP_TOOLS" \
      --force --no-default-features --bin wasm-bindgen
    pp_installed "wasm-bindgen-cli $version (cargo install)"
  fi
}

# cargo fuzz needs a nightly toolchain (sanitizer flags). Returns 1 (after saying why) when none can be had.
ensure_fuzz_tools() {
  if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "== rustup toolchain install nightly --profile minimal (cargo fuzz needs nightly)"
    if ! rustup toolchain install nightly --profile minimal >>"$PP_DEPS_LOG" 2>&1; then
      echo "ERROR: no nightly toolchain and 'rustup toolchain install nightly' failed" >&2
      _deps_log_tail
      return 1
    fi
    pp_installed "nightly toolchain (rustup)"
  fi
  if ! cargo fuzz --version 2>/dev/null | grep -q ' 0\.13\.2'; then
    echo "== cargo install cargo-fuzz 0.13.2 (~2 min, once)"
    cargo install cargo-fuzz --locked --version 0.13.2
    pp_installed "cargo-fuzz 0.13.2 (cargo install)"
  fi
}

# ensure_requirements_venv DIR REQUIREMENTS IMPORTS WHAT: a venv at DIR with `pip install -r REQUIREMENTS`, made
# (again) unless it exists, holds a copy of that exact requirements file, and imports IMPORTS.
ensure_requirements_venv() {
  local dir=$1 req=$2 imports=$3 what=$4
  if [ -x "$dir/bin/python" ] && cmp -s "$req" "$dir/.pp-requirements" &&
    "$dir/bin/python" -c "import $imports" 2>/dev/null; then
    return 0
  fi
  if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
    apt_install "python3 -m venv ($what)" python3-venv
  fi
  echo "== python venv $dir from ${req#"$ROOT/"} ($what)"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  "$dir/bin/pip" install -q -r "$req"
  cp "$req" "$dir/.pp-requirements"
  pp_installed "python venv $dir (pip -r ${req#"$ROOT/"})"
}

# The Python side (torch==2.11.0 CPU/CUDA-13 wheel from PyPI, onnx, onnxruntime): the libtorch executor links the
# venv's torch; the fixture generator and the benchmark run in it. Re-installed when tests/requirements-torch.txt
# changes (a copy is kept in the venv).
ensure_venv() {
  ensure_requirements_venv "$PP_VENV" "$ROOT/tests/requirements-torch.txt" "torch, onnx, onnxruntime, onnxscript" \
    "torch 2.11.0, onnx, onnxruntime; ~3 min, ~5 GB"
}

# The Python package's test venv (tests/requirements-python.txt: torch 2.11.0, RLlib on Ray 2.60, SB3, pytest),
# apart from the torch venv: ray pins gymnasium 1.2 and the wheel is installed into it fresh on every run. torch's
# wheels come from pip's cache when the torch venv was made first (72 s here, ~2 GB more disk).
PP_PYVENV="${POLICYPORT_PY_VENV:-$HOME/.cache/policyport/venv-py}"
ensure_py_venv() {
  ensure_requirements_venv "$PP_PYVENV" "$ROOT/tests/requirements-python.txt" \
    "torch, ray.rllib, stable_baselines3, sb3_contrib, pytest" "torch, ray[rllib], stable-baselines3, pytest"
}

deps_summary() {
  local listed=()
  if [ -n "$PP_INSTALLED_LOG" ] && [ -s "$PP_INSTALLED_LOG" ]; then
    mapfile -t listed <"$PP_INSTALLED_LOG"
  elif [ -z "$PP_INSTALLED_LOG" ]; then
    listed=("${PP_INSTALLED[@]}")
  fi
  if [ ${#listed[@]} = 0 ]; then
    echo "installed by this run: nothing (everything was already there)"
  else
    echo "installed by this run:"
    printf '  - %s\n' "${listed[@]}"
  fi
}
