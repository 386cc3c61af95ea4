"""A fake engine for fast logic tests: a small simulation of vLLM's scheduler on a virtual clock.

Like vLLM's v1 scheduler it runs up to `max_num_seqs` sequences, spends at most `max_num_batched_tokens`
per step (one per decoding sequence, the rest on prefill, split across steps when chunked prefill is on,
as by default), allocates KV-cache blocks (128 tokens by default, as vLLM's CPU backend) as sequences
grow, preempts (recomputes) the newest sequence when blocks run out, and admits no new sequence in a step
that preempted. Step time is an overhead plus a cost per sequence and per prefilled token: linear in the
batch, with no compute knee, so its cost falls with every added sequence until preemption. Its cost
surface and boundary are consequences of the flags, known exactly when `noise_sd` is 0; they are the
fake's, not vLLM's (tests compare with a real engine where that matters). Knobs inject drift, noise, start
failures, crashes and hangs. With `realtime=True` a step also sleeps its simulated time (for benchmarks).
"""

from __future__ import annotations

import math
import os
import platform
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from throttle_sweep.engines.base import Request, StepEvent
from throttle_sweep.errors import EngineRunError, EngineStartError

FAKE_FLAG_SCHEMA: dict[str, Any] = {
    "model": str | None,
    "max_num_seqs": int | None,
    "max_num_batched_tokens": int | None,
    "kv_cache_memory_bytes": int | None,
    "num_gpu_blocks_override": int | None,
    "block_size": int | None,
    "max_model_len": int | None,
    "seed": int | None,
    "enforce_eager": bool,
    "enable_chunked_prefill": bool | None,
    "enable_prefix_caching": bool | None,
    "gpu_memory_utilization": float,
    "kv_cache_dtype": Literal["auto", "float16", "bfloat16", "fp8"],
    "scheduling_policy": Literal["fcfs", "priority"],
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "distributed_executor_backend": str | None,
}


@dataclass
class FakeKnobs:
    step_overhead_s: float = 0.004
    per_seq_s: float = 0.0004
    per_prefill_token_s: float = 0.00003
    kv_bytes_per_token: int = 1024
    start_s: float = 1.5
    noise_sd: float = 0.0  # sd of log step time, drawn once per session (replicate)
    drift_per_start: float = 0.0  # relative slow-down added by every replicate a slot runs (machine drift)
    lifetime_sd: float = 0.0  # sd of log step time drawn once per engine start: an engine instance's own speed
    crash_after_steps: int | None = None  # the engine dies mid-run
    fail_start_when: dict[str, int] = field(default_factory=dict)  # flag -> start fails above this value
    # flag -> the whole process dies (os._exit) a few steps into a run above this value: a segfault stand-in,
    # for slots that live in their own process (Ray actors, subprocesses), never in a test's own process
    exit_when: dict[str, int] = field(default_factory=dict)
    # flag -> the engine hangs (sleeps for an hour) a few steps into a run above this value: a deadlock stand-in,
    # for slots that live in their own process
    hang_when: dict[str, int] = field(default_factory=dict)
    realtime: bool = False
    seed: int = 0
    # the chance that a step admits no waiting sequence, drawn per replicate from `seed`: batch composition that
    # depends on timing, as with vLLM's asynchronous scheduling on a GPU (preemption counts then vary by run)
    jitter: float = 0.0
    # a directory that stands for one GPU's memory: an awake engine holds a file in it, and starting or waking
    # an engine while another one is awake fails like CUDA running out of memory; the engine then sleeps and
    # wakes (vLLM's sleep mode, level 1) as a GPU engine must when a slot keeps two of them
    gpu_dir: str | None = None
    wake_s: float = 0.3  # what a wake-up costs (reloading the weights)
    # on the pretend GPU, what an engine asleep still holds (its CUDA context, graph pools), which a new engine's
    # memory profile counts against its KV cache when kv_cache_memory_bytes does not size it (the size a GPU
    # engine would get from gpu_memory_utilization: gpu_kv_bytes when it is alone)
    gpu_kv_bytes: int = 64 << 20
    asleep_holds_bytes: int = 0
    # how much more than gpu_kv_bytes the pretend GPU has room for (vLLM leaves 1 - gpu_memory_utilization
    # free): a start whose KV cache and the sleepers' leftovers exceed gpu_kv_bytes + this runs out of memory
    gpu_headroom_bytes: int = 1 << 40
    sleep_fails_when: dict[str, int] = field(default_factory=dict)  # flag -> it cannot sleep above this value
    # the pretend GPU's size: when set, a start is refused as vLLM refuses it unless the free memory is at least
    # gpu_memory_utilization x this; sleepers hold asleep_holds_bytes each, and a file `foreign-<bytes>` in
    # gpu_dir stands for memory a process outside the tool holds
    gpu_total_bytes: int | None = None
    # pretend GPU types (a Ray node's `accelerator_type:<type>` resource) -> how many times faster a step runs
    # there than these knobs say: a slot of that type runs the engine `on_gpu_type`
    type_speed: Any = None  # {type: speed} (typed Any: OmegaConf cannot merge a dict into a None Dict node)


class FakeSession:
    engine_steps = True  # one step() is one scheduler iteration, as in vLLM's in-process engine core

    def __init__(self, flags: Mapping[str, Any], knobs: FakeKnobs, start_index: int) -> None:
        self.knobs, self.flags = knobs, dict(flags)
        self.max_num_seqs = int(flags.get("max_num_seqs") or 256)
        self.token_budget = int(flags.get("max_num_batched_tokens") or 8192)
        self.block_size = int(flags.get("block_size") or 128)
        self.chunked = flags.get("enable_chunked_prefill") is not False
        kv_bytes = int(flags.get("kv_cache_memory_bytes") or self._profiled_kv_bytes())
        self.total_blocks = max(1, kv_bytes // (knobs.kv_bytes_per_token * self.block_size))
        if flags.get("num_gpu_blocks_override"):  # vLLM's own override wins over any size
            self.total_blocks = int(flags["num_gpu_blocks_override"])
        self.kv_blocks, self.kv_block_size = self.total_blocks, self.block_size
        self.lifetime_speed = self._lifetime(start_index)
        self._jitter = random.Random(f"{knobs.seed}/jitter/{start_index}")
        self._begun = False
        self._set_speed(start_index)
        self.start_seconds = knobs.start_s
        self.clock = 0.0
        self.steps = 0
        self.preempted = 0
        self.waiting: deque[dict] = deque()
        self.running: list[dict] = []
        self.asleep = False
        self._marker = f"{os.getpid()}-{id(self):x}"
        self.dies = any((flags.get(name) or 0) > limit for name, limit in knobs.exit_when.items())
        self.hangs = any((flags.get(name) or 0) > limit for name, limit in knobs.hang_when.items())

    def begin_replicate(self, index: int) -> None:
        """Noise is drawn once per replicate and drift grows with the slot's replicate index: on a warm engine
        the slot passes its own count, so the machine drifts the same whether engines restart or not."""
        if not self._begun:  # this engine's own speed, drawn at its first replicate from the slot's count
            self.lifetime_speed, self._begun = self._lifetime(index), True
        # every replicate starts its virtual clock at 0: the same work gives the same seconds to the last bit,
        # whatever ran on this engine before (a warm-up run, earlier replicates)
        self.clock = 0.0
        self._set_speed(index)
        self._jitter = random.Random(f"{self.knobs.seed}/jitter/{index}")

    def _lifetime(self, index: int) -> float:
        return math.exp(random.Random(f"{self.knobs.seed}/{index}").gauss(0.0, self.knobs.lifetime_sd))

    def _set_speed(self, index: int) -> None:
        rng = random.Random(self.knobs.seed * 1_000_003 + index)
        self.speed = ((1.0 + self.knobs.drift_per_start * index) * math.exp(rng.gauss(0.0, self.knobs.noise_sd))
                      * self.lifetime_speed)

    def _profiled_kv_bytes(self) -> int:
        if self.knobs.gpu_dir is None:
            return 64 << 20
        sleepers = sum(p.name.endswith(".asleep") for p in Path(self.knobs.gpu_dir).iterdir())
        return max(0, self.knobs.gpu_kv_bytes - sleepers * self.knobs.asleep_holds_bytes)

    def kv_pin(self) -> dict[str, int]:
        """The flags that give a later start this engine's KV capacity, whatever else holds the GPU."""
        return {"num_gpu_blocks_override": self.total_blocks}

    def computed_tokens(self) -> dict[str, int]:
        return {seq["id"]: seq["computed"] for seq in self.running}

    def add(self, request: Request) -> None:
        self.waiting.append({"id": request.id, "prompt": request.prompt_len or 1, "out": request.output_len,
                             "done": 0, "blocks": 0, "computed": 0})

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _free_blocks(self) -> int:
        return self.total_blocks - sum(seq["blocks"] for seq in self.running)

    def step(self) -> list[StepEvent]:
        self._faults()
        self.steps += 1
        preempted_now = self._grow_decoding()
        prefill_tokens = self._schedule_prefill(preempted_now)
        if not self.running:
            raise EngineRunError("fake engine cannot schedule: one request needs more KV cache than exists, or its "
                                 "prompt exceeds max_num_batched_tokens with chunked prefill off")
        elapsed = self._step_seconds(prefill_tokens) * self.speed
        self.clock += elapsed
        if self.knobs.realtime:
            time.sleep(elapsed)
        return self._emit()

    def _step_seconds(self, prefill_tokens: int) -> float:
        """The step's time before noise and drift: linear in the batch (the GPU twin puts a roofline here)."""
        return (self.knobs.step_overhead_s + self.knobs.per_seq_s * len(self.running)
                + self.knobs.per_prefill_token_s * prefill_tokens)

    def _faults(self) -> None:
        """The failure knobs: asleep, a crash after some steps, a process that dies or hangs."""
        if self.asleep:
            raise EngineRunError("fake engine stepped while asleep")
        if self.knobs.crash_after_steps is not None and self.steps >= self.knobs.crash_after_steps:
            raise EngineRunError(f"fake engine crashed after {self.steps} steps (crash_after_steps)")
        if self.dies and self.steps >= 3:
            os._exit(70)
        if self.hangs and self.steps >= 3:
            time.sleep(3600)

    def _grow_decoding(self) -> bool:
        """Decoding sequences (prefill complete) grow by one token; the newest is preempted when the cache is
        full. Whether any was preempted in this step."""
        preempted_now, free = False, self._free_blocks()  # kept up to date below: summing each time was slow
        gone: set[int] = set()  # preempted in this step (a set: a GPU batch holds a thousand sequences)
        for seq in list(self.running):
            if id(seq) in gone or seq["computed"] < self._context(seq):
                continue
            need = self._blocks_for(seq["prompt"] + seq["done"] + 1) - seq["blocks"]
            while need > free and self.running:
                victim = self.running.pop()
                gone.add(id(victim))
                free += victim["blocks"]
                victim["blocks"], victim["computed"] = 0, 0
                self.waiting.appendleft(victim)
                self.preempted += 1
                preempted_now = True
                if victim is seq:
                    break
            if id(seq) not in gone:
                seq["blocks"] += need
                free -= need
        return preempted_now

    def _schedule_prefill(self, preempted_now: bool) -> int:
        """Prefill within the step's token budget: running sequences' next chunks first (vLLM schedules running
        requests before waiting ones), then waiting ones admitted (prefill, or recompute after preemption), but
        not in a step that preempted. The prefill tokens scheduled."""
        decoding = [seq for seq in self.running if seq["computed"] >= self._context(seq)]
        budget = self.token_budget - len(decoding)  # every decoding sequence spends one token of the budget
        prefill_tokens = 0
        for seq in self.running:
            left = self._context(seq) - seq["computed"]
            if left > 0 and budget > 0:
                chunk = min(left, budget)
                seq["computed"] += chunk
                prefill_tokens += chunk
                budget -= chunk
        free = self._free_blocks()
        held = bool(self.running) and self.knobs.jitter > 0 and self._jitter.random() < self.knobs.jitter
        while self.waiting and not preempted_now and not held and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            first = self._context(seq) if not self.chunked else min(self._context(seq), max(budget, 0))
            if first <= 0 or (not self.chunked and first > budget) \
                    or self._blocks_for(self._context(seq) + 1) > free:
                break
            self.waiting.popleft()
            seq["blocks"] = self._blocks_for(self._context(seq) + 1)
            free -= seq["blocks"]
            self.running.append(seq)
            budget -= first
            seq["computed"] = first
            prefill_tokens += first
        return prefill_tokens

    def _emit(self) -> list[StepEvent]:
        """A token for every sequence whose prefill is complete; finished ones leave."""
        events, staying = [], []
        for seq in self.running:
            if seq["computed"] < self._context(seq):
                staying.append(seq)
                continue  # still prefilling: no token this step
            seq["done"] += 1
            seq["computed"] = self._context(seq)
            finished = seq["done"] >= seq["out"]
            events.append(StepEvent(seq["id"], seq["done"], finished, seq["prompt"]))
            if not finished:
                staying.append(seq)
        self.running = staying
        return events

    def _context(self, seq: dict) -> int:
        """Tokens that must be in the KV cache before the sequence can produce its next token."""
        return seq["prompt"] + seq["done"]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_cache_usage(self) -> float:
        return (self.total_blocks - self._free_blocks()) / self.total_blocks

    def preemptions(self) -> int:
        return self.preempted

    def now(self) -> float:
        return self.clock

    def wait_until(self, t: float) -> None:
        if self.knobs.realtime and t > self.clock:
            time.sleep(t - self.clock)
        self.clock = max(self.clock, t)

    def close(self) -> None:
        self.running.clear()
        self.waiting.clear()
        self._release()

    # ---- sleep mode, on a pretend GPU (knobs.gpu_dir) ----
    def claim(self) -> None:
        """Take the pretend GPU's memory, or fail as vLLM does when another engine holds it."""
        if self.knobs.gpu_dir is None:
            return
        gpu = Path(self.knobs.gpu_dir)
        holders = [p.name for p in gpu.iterdir() if p.name != self._marker and not p.name.endswith(".asleep")
                   and not p.name.startswith("foreign-")]
        if holders:
            raise EngineStartError(f"fake GPU out of memory: engine {holders[0]} is awake on it")
        sleepers = sum(p.name.endswith(".asleep") and p.name != f"{self._marker}.asleep" for p in gpu.iterdir())
        if (total := self.knobs.gpu_total_bytes) is not None:
            held = sleepers * self.knobs.asleep_holds_bytes + sum(
                int(p.name.removeprefix("foreign-")) for p in gpu.iterdir() if p.name.startswith("foreign-"))
            utilization = float(self.flags.get("gpu_memory_utilization") or 0.9)
            if total - held < utilization * total:  # vLLM's words (v1/worker/utils.py)
                raise EngineStartError(
                    f"ValueError: Free memory on device cuda:0 ({(total - held) / 2**30:.2f}/{total / 2**30:.2f} "
                    f"GiB) on startup is less than desired GPU memory utilization ({utilization}, "
                    f"{utilization * total / 2**30:.2f} GiB). Decrease GPU memory utilization or reduce GPU "
                    "memory used by other processes.")
        needs = self.total_blocks * self.block_size * self.knobs.kv_bytes_per_token
        room = self.knobs.gpu_kv_bytes + self.knobs.gpu_headroom_bytes - sleepers * self.knobs.asleep_holds_bytes
        if needs > room:
            raise EngineStartError(f"fake GPU out of memory: a KV cache of {needs} bytes beside {sleepers} sleeping "
                                   f"engine(s) leaves no room")
        (gpu / self._marker).touch()

    def _release(self, *, asleep: bool = False) -> None:
        if self.knobs.gpu_dir is not None:
            (Path(self.knobs.gpu_dir) / self._marker).unlink(missing_ok=True)
            sleeping = Path(self.knobs.gpu_dir) / f"{self._marker}.asleep"
            if asleep:
                sleeping.touch()
            else:
                sleeping.unlink(missing_ok=True)

    def sleep(self) -> None:
        if any((self.flags.get(name) or 0) > limit for name, limit in self.knobs.sleep_fails_when.items()):
            raise EngineRunError("fake engine could not go to sleep")
        self.asleep = True
        self._release(asleep=True)

    def wake(self) -> None:
        self.claim()
        if self.knobs.gpu_dir is not None:
            (Path(self.knobs.gpu_dir) / f"{self._marker}.asleep").unlink(missing_ok=True)
        self.asleep = False
        self.clock += self.knobs.wake_s


class FakeEngine:
    name = "fake"

    def __init__(self, knobs: FakeKnobs | None = None, gpu_type: str | None = None) -> None:
        self.knobs = knobs or FakeKnobs()
        self.gpu_type = gpu_type  # the pretend GPU type it runs on (its device name)
        self.starts = 0

    def flag_schema(self) -> Mapping[str, Any]:
        return FAKE_FLAG_SCHEMA

    def on_gpu_type(self, gpu_type: str) -> FakeEngine:
        """The engine on a slot of this pretend GPU type: its step times divided by `type_speed[gpu_type]`."""
        speed = float((self.knobs.type_speed or {}).get(gpu_type, 1.0))
        k = self.knobs
        return FakeEngine(replace(k, step_overhead_s=k.step_overhead_s / speed, per_seq_s=k.per_seq_s / speed,
                                  per_prefill_token_s=k.per_prefill_token_s / speed), gpu_type)

    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in flags.items() if v is not None}

    def refusal(self, flags: Mapping[str, Any]) -> str | None:
        """What vLLM's scheduler config refuses too, in its words (the fake's stand-in for vllm_refusal)."""
        seqs, tokens = flags.get("max_num_seqs"), flags.get("max_num_batched_tokens")
        if seqs is not None and tokens is not None and tokens < seqs:
            return (f"SchedulerConfig: max_num_batched_tokens ({tokens}) must be greater than or equal to "
                    f"max_num_seqs ({seqs}).")
        return None

    def start(self, flags: Mapping[str, Any]) -> FakeSession:
        index = self.starts
        self.starts += 1
        if (why := self.refusal(flags)) is not None:
            raise EngineStartError(why)
        for name, limit in self.knobs.fail_start_when.items():
            if (flags.get(name) or 0) > limit:
                raise EngineStartError(f"fake engine refuses {name}={flags.get(name)} (> {limit})")
        if self.knobs.realtime:
            time.sleep(self.knobs.start_s)
        session = FakeSession(self.engine_flags(flags), self.knobs, index)
        session.claim()
        return session

    def environment(self) -> dict[str, Any]:
        return {"engine": self.name, "vllm_version": None, "device": "fake-gpu" if self.knobs.gpu_dir else "fake",
                "device_name": self.gpu_type or "fake",
                "host": platform.node(), "cpu_count": os.cpu_count()}
