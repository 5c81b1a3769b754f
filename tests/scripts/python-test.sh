#!/usr/bin/env bash
# The Python package (host/python): pack the wheel from the native module the workspace build made (no second
# compile: host/python/pack_wheel.py says why), install it into its own venv with RLlib and SB3, run pytest
# (tests/python: the API on every backend, SB3 against its own predict, RLlib on Ray against its torch module,
# a two-node cluster, the README's examples). test.sh runs this after its build; alone it needs that build.
# Writes a JUnit report to $CARGO_TARGET_DIR/pytest.xml (test.sh counts from it).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_py_venv
lib="$PP_OUT/lib_native.so"
[ -f "$lib" ] || { echo "no $lib: build first (bash tests/scripts/test.sh, or cargo build --profile $PP_PROFILE --workspace --features \"$PP_FEATURES\")" >&2; exit 1; }
wheel=$("$PP_PYVENV/bin/python" host/python/pack_wheel.py --lib "$lib" --out "$CARGO_TARGET_DIR/wheels")
echo "wheel: $wheel ($(stat -c %s "$wheel") bytes)"
"$PP_PYVENV/bin/pip" install -q --force-reinstall --no-deps "$wheel"
# Run from the tests directory so `import policyport` finds the installed wheel, never the source tree.
cd "$ROOT/tests/python"
export RAY_AUTH_MODE=disabled
"$PP_PYVENV/bin/python" -m pytest -q -rs -p no:cacheprovider --durations=8 --junitxml="$CARGO_TARGET_DIR/pytest.xml" "$@"
