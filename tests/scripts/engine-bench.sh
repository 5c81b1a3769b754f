#!/usr/bin/env bash
# Per-tick cost of driving N game agents through one policy (issue 35; a benchmark, never a timed test): the Bevy
# plugin's Act set, the agents layer, the C# binding's Agents.Tick (Mono), the Godot 3 GDNative runner's tick (timed
# from GDScript in Debian's godot3-server), beside a bare Session::act of the same
# batch and beside the Godot RL Agents pattern (one onnxruntime Run at batch 1 per agent), in one run, on the
# bundled CartPole MLP (1, 100, 1 000, 10 000 agents) and the NatureCNN fixture (1, 100, 1 000: 10 000 frames of
# 84x84x4 are 1.1 GB of floats). Prints a table with the ratios; needs test.sh's build (or runs it).
# Benchmarks build the `release` profile (what users get), not the test command's `suite` (Cargo.toml).
PP_PROFILE="${PP_PROFILE:-release}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$ROOT/tests/scripts/deps.sh"
set -euo pipefail
need_cargo
torch_env
ensure_mono
ensure_godot3
# bench-timing: tick_bench's act-system parts timed inside the Bevy system (`bevy_in_*`), and the Godot 3 runner's
# acts timed inside its calls (`godot3_in_*`; policyport-agents times the act of `tick_rows`, so the C# binding's
# ticks carry its two clock reads too, ~0.04 µs).
cargo build --profile "$PP_PROFILE" --workspace --all-targets --features "$PP_FEATURES,policyport-bevy/bench-timing,policyport-godot3/bench-timing"
rel="$PP_OUT"
d="$CARGO_TARGET_DIR/engine-bench"
rm -rf "$d" && mkdir -p "$d"
seconds=${POLICYPORT_BENCH_SECONDS:-0.3}
ort_lib=$(ls "$PP_VENV"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so* | sort | tail -1)
mcs -langversion:7.2 -unsafe -target:library -out:"$d/Policyport.dll" host/csharp/Policyport.cs
mcs -langversion:7.2 -unsafe -r:"$d/Policyport.dll" -out:"$d/Bench.exe" host/csharp/tests/Bench.cs
g3="$d/godot3" && cp -r host/godot3/demo "$g3" && mkdir -p "$g3/bin" "$g3/.xdg" && cp "$rel/libpolicyport_godot3.so" "$g3/bin/"
for spec in "cartpole 1,100,1000,10000" "nature_cnn 1,100,1000"; do
  read -r name counts <<<"$spec"
  fx="tests/fixtures/$name"
  "$PP_BIN" compile "$fx/policy.onnx" --spec "$fx/import.json" -o "$d/$name.policy" >/dev/null
  "$rel/examples/tick_bench" --policy "$d/$name.policy" --agents "$counts" --seconds "$seconds" --threads 2 | sed "s/^{/{\"model\": \"$name\", /" >> "$d/results.jsonl"
  (cd "$d" && LD_LIBRARY_PATH="$rel" mono Bench.exe "$name.policy" "$counts" "$seconds") | sed "s/^{/{\"model\": \"$name\", /" >> "$d/results.jsonl"
  XDG_DATA_HOME="$g3/.xdg" POLICYPORT_POLICY="$d/$name.policy" POLICYPORT_BENCH_AGENTS="$counts" POLICYPORT_BENCH_SECONDS="$seconds" \
    godot3-server --path "$g3" res://bench.tscn 2>/dev/null | grep '^{' | sed "s/^{/{\"model\": \"$name\", /" >> "$d/results.jsonl"
  # The Godot RL Agents pattern runs the actor alone (its export returns `action_net(...)`: the critic is dead
  # code the ONNX exporter drops), as every path above acts without the value: the fixture's graph cut at the
  # distribution's outputs. The whole graph (with the value) is timed too, for reference.
  "$PP_VENV/bin/python" - "$fx" "$d/$name.actor.onnx" <<'PY'
import json, sys, onnx, onnx.utils
fx, out = sys.argv[1], sys.argv[2]
dist = json.load(open(f"{fx}/import.json"))["distribution"]
graph_outputs = {o.name for o in onnx.load(f"{fx}/policy.onnx").graph.output}
keep = [v for k, v in dist.items() if k != "kind" and isinstance(v, str) and v in graph_outputs]
inputs = [i.name for i in onnx.load(f"{fx}/policy.onnx").graph.input]
onnx.utils.extract_model(f"{fx}/policy.onnx", out, inputs, keep)
PY
  "$rel/policyport-ort-bench" --lib "$ort_lib" --model "$d/$name.actor.onnx" --batches 1 --seconds 1 | sed "s/^{/{\"model\": \"$name\", /" >> "$d/results.jsonl"
  "$rel/policyport-ort-bench" --lib "$ort_lib" --model "$fx/policy.onnx" --batches 1 --seconds 1 | sed "s/^{/{\"model\": \"$name\", \"graph\": \"with value\", /" >> "$d/results.jsonl"
done
python3 - "$d/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"engine per-tick cost, µs per tick (median), one thread; {len(rows)} measurements ({sys.argv[1]})")
for model in dict.fromkeys(r["model"] for r in rows):
    ort = [r for r in rows if r["model"] == model and r.get("runtime") == "onnxruntime-native"]
    ort1 = next(r["us_per_run"] for r in ort if "graph" not in r)
    ort_whole = next(r["us_per_run"] for r in ort if "graph" in r)
    counts = sorted({r["agents"] for r in rows if r["model"] == model and "agents" in r})
    print(f"\n{model} (onnxruntime native at batch 1: {ort1:.1f} µs per Run of the actor alone, {ort_whole:.1f} µs with the value)")
    print("| agents | Session::act | Session::act, env-id list | Session::act with the value | agents layer | Bevy Act set | Bevy act system | Bevy update | Session::act alone | C# Agents.Tick | Godot 3 tick | onnxruntime, batch 1 per agent | Bevy overhead | Bevy overhead, same tick | C# overhead | Godot 3 overhead | Godot 3 overhead, same tick | vs the per-agent loop | Session::act, 2 threads | Bevy Act set, 2 threads | vs the per-agent loop, 2 threads |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in counts:
        get = lambda p, t=1: next(r["us_per_tick"] for r in rows if r["model"] == model and r.get("path") == p and r["agents"] == n and r.get("threads", 1) == t)
        s, si, a, b, u, c = get("session_act"), get("session_act_ids"), get("agents"), get("bevy_act_set"), get("bevy_update"), get("csharp_tick")
        bs = get("bevy_act_system")
        sv = get("session_act_with_value")
        g, alone = get("godot3_tick"), get("session_act_alone")
        s2, b2 = get("session_act", 2), get("bevy_act_set", 2)
        loop = ort1 * n
        try:
            same_tick = f"{100 * get('bevy_in_overhead') / get('bevy_in_act'):+.1f} %"
        except StopIteration:
            same_tick = "n/a"
        try:
            godot_same_tick = f"{100 * get('godot3_in_overhead') / get('godot3_in_act'):+.1f} %"
        except StopIteration:
            godot_same_tick = "n/a"
        print(f"| {n} | {s:.1f} | {si:.1f} | {sv:.1f} | {a:.1f} | {b:.1f} | {bs:.1f} | {u:.1f} | {alone:.1f} | {c:.1f} | {g:.1f} | {loop:.1f} | {100 * (bs - s) / s:+.1f} % | {same_tick} | "
              f"{100 * (c - alone) / alone:+.1f} % | {100 * (g - alone) / alone:+.1f} % | {godot_same_tick} | **{loop / b:.1f}x** | {s2:.1f} | {b2:.1f} | **{loop / b2:.1f}x** |")
print("\nEvery path acts without the value estimate (a game's default: AgentsConfig::values off, Request::skip_value; "
      "the cpu backend then skips the critic's own layers), and so does the per-agent onnxruntime loop (the actor alone, as "
      "Godot RL Agents exports it); Session::act with the value: the same act computing it, for reference. "
      "One thread: the paths of tick_bench ticked in turn (interleaved, so drift and cache state hit all alike). "
      "Session::act alone: the same act back to back, as the C# and Godot processes run theirs (their overheads are against it; "
      "Bevy's against the interleaved Session::act). Session::act, env-id list: the same act with the request the agents layer sends (an env id per row, "
      "episode-start flags). Bevy act system: the Act set's span (a timing system on each side) less an empty pair of the same "
      "timing systems in the same app and tick (what the timing itself costs, ~0.1 µs). Bevy overhead, same tick: the act system "
      "less the policy's act() timed inside it in the same tick (policyport-bevy's bench-timing feature), over that act (medians): "
      "free of the run-to-run variation of an act timed in another tick. Godot 3 overhead, same tick: the same for the "
      "Godot 3 runner (policyport-godot3's bench-timing feature: the acts inside the timed tick_discrete() calls, read from "
      "info()), free also of what differs between this act and one in another process. Bevy / C# / Godot 3 overhead: (that path − Session::act) / Session::act "
      "(Bevy: its act system; Godot 3: tick_discrete() "
      "from GDScript, the ids an Array, the observations a PoolRealArray). The per-agent loop: N × onnxruntime's batch-1 Run "
      "(measured back to back: what Godot RL Agents' ONNXInference does per agent), against the Bevy Act set. 2 threads: the "
      "act() split over the caller and one worker (Session::set_threads, Agents::set_threads), ticks back to back (a worker "
      "asleep after a whole game frame wakes late: tick_bench --gap-us shows it; the caller then takes its parts).")
PY
