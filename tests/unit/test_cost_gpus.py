"""An engine is charged for every GPU it holds: tensor x pipeline x data parallel, at least cost.gpus."""

from __future__ import annotations

import pytest

from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.engines.flags import engine_gpus
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate, one_line
from throttle_sweep.measurement.workload import WorkloadSpec

SPEC = WorkloadSpec(num_requests=8, prompt_len=16, output_len=16, concurrency=8, warmup_requests=0)


@pytest.mark.parametrize("flags, gpus", [({}, 1), ({"tensor_parallel_size": 2}, 2),
                                         ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),
                                         ({"tensor_parallel_size": 2, "data_parallel_size": 3}, 6)])
def test_an_engine_holds_tensor_times_pipeline_times_data_parallel_gpus(flags, gpus):
    assert engine_gpus(flags) == gpus


def test_a_tensor_parallel_engine_is_charged_for_both_its_gpus_whatever_cost_gpus_says():
    record = measure_replicate(FakeEngine(FakeKnobs()), {"max_num_seqs": 8, "tensor_parallel_size": 2}, SPEC,
                               Price(1.39, 1), run_id="t", arm="candidate", position=0, environment={})
    assert record["gpus"] == 2
    expected = 1.39 * 2 * record["wall_s"] / 3600 / (record["output_tokens"] / 1e6)
    assert record["usd_per_mtok"] == pytest.approx(expected)
    assert "x 2 GPU" in one_line(record, Price(1.39, 1))
    roomy = measure_replicate(FakeEngine(FakeKnobs()), {"max_num_seqs": 8}, SPEC, Price(1.39, 4), run_id="t",
                              arm="baseline", position=1, environment={})
    assert roomy["gpus"] == 4  # cost.gpus is a floor: a node rented whole is paid whole


def test_the_dollar_budget_counts_every_gpu_a_record_was_charged_for():
    import optuna

    from throttle_sweep.cluster.pool import LocalPool
    from throttle_sweep.sweep.budget import budget_left
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    hour_on = [{"wall_s": 1800.0, "gpus": 2, "status": "ok"}, {"wall_s": 1800.0, "gpus": 2, "status": "ok"}]  # two engine half-hours on 2 GPUs each
    settings = SweepSettings(n_trials=10, budget_usd=1.5, usd_per_gpu_hour=1.0)
    sweep = Sweep(study=optuna.create_study(), distributions={}, base_flags={}, baseline_flags={}, workload_key={},
                  pool=LocalPool(lambda *a: {}), write=lambda r: None, existing=hour_on, settings=settings)
    assert budget_left(sweep.runner, None) == "dollar budget spent ($2.0000 of $1.5 at the assumed price)"  # 2 GPU-hours
