#!/usr/bin/env python3
"""The PyTorch peer for the libtorch/CUDA benchmark: the benchmark MLP (tests/fixtures/mlp64) in torch eager, act =
forward + Categorical sample + value, read back to the host (what a sampling worker does per step).
Prints one JSON line per batch, like `policyport bench-torch`.

    python tests/bench/torch_eager.py --device cuda --batches 1,64,1024,65536 [--precision f32|f16|bf16]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
sys.path.insert(0, HERE)
from bench import median_us  # noqa: E402


def model(device, dtype):
    from generate import SharedTrunkMlp
    import onnx
    from onnx import numpy_helper
    m = SharedTrunkMlp()
    path = os.path.join(HERE, "..", "fixtures", "mlp64", "policy.onnx")
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in onnx.load(path).graph.initializer}
    m.load_state_dict(inits)
    return m.eval().to(device=device, dtype=dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,64,1024")
    ap.add_argument("--precision", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.precision]
    dev = torch.device(a.device)
    m = model(dev, dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for b in [int(x) for x in a.batches.split(",")]:
        obs = torch.randn(b, 64).numpy()

        @torch.inference_mode()
        def act():
            x = torch.from_numpy(obs).to(dev, non_blocking=False).to(dtype)
            logits, value = m(x)
            action = torch.distributions.Categorical(logits=logits.float()).sample()
            return action.cpu().numpy(), value.float().cpu().numpy()

        us = median_us(act, a.seconds, sync)
        print(json.dumps({"runtime": f"torch-eager-{a.precision}", "device": str(dev), "batch": b, "us_per_act": us}))


if __name__ == "__main__":
    main()
