"""policyport: run trained reinforcement-learning policies fast.

Compile a trained policy (an RLlib checkpoint, a Stable-Baselines3 ``model.zip``, a CleanRL state dict, an ONNX
file) into a portable ``.policy`` artifact, load it on a backend and ``act()`` on batches of envs::

    import numpy as np, policyport
    artifact = policyport.compile("model.zip")            # bytes
    policy = policyport.Policy.load(artifact, backend="cpu")
    out = policy.act(np.zeros((8, 4), np.float32), seed=1, step=0)
    out.actions, out.log_prob, out.value, out.dist_inputs

Integrations: :mod:`policyport.rllib` (RLlib env runners sample through policyport while the learner trains the
torch module) and :mod:`policyport.sb3` (an SB3-style ``predict``). Errors are typed: every exception policyport
raises is a :class:`PolicyportError` subclass named after what went wrong.
"""

from __future__ import annotations

import io as _io
from typing import Any, Mapping

from ._native import (  # noqa: F401  (re-exported)
    FORMAT_VERSION,
    ActResult,
    ArtifactError,
    BackendError,
    BatchError,
    CallError,
    CompileError,
    EnvIdError,
    EpisodeStartsError,
    ActionMaskError,
    MalformedModelError,
    MemoryLimitError,
    NonFiniteOutputError,
    NotCompiledError,
    ObservationError,
    Policy,
    PolicyInfo,
    PolicyportError,
    SpecError,
    StateError,
    UnsupportedModelError,
    __version__,
    backends,
    compile,
    compile_rllib_module,
    cpu_kernels,
    cuda_available,
)

__all__ = [
    "FORMAT_VERSION",
    "ActResult",
    "ArtifactError",
    "BackendError",
    "BatchError",
    "CallError",
    "CompileError",
    "EnvIdError",
    "EpisodeStartsError",
    "ActionMaskError",
    "MalformedModelError",
    "MemoryLimitError",
    "NonFiniteOutputError",
    "NotCompiledError",
    "ObservationError",
    "Policy",
    "PolicyInfo",
    "PolicyportError",
    "SpecError",
    "StateError",
    "UnsupportedModelError",
    "__version__",
    "backends",
    "compile",
    "compile_rllib_module",
    "cpu_kernels",
    "compile_state_dict",
    "cuda_available",
]


def compile_state_dict(
    state_dict: Mapping[str, Any],
    *,
    layout: str,
    spaces: Mapping[str, Any],
    storage: str = "f32",
) -> bytes:
    """Compile an in-memory PyTorch state dict of a known agent layout (``cleanrl-ppo``, ``cleanrl-ppo-continuous``,
    ``cleanrl-atari``, ``cleanrl-atari-lstm``, ``cleanrl-sac``) with its spaces
    (``{"observation": {...}, "action": {...}}``, SPEC.md's spaces). Needs torch (the dict is serialised with
    ``torch.save``, the format the importer reads without Python)."""
    import torch

    buf = _io.BytesIO()
    torch.save(dict(state_dict), buf)
    return compile(buf.getvalue(), layout=layout, spaces=spaces, storage=storage)
