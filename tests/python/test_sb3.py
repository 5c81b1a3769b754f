"""policyport.sb3.Predictor against Stable-Baselines3's own predict() on the committed SB3 fixtures (PPO, SAC,
VecNormalize, CNN frames, Dict observations, MultiDiscrete, RecurrentPPO with its state threaded, DQN, QR-DQN, TD3,
DDPG, TQC, and MaskablePPO with its action masks)."""

import pathlib

import gymnasium as gym
import numpy as np
import pytest

import policyport.sb3 as ps

ROOT = pathlib.Path(__file__).resolve().parents[2]
SB3 = ROOT / "tests" / "fixtures" / "sb3"


def _load(name):
    from sb3_contrib import QRDQN, TQC, MaskablePPO, RecurrentPPO
    from stable_baselines3 import DDPG, DQN, PPO, SAC, TD3

    path = SB3 / name / "model.zip"
    prefixes = [("recurrent", RecurrentPPO), ("sac", SAC), ("dqn", DQN), ("qrdqn", QRDQN), ("td3", TD3),
                ("ddpg", DDPG), ("tqc", TQC), ("maskable", MaskablePPO)]
    cls = next((c for p, c in prefixes if name.startswith(p)), PPO)
    return cls.load(path, device="cpu")


def _obs(space, n, seed):
    space.seed(seed)
    xs = [space.sample() for _ in range(n)]
    if isinstance(space, gym.spaces.Dict):
        return {k: np.stack([x[k] for x in xs]) for k in space.spaces}
    return np.stack(xs)


FEEDFORWARD = ["ppo_cartpole", "sac_pendulum", "ppo_cnn_frames", "ppo_multi_input_dict", "ppo_grid_multidiscrete",
               "dqn_cartpole", "qrdqn_cartpole", "dqn_cnn_frames", "td3_pendulum", "ddpg_mountaincar", "tqc_pendulum"]


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


@pytest.mark.parametrize("name", ["maskable_ppo_discrete", "maskable_ppo_multidiscrete"])
def test_maskable_predict_takes_action_masks_like_sb3_contrib(name):
    import json

    model = _load(name)
    pred = ps.Predictor(model)
    for case in json.loads((SB3 / name / "masks.json").read_text())["cases"]:
        obs = np.asarray(case["obs"], np.float32).reshape(case["batch"]).astype(np.int64)
        mask = np.asarray(case["mask"], bool).reshape(case["batch"], -1)
        want, _ = model.predict(obs, action_masks=mask, deterministic=True)
        got, _ = pred.predict(obs, action_masks=mask, deterministic=True)
        np.testing.assert_array_equal(got, want)
        # Sampled: never a forbidden action, and the draws of the native API with the same mask.
        got, _ = pred.predict(obs, action_masks=mask, deterministic=False)
        space = model.action_space
        nvec = np.atleast_1d(space.nvec if isinstance(space, gym.spaces.MultiDiscrete) else space.n)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        chosen = np.asarray(got).reshape(case["batch"], -1)
        assert all(mask[r, offsets[j] + chosen[r, j]] for r in range(case["batch"]) for j in range(len(nvec)))
        out = pred.policy.act(obs.reshape(-1, 1).astype(np.float32), seed=case["seed"], step=case["step"],
                              action_mask=mask)
        np.testing.assert_array_equal(out.actions.reshape(-1), case["sampled_actions"])
        # sb3-contrib's MaskableCategorical log-probabilities of those actions.
        np.testing.assert_allclose(out.log_prob, case["log_prob"], rtol=1e-5, atol=1e-5)


def test_action_mask_and_epsilon_errors_are_typed_and_change_nothing():
    import policyport

    pred = ps.Predictor(_load("maskable_ppo_multidiscrete"))
    p = pred.policy
    obs = np.zeros((2, 1), np.float32)
    n = p.info.dist_params_len
    before = p.act(obs, seed=1, step=2, action_mask=np.ones((2, n), bool))
    for bad in (np.ones((2, n - 1), bool), np.ones((n, 2), bool), np.ones((2, n), np.float32),
                np.zeros((2, n), bool)):
        with pytest.raises(policyport.ActionMaskError):
            p.act(obs, seed=1, step=2, action_mask=bad)
    with pytest.raises(policyport.ActionMaskError):
        p.act(obs, epsilon=0.5)
    again = p.act(obs, seed=1, step=2, action_mask=np.ones((2, n), bool))
    np.testing.assert_array_equal(before.actions, again.actions)
    dqn = ps.Predictor(_load("dqn_cartpole")).policy
    x = np.zeros((3, 4), np.float32)
    greedy = dqn.act(x, deterministic=True).actions
    np.testing.assert_array_equal(dqn.act(x, seed=4, step=1, epsilon=0.0).actions, greedy)
    for eps in (-0.5, 2.0, float("nan")):
        with pytest.raises(policyport.ActionMaskError):
            dqn.act(x, seed=4, epsilon=eps)
    td3 = ps.Predictor(_load("td3_pendulum")).policy
    with pytest.raises(policyport.ActionMaskError):
        td3.act(np.zeros((1, 3), np.float32), action_mask=np.ones((1, 1), bool))


def test_observations_are_checked_by_full_shape_and_channels_last_frames_are_transposed():
    """An SB3 CnnPolicy's artifact takes SB3's channels-first frames; the env's own channels-last frames are
    transposed as SB3's predict does, and an array of the right count in any other shape is refused by name."""
    import policyport

    model = _load("ppo_cnn_frames")
    p = ps.Predictor(model).policy
    c, h, w = model.observation_space.shape
    chw = _obs(model.observation_space, 3, 0)
    hwc = np.ascontiguousarray(chw.transpose(0, 2, 3, 1))
    a = p.act(chw, deterministic=True).actions
    np.testing.assert_array_equal(p.act(hwc, deterministic=True).actions, a)
    for bad in (chw.reshape(3, -1), chw.reshape(3, h, c, w), chw.reshape(3 * c, h, w)):
        with pytest.raises(policyport.ObservationError, match="shape"):
            p.act(bad, deterministic=True)
