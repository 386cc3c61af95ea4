"""A real sweep on the vLLM CPU engine: the boundary it probes is bare vLLM's, and its export is read back by
vLLM's own argument parser."""

from __future__ import annotations

import optuna
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # a winner confirmed on the real engine


def bare_preemptions(max_num_seqs: int, *, requests: int, prompt_len: int, output_len: int) -> int:
    """vLLM alone (no throttle_sweep code): LLM.generate over the same fixed work, its preemption counter."""
    from vllm import LLM, SamplingParams

    from throttle_sweep.models import TINY_QWEN2

    llm = LLM(model=str(TINY_QWEN2), load_format="dummy", skip_tokenizer_init=True, kv_cache_memory_bytes=2 << 20,
              max_model_len=256, max_num_seqs=max_num_seqs, enforce_eager=True, disable_log_stats=False, seed=0)
    try:
        prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 1 for j in range(prompt_len)]} for i in range(requests)]
        llm.generate(prompts, SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
                                             detokenize=False), use_tqdm=False)
        return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def test_the_probed_boundary_is_the_one_bare_vllm_shows(tmp_path):
    """A step-1 sweep over max_num_seqs 2..12 with a 2 MiB KV cache: the probes name the exact boundary, which
    bare LLM.generate runs of the same work confirm (no preemption at the last clean value, some at the next);
    nothing past it is measured, and the winner is feasible."""
    work = {"requests": 12, "prompt_len": 32, "output_len": 128}
    # 4 confirmation replicates per arm (abba needs an even number): with 2, the drift-aware fit has 1 degree of freedom (t = 12.7) and a
    # loaded CI machine (26% between two runs of one arm) left the winner's interval at [0.065, 1.162]
    cfg = compose_cfg("+space=batching", "study.name=edge", "study.n_trials=1", "study.sampler=grid",
                      "space.max_num_seqs.low=2", "space.max_num_seqs.high=12", "space.max_num_seqs.log=false",
                      "~space.max_num_batched_tokens", "engine.kv_cache_memory_bytes=2097152", "engine.max_model_len=256",
                      "compare.replicates=2", "study.confirm_top=1", "study.confirm_replicates=4",
                      f"workload.num_requests={work['requests']}", f"workload.prompt_len={work['prompt_len']}",
                      f"workload.output_len={work['output_len']}", "workload.concurrency=12",
                      "workload.warmup_requests=0", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name="edge", storage=f"sqlite:///{tmp_path / 'edge' / 'study.db'}")
    (found,) = study.user_attrs["boundaries"]
    assert found["exact"] and found["settled"], found
    clean, dirty = found["last_clean"], found["first_preempting"]
    assert bare_preemptions(clean, **work) == 0 and bare_preemptions(dirty, **work) == found["probes"][str(dirty)][0] > 0
    assert found["predicted_last_clean"] == clean  # vLLM's own KV capacity, less its null block
    measured = [t for t in study.trials if t.user_attrs.get("source") in (None, "reference")]  # reference: probed
    assert measured and all(t.params["max_num_seqs"] <= clean and t.user_attrs["preemptions"] == 0 for t in measured)
    winner = study.user_attrs["winner"]
    assert winner["params"]["max_num_seqs"] == clean  # the grid starts at the boundary
    assert winner["ci"][1] < 1  # confirmed cheaper than max_num_seqs=1, Bonferroni-adjusted

    # the export, read back by vLLM's own argument parser
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--config", str(tmp_path / "edge" / "best" / "vllm_config.yaml")])
    assert args.max_num_seqs == clean and args.max_model_len == 256
    assert args.kv_cache_memory_bytes == 2097152 and args.load_format == "dummy" and args.enforce_eager is True
