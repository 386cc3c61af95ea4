"""A start the multiprocess engine core refuses (how a GPU runs vLLM; VLLM_ENABLE_V1_MULTIPROCESSING=1 here, on
the CPU build): the record says the core's own reason, not only that the core failed to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_start_the_multiprocess_core_refuses_keeps_the_cores_own_reason_in_the_record(tmp_path):
    # 4 KiB of KV cache: not one block, for any request
    work = ["mode=measure", f"results_dir={tmp_path}", "run=mp", "engine.kv_cache_memory_bytes=4096",
            "engine.max_model_len=256", "workload.num_requests=2", "workload.warmup_requests=0"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    done = subprocess.run([sys.executable, "-m", "throttle_sweep", *work], env=env, capture_output=True, text=True,
                          timeout=600)
    records = [json.loads(line) for line in (tmp_path / "mp" / "replicates.jsonl").read_text().splitlines()]
    record = records[-1]
    assert record["status"] == "failed" and record["failed_at"] == "start", done.stdout + done.stderr
    assert "Engine core initialization failed" in record["reason"]
    assert "ValueError: No available memory for the cache blocks" in record["reason"], record["reason"]


def test_a_core_that_says_it_was_refused_for_memory_is_taken_at_its_word(monkeypatch):
    """vLLM's own refusal for memory, in the core's words: no reading of the GPUs is needed to say so."""
    import vllm

    import throttle_sweep.engines.gpu_memory as gpu_memory
    import throttle_sweep.engines.vllm_inproc as inproc
    from throttle_sweep.errors import EngineStartError, refused_for_memory

    refusal = ("ValueError: Free memory on device cuda:0 (10.0/79.2 GiB) on startup is less than desired GPU memory "
               "utilization (0.9, 71.3 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
               "processes.")

    def failed(**kwargs):
        os.write(2, f"Process EngineCore:\nTraceback (most recent call last):\n{refusal}\n".encode())
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    monkeypatch.setattr(vllm, "LLM", failed)
    monkeypatch.setattr(inproc, "served_batch_defaults", lambda flags: {})
    monkeypatch.setattr(gpu_memory, "before_start", lambda flags: 0.0)
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: pytest.fail("the GPUs read for what the core said"))
    with pytest.raises(EngineStartError) as failure:
        inproc.VllmInprocEngine().start({"model": "m"})
    assert refusal in str(failure.value) and refused_for_memory(str(failure.value))
