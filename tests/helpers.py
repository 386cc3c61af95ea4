"""Small builders shared by tests."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from throttle_sweep.cluster.pool import HeldRecords
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate
from throttle_sweep.settings.schema import CONF_DIR, register


def compose_cfg(*overrides: str, tmp_path: Path | None = None):
    register()
    extra = [f"results_dir={tmp_path}"] if tmp_path is not None else []
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[*extra, *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # as under @hydra.main: commands read the chosen group options
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def default_sigint() -> None:
    """A child's SIGINT as a terminal gives it (`preexec_fn=`): a shell's background job starts with SIGINT
    ignored, an ignored signal stays ignored across exec, and Python then installs no Ctrl-C handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class PoolBasics:
    """What every pool answers besides `submit` and `wait` (pool.Pool), for the test pools: slots on
    machines of their own, nothing held back."""

    shares_machine = False

    def written(self, job):
        pass

    def drain(self):
        return []

    def close(self):
        pass


def stage(next_comparison, finished, rest=lambda: 0):
    """A runner.Stage from two functions."""
    from types import SimpleNamespace

    return SimpleNamespace(next=next_comparison, finished=finished, rest=rest)


class FakeOneSlot(HeldRecords, PoolBasics):
    """The smallest pool a Sweep runs on: one slot on the fake engine, each job measured when it is waited
    for, its record held until written (pool.Pool, as tests/unit/test_pool_contract_in_thread.py checks).
    `tweak(job, record)` may change a record before the driver gets it (a failure, a count); `stop_after`
    jobs, the next wait raises KeyboardInterrupt (a Ctrl-C mid-sweep)."""

    slots, size = [0], 1

    def __init__(self, spec, *, knobs=None, tweak=None, stop_after=None):
        super().__init__()
        self.engine, self.spec, self.tweak, self.stop_after = FakeEngine(knobs or FakeKnobs()), spec, tweak, stop_after
        self.queue, self.jobs = [], []

    def submit(self, job):
        self.queue.append(job)

    def wait(self):
        job = self.queue.pop(0)
        self.jobs.append(job)
        if self.stop_after is not None and len(self.jobs) > self.stop_after:
            raise KeyboardInterrupt
        spec = replace(self.spec, **job.workload) if job.workload else self.spec
        record = measure_replicate(self.engine, job.flags, spec, Price(), run_id="t", arm=job.arm,
                                   position=job.position, environment={}, context={**job.context, "slot": "s0"})
        if self.tweak is not None:
            self.tweak(job, record)
        self._held.append((job, record))
        return [(job, record)]

    def drain(self):
        return self._take_held()


def servers_running() -> list[int]:
    """vLLM API servers alive that this test worker started, however launched (`vllm serve`, or its module),
    directly, through Ray or orphaned: each inherits its worker's name and this run's mark, so a server that a
    test on another worker runs at the same time is not counted."""
    import psutil

    mine = {k: os.environ.get(k) for k in ("PYTEST_XDIST_WORKER", "THROTTLE_SWEEP_TEST_RUN")}
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(k in " ".join(p.info["cmdline"] or []) for k in ("vllm.entrypoints.openai.api_server",
                                                                "vllm.entrypoints.cli.main serve")):
            try:
                env = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if all(env.get(k) == v for k, v in mine.items()):
                found.append(p.pid)
    return found


# backend=server tests: the tiny model with 2 MiB of KV cache, and small fixed work
SERVER_EDGE = {"kv_cache_memory_bytes": 2 << 20, "max_model_len": 256, "enforce_eager": True, "seed": 0}
SERVER_SMALL = ["backend=server", "workload.num_requests=16", "workload.output_len=32", "workload.prompt_len=32",
                "workload.warmup_requests=2"]


def gpu_check():
    """scripts/gpu_check.py as a module (scripts/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a goodput sweep over two pretend GPU types on the fake engine: B steps 4x faster than A (add cost.prices)
GOODPUT_TYPED = ("backend=fake", "+space=batching", "study.objective=goodput", "workload=open_loop",
                 "workload.num_requests=100", "workload.output_len=32", "capacity.run_s=10", "capacity.knee_rates=3",
                 "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "space.max_num_seqs.low=4",
                 "space.max_num_seqs.high=16", "space.max_num_batched_tokens.choices=[2048]", "study.n_trials=3",
                 "study.confirm_top=1", "fake.noise_sd=0.02", "fake.type_speed={A: 1.0, B: 4.0}", "plots=false",
                 "study.name=g", "ray.enabled=true")


def deploy(best: Path, **flags) -> None:
    """Edit an export's deployed vllm_config.yaml (mode=recheck's tests): these flags set (None: removed)."""
    import yaml

    path = best / "vllm_config.yaml"
    served = yaml.safe_load(path.read_text())
    for key, value in flags.items():
        served.pop(key.replace("_", "-"), None)
        if value is not None:
            served[key.replace("_", "-")] = value
    path.write_text(yaml.safe_dump(served))
