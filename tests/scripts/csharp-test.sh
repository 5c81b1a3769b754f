#!/usr/bin/env bash
# The C# binding (host/csharp: P/Invoke over the C ABI) under Debian's Mono: the binding, its tests and the Unity
# component example (against a stub of the UnityEngine types it uses) compiled with mcs; the C examples cartpole.c
# and agents.c compiled with cc against the generated header; then Tests.exe checks that the C# CartPole loop and
# the C# agents game print exactly what the C examples print, natively and sandboxed, and that bad input is a
# typed exception. test.sh runs this after its build and counts the closing "N passed, M failed" line; alone it
# needs that build (the C ABI library, the CLI, the wasm plugin).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/deps.sh"
set -euo pipefail
ensure_mono
torch_env  # the CLI links libtorch (the tch feature)
rel="$PP_OUT"
plugin="$CARGO_TARGET_DIR/wasm32-unknown-unknown/plugin/policyport_plugin.wasm"
for f in "$rel/libpolicyport_capi.so" "$PP_BIN" "$plugin"; do
  [ -f "$f" ] || { echo "no $f: build first (bash tests/scripts/test.sh)" >&2; exit 1; }
done
# The header cbindgen wrote for this build (the newest of the capi crate's build dirs).
header=$(ls -t "$rel"/build/policyport-capi-*/out/policyport.h | head -1)
out="$CARGO_TARGET_DIR/csharp-test"
rm -rf "$out" && mkdir -p "$out"
# SB3's briefly trained CartPole PPO: its episodes end anywhere from 9 to 500 steps, so equal returns mean equal
# episodes (the bundled policy solves every episode: 500 each, whatever happens in between).
"$PP_BIN" compile tests/fixtures/sb3/ppo_cartpole/model.zip -o "$out/cartpole.policy"
for ex in cartpole agents; do
  "${CC:-cc}" -std=c11 -Wall -Wextra -Werror -O2 "host/capi/examples/$ex.c" -I"$(dirname "$header")" -L"$rel" \
    -Wl,-rpath,"$rel" -lpolicyport_capi -lm -o "$out/$ex"
done
c_line=$("$out/cartpole" "$out/cartpole.policy")
"$out/agents" "$out/cartpole.policy" --agents 32 --ticks 1200 > "$out/agents.txt"
echo "C: $c_line"
echo "C: $(tail -1 "$out/agents.txt")"
mcs -langversion:7.2 -unsafe -target:library -out:"$out/Policyport.dll" host/csharp/Policyport.cs
mcs -langversion:7.2 -unsafe -r:"$out/Policyport.dll" -out:"$out/Tests.exe" host/csharp/tests/Tests.cs
mcs -langversion:7.2 -target:library -r:"$out/Policyport.dll" -out:"$out/PolicyportAgents.dll" \
  host/csharp/examples/PolicyportAgents.cs host/csharp/tests/UnityStub.cs
echo "compiled: Policyport.dll, Tests.exe, the Unity component example (PolicyportAgents.dll)"
cd "$out"
LD_LIBRARY_PATH="$rel${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" mono Tests.exe cartpole.policy "$plugin" "$c_line" agents.txt
