"""policyport.sb3.Predictor against Stable-Baselines3's own predict() on the committed SB3 fixtures (PPO, SAC,
VecNormalize, CNN frames, Dict observations, MultiDiscrete, RecurrentPPO with its state threaded)."""

import pathlib

import gymnasium as gym
import numpy as np
import pytest

import policyport.sb3 as ps

ROOT = pathlib.Path(__file__).resolve().parents[2]
SB3 = ROOT / "tests" / "fixtures" / "sb3"


def _load(name):
    from sb3_contrib import RecurrentPPO
    from stable_baselines3 import PPO, SAC

    path = SB3 / name / "model.zip"
    cls = RecurrentPPO if name.startswith("recurrent") else SAC if name.startswith("sac") else PPO
    return cls.load(path, device="cpu")


def _obs(space, n, seed):
    space.seed(seed)
    xs = [space.sample() for _ in range(n)]
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([x[k] for x in xs]) for k in space.spaces}
    return np.stack(xs)


FEEDFORWARD = ["ppo_cartpole", "sac_pendulum", "ppo_cnn_frames", "ppo_multi_input_dict", "ppo_grid_multidiscrete"]


@pytest.mark.parametrize("name", FEEDFORWARD)
def test_predict_matches_sb3_deterministic(name):
    model = _load(name)
    pred = ps.Predictor(model)
    for seed in range(3):
        obs = _obs(model.observation_space, 6, seed)
        want, _ = model.predict(obs, deterministic=True)
        got, state = pred.predict(obs, deterministic=True)
        assert state is None
        assert got.shape == want.shape and got.dtype.kind == want.dtype.kind, (got.shape, want.shape, got.dtype, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_array_equal(got, want)
    # One unbatched observation gives one unbatched action, as in SB3.
    one = _obs(model.observation_space, 1, 7)
    one = {k: v[0] for k, v in one.items()} if isinstance(one, dict) else one[0]
    want, _ = model.predict(one, deterministic=True)
    got, _ = pred.predict(one, deterministic=True)
    assert np.shape(got) == np.shape(want)
    # Sampled actions lie in the action space.
    got, _ = pred.predict(_obs(model.observation_space, 6, 9), deterministic=False)
    assert all(model.action_space.contains(np.asarray(a, dtype=model.action_space.dtype)) for a in got)


def test_predict_with_vecnormalize_matches_sb3():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    d = SB3 / "ppo_pendulum_vecnormalize"
    model = PPO.load(d / "model.zip", device="cpu")
    venv = VecNormalize.load(d / "vecnormalize.pkl", DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    venv.training = False
    from_object = ps.Predictor(model, venv)
    from_files = ps.Predictor(d / "model.zip", d / "vecnormalize.pkl")
    obs = _obs(model.observation_space, 5, 0)
    want, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    for pred in (from_object, from_files):
        got, _ = pred.predict(obs, deterministic=True)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["recurrent_ppo_cartpole", "recurrent_ppo_pendulum_shared_2layers", "recurrent_ppo_cnn_frames"])
def test_recurrent_predict_threads_state_like_sb3(name):
    model = _load(name)
    pred = ps.Predictor(model)
    n = 3
    s_want = s_got = None
    for t in range(6):
        obs = _obs(model.observation_space, n, 100 + t)
        starts = np.array([t == 0 or (t == 3 and i == 1) for i in range(n)])
        want, s_want = model.predict(obs, state=s_want, episode_start=starts, deterministic=True)
        got, s_got = pred.predict(obs, state=s_got, episode_start=starts, deterministic=True)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_array_equal(got, want)
        assert len(s_got) == 2 and s_got[0].shape == s_want[0].shape, (s_got[0].shape, s_want[0].shape)
        np.testing.assert_allclose(s_got[0], s_want[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(s_got[1], s_want[1], rtol=1e-4, atol=1e-4)


def test_evaluate_policy_runs_the_predictor():
    from stable_baselines3.common.evaluation import evaluate_policy

    model = _load("ppo_cartpole")
    env = gym.make("CartPole-v1")
    mean_pp, _ = evaluate_policy(ps.Predictor(model), env, n_eval_episodes=3, deterministic=True)
    mean_sb3, _ = evaluate_policy(model, env, n_eval_episodes=3, deterministic=True)
    assert mean_pp > 0 and abs(mean_pp - mean_sb3) <= 0.25 * max(mean_sb3, 1.0) + 5, (mean_pp, mean_sb3)
