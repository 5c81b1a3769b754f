#!/usr/bin/env bash
# Godot 3 in a real engine: Debian's godot3-server (Godot 3.2.3, headless) loads the GDNative library
# (host/godot3) and runs host/godot3/demo, a scene that is host/capi/examples/agents.c written in GDScript: 64
# CartPoles, one PolicyRunner.tick per physics frame in a rotating order, respawns, agent 0 replaced midway. The
# C program runs on the same trained policy (SB3's briefly trained CartPole: episodes of 9..500 steps, so equal
# returns mean something) and every finished episode's return must be equal, in order (odd frames act through
# tick_discrete(), even frames through tick() + discrete_actions()). The scene first drives the
# runner's refusals (a PoolIntArray of ids, a float id, a String as the second id, one id twice, a dead id, a short
# row, a missing argument, a mask byte of 7, ...) and checks each is refused with its reason and changes nothing,
# that the ids' Array is read in place on this engine (`info().ids_in_place`), and that the PoolIntArray
# discrete_actions() answered keeps its numbers after the next tick. Then demo/group.tscn: 64 cart nodes of a
# group driven by the GDScript PolicyAgents node (policy_agents.gd) on the bundled policy, one cart freed and one
# added midway: its id must be released (64 agents alive at the end) and the carts balance (mean return >= 450).
# Needs test.sh's build (the CLI, the GDNative library and the C ABI library in $PP_OUT); installs godot3-server.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_godot3
cli_env
agents=${POLICYPORT_GODOT3_AGENTS:-64} ticks=${POLICYPORT_GODOT3_TICKS:-1500}
lib="$PP_OUT/libpolicyport_godot3.so"
capi="$PP_OUT/libpolicyport_capi.so"
for f in "$lib" "$capi" "$PP_BIN"; do
  [ -f "$f" ] || { echo "no $f: build first (bash tests/scripts/test.sh)" >&2; exit 1; }
done
d="$CARGO_TARGET_DIR/godot3-demo"
rm -rf "$d" && cp -r host/godot3/demo "$d" && mkdir -p "$d/bin" "$d/.xdg"
cp "$lib" "$d/bin/"
"$PP_BIN" compile tests/fixtures/sb3/ppo_cartpole/model.zip -o "$d/cartpole.policy"

header=$(ls -t "$PP_OUT"/build/policyport-capi-*/out/policyport.h | head -1)
cc -std=c11 -Wall -Wextra -Werror -O2 host/capi/examples/agents.c -I"$(dirname "$header")" \
  -L"$(dirname "$capi")" -Wl,-rpath,"$(dirname "$capi")" -lpolicyport_capi -lm -o "$d/agents_c"
"$d/agents_c" "$d/cartpole.policy" --agents "$agents" --ticks "$ticks" > "$d/c.txt"

# --fixed-fps: one physics frame per frame, as fast as the machine goes (no real-time wait). Godot writes its
# user data under XDG_DATA_HOME; the timeout stops a scene that never quits (a script error leaves it idle).
echo "$(godot3-server --version 2>/dev/null | tail -1): $agents agents, $ticks physics frames"
set +e
XDG_DATA_HOME="$d/.xdg" XDG_CONFIG_HOME="$d/.xdg" POLICYPORT_AGENTS=$agents POLICYPORT_TICKS=$ticks \
  timeout 300 godot3-server --fixed-fps 60 --path "$d" > "$d/run.log" 2>&1
rc=$?
set -e
grep '^godot3: ' "$d/run.log" || true
fail() {
  echo "FAILED: $*" >&2
  grep -v '^ *At: ' "$d/run.log" | tail -n 20 >&2
  exit 1
}
[ "$rc" = 0 ] || fail "godot3-server exited $rc"
if grep -q 'godot3: FAILED' "$d/run.log"; then fail "the scene reported a failure"; fi
refusals=$(grep -c '^godot3: refused as it should: ' "$d/run.log" || true)
[ "$refusals" = 12 ] || fail "$refusals of the scene's 12 refusal checks ran"
grep -q '^godot3: the last actions are kept while the next are written' "$d/run.log" || fail "no check of kept actions"
grep -q "^godot3: $agents agents, $ticks ticks, [0-9]* episodes finished" "$d/run.log" || fail "no closing line"
c_returns=$(grep '^returns:' "$d/c.txt")
g_returns=$(grep '^returns:' "$d/run.log" || true)
[ "$c_returns" = "$g_returns" ] ||
  fail "the Godot scene's returns differ from agents.c's ($(wc -w <<<"$c_returns") vs $(wc -w <<<"$g_returns") words)"
echo "godot3: every return equal to agents.c's ($(tail -1 "$d/c.txt"))"

"$PP_BIN" compile tests/fixtures/cartpole/policy.onnx --spec tests/fixtures/cartpole/import.json -o "$d/bundled.policy"
set +e
XDG_DATA_HOME="$d/.xdg" XDG_CONFIG_HOME="$d/.xdg" POLICYPORT_POLICY="$d/bundled.policy" \
  timeout 300 godot3-server --fixed-fps 60 --path "$d" res://group.tscn > "$d/group.log" 2>&1
rc=$?
set -e
grep '^godot3 group: ' "$d/group.log" || true
[ "$rc" = 0 ] || { grep -v '^ *At: ' "$d/group.log" | tail -n 20 >&2; echo "FAILED: the group scene exited $rc" >&2; exit 1; }
grep -Eq '^godot3 group: 64 carts, 600 frames, 64 agents alive, [1-9][0-9]* episodes finished, mean return (4[5-9][0-9]|500)\.' "$d/group.log" ||
  { grep -v '^ *At: ' "$d/group.log" | tail -n 20 >&2; echo "FAILED: want 64 agents alive and mean return >= 450" >&2; exit 1; }
