# Shared settings for the project scripts (sourced, not run).
# One target dir outside the clone, so repeated runs (and CI re-runs on the same machine) build incrementally.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/policyport/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
PP_VENV="${POLICYPORT_VENV:-$HOME/.cache/policyport/venv}"
# The crate graph's profile: `suite` (Cargo.toml says what it lowers) for the test command and everything run on its
# build; the benchmark scripts set PP_PROFILE=release before sourcing this file (what `cargo install` gives a user).
# Its outputs (the CLI, the C ABI / Godot / Python libraries, test and example binaries) are in $PP_OUT.
PP_PROFILE="${PP_PROFILE:-suite}"
PP_OUT="$CARGO_TARGET_DIR/$PP_PROFILE"
PP_BIN="$PP_OUT/policyport"
# The lean CLI (README command 1's: the native cpu backend alone, no burn, wasmtime or libtorch; the `demo` profile):
# the same commands, and it starts in ~4 ms where $PP_BIN, which links libtorch, spends ~0.33 s of CPU loading it
# (Zen 5, 2026-12-07). The test command's CLI and browser stages start it ~220 times: ~70 s a run.
PP_LEAN_BIN="$CARGO_TARGET_DIR/demo/policyport"
# The Python package's native module (host/python) is an extension module in every build of the workspace: it
# never links libpython (which a fresh machine's python3 may not ship as a shared library), and maturin sets the
# same variable, so its build and the workspace build share pyo3's compiled crates.
export PYO3_BUILD_EXTENSION_MODULE=1
# The one feature set that test.sh, bench.sh and gpu-bundle.sh build: the workspace with the libtorch executor and
# the wgpu backend, and the conformance suite told so (its own tch/wgpu features only forward to these, so the
# graph is the same). Any other feature set is a second full build of burn/wgpu/tch.
PP_FEATURES="policyport-torch/tch,policyport/wgpu,policyport-conformance/tch,policyport-conformance/wgpu"
cd "$ROOT"
# Every install step (ensure_venv, ensure_lavapipe, ensure_browser_deps, ...): idempotent, one piece at a time.
source "$ROOT/tests/scripts/deps.sh"

need_cargo() {
  command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }
}

# Each step header says when it started (seconds since the script began), so a slow run shows where time went.
PP_T0="${PP_T0:-$(date +%s)}"
export PP_T0
PP_STEPS=()
PP_STEP_T=()
PP_STEP_CPU=()
# cpu_busy_cs: the whole machine's busy CPU time so far, in centiseconds (/proc/stat's first line: user, nice,
# system, irq, softirq and steal ticks; USER_HZ is 100 on Linux), or nothing where there is no /proc/stat.
cpu_busy_cs() {
  [ -r /proc/stat ] || return 0
  awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
step() {
  echo
  echo "== $* [+$(( $(date +%s) - PP_T0 )) s]"
  PP_STEPS+=("$*")
  PP_STEP_T+=("$(date +%s)")
  PP_STEP_CPU+=("$(cpu_busy_cs)")
}
# step_times: each step's wall time, measured (a step lasts until the next one starts, the last until now), and
# the CPU time the whole machine spent meanwhile (background jobs included: it says which stages are bound by the
# cores, whose work only less compiling or testing shortens, and which leave them idle, where overlapping helps).
step_times() {
  local i n=${#PP_STEPS[@]} now end cpu_now cpu_end cpu
  now=$(date +%s)
  cpu_now=$(cpu_busy_cs)
  echo "time per stage (wall; the machine's CPU seconds meanwhile, background jobs included, and cores busy on average):"
  for ((i = 0; i < n; i++)); do
    end=${PP_STEP_T[i + 1]:-$now}
    cpu_end=${PP_STEP_CPU[i + 1]:-$cpu_now}
    if [ -n "${PP_STEP_CPU[i]}" ] && [ -n "$cpu_end" ]; then
      cpu=$(( (cpu_end - PP_STEP_CPU[i]) / 100 ))
      printf '%6d s  %6d cpu-s  %4s cores  %s\n' $((end - PP_STEP_T[i])) "$cpu" \
        "$(awk -v c="$cpu" -v w=$((end - PP_STEP_T[i])) 'BEGIN { printf (w > 0 ? "%.1f" : "-"), (w > 0 ? c / w : 0) }')" \
        "${PP_STEPS[i]:0:100}"
    else
      printf '%6d s  %s\n' $((end - PP_STEP_T[i])) "${PP_STEPS[i]:0:110}"
    fi
  done
  [ -z "${PP_STEP_CPU[0]:-}" ] || [ -z "$cpu_now" ] ||
    echo "  all stages: $(( (cpu_now - PP_STEP_CPU[0]) / 100 )) cpu-s over $((now - PP_STEP_T[0])) s on $(nproc) cores"
}

# Build and run against the venv's libtorch (the `tch` feature): torch-sys finds torch through the venv's python,
# test binaries find libtorch and the CUDA runtime wheels through LD_LIBRARY_PATH.
torch_env() {
  ensure_venv
  local site
  site=$("$PP_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  export LIBTORCH_USE_PYTORCH=1 VIRTUAL_ENV="$PP_VENV" PATH="$PP_VENV/bin:$PATH"
  export LD_LIBRARY_PATH="$site/torch/lib:$(ls -d "$site"/nvidia/cu*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
}

# For running an already-built CLI: a CLI built with the `tch` feature needs the venv's libtorch on the loader
# path (set when the venv exists; nothing is installed here).
cli_env() {
  if [ -x "$PP_VENV/bin/python" ]; then
    local site
    site=$("$PP_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    export LD_LIBRARY_PATH="$site/torch/lib:$(ls -d "$site"/nvidia/cu*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
  fi
}
