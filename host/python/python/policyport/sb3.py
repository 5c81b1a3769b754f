"""Stable-Baselines3: a predictor with SB3's ``predict`` signature, for evaluation loops.

    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    import policyport.sb3

    model = PPO.load("model.zip")
    predictor = policyport.sb3.Predictor(model)                 # or Predictor("model.zip")
    evaluate_policy(predictor, env, n_eval_episodes=10)          # anything that calls model.predict(...)

``predict(observation, state=None, episode_start=None, deterministic=False) -> (actions, state)`` behaves like
``model.predict``: one observation or a batch of them (SB3's own test, ``is_vectorized_observation``), channel-last
images transposed as SB3 does, a VecNormalize's statistics applied (pass the ``VecNormalize`` or its saved file), the
same action dtype and shape, clipping and squashing as the model's, and for RecurrentPPO the LSTM state
``(h, c)`` as ``[n_layers, n_envs, hidden]`` arrays with ``episode_start`` zeroing it; for MaskablePPO the
``action_masks`` keyword of its ``predict`` (masked before argmax and sampling, as sb3-contrib does). Sampled actions
(``deterministic=False``) come from the same distribution through policyport's seeded streams (``seed``; each call
is one step).
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, Optional, Union

import numpy as np

from . import Policy, compile

__all__ = ["Predictor", "compile_model"]


def compile_model(model: Any, vecnormalize: Any = None, *, storage: str = "f32") -> bytes:
    """``.policy`` bytes from an SB3 model (an algorithm object, or a ``model.save()`` path / bytes) and optionally
    its ``VecNormalize`` (the object, or its ``.save()`` path / bytes)."""
    if isinstance(model, (str, os.PathLike, bytes, bytearray)):
        archive = model
    else:
        buf = io.BytesIO()
        model.save(buf)
        archive = buf.getvalue()
    vn = vecnormalize
    if vn is not None and not isinstance(vn, (str, os.PathLike, bytes, bytearray)):
        # VecNormalize.__getstate__ drops the wrapped env: the pickle is what VecNormalize.save() writes.
        vn = pickle.dumps(vn)
    return compile(archive, vecnormalize=vn, storage=storage)


class Predictor:
    """An SB3-style predictor running a compiled policy."""

    def __init__(
        self,
        model: Any,
        vecnormalize: Any = None,
        *,
        backend: str = "cpu",
        seed: int = 0,
        policy: Optional[Policy] = None,
    ) -> None:
        self.policy = policy or Policy.load(compile_model(model, vecnormalize), backend)
        info = self.policy.info
        self._seed = int(seed)
        self._step = 0
        self.observation_space, self.action_space = _spaces(model, info)
        # Recurrent: the actor's LSTM states (what RecurrentPPO.predict carries) and the rest (a critic LSTM, whose
        # state predict does not return: zeros, as it only feeds the value).
        self._actor_states = [i for i, (n, _) in enumerate(info.states) if n.startswith(("lstm_actor.", "lstm_shared."))]
        self._numel = [numel for _, numel in info.states]
        self._layers = max(1, len(self._actor_states) // 2)

    def predict(
        self,
        observation: Union[np.ndarray, dict],
        state: Optional[tuple[np.ndarray, ...]] = None,
        episode_start: Optional[np.ndarray] = None,
        deterministic: bool = False,
        action_masks: Optional[np.ndarray] = None,
    ) -> tuple[np.ndarray, Optional[tuple[np.ndarray, ...]]]:
        from stable_baselines3.common.preprocessing import is_image_space, maybe_transpose
        from stable_baselines3.common.utils import is_vectorized_observation

        space = self.observation_space
        if isinstance(observation, dict):
            vectorized = is_vectorized_observation(observation, space)
            parts = []
            for key, sub in space.spaces.items():
                x = np.asarray(observation[key])
                if is_image_space(sub):
                    x = maybe_transpose(x, sub)
                parts.append(x.reshape((-1 if vectorized else 1, int(np.prod(sub.shape)))).astype(np.float32))
            obs = np.concatenate(parts, axis=1)
        else:
            obs = np.asarray(observation)
            if is_image_space(space):
                obs = maybe_transpose(obs, space)
            vectorized = is_vectorized_observation(obs, space)
            obs = obs.reshape((-1,) + tuple(space.shape))
        n = obs.shape[0]

        step = self._step
        self._step += 1
        kwargs: dict[str, Any] = {}
        if self.policy.info.states:
            full = [np.zeros((n, k), np.float32) for k in self._numel]
            if state is not None:
                h, c = state  # [n_layers, n_envs, hidden]
                for j, idx in enumerate(self._actor_states):
                    layer, which = divmod(j, 2)
                    full[idx] = np.asarray((h, c)[which][layer], np.float32).reshape(n, -1)
            kwargs["state"] = full
            if episode_start is not None:
                kwargs["episode_starts"] = np.asarray(episode_start, bool).reshape(n)
        if action_masks is not None:
            # sb3-contrib's MaskablePPO.predict(..., action_masks=): one row of flags per observation (a single
            # observation's mask may come flat).
            kwargs["action_mask"] = np.asarray(action_masks, bool).reshape(n, -1)
        # predict() returns actions (and the actor's state) only: the critic's layers are not run.
        out = self.policy.act(obs, deterministic=deterministic, seed=self._seed, step=step, value=False, **kwargs)

        actions = out.actions
        import gymnasium as gym

        if isinstance(self.action_space, gym.spaces.Box):
            actions = actions.reshape((-1,) + self.action_space.shape)
        elif isinstance(self.action_space, gym.spaces.MultiBinary):
            actions = actions.reshape((-1,) + tuple(np.atleast_1d(self.action_space.n)))
        new_state = None
        if self.policy.info.states:
            hs, cs = [], []
            for j, idx in enumerate(self._actor_states):
                (hs if j % 2 == 0 else cs).append(out.state[idx])
            new_state = (np.stack(hs), np.stack(cs))  # [n_layers, n_envs, hidden]
        if not vectorized:
            actions = actions.squeeze(axis=0)
        return actions, new_state


def _spaces(model: Any, info: Any) -> tuple[Any, Any]:
    """The model's gymnasium spaces (from the object, or read back from the archive for a path / bytes)."""
    if hasattr(model, "observation_space") and hasattr(model, "action_space"):
        return model.observation_space, model.action_space
    from stable_baselines3.common.save_util import load_from_zip_file

    src = io.BytesIO(model) if isinstance(model, (bytes, bytearray)) else model
    data, _, _ = load_from_zip_file(src, load_data=True, device="cpu")
    return data["observation_space"], data["action_space"]
