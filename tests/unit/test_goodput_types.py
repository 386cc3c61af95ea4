"""A goodput sweep over GPU types (`cost.prices`, #26): the type is a knob, each type's runs go to a slot of
that type, and the answer names the cheapest (type, flags, replicas), with a confirmed line per type. The
slots here are in-thread fake engines with a speed per pretend type; the Ray placement of one slot per type
is tests/integration/test_ray_gpu_types.py."""

from __future__ import annotations

import json

import pytest
import yaml
from rich.console import Console

from tests.helpers import GOODPUT_TYPED as TYPED
from tests.helpers import compose_cfg
from throttle_sweep.commands import goodput as goodput_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.gpu_types import check_types, cluster_types
from throttle_sweep.ray_runtime import ClusterError
from throttle_sweep.records import read_records
from throttle_sweep.slot import WarmSlot


@pytest.fixture
def local_types(monkeypatch):
    """One in-thread slot per type, each running the fake engine at its type's speed: what a Ray slot placed on
    a node of that type runs (cluster.SlotActor)."""
    made = []

    def make(ray_conf, engine, spec, prices, *, engine_flags, warm, run_id, out, say, starts=()):
        slots = {t: WarmSlot(engine.on_gpu_type(t), spec, price, run_id=run_id, name=f"local-{t}", **warm)
                 for t, price in prices.items()}
        made.append(list(prices))
        return slots, lambda: [s.close() for s in slots.values()]

    monkeypatch.setattr(goodput_cmd, "make_typed_slots", make)
    return made


def run(tmp_path, *args):
    console = Console(record=True, width=250)
    code = sweep_cmd.run(compose_cfg(*TYPED, *args, tmp_path=tmp_path), console)
    return code, console.export_text()


def test_the_answer_names_the_type_whose_goodput_costs_least_at_its_price_and_for_the_target(tmp_path, local_types):
    """B steps 4x faster than A at 2.5x its price: per token B is the cheaper; for 30 req/s, two replicas of A
    (about 29 req/s each, $1/h) cost less than one of B ($2.5/h), read from the same runs."""
    code, said = run(tmp_path, "cost.prices={A: 1.0, B: 2.5}")
    assert local_types == [["A", "B"]], said
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert (summary["winner"] or {}).get("params", {}).get("gpu_type") == "B", said
    # every type has its cheapest confirmed, with an interval, and the faster type serves more per replica
    types = summary["gpu_types"]
    assert set(types) == {"A", "B"} and all(types[t]["cheapest"] for t in types), said
    assert types["B"]["cheapest"]["capacity_rps"] > 2 * types["A"]["cheapest"]["capacity_rps"]
    for t in types:  # its cost is its own type's price over its goodput (32 output tokens a request)
        c = types[t]["cheapest"]
        assert c["usd_per_mtok_at_capacity"] == pytest.approx(
            types[t]["usd_per_gpu_hour"] / 3600 / (c["capacity_rps"] * 0.9 * 32) * 1e6)
    assert "per GPU type, its cheapest confirmed configuration:" in said and "unpaired" in said
    # each configuration ran on its own type's slot, at its price; the baseline is vLLM's defaults on the first
    records = read_records(tmp_path / "g" / "replicates.jsonl")
    for r in records:
        assert r["environment"]["device_name"] == r["params"]["gpu_type"]
        assert r["usd_per_gpu_hour"] == types[r["params"]["gpu_type"]]["usd_per_gpu_hour"]
    assert next(s for s in summary["screen"] if s["config"] == "baseline")["params"]["gpu_type"] == "A"
    assert [s["params"]["gpu_type"] for s in summary["screen"][1:3]] == ["A", "B"]  # every type is tried first
    best = tmp_path / "g" / "best"
    if code == 0:  # exported: the type beside the flags, never as a vLLM flag; measured again at its price
        assert json.loads((best / "best.json").read_text())["params"]["gpu_type"] == "B"
        assert "gpu_type" not in yaml.safe_load((best / "vllm_config.yaml").read_text())
        assert "cost.usd_per_gpu_hour=2.5" in (best / "overrides.yaml").read_text()

    code, said = run(tmp_path, "cost.prices={A: 1.0, B: 2.5}", "workload.target_rps=30")
    assert len(read_records(tmp_path / "g" / "replicates.jsonl")) == len(records)  # nothing measured again
    cheapest = json.loads((tmp_path / "g" / "summary.json").read_text())["gpu_types"]
    winner = json.loads((tmp_path / "g" / "summary.json").read_text())["winner"]
    assert winner is not None and winner["params"]["gpu_type"] == "A", said
    assert winner["fleet"]["usd_per_hour"] < cheapest["B"]["cheapest"]["fleet"]["usd_per_hour"]
    for t in cheapest:
        c = cheapest[t]["cheapest"]
        assert c["fleet"]["usd_per_hour"] == pytest.approx(cheapest[t]["usd_per_gpu_hour"] * c["fleet"]["gpus"])


@pytest.mark.parametrize(("args", "words"), [
    (("cost.prices={A: 1.0, B: 2.0}", "ray.enabled=false"), "cost.prices makes the GPU type a knob"),
    (("cost.prices={A: 1.0, B: 0}",), "cost.prices.B must be a positive price"),
    (("cost.prices={A: 1.0}", "cost.baseline_type=H100"), "cost.baseline_type='H100' is not priced"),
    (("cost.baseline_type=A",), "cost.prices is unset"),
    (("cost.prices=[A, B]",), "cost.prices maps GPU types to USD per GPU-hour"),
])
def test_bad_prices_are_refused_by_name_before_any_engine_starts(tmp_path, local_types, args, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("+", r"\+")):
        run(tmp_path, *args)
    assert local_types == []


def test_a_priced_type_no_node_has_is_refused_naming_the_types_there():
    resources = {"CPU": 4.0, "accelerator_type:A100": 1.0, "accelerator_type:T4": 2.0}
    assert cluster_types(resources) == ["A100", "T4"]
    check_types(["A100"], resources)
    with pytest.raises(ClusterError, match="H100 that no node of this Ray cluster has .its types: A100, T4"):
        check_types(["A100", "H100"], resources)
