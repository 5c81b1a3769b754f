#!/usr/bin/env bash
# The Godot 4 demo project (host/godot/demo) headless: 64 CartPoles as nodes, one PolicyAgents node acting for
# all of them each physics frame through the GDExtension. Needs a Godot 4 binary in GODOT4_BIN (none can be
# installed from Debian's packages, which ship only Godot 3.2): test.sh reports this check skipped without one.
# Needs test.sh's build (the extension and the CLI).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail
[ -n "${GODOT4_BIN:-}" ] && [ -x "$GODOT4_BIN" ] || { echo "GODOT4_BIN is not set to a Godot 4 binary" >&2; exit 2; }
torch_env
lib="$PP_OUT/libpolicyport_godot.so"
[ -f "$lib" ] || { echo "no $lib: build first (bash tests/scripts/test.sh)" >&2; exit 1; }
demo="$CARGO_TARGET_DIR/godot-demo"
rm -rf "$demo" && cp -r host/godot/demo "$demo" && mkdir -p "$demo/bin"
cp "$lib" "$demo/bin/"
"$PP_BIN" compile tests/fixtures/cartpole/policy.onnx --spec tests/fixtures/cartpole/import.json -o "$demo/cartpole.policy"
"$GODOT4_BIN" --headless --path "$demo" 2>&1 | tee "$demo/run.log"
grep -Eq '^godot: 64 carts, 600 frames, [0-9]+ episodes finished, mean return (4[5-9][0-9]|500)\.' "$demo/run.log"
