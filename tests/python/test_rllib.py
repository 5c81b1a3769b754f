"""policyport.rllib on Ray (RLlib 2.60, new API stack): env runners sample through policyport while the learner
trains the torch module. Checked against RLlib itself: the torch module's own action_dist_inputs for the same
observations (and LSTM state), RLlib's own distribution's log-probability of the actions, the actions replayed
from the recorded (seed, step), learning, weight syncs, a two-node cluster. Bounded: each test builds a small
algorithm (a few seconds); the file runs in about a minute on 2 cores."""

import os
import statistics
import sys

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns

import policyport as pp
import policyport.rllib as pr

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# The checks below run inside env-runner actors, which cannot import this test file: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


class TinyPixels(gym.Env):
    """A 42x42x3 frame env (RLlib's default CNN filters for 42-pixel frames): the reward is for the action that
    matches the brighter half of the frame."""

    observation_space = gym.spaces.Box(0.0, 1.0, (42, 42, 3), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        super().__init__()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        self.side = int(self.np_random.integers(2))
        f = self.np_random.random((42, 42, 3)).astype(np.float32) * 0.5
        f[:, self.side * 21 : (self.side + 1) * 21] += 0.5
        return f

    def step(self, action):
        self.t += 1
        r = float(action == self.side)
        return self._frame(), r, False, self.t >= 20, {}


def _config(env="CartPole-v1", runners=2, envs=4, seed=7, **model):
    c = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs, num_cpus_per_env_runner=0.5 if runners else 1)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2, lr=3e-4)
        .debugging(seed=seed)
    )
    if model:
        c = c.rl_module(model_config=model)
    return c


def _check_runner(runner):
    """Inside an env runner: what policyport answered vs what RLlib's torch module and distribution say."""
    m = runner.module
    assert isinstance(m, pr.PolicyportPPOTorchRLModule) and m.policyport_policy is not None
    replay = pp.Policy.load(pr.compile_module(m))
    dist_cls = m.get_exploration_action_dist_cls()
    worst = {"dist": 0.0, "logp": 0.0}
    for rec in m.policyport_record:
        obs = torch.from_numpy(rec["obs"])
        batch = {Columns.OBS: obs}
        if rec["state_in"] is not None:
            batch[Columns.OBS] = obs.unsqueeze(1)
            layout = m._pp_states
            nested = {}
            for (path, layer), s in zip(layout, rec["state_in"]):
                pr._set(nested, path, torch.from_numpy(s).unsqueeze(1))
            batch[Columns.STATE_IN] = nested
        with torch.no_grad():
            want = DefaultPPOTorchRLModule._forward_exploration(m, batch)[Columns.ACTION_DIST_INPUTS]
        want = want.reshape(rec["dist_inputs"].shape).numpy()
        worst["dist"] = max(worst["dist"], float(np.abs(want - rec["dist_inputs"]).max()))
        logp = dist_cls.from_logits(torch.from_numpy(rec["dist_inputs"])).logp(torch.from_numpy(rec["actions"]))
        worst["logp"] = max(worst["logp"], float(np.abs(logp.numpy() - rec["log_prob"]).max()))
        again = replay.act(rec["obs"], deterministic=not rec["explore"], seed=rec["seed"], step=rec["step"], state=rec["state_in"])
        assert np.array_equal(again.actions, rec["actions"]), "replaying (seed, step) changed the actions"
    return len(m.policyport_record), worst, m.policyport_rebuild_seconds


def _record(runner):
    runner.module.policyport_record = []


def _record_and_sample(runner):
    """Sample with the runner's current (synced) weights, recording every policyport forward."""
    _record(runner)
    runner.sample(num_timesteps=120, explore=True)


def test_two_env_runners_sample_through_policyport_as_rllib_would(local_ray):
    algo = pr.accelerate(_config()).build_algo()
    try:
        algo.train()  # after it the learner's weights were synced: the runners' policies were rebuilt
        algo.env_runner_group.foreach_env_runner(_record_and_sample, local_env_runner=False)
        results = algo.env_runner_group.foreach_env_runner(_check_runner, local_env_runner=False)
        assert len(results) == 2
        for calls, worst, rebuilds in results:
            assert calls > 20
            assert worst["dist"] < 1e-4 and worst["logp"] < 1e-4, worst
            assert rebuilds, "the policy was never compiled from the synced weights"
        # Two runners, two seeds: their draws differ.
        seeds = algo.env_runner_group.foreach_env_runner(lambda r: r.module._pp_seed, local_env_runner=False)
        assert len(set(seeds)) == 2
    finally:
        algo.stop()


def test_ppo_learns_and_weight_syncs_rebuild_the_policy(local_ray):
    algo = pr.accelerate(_config(runners=2, envs=4, seed=11)).build_algo()
    probe = np.array([[0.02, 0.3, -0.04, -0.5]], np.float32)
    try:
        before = algo.env_runner_group.foreach_env_runner(
            lambda r: r.module.policyport_policy.act(probe, deterministic=True).dist_inputs, local_env_runner=False
        )[0]
        returns, rebuilds, samples = [], [], []
        for _ in range(8):
            r = algo.train()
            returns.append(r["env_runners"].get("episode_return_mean", np.nan))
            samples.append(r["env_runners"]["sample"])
        after = algo.env_runner_group.foreach_env_runner(
            lambda r: (r.module.policyport_policy.act(probe, deterministic=True).dist_inputs, r.module.policyport_rebuild_seconds),
            local_env_runner=False,
        )
        assert not np.allclose(before, after[0][0]), "the env runner's policy did not follow the learner's weights"
        rebuilds = [t for _, times in after for t in times]
        assert len(rebuilds) >= 2 * 8, len(rebuilds)
        # A rebuild is small next to a sampling round.
        assert statistics.median(rebuilds) < 0.5 * statistics.median(samples), (rebuilds, samples)
        first, last = returns[0], max(returns[-3:])
        assert last > first + 15, returns
    finally:
        algo.stop()


def test_lstm_module_state_matches_rllib(local_ray):
    cfg = _config(runners=0, envs=2, seed=3, use_lstm=True, lstm_cell_size=16, max_seq_len=8, fcnet_hiddens=[32])
    algo = pr.accelerate(cfg).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        _record(runner)
        runner.sample(num_timesteps=60, explore=True)
        calls, worst, _ = _check_runner(runner)
        assert calls >= 30 and worst["dist"] < 1e-4 and worst["logp"] < 1e-4, worst
        algo.train()  # learns with the recorded state_out in its episodes
    finally:
        algo.stop()


def test_cnn_module_matches_rllib(local_ray):
    cfg = _config(env=TinyPixels, runners=0, envs=2, seed=5)
    algo = pr.accelerate(cfg).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        _record(runner)
        runner.sample(num_timesteps=20, explore=True)
        calls, worst, _ = _check_runner(runner)
        assert calls >= 10 and worst["dist"] < 1e-4 and worst["logp"] < 1e-4, worst
        # explore=False: the deterministic action is the argmax of RLlib's logits.
        _record(runner)
        runner.sample(num_timesteps=6, explore=False)
        for rec in runner.module.policyport_record:
            assert not rec["explore"] and np.array_equal(rec["actions"], rec["dist_inputs"].argmax(-1))
    finally:
        algo.stop()


def test_unsupported_modules_are_refused_by_name():
    from ray.rllib.algorithms.sac import SACConfig

    with pytest.raises(pp.UnsupportedModelError, match="SAC|DefaultPPOTorchRLModule"):
        cfg = SACConfig().environment("Pendulum-v1")
        spec = cfg.get_default_rl_module_spec()
        cfg.rl_module(rl_module_spec=spec)
        pr.accelerate(cfg)


def test_two_node_cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()  # the local instance of the tests above
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cfg = _config(runners=2, envs=2, seed=13)
        cfg.env_runners(num_cpus_per_env_runner=1)  # one per node
        algo = pr.accelerate(cfg).build_algo()
        try:
            algo.train()
            algo.train()
            algo.env_runner_group.foreach_env_runner(_record_and_sample, local_env_runner=False)
            nodes = algo.env_runner_group.foreach_env_runner(
                lambda r: ray.get_runtime_context().get_node_id(), local_env_runner=False
            )
            assert len(set(nodes)) == 2, nodes
            for calls, worst, rebuilds in algo.env_runner_group.foreach_env_runner(_check_runner, local_env_runner=False):
                assert calls > 10 and worst["dist"] < 1e-4 and len(rebuilds) >= 2, (calls, worst, rebuilds)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
