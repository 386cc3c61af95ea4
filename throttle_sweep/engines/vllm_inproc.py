"""vLLM's own engine, in this process (`vllm.LLM`), stepped request by request.

With no model named, it serves the embedded tiny Qwen2 config with dummy weights and token-id
prompts, so every code path that matters for cost (scheduler, KV cache, preemption, metrics) is vLLM's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import platform
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from throttle_sweep.engines import core_stderr, gpu_found, gpu_memory
from throttle_sweep.engines.base import Request, StepEvent, WallClock
from throttle_sweep.engines.core_stderr import CORE_FAILED
from throttle_sweep.engines.flags import vllm_flag_schema
from throttle_sweep.errors import EngineRunError, EngineStartError, refused_for_memory
from throttle_sweep.models import TINY_QWEN2

# vLLM's CPU build only: keep the engine core in this process (fast restarts, one writer, no orphans),
# don't pin OpenMP threads to cores another process may own, and don't oversubscribe 2 cores. A GPU build
# keeps vLLM's own defaults (its multiprocess engine core, as production runs it).
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
QUIET_ENV = {  # every build
    "VLLM_LOGGING_LEVEL": "ERROR",  # our results are the output; set VLLM_LOGGING_LEVEL=INFO to see vLLM
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings (a NUMA-binding line per engine start)
}
PREFIX_RESET_WAIT_S, PREFIX_RESET_RETRY_S = 1.0, 0.05  # a refused prefix-cache reset is tried again this long
KV_SAMPLE_S = 0.1  # with a multiprocess engine core, KV usage is read from vLLM's metrics at most this often


DEFAULTED = "THROTTLE_SWEEP_DEFAULTED"  # the variables prepare_environment set (not the user), inherited by children


def prepare_environment() -> None:
    """Set vLLM's CPU environment defaults before vllm is imported (a user's own values win)."""
    asked = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR") != "ERROR"  # the one switch that turns the noise on
    defaulted = set(filter(None, os.environ.get(DEFAULTED, "").split(",")))
    for key, value in {**(CPU_ENV if cpu_build() else {}), **QUIET_ENV}.items():
        if not (asked and key == "TORCH_CPP_LOG_LEVEL") and key not in os.environ:
            os.environ[key] = value
            defaulted.add(key)
    os.environ[DEFAULTED] = ",".join(sorted(defaulted))
    if not asked:  # the same switch: VLLM_LOGGING_LEVEL=INFO shows them
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
        # vLLM configures its logging only when an engine starts; what it logs while being imported (such as
        # "Triton is installed, but doesn't include CPU backend") reaches Python's last-resort handler
        logging.getLogger("vllm").setLevel(logging.ERROR)


@functools.cache  # the install does not change under a running process; reading its metadata costs milliseconds
def cpu_build() -> bool:
    """Is the installed vLLM its CPU build (the `vllm-cpu` package, or a `+cpu` version)? No vLLM import."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return dist == "vllm-cpu" or "cpu" in version
    return False


def server_environment(cpu: bool) -> dict[str, str]:
    """The environment for a vLLM API server: this process's, less the defaults set for an in-process engine
    (the server keeps vLLM's multiprocess engine core and logs at INFO, which its log file needs), plus the
    CPU build's thread settings on the CPU build only. A user's own values win."""
    env = dict(os.environ)
    for key in filter(None, env.pop(DEFAULTED, "").split(",")):
        env.pop(key, None)
    if cpu:
        for key in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"):
            env.setdefault(key, CPU_ENV[key])
    return env


class VllmSession(WallClock):
    def __init__(self, llm: Any) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.llm = llm
        self._delta = RequestOutputKind.DELTA  # only new tokens per step: no per-step copies of whole outputs
        self._produced: dict[str, int] = {}
        self._engine = llm.llm_engine
        # the scheduler is in reach only with the engine core in this process (the CPU build's default); with
        # vLLM's multiprocess engine core (a GPU build's default), KV usage comes from vLLM's own metrics
        core = getattr(self._engine.engine_core, "engine_core", None)
        self._scheduler = getattr(core, "scheduler", None)
        self.engine_core = "in-process" if self._scheduler is not None else "multiprocess"
        # in-process, one step() is one scheduler iteration and requests join between them, so the driver's
        # trace is the engine's schedule; a multiprocess core steps on its own and batches its outputs. With
        # CUDA graphs (a GPU engine not in eager mode) max_num_seqs and max_num_batched_tokens also choose the
        # captured batch sizes, so equal schedules need not cost the same: no schedule is recorded there.
        model = getattr(self._engine.vllm_config, "model_config", None)
        eager = bool(getattr(model, "enforce_eager", False)) or cpu_build()  # the CPU build captures no graphs
        self.engine_steps = self.engine_core == "in-process" and eager
        self._kv_read_at, self._kv_usage = -float("inf"), 0.0
        self._sampling = SamplingParams
        model_config = self._engine.vllm_config.model_config
        self.sampling_defaults: dict[str, Any] = dict(model_config.get_diff_sampling_param())
        self._detokenize = not model_config.skip_tokenizer_init
        self.start_seconds = 0.0
        try:  # the engine's own value when the flag was left to vLLM's default
            self.max_num_seqs: int | None = int(self._engine.vllm_config.scheduler_config.max_num_seqs)
        except (AttributeError, TypeError, ValueError):
            self.max_num_seqs = None
        cache = getattr(self._engine.vllm_config, "cache_config", None)
        # the KV capacity vLLM found room for, less the one block its v1 block pool keeps as the null block
        blocks = getattr(cache, "num_gpu_blocks", None)
        self.kv_blocks: int | None = blocks - 1 if isinstance(blocks, int) and blocks > 1 else None
        self.kv_block_size: int | None = getattr(cache, "block_size", None)

    def kv_pin(self) -> dict[str, int] | None:
        """The flag that gives a later start exactly this engine's KV capacity, whatever else holds the GPU:
        vLLM's block count (its null block included), which wins over any memory size."""
        return {"num_gpu_blocks_override": self.kv_blocks + 1} if self.kv_blocks is not None else None

    def begin_replicate(self, index: int) -> None:
        """A warm engine starts each replicate as a fresh one would: nothing cached from the one before (the
        workload's own shared prefixes still hit within a replicate)."""
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """vLLM resets nothing, and answers False, while requests still hold blocks: tried again for up to
        PREFIX_RESET_WAIT_S, as the HTTP path tries its server (openai_http)."""
        deadline = time.monotonic() + PREFIX_RESET_WAIT_S
        while self.llm.reset_prefix_cache() is False:
            if time.monotonic() > deadline:
                raise EngineRunError(f"vLLM did not reset its prefix cache within {PREFIX_RESET_WAIT_S:g} s "
                                     "(requests still held blocks): the replicate would start with the last "
                                     "one's prompts cached")
            time.sleep(PREFIX_RESET_RETRY_S)

    def params(self, request: Request) -> Any:
        """The request's sampling as vLLM's API server builds it from the same request body (openai_http):
        the model's generation_config defaults (top_k, top_p, repetition penalty ...) under what the request
        sets, and every token detokenized where the model has a tokenizer. Production pays for both."""
        return self._sampling(**{
            **self.sampling_defaults,
            "max_tokens": request.output_len,
            "min_tokens": request.output_len,
            "ignore_eos": True,
            "detokenize": self._detokenize,
            "temperature": 1.0,
            "output_kind": self._delta,
        })

    def add(self, request: Request) -> None:
        params = self.params(request)
        if request.prompt_token_ids is not None:
            prompt: Any = {"prompt_token_ids": list(request.prompt_token_ids)}
        else:
            prompt = request.prompt_text
        self._engine.add_request(request.id, prompt, params)
        self._produced[request.id] = 0

    def step(self) -> list[StepEvent]:
        try:
            outputs = self._engine.step()
        except Exception as exc:  # the engine core died mid-run
            raise EngineRunError(f"vLLM engine step failed: {type(exc).__name__}: {exc}") from exc
        events = []
        for out in outputs:
            produced = self._produced[out.request_id] + len(out.outputs[0].token_ids)
            if out.finished:
                del self._produced[out.request_id]
            else:
                self._produced[out.request_id] = produced
            events.append(StepEvent(out.request_id, produced, out.finished, len(out.prompt_token_ids or ())))
        return events

    def has_unfinished(self) -> bool:
        return self._engine.has_unfinished_requests()

    def computed_tokens(self) -> dict[str, int]:
        """Tokens the scheduler has computed for each request it holds (prompt chunks and cached prefixes
        included). vLLM suffixes the ids it is given ('req-3' -> 'req-3-1a2b3c4d'); the suffix is cut off."""
        requests = getattr(self._scheduler, "requests", None) or {}
        return {rid.rsplit("-", 1)[0]: int(r.num_computed_tokens) for rid, r in requests.items()}

    def kv_cache_usage(self) -> float:
        if self._scheduler is not None:
            return float(self._scheduler.kv_cache_manager.usage)
        now = time.perf_counter()
        if now - self._kv_read_at >= KV_SAMPLE_S:  # reading the metrics costs milliseconds: not every step
            self._kv_read_at = now
            self._kv_usage = float(max((m.value for m in self.llm.get_metrics()
                                        if m.name == "vllm:kv_cache_usage_perc"), default=0.0))
        return self._kv_usage

    def preemptions(self) -> int:
        return self._counter("vllm:num_preemptions")

    def prefix_cache(self) -> tuple[int, int]:
        """Cumulative prompt tokens looked up in the prefix cache, and how many of them it held."""
        return self._counter("vllm:prefix_cache_queries"), self._counter("vllm:prefix_cache_hits")

    def _counter(self, name: str) -> int:
        return int(sum(m.value for m in self.llm.get_metrics() if m.name == name))

    def sleep(self) -> None:
        """Level 1: weights to host memory, KV cache freed, so another engine can use the GPU (not on CPU)."""
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()

    def close(self) -> None:
        # An in-process core on the CPU build: its shutdown's own collections are deferred to the one below (on
        # a GPU they must run before vLLM empties the CUDA cache, or the next engine finds less memory free).
        deferred = self.engine_core == "in-process" and cpu_build()
        try:
            with collections_deferred() if deferred else contextlib.nullcontext():
                self._engine.engine_core.shutdown()
        finally:
            self.llm = self._engine = self._scheduler = None
            gc.unfreeze()  # whatever an earlier close (or vLLM) froze is looked at again: nothing stays uncollected
            gc.collect()  # the one full collection: the engine's cycles go here
            gc.freeze()  # the survivors (imported modules): the next engine's start-up collections skip them
            atexit.unregister(gc.unfreeze)  # registered once: unfrozen at exit, or extension modules report
            atexit.register(gc.unfreeze)  # what is still frozen as leaked


_DEFERRING = threading.Lock()  # one deferral at a time: an overlapping one would keep the no-op for good


@contextlib.contextmanager
def collections_deferred() -> Iterator[None]:
    """vLLM's shutdown unfreezes the heap and collects all of it twice, about 0.4 s each with vLLM imported
    (some 750k objects); the collection after it does the same work once. Its start-up collections, once the
    heap is frozen again, take milliseconds instead (benchmarks/warm_engines.py measures the start). While deferred,
    gc.collect is a no-op in every thread of this process: only the engine's own shutdown runs then."""
    with _DEFERRING:
        collect = gc.collect
        gc.collect = lambda generation=2: 0
        try:
            yield
        finally:
            gc.collect = collect


BATCH_FLAGS = ("max_num_seqs", "max_num_batched_tokens")


def start_failure(exc: Exception, flags: Mapping[str, Any], listening: core_stderr.Listener | None) -> str:
    """Why a start failed. A multiprocess core's failure reaches this process only as "Engine core
    initialization failed": its own cause is read from what it wrote to stderr, and where that is not vLLM's
    refusal for memory, the GPUs are read once the dead core's memory is back, to tell whether another process
    holds what the flags asked."""
    reason = f"{type(exc).__name__}: {exc}"
    if CORE_FAILED not in reason:
        return reason
    if listening is not None:
        listening.drain()
        if said := core_stderr.cause(listening.lines()):
            reason += f"; the engine core: {said}"
    if not refused_for_memory(reason) and (short := gpu_memory.after_failure(flags)):
        reason += f" ({short})"
    return reason


def served_batch_defaults(flags: Mapping[str, Any]) -> dict[str, int]:
    """The batch flags left to vLLM's default, as `vllm serve` resolves them on this hardware. vLLM gives its
    offline class `LLM` other defaults than its API server (on an H100 16384 batched tokens against 8192; on
    this CPU build 256 sequences and 4096 tokens against 128 and 2048): measured in-process with the server's,
    the engine runs what the exported config will serve. Resolved by vLLM's own code, for the server."""
    missing = [k for k in BATCH_FLAGS if flags.get(k) is None]
    if not missing:
        return {}
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    config = EngineArgs(**flags).create_engine_config(UsageContext.OPENAI_API_SERVER)
    return {k: int(getattr(config.scheduler_config, k)) for k in missing}


class VllmInprocEngine:
    name = "vllm"

    def preload(self) -> None:
        """Import vLLM ahead of the first start (about 15 s on a small CPU), in a warm engine's own process."""
        prepare_environment()
        from vllm import LLM  # noqa: F401

    def flag_schema(self) -> Mapping[str, Any]:
        prepare_environment()
        return vllm_flag_schema()

    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        """The user's flags plus what measurement needs: metrics on, and the embedded model by default."""
        resolved = {k: v for k, v in flags.items() if v is not None}
        if resolved.get("model") is None:
            resolved["model"] = str(TINY_QWEN2)
            resolved.setdefault("load_format", "dummy")
            resolved.setdefault("skip_tokenizer_init", True)
        resolved["disable_log_stats"] = False  # the preemption counter lives in the stats
        return resolved

    def refusal(self, flags: Mapping[str, Any]) -> str | None:
        """vLLM's reason for refusing these flags at start, from its own config validation (engines/
        vllm_validation.py); None when it accepts them, or when it cannot be asked before a start (a model
        named on a hub). The server engine asks the same of its own flags."""
        from throttle_sweep.engines.vllm_validation import CannotValidate, vllm_refusal

        try:
            return vllm_refusal(self.engine_flags(flags))
        except CannotValidate:
            return None

    def start(self, flags: Mapping[str, Any]) -> VllmSession:
        prepare_environment()
        from vllm import LLM

        began = time.perf_counter()
        resolved = self.engine_flags(flags)
        # vLLM refuses a start below gpu_memory_utilization x total free on each GPU: the last engine's memory
        # may still be on its way back
        waited = gpu_memory.before_start(resolved)
        listening = None
        try:
            with core_stderr.heard() as listening:  # a multiprocess core's traceback goes to the stderr it inherits
                served = served_batch_defaults(resolved)
                llm = LLM(**resolved, **served)
        except Exception as exc:
            gc.collect()
            raise EngineStartError(start_failure(exc, resolved, listening)) from exc
        session = VllmSession(llm)
        session.served_defaults = served
        session.memory_wait_s = waited
        session.start_seconds = time.perf_counter() - began
        return session

    def environment(self) -> dict[str, Any]:
        prepare_environment()
        import torch
        import vllm
        from vllm.platforms import current_platform

        # vLLM's platform reads a GPU's name through NVML: torch.cuda would initialise CUDA in this process,
        # and vLLM then forces `spawn` for its engine core and workers
        device = current_platform.device_type
        return {
            "engine": self.name,
            "vllm_version": vllm.__version__,
            "torch_version": torch.__version__,
            "driver_version": None if device == "cpu" else gpu_found.driver_version(),
            "device": device,
            "device_name": platform.processor() if device == "cpu" else current_platform.get_device_name(0),
            "host": platform.node(),
            "cpu_count": os.cpu_count(),
            **({"threads": torch.get_num_threads()} if device == "cpu" else {}),  # what a CPU engine computes on
        }
