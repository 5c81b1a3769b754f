"""RLlib (new API stack, ray 2.60): env runners sample through policyport while the learner trains the torch module.

    from ray.rllib.algorithms.ppo import PPOConfig
    import policyport.rllib

    config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
    config = policyport.rllib.accelerate(config)        # the only change
    algo = config.build_algo()
    algo.train()

How it works. ``accelerate`` swaps the module class for its policyport twin — :class:`PolicyportPPOTorchRLModule`
(PPO and IMPALA's ``DefaultPPOTorchRLModule``), :class:`PolicyportAPPOTorchRLModule` (APPO's, with its target
networks) or :class:`PolicyportActionMaskingTorchRLModule` (RLlib's example ``ActionMaskingTorchRLModule``): the
same networks, checkpoints and learner — and the env runner class for
:class:`PolicyportEnvRunner`, which attaches policyport to the module each env runner builds. On an env runner
the module's ``forward_exploration`` / ``forward_inference`` run the compiled policy and return what RLlib's
connectors expect: ``actions`` (so ``GetActions`` does not sample again), ``action_logp`` and
``action_dist_inputs`` (PPO's learner rebuilds the old distribution from them), and for LSTM modules
``state_out`` in RLlib's nested layout. RLlib's env-to-module pipeline (MeanStdFilter, FlattenObservations, the
state and time-rank pieces) and module-to-env pipeline (NormalizeAndClipActions, ...) still run around it, so the
artifact is the module alone (``policyport.compile_rllib_module``: raw distribution draws, no action mapping).

Weight sync: when the learner's weights reach an env runner (``set_state``), the policy is recompiled from the
module's own state in process; ``module.policyport_rebuild_seconds`` keeps the times. The learner never calls the
exploration / inference forwards, so it trains the torch module as before.

Action masks: with the action-masking module the env's Dict observation ``{"action_mask", "observations"}`` is
split: the observations are acted on and the mask is the request's action mask (a mask entry must be 0 or 1:
RLlib adds ``log(mask)`` to the logits, which only 0 and 1 make a mask). DQN and SAC modules are refused by name
(their checkpoints compile with :func:`policyport.compile_rllib`).

Exploration: actions are drawn from the same distribution RLlib would sample (the module's categorical or
diagonal Gaussian over the same ``action_dist_inputs``) with policyport's seeded Philox streams instead of torch's
generator: stream (seed, env row, step), the seed derived from ``config.seed`` (or fresh entropy when unset) and
the env runner's index, the step counted per forward call.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from typing import Any, Optional

import numpy as np
import torch

from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from . import ActionMaskError, Policy, UnsupportedModelError, compile_rllib_module

__all__ = [
    "PolicyportPPOTorchRLModule",
    "PolicyportAPPOTorchRLModule",
    "PolicyportActionMaskingTorchRLModule",
    "PolicyportEnvRunner",
    "accelerate",
    "compile_module",
]


def compile_module(module: Any, *, storage: str = "f32", name: Optional[str] = None, goldens: bool = True) -> bytes:
    """Compile an RLlib ``DefaultPPOTorchRLModule``, ``DefaultAPPOTorchRLModule`` or ``ActionMaskingTorchRLModule``
    (any subclass; in process, its current weights) into ``.policy``
    bytes: the module alone, raw actions (what :func:`policyport.compile_rllib_module` documents). ``goldens=False``
    leaves out the float64 reference's golden vectors (the env runners' rebuilds: the artifact never leaves the
    process)."""
    base = _rllib_base(type(module))
    state = pickle.dumps(module.get_state(), protocol=5)
    ctor = pickle.dumps(
        {"class": base, "ctor_args_and_kwargs": module.get_ctor_args_and_kwargs()}, protocol=5
    )
    return compile_rllib_module(state, ctor, name=name or base.__name__, storage=storage, goldens=goldens)


# The RLlib classes the importer reads, most derived first (the action-masking module and APPO's derive from PPO's).
_BASES = (ActionMaskingTorchRLModule, DefaultAPPOTorchRLModule, DefaultPPOTorchRLModule)


def _rllib_base(cls: type) -> type:
    """The RLlib class the importer reads (the module's own class may be ours or the user's subclass)."""
    for base in _BASES:
        if issubclass(cls, base):
            return base
    raise UnsupportedModelError(
        f"RLModule class {cls.__module__}.{cls.__qualname__}: policyport's RLlib integration reads "
        "DefaultPPOTorchRLModule (PPO and IMPALA: the default MLP, CNN and LSTM encoders), DefaultAPPOTorchRLModule, "
        "RLlib's example ActionMaskingTorchRLModule and their subclasses (DQN and SAC checkpoints compile with "
        "policyport.compile_rllib)"
    )


class _PolicyportForwards:
    """What the policyport twins add to an RLlib module: exploration and inference forwards that run policyport
    once attached (:meth:`policyport_attach`, done by :class:`PolicyportEnvRunner`). Unattached (the learner),
    the module is RLlib's unchanged."""

    def setup(self) -> None:
        super().setup()
        self._pp_backend: Optional[str] = None
        self._pp_policy: Optional[Policy] = None
        self._pp_seed = 0
        self._pp_step = 0
        # Per artifact state: (path in STATE_IN, layer); the distinct paths in order.
        self._pp_states: list[tuple[tuple[str, ...], int]] = []
        self._pp_leaves: list[tuple[str, ...]] = []
        self.policyport_rebuild_seconds: list[float] = []
        # Set to a list to record every policyport forward (inputs, seed, step, outputs): tests replay them.
        self.policyport_record: Optional[list] = None

    # --- attachment and rebuilds -------------------------------------------------------------------------------
    def policyport_attach(self, *, backend: str = "cpu", seed: int = 0) -> None:
        """Run the exploration / inference forwards through policyport on ``backend`` from now on."""
        self._pp_backend = backend
        self._pp_seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        self.policyport_rebuild()

    @property
    def policyport_policy(self) -> Optional[Policy]:
        return self._pp_policy

    def policyport_rebuild(self) -> None:
        """Recompile the policy from the module's current weights (after a weight sync)."""
        if self._pp_backend is None:
            return
        t0 = time.perf_counter()
        artifact = compile_module(self, goldens=False)
        policy = Policy.load(artifact, self._pp_backend)
        self._pp_states = _state_layout(policy.info.states)
        self._pp_leaves = list(dict.fromkeys(path for path, _ in self._pp_states))
        self._pp_policy = policy
        self.policyport_rebuild_seconds.append(time.perf_counter() - t0)

    def set_state(self, state: Any) -> None:
        super().set_state(state)
        if self._pp_backend is not None:
            self.policyport_rebuild()

    # --- the forwards env runners call -------------------------------------------------------------------------
    # The public forwards are overridden too: TorchRLModule's wrap every call in `self.eval()` (a walk over every
    # torch submodule: ~95 us of a ~130 us forward for the default CartPole module, measured), which a compiled
    # policy does not need.
    def forward_exploration(self, batch: dict, **kwargs: Any) -> dict:
        if self._pp_policy is None:
            return super().forward_exploration(batch, **kwargs)
        return self._pp_forward(batch, explore=True)

    def forward_inference(self, batch: dict, **kwargs: Any) -> dict:
        if self._pp_policy is None:
            return super().forward_inference(batch, **kwargs)
        return self._pp_forward(batch, explore=False)

    def _pp_forward(self, batch: dict, *, explore: bool) -> dict:
        policy = self._pp_policy
        obs, mask = batch[Columns.OBS], None
        if isinstance(self, ActionMaskingTorchRLModule):
            obs, mask = _split_masked(obs)
        obs = _to_numpy(obs)
        stateful = bool(self._pp_states)
        if stateful:
            # [B, T=1, ...] during sampling (AddTimeDimToBatchAndZeroPad); one step per env.
            obs = obs[:, 0]
            mask = None if mask is None else mask[:, 0]
        n = obs.shape[0]
        state_in = None
        if stateful:
            # RLlib's STATE_IN: {"actor": {"h", "c"}, "critic": {"h", "c"}} (a flat {"h", "c"} with a shared
            # encoder), each [B, num_layers, cell]; the artifact has one state per layer, in its own order.
            nested = batch[Columns.STATE_IN]
            leaves = {path: _to_numpy(_get(nested, path)) for path in self._pp_leaves}
            state_in = [leaves[path][:, layer].reshape(n, -1) for path, layer in self._pp_states]
        step = self._pp_step
        self._pp_step += 1
        out = policy.act(
            obs,
            deterministic=not explore,
            seed=self._pp_seed,
            step=step,
            state=state_in,
            action_mask=mask,
        )
        # NumPy out: the module-to-env pipeline's TensorToNumpy passes NumPy arrays through, so no tensor is made.
        result: dict = {Columns.ACTIONS: out.actions, Columns.ACTION_DIST_INPUTS: out.dist_inputs}
        if out.log_prob is not None:
            result[Columns.ACTION_LOGP] = out.log_prob
        if self.policyport_record is not None:
            self.policyport_record.append(
                {"obs": obs.copy(), "mask": mask, "state_in": state_in, "seed": self._pp_seed, "step": step,
                 "explore": explore,
                 "actions": out.actions, "log_prob": out.log_prob, "dist_inputs": out.dist_inputs}
            )
        if stateful:
            # Stateful modules answer with a time rank (RemoveSingleTsTimeRankFromBatch drops it) and the next
            # state in STATE_IN's layout, layers stacked on axis 1.
            result = {k: v[:, None] for k, v in result.items()}
            state_out: dict = {}
            for path in self._pp_leaves:
                layers = [out.state[i] for i, (p, _) in enumerate(self._pp_states) if p == path]
                _set(state_out, path, np.stack(layers, axis=1))
            result[Columns.STATE_OUT] = state_out
        return result


class PolicyportPPOTorchRLModule(_PolicyportForwards, DefaultPPOTorchRLModule):
    """``DefaultPPOTorchRLModule`` (PPO, IMPALA) sampling through policyport on env runners."""


class PolicyportAPPOTorchRLModule(_PolicyportForwards, DefaultAPPOTorchRLModule):
    """``DefaultAPPOTorchRLModule`` sampling through policyport on env runners (the learner's target networks are
    APPO's own)."""


class PolicyportActionMaskingTorchRLModule(_PolicyportForwards, ActionMaskingTorchRLModule):
    """RLlib's example ``ActionMaskingTorchRLModule`` sampling through policyport on env runners: the Dict's
    ``action_mask`` becomes the request's action mask."""


# RLlib's module class -> its policyport twin.
_TWINS = {
    DefaultPPOTorchRLModule: PolicyportPPOTorchRLModule,
    DefaultAPPOTorchRLModule: PolicyportAPPOTorchRLModule,
    ActionMaskingTorchRLModule: PolicyportActionMaskingTorchRLModule,
}


def _split_masked(obs: Any) -> tuple[Any, np.ndarray]:
    """The action-masking module's ``{"action_mask", "observations"}`` -> (observations, boolean mask). RLlib adds
    ``clamp(log(mask), FLOAT_MIN)`` to the logits, so a mask is a mask only where its entries are 0 or 1."""
    if not isinstance(obs, dict) or "action_mask" not in obs or "observations" not in obs:
        raise ValueError(
            "ActionMaskingTorchRLModule takes Dict observations {'action_mask': ..., 'observations': ...}; "
            f"got {type(obs).__name__}"
        )
    mask = _to_numpy(obs["action_mask"])
    allowed = mask == 1
    if not np.all(allowed | (mask == 0)):
        raise ActionMaskError("an action_mask entry is neither 0 nor 1 (RLlib adds log(mask) to the logits)")
    return obs["observations"], allowed


def _state_layout(states: list[tuple[str, int]]) -> list[tuple[tuple[str, ...], int]]:
    """(path in RLlib's STATE_IN, layer) per artifact state, from names like ``encoder.actor_encoder.lstm.l0.h``
    (``encoder.encoder.lstm.l0.h`` with a shared encoder), in the artifact's order."""
    out = []
    for name, _numel in states:
        parts = name.split(".")
        try:
            which = {"actor_encoder": ("actor",), "critic_encoder": ("critic",), "encoder": ()}[parts[1]]
            layer = int(parts[-2].removeprefix("l"))
            hc = parts[-1]
            if hc not in ("h", "c"):
                raise ValueError
        except (IndexError, KeyError, ValueError):
            raise UnsupportedModelError(f"recurrent state '{name}' does not map to RLlib's STATE_IN layout") from None
        out.append((which + (hc,), layer))
    return out


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu" and not x.requires_grad:
            return x.numpy()
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _get(nested: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        nested = nested[p]
    return nested


def _set(nested: dict, path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        nested = nested.setdefault(p, {})
    nested[path[-1]] = value


class PolicyportEnvRunner(SingleAgentEnvRunner):
    """``SingleAgentEnvRunner`` that attaches policyport to the module it builds (backend and seed from the config's
    ``_policyport`` settings, written by :func:`accelerate`)."""

    def make_module(self) -> None:
        super().make_module()
        module = self.module
        if isinstance(module, _PolicyportForwards):
            settings = getattr(self.config, "_policyport", None) or {}
            module.policyport_attach(
                backend=settings.get("backend", "cpu"),
                seed=_runner_seed(settings.get("seed"), self.worker_index),
            )


def _runner_seed(seed: Optional[int], worker_index: int) -> int:
    """One sampling seed per env runner: from the config's seed when set (reproducible), else fresh entropy."""
    base = os.urandom(8) if seed is None else int(seed).to_bytes(8, "little", signed=True)
    digest = hashlib.sha256(base + int(worker_index).to_bytes(4, "little")).digest()
    return int.from_bytes(digest[:8], "little")


def accelerate(config: Any, *, backend: str = "cpu", seed: Optional[int] = None) -> Any:
    """Make a PPO, APPO or IMPALA ``AlgorithmConfig``'s env runners sample through policyport (returns the same
    config). The module class (the config's, else the algorithm's default) is swapped for its policyport twin;
    RLlib's example ``ActionMaskingTorchRLModule`` is read too. Other modules (DQN, SAC, custom ones) are refused
    by name.

    ``backend``: what env runners load the compiled policy on ("cpu" is the fast one for env-runner batch sizes;
    "auto", "wgpu", "torch" work too). ``seed``: the base of the sampling seeds (default: ``config.seed``)."""
    spec = config._rl_module_spec
    if spec is None:
        spec = RLModuleSpec()
    elif not isinstance(spec, RLModuleSpec):
        raise UnsupportedModelError("multi-agent module specs: policyport.rllib drives single-agent modules")
    current = spec.module_class
    if current is None:
        current = config.get_default_rl_module_spec().module_class
    if not isinstance(current, type) or not issubclass(current, _PolicyportForwards):
        base = _rllib_base(current) if isinstance(current, type) else _rllib_base(type(current))
        if current is not base:
            # A user subclass of an RLlib module: its own code would be bypassed by the twin.
            raise UnsupportedModelError(
                f"RLModule class {current.__module__}.{current.__qualname__} subclasses {base.__name__}: "
                f"policyport.rllib swaps in its own {base.__name__} twin; give the base class, or derive from "
                f"{_TWINS[base].__name__}"
            )
        spec.module_class = _TWINS[base]
    config.rl_module(rl_module_spec=spec)
    config.env_runners(env_runner_cls=PolicyportEnvRunner)
    config._policyport = {"backend": backend, "seed": config.seed if seed is None else seed}
    return config
