"""A small real sweep on the vLLM CPU engine, and its export read back by vLLM's own argument parser."""

from __future__ import annotations

import optuna
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd

pytestmark = pytest.mark.integration


def test_small_real_sweep_confirms_and_exports_a_config_vllm_parses(tmp_path):
    cfg = compose_cfg("+space=batching", "study.name=real", "study.n_trials=3", "study.sampler=grid",
                      "space.max_num_seqs.low=2", "space.max_num_seqs.high=8", "~space.max_num_batched_tokens",
                      "compare.replicates=2", "study.confirm_top=1", "study.confirm_replicates=4",
                      "workload.num_requests=16", "workload.output_len=32", "workload.prompt_len=32",
                      "workload.concurrency=16", "workload.warmup_requests=2", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name="real", storage=f"sqlite:///{tmp_path / 'real' / 'study.db'}")
    assert {t.params["max_num_seqs"] for t in study.trials} == {2, 4, 8}
    assert all(t.user_attrs["preemptions"] == 0 for t in study.trials)
    winner = study.user_attrs["winner"]
    assert winner["ci"][1] < 1  # confirmed cheaper than max_num_seqs=1, Bonferroni-adjusted

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--config", str(tmp_path / "real" / "best" / "vllm_config.yaml")])
    assert args.max_num_seqs == winner["params"]["max_num_seqs"]
    assert args.kv_cache_memory_bytes == 64 << 20 and args.load_format == "dummy" and args.enforce_eager is True
