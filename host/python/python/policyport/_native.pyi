"""Type stubs of policyport's native module (host/python/src/lib.rs)."""

import os
from typing import Any, ClassVar, Literal, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

__version__: str
FORMAT_VERSION: tuple[int, int]

_Source = Union[bytes, bytearray, memoryview, str, os.PathLike[str]]
_Json = Union[str, dict[str, Any], os.PathLike[str]]

class PolicyportError(Exception):
    # The core's ErrorKind name ("artifact", "observation", "call", "state", "backend", "too_large",
    # "non_finite"), the same word a browser error's `kind` carries; None for the compile errors.
    kind: ClassVar[Optional[str]]
class ArtifactError(PolicyportError): ...
class ObservationError(PolicyportError): ...
class CallError(PolicyportError): ...
class BatchError(CallError): ...
class EpisodeStartsError(CallError): ...
class MemoryLimitError(PolicyportError): ...
class NonFiniteOutputError(PolicyportError): ...
class EnvIdError(CallError): ...
class ActionMaskError(CallError): ...
class StateError(PolicyportError): ...
class BackendError(PolicyportError): ...
class NotCompiledError(BackendError): ...
class CompileError(PolicyportError): ...
class UnsupportedModelError(CompileError): ...
class MalformedModelError(CompileError): ...
class SpecError(CompileError): ...

class PolicyInfo:
    """What a loaded policy is (read-only)."""

    name: str
    backend: str
    format_version: tuple[int, int]
    observation: dict[str, Any]
    action: dict[str, Any]
    obs_len: int
    obs_shape: list[int]
    obs_dtype: str
    action_len: int
    discrete: bool
    dist_params_len: int
    has_value: bool
    action_masks: bool
    states: list[tuple[str, int]]
    parameters: int
    selection: Optional[str]
    def as_dict(self) -> dict[str, Any]: ...

class ActResult:
    """The outputs of one act()."""

    actions: npt.NDArray[Any]
    value: Optional[npt.NDArray[np.float32]]
    dist_inputs: npt.NDArray[np.float32]
    log_prob: Optional[npt.NDArray[np.float32]]
    state: Optional[list[npt.NDArray[np.float32]]]

class Policy:
    """A compiled policy on one backend with one session (recurrent state per env id)."""

    @staticmethod
    def load(
        source: _Source,
        backend: str = "cpu",
        *,
        batch: int = 1,
        device: str = "cpu",
        precision: str = "f32",
        max_envs: Optional[int] = None,
        threads: int = 1,
    ) -> "Policy": ...
    def new_session(self) -> "Policy": ...
    def set_threads(self, threads: int) -> None: ...
    @property
    def threads(self) -> int: ...
    def set_thread_split(self, split: Literal["measured", "always"]) -> None: ...
    @property
    def thread_split(self) -> Literal["measured", "always"]: ...
    @property
    def info(self) -> PolicyInfo: ...
    @property
    def num_envs(self) -> int: ...
    def act(
        self,
        obs: npt.ArrayLike,
        *,
        deterministic: bool = False,
        seed: int = 0,
        step: int = 0,
        env_ids: Optional[npt.ArrayLike] = None,
        episode_starts: Optional[npt.ArrayLike] = None,
        state: Optional[Sequence[npt.ArrayLike]] = None,
        return_state: bool = False,
        action_mask: Optional[npt.ArrayLike] = None,
        epsilon: Optional[float] = None,
        value: bool = True,
    ) -> ActResult: ...
    def reset(self, env_ids: npt.ArrayLike) -> None: ...
    def get_state(self, env_ids: npt.ArrayLike) -> list[npt.NDArray[np.float32]]: ...
    def set_state(self, env_ids: npt.ArrayLike, state: Sequence[npt.ArrayLike]) -> None: ...
    def verify(self) -> list[dict[str, Any]]: ...

def compile(
    source: _Source,
    *,
    spec: Optional[_Json] = None,
    layout: Optional[str] = None,
    spaces: Optional[Union[str, dict[str, Any]]] = None,
    vecnormalize: Optional[_Source] = None,
    golden: Optional[_Json] = None,
    storage: str = "f32",
) -> bytes: ...
def compile_rllib_module(
    module_state: bytes,
    module_ctor: bytes,
    *,
    name: str = "rllib_module",
    storage: str = "f32",
    goldens: bool = True,
) -> bytes: ...
def backends() -> list[str]: ...
def cuda_available() -> bool: ...
def cpu_kernels() -> str: ...
