"""RLlib PPO sampling with its default torch inference vs through policyport, same env runners, same machine, same
run (tests/scripts/rllib-bench.sh). Prints env steps/s of pure sampling (every env runner samples a fixed number of
steps, timed from the driver), RLlib's own per-forward inference time (`rlmodule_inference_timer`, the new API
stack's successor of `mean_inference_ms`), both ways and as ratios, and how long a policyport rebuild at a weight
sync takes. Models: the default CartPole MLP (256-256 tanh), the default LSTM (cell 256) and the default CNN on
42x42x3 frames. The numbers are this machine's; the ratio is the result (targets: issue 17, >= 2x env steps/s on
the default CartPole model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.algorithms.ppo import PPOConfig

import policyport.rllib as pr


class Frames(gym.Env):
    """42x42x3 float frames (RLlib's default CNN filters for 42-pixel frames), cheap to step."""

    observation_space = gym.spaces.Box(0.0, 1.0, (42, 42, 3), np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, config=None):
        super().__init__()
        self._frame = np.random.default_rng(0).random((42, 42, 3)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame, {}

    def step(self, action):
        self.t += 1
        return self._frame, 0.0, False, self.t >= 100, {}


MODELS = {
    "mlp": ("CartPole-v1", {}),
    "lstm": ("CartPole-v1", {"use_lstm": True, "max_seq_len": 20}),
    "cnn": (Frames, {}),
}


def build(model: str, accelerate: bool, runners: int, envs: int):
    env, mc = MODELS[model]
    cfg = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, num_cpus_per_env_runner=0.5)
        .training(train_batch_size_per_learner=200 * runners * envs, minibatch_size=100, num_epochs=1)
        .debugging(seed=0)
    )
    if mc:
        cfg = cfg.rl_module(model_config=mc)
    if accelerate:
        cfg = pr.accelerate(cfg)
    return cfg.build_algo()


def _sample(runner, steps):
    t0 = time.perf_counter()
    runner.sample(num_timesteps=steps, explore=True)
    wall = time.perf_counter() - t0
    m = runner.get_metrics()
    timer = m.get("rlmodule_inference_timer")
    timer = getattr(timer, "peek", lambda: timer)() if timer is not None else None
    if hasattr(timer, "item"):
        timer = float(timer)
    rebuilds = list(getattr(runner.module, "policyport_rebuild_seconds", []))
    return wall, timer, rebuilds


def measure(model: str, accelerate: bool, runners: int, envs: int, seconds: float) -> dict:
    algo = build(model, accelerate, runners, envs)
    try:
        algo.train()  # warm: one round of sampling, learning and a weight sync
        group = algo.env_runner_group
        group.foreach_env_runner(lambda r: _sample(r, 100 * envs), local_env_runner=False)
        # Size the timed round to ~`seconds`.
        t0 = time.perf_counter()
        group.foreach_env_runner(lambda r: _sample(r, 200 * envs), local_env_runner=False)
        per_step = (time.perf_counter() - t0) / (200 * envs)
        steps = max(200, int(seconds / max(per_step, 1e-6)))
        t0 = time.perf_counter()
        res = group.foreach_env_runner(lambda r: _sample(r, steps), local_env_runner=False)
        wall = time.perf_counter() - t0
        timers = [r[1] for r in res if r[1] is not None]
        rebuilds = [t for r in res for t in r[2]]
        return {
            "steps_per_s": steps * len(res) / wall,
            "inference_ms": 1000 * statistics.mean(timers) if timers else float("nan"),
            "rebuild_ms": 1000 * statistics.median(rebuilds) if rebuilds else None,
            "steps": steps * len(res),
        }
    finally:
        algo.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,lstm,cnn")
    ap.add_argument("--runners", type=int, default=2)
    ap.add_argument("--envs", default="1,8", help="envs per env runner, comma-separated")
    ap.add_argument("--seconds", type=float, default=4.0, help="timed sampling per configuration")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    print(f"RLlib {ray.__version__} PPO sampling, {args.runners} env runners, {os.cpu_count()} CPUs; torch inference vs policyport (cpu)")
    print(f"{'model':6} {'envs':>4} | {'torch steps/s':>13} {'pp steps/s':>10} {'ratio':>6} | {'torch infer ms':>14} {'pp infer ms':>11} {'ratio':>6} | {'rebuild ms':>10}")
    for model in args.models.split(","):
        for envs in (int(e) for e in args.envs.split(",")):
            t = measure(model, False, args.runners, envs, args.seconds)
            p = measure(model, True, args.runners, envs, args.seconds)
            row = {"model": model, "envs_per_runner": envs, "torch": t, "policyport": p,
                   "steps_ratio": p["steps_per_s"] / t["steps_per_s"],
                   "inference_ratio": t["inference_ms"] / p["inference_ms"]}
            rows.append(row)
            print(f"{model:6} {envs:>4} | {t['steps_per_s']:>13.0f} {p['steps_per_s']:>10.0f} {row['steps_ratio']:>5.2f}x | "
                  f"{t['inference_ms']:>14.3f} {p['inference_ms']:>11.3f} {row['inference_ratio']:>5.2f}x | {p['rebuild_ms']:>10.1f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
