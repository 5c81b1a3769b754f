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


class MaskedChoice(gym.Env):
    """RLlib's action-masking layout: {"action_mask": Box(0, 1, (4,)), "observations": Box(-1, 1, (5,))}, a random
    mask each step (one allowed action at least); reward for the allowed action with the largest observation."""

    observation_space = gym.spaces.Dict({
        "action_mask": gym.spaces.Box(0.0, 1.0, (4,), np.float32),
        "observations": gym.spaces.Box(-1.0, 1.0, (5,), np.float32)})
    action_space = gym.spaces.Discrete(4)

    def __init__(self, config=None):
        super().__init__()

    def _obs(self):
        mask = (self.np_random.random(4) < 0.5).astype(np.float32)
        mask[self.np_random.integers(4)] = 1.0
        self.last = {"action_mask": mask, "observations": self.np_random.uniform(-1, 1, 5).astype(np.float32)}
        return self.last

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        mask, x = self.last["action_mask"], self.last["observations"]
        assert mask[action] == 1, f"a masked action {action} reached the env (mask {mask})"
        r = float(action == int(np.argmax(np.where(mask > 0, x[:4], -np.inf))))
        self.t += 1
        return self._obs(), r, False, self.t >= 16, {}


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
    """Inside an env runner: what policyport answered vs what RLlib's torch module and distribution say (the
    action-masking module: on the allowed logits; the masked ones sit at float32's minimum, RLlib's near it)."""
    m = runner.module
    assert isinstance(m, (pr.PolicyportPPOTorchRLModule, pr.PolicyportAPPOTorchRLModule,
                          pr.PolicyportActionMaskingTorchRLModule)) and m.policyport_policy is not None
    replay = pp.Policy.load(pr.compile_module(m))
    dist_cls = m.get_exploration_action_dist_cls()
    base = pr._rllib_base(type(m))
    worst = {"dist": 0.0, "logp": 0.0}
    for rec in m.policyport_record:
        obs = torch.from_numpy(rec["obs"])
        batch = {Columns.OBS: obs}
        if rec["mask"] is not None:
            assert rec["mask"][np.arange(len(rec["actions"])), rec["actions"]].all(), "a masked action was drawn"
            batch = {Columns.OBS: {"observations": obs, "action_mask": torch.from_numpy(rec["mask"].astype(np.float32))}}
        if rec["state_in"] is not None:
            batch[Columns.OBS] = obs.unsqueeze(1)
            layout = m._pp_states
            nested = {}
            for (path, layer), s in zip(layout, rec["state_in"]):
                pr._set(nested, path, torch.from_numpy(s).unsqueeze(1))
            batch[Columns.STATE_IN] = nested
        with torch.no_grad():
            want = base._forward_exploration(m, batch)[Columns.ACTION_DIST_INPUTS]
        want = want.reshape(rec["dist_inputs"].shape).numpy()
        allowed = np.ones(want.shape, bool) if rec["mask"] is None else rec["mask"]
        assert np.all(want[~allowed] < -1e38) and np.all(rec["dist_inputs"][~allowed] < -1e38)
        worst["dist"] = max(worst["dist"], float(np.abs(want - rec["dist_inputs"])[allowed].max()))
        logp = dist_cls.from_logits(torch.from_numpy(rec["dist_inputs"])).logp(torch.from_numpy(rec["actions"]))
        worst["logp"] = max(worst["logp"], float(np.abs(logp.numpy() - rec["log_prob"]).max()))
        again = replay.act(rec["obs"], deterministic=not rec["explore"], seed=rec["seed"], step=rec["step"],
                           state=rec["state_in"], action_mask=rec["mask"])
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


def test_action_masking_module_never_draws_a_masked_action_and_matches_rllib(local_ray):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

    cfg = _config(env=MaskedChoice, runners=0, envs=4, seed=13)
    cfg.rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule, model_config={"fcnet_hiddens": [32]}))
    algo = pr.accelerate(cfg).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        assert isinstance(runner.module, pr.PolicyportActionMaskingTorchRLModule)
        assert runner.module.policyport_policy.info.action_masks
        _record(runner)
        runner.sample(num_timesteps=200, explore=True)  # MaskedChoice asserts no masked action reaches it
        calls, worst, _ = _check_runner(runner)
        assert calls >= 50 and worst["dist"] < 1e-4 and worst["logp"] < 1e-4, worst
        algo.train()  # the learner (RLlib's own masking module) trains on what policyport sampled
        # A mask entry that is neither 0 nor 1 is refused by name.
        bad = {"action_mask": np.full((1, 4), 0.5, np.float32), "observations": np.zeros((1, 5), np.float32)}
        with pytest.raises(pp.ActionMaskError, match="neither 0 nor 1"):
            runner.module.forward_inference({Columns.OBS: bad})
    finally:
        algo.stop()


def test_appo_and_impala_env_runners_sample_through_policyport(local_ray):
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig

    for config_cls, twin in [(APPOConfig, pr.PolicyportAPPOTorchRLModule), (IMPALAConfig, pr.PolicyportPPOTorchRLModule)]:
        cfg = (config_cls().environment("CartPole-v1").env_runners(num_env_runners=0, num_envs_per_env_runner=2)
               .training(train_batch_size_per_learner=128).rl_module(model_config={"fcnet_hiddens": [32]})
               .debugging(seed=17))
        algo = pr.accelerate(cfg).build_algo()
        try:
            runner = algo.env_runner_group.local_env_runner
            assert type(runner.module) is twin, type(runner.module)
            algo.train()  # the learner (APPO's with its target networks) trains on what policyport sampled
            _record(runner)
            runner.sample(num_timesteps=40, explore=True)
            calls, worst, _ = _check_runner(runner)
            assert calls >= 20 and worst["dist"] < 1e-4 and worst["logp"] < 1e-4, (config_cls.__name__, worst)
        finally:
            algo.stop()


def test_unsupported_modules_are_refused_by_name():
    from ray.rllib.algorithms.sac import SACConfig

    with pytest.raises(pp.UnsupportedModelError, match="SAC|DefaultPPOTorchRLModule"):
        cfg = SACConfig().environment("Pendulum-v1")
        spec = cfg.get_default_rl_module_spec()
        cfg.rl_module(rl_module_spec=spec)
        pr.accelerate(cfg)
    from ray.rllib.algorithms.dqn import DQNConfig

    with pytest.raises(pp.UnsupportedModelError, match="DQN"):
        pr.accelerate(DQNConfig().environment("CartPole-v1"))

    class Custom(DefaultPPOTorchRLModule):
        pass

    with pytest.raises(pp.UnsupportedModelError, match="subclasses DefaultPPOTorchRLModule"):
        pr.accelerate(PPOConfig().environment("CartPole-v1").rl_module(rl_module_spec=pr.RLModuleSpec(module_class=Custom)))


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
