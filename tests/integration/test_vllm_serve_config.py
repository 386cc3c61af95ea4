"""The exported config, read by `vllm serve` itself: vLLM's own CLI parser (the top-level parser with the
serve subcommand, as vllm/entrypoints/cli/main.py builds it) turns the command the export names into exactly
the winner's flags, `false` included. No server is started."""

from __future__ import annotations

import shlex

import pytest

from throttle_sweep.sweep.export import export_best

pytestmark = pytest.mark.integration

WINNER = {"model": "/models/m", "max_num_seqs": 7, "max_num_batched_tokens": 4096, "enable_prefix_caching": False,
          "enable_chunked_prefill": True, "enforce_eager": True, "kv_cache_memory_bytes": 2097152,
          "disable_log_stats": False}


def vllm_serve_args(argv: list[str]):
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    for cmd in cmd_init():
        cmd.subparser_init(subparsers)
    args = parser.parse_args(argv)
    args.model = args.model_tag or args.model  # as `vllm serve` does (ServeSubcommand.cmd)
    return args


def test_vllm_serve_config_with_the_exported_yaml_alone_serves_every_flag_of_the_winner(tmp_path):
    """`vllm serve --config FILE` reads the file with its top-level parser, which drops a `false` (vLLM 0.32):
    the file must turn a flag off in a form that parser passes on."""
    paths = export_best(tmp_path, engine_flags=WINNER, params={}, summary={}, hydra_overrides=[])
    args = vllm_serve_args(["serve", "--config", str(paths["yaml"])])
    served = {k: getattr(args, k) for k in WINNER if k != "disable_log_stats"}
    assert served == {k: v for k, v in WINNER.items() if k != "disable_log_stats"}


def test_the_api_server_module_reads_the_exported_yaml_the_same(tmp_path):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    paths = export_best(tmp_path, engine_flags=WINNER, params={}, summary={}, hydra_overrides=[])
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(paths["yaml"])])
    assert {k: getattr(args, k) for k in WINNER if k != "disable_log_stats"} == {
        k: v for k, v in WINNER.items() if k != "disable_log_stats"}


def test_the_exported_command_line_serves_every_flag_of_the_winner(tmp_path):
    paths = export_best(tmp_path, engine_flags=WINNER, params={}, summary={}, hydra_overrides=[])
    argv = shlex.split(paths["cmd"].read_text().splitlines()[-1])
    args = vllm_serve_args(argv[1:])
    assert {k: getattr(args, k) for k in WINNER if k != "disable_log_stats"} == {
        k: v for k, v in WINNER.items() if k != "disable_log_stats"}
