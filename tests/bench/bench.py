#!/usr/bin/env python3
"""act() latency on the benchmark policy (obs 64 -> 256 -> 256 tanh -> 4 logits + 1 value), policyport against
onnxruntime and torch eager on the same model, in one invocation, one thread each. Prints a table with ratios.

Run through tests/scripts/bench.sh (builds the CLI, makes the venv). The peers run the same ONNX file / the same
weights; each timing is the median over blocks of back-to-back calls, inputs fixed, outputs read back.
policyport's act() includes what a user gets from it: observation checks, preprocessing, the forward pass,
seeded sampling of the action, and the value estimate.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures", "mlp64")
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))


def median_us(fn, seconds, sync=lambda: None):
    """Median µs per call over blocks of back-to-back calls (calibrated to ≥ 50 ms a block); `sync` ends a block
    (e.g. torch.cuda.synchronize) so asynchronous work is counted."""
    for _ in range(3):
        fn()
    sync()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        if time.perf_counter() - t0 > 0.05:
            break
        n *= 2
    blocks = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(blocks) < 3:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        blocks.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(blocks))


def torch_model():
    from generate import SharedTrunkMlp
    m = SharedTrunkMlp()
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in onnx.load(f"{FIX}/policy.onnx").graph.initializer}
    m.load_state_dict(inits)
    return m.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policyport", required=True)
    ap.add_argument("--batches", default="1,64,1024")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--json", help="also write results here")
    ap.add_argument("--plugin", help="policyport_plugin.wasm: also time act() inside the wasm sandbox")
    ap.add_argument("--wgpu", action="store_true", help="also the wgpu backend (lavapipe here: a correctness device)")
    ap.add_argument("--tch", action="store_true", help="also the libtorch executor on CPU (policyport bench-torch)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        art = os.path.join(tmp, "mlp64.policy")
        subprocess.run([args.policyport, "compile", f"{FIX}/policy.onnx", "--spec", f"{FIX}/import.json",
                        "--golden", f"{FIX}/io.json", "-o", art], check=True, stdout=subprocess.DEVNULL)
        ours = {}
        runs = [("cpu", ["--backend", "cpu"]), ("flex", ["--backend", "flex"])]
        if args.plugin:
            runs.append(("wasm", ["--plugin", args.plugin]))
        if args.wgpu:
            runs.append(("wgpu", ["--backend", "wgpu"]))
        dispatches = {}
        for name, extra in runs:
            out = subprocess.run([args.policyport, "bench", art, "--batches", args.batches, "--seconds",
                                  str(args.seconds)] + extra, check=True, capture_output=True, text=True).stdout
            recs = list(map(json.loads, out.strip().splitlines()))
            ours[name] = {r["batch"]: r["us_per_act"] for r in recs}
            dispatches[name] = {r["batch"]: r.get("dispatches_per_act") for r in recs}
        if args.tch:
            out = subprocess.run([args.policyport, "bench-torch", art, "--batches", args.batches, "--seconds",
                                  str(args.seconds), "--threads", "1"], check=True, capture_output=True,
                                 text=True).stdout
            ours["tch"] = {r["batch"]: r["us_per_act"] for r in map(json.loads, out.strip().splitlines())}

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(f"{FIX}/policy.onnx", so, providers=["CPUExecutionProvider"])
    model = torch_model()
    rows = []
    for b in batches:
        x = np.random.default_rng(b).standard_normal((b, 64)).astype(np.float32)
        xt = torch.from_numpy(x)
        t_ort = median_us(lambda: sess.run(None, {"obs": x}), args.seconds)

        def eager():
            with torch.inference_mode():
                logits, value = model(xt)
                return logits.numpy(), value.numpy()
        t_torch = median_us(eager, args.seconds)
        rows.append({"batch": b, "policyport_cpu_us": ours["cpu"][b], "policyport_flex_us": ours["flex"][b],
                     "onnxruntime_us": t_ort, "torch_eager_us": t_torch})

    print(f"act() on obs64-256-256-(4+1) tanh, 1 thread, median us per call ({os.uname().machine}, "
          f"torch {torch.__version__}, onnxruntime {ort.__version__})")
    print("| batch | policyport cpu | policyport flex (burn) | onnxruntime | torch eager | ort / cpu | torch / cpu |"
          " ort / flex |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, f = r["policyport_cpu_us"], r["policyport_flex_us"]
        print(f"| {r['batch']} | {c:.1f} | {f:.1f} | {r['onnxruntime_us']:.1f} | {r['torch_eager_us']:.1f} | "
              f"{r['onnxruntime_us'] / c:.2f}x | {r['torch_eager_us'] / c:.2f}x | {r['onnxruntime_us'] / f:.2f}x |")
    print("(ratios > 1: policyport faster)")
    if "wasm" in ours:
        print()
        print("policyport inside the wasm sandbox (wasmtime 48, SIMD128) vs native cpu, same artifact, median us per act()")
        print("| batch | native cpu | wasm plugin | wasm / native |")
        print("|---|---|---|---|")
        for b in batches:
            print(f"| {b} | {ours['cpu'][b]:.1f} | {ours['wasm'][b]:.1f} | {ours['wasm'][b] / ours['cpu'][b]:.2f}x |")
    if "tch" in ours:
        print()
        print("libtorch executor (policyport bench-torch, eager, CPU, 1 thread, device Philox sampling) vs torch eager")
        print("| batch | policyport tch | torch eager | torch / tch |")
        print("|---|---|---|---|")
        for r in rows:
            b = r["batch"]
            print(f"| {b} | {ours['tch'][b]:.1f} | {r['torch_eager_us']:.1f} | {r['torch_eager_us'] / ours['tch'][b]:.2f}x |")
    if "wgpu" in ours:
        print()
        print("wgpu backend (this machine's adapter; Mesa lavapipe = Vulkan on the CPU) vs native cpu")
        print("| batch | dispatches per act | wgpu | native cpu | wgpu / cpu |")
        print("|---|---|---|---|---|")
        for b in batches:
            print(f"| {b} | {dispatches['wgpu'][b]} | {ours['wgpu'][b]:.1f} | {ours['cpu'][b]:.1f} | "
                  f"{ours['wgpu'][b] / ours['cpu'][b]:.2f}x |")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
