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
from throttle_sweep.cluster.gpu_types import TypedSlot, check_room, check_types, cluster_types
from throttle_sweep.cluster.pool import Job
from throttle_sweep.cluster.ray_pool import SlotShape, took_key
from throttle_sweep.cluster.ray_runtime import ClusterError
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.commands import goodput as goodput_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.report import figures
from throttle_sweep.store.records import read_records


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


def test_the_answer_names_the_type_whose_goodput_costs_least_at_its_price_and_for_the_target(tmp_path, local_types,
                                                                                            monkeypatch):
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
    assert summary["price"] == "A $1/GPU-hour, B $2.5/GPU-hour (assumed)"
    assert {c["config"]: c["usd_per_gpu_hour"] for c in summary["confirmed"]}[summary["winner"]["config"]] == 2.5
    # exported: the type beside the flags, never as a vLLM flag; measured again at its price
    assert code == 0, said
    best = tmp_path / "g" / "best"
    assert json.loads((best / "best.json").read_text())["params"]["gpu_type"] == "B"
    assert "gpu_type" not in yaml.safe_load((best / "vllm_config.yaml").read_text())
    assert "cost.usd_per_gpu_hour=2.5" in (best / "overrides.yaml").read_text()

    drawn = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.__setitem__(path.name, fig))
    code, said = run(tmp_path, "cost.prices={A: 1.0, B: 2.5}", "workload.target_rps=30", "plots=true")
    assert len(read_records(tmp_path / "g" / "replicates.jsonl")) == len(records)  # nothing measured again
    cheapest = json.loads((tmp_path / "g" / "summary.json").read_text())["gpu_types"]
    winner = json.loads((tmp_path / "g" / "summary.json").read_text())["winner"]
    assert winner is not None and winner["params"]["gpu_type"] == "A", said
    assert winner["fleet"]["usd_per_hour"] < cheapest["B"]["cheapest"]["fleet"]["usd_per_hour"]
    for t in cheapest:
        c = cheapest[t]["cheapest"]
        assert c["fleet"]["usd_per_hour"] == pytest.approx(cheapest[t]["usd_per_gpu_hour"] * c["fleet"]["gpus"])
    # the pictures name each configuration with its type, and star the winner (of type A for 30 req/s)
    [ax] = drawn["attainment_vs_rate.png"].axes
    named = {t.get_text().split(":")[0] for t in ax.get_legend().get_texts()}
    assert {" on A", " on B"} <= {n[n.index(" on "):] for n in named if " on " in n}
    assert f"winner {winner['config']} on A" in named


@pytest.mark.parametrize(("args", "words"), [
    (("cost.prices={A: 1.0, B: 2.0}", "ray.enabled=false"), "cost.prices makes the GPU type a knob"),
    (("cost.prices={A: 1.0, B: 0}",), "cost.prices.B must be a positive price"),
    (("cost.prices={A: 1.0}", "cost.baseline_type=H100"), "cost.baseline_type='H100' is not priced"),
    (("cost.baseline_type=A",), "cost.prices is unset"),
    (("cost.prices=[A, B]",), "cost.prices maps GPU types to USD per GPU-hour"),
    (("cost.prices={A: 1.0, B: 2.0, C: 3.0}", "study.n_trials=2"), "study.n_trials=2 cannot try each of the 3"),
    (("cost.prices={A: 1.0}", "study.objective=cost"), "cost.prices prices GPU types for a goodput sweep"),
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


class StubPool:
    """What TypedSlot needs of a RayPool: the slots alive, submit, wait (the finished jobs), written."""

    def __init__(self, slots):
        self.slots, self.submitted, self.written_jobs = slots, [], []

    def submit(self, job):
        self.submitted.append(job)

    def wait(self):
        done, self.submitted = self.submitted, []
        return [(job, {"status": "ok", "slot": job.slot, "rate": (job.workload or {}).get("rate")}) for job in done]

    def written(self, job):
        self.written_jobs.append(job)


def test_a_typed_slot_sends_the_run_with_its_rate_and_a_retired_one_says_which_type_is_gone():
    pool = StubPool([0, 1])
    slot = TypedSlot(pool, 1, "H100")
    record = slot.measure({"max_num_seqs": 8}, "candidate", 3, {"stage": "s"}, workload={"rate": 2.5})
    assert record == {"status": "ok", "slot": 1, "rate": 2.5}
    (job,) = pool.written_jobs
    assert job.context == {"stage": "s", "gpu_type": "H100"} and job.position == 3
    pool.slots = [0]  # the pool retired it: no node of the type can host it
    with pytest.raises(ClusterError, match="the slot of GPU type H100 is gone"):
        slot.measure({}, "candidate", 4, {}, workload={"rate": 2.5})


def test_a_run_the_slot_lost_runs_again_and_a_rerun_replays_the_same_sweep(tmp_path, local_types, monkeypatch):
    """A node's death or a deadline is the slot's loss: the run is kept (infrastructure) and measured again,
    never the configuration's failure; the same command then replays every run, measuring nothing."""
    lost = []
    original = WarmSlot.measure

    def measure(self, flags, arm, position, context, *, workload=None):
        record = original(self, flags, arm, position, context, workload=workload)
        if len(lost) < 2 and context.get("search_stage") == "bisect" and self.name == "local-B":
            lost.append(position)
            return {**record, "status": "failed", "reason": "node died", "infrastructure": True}
        return record

    monkeypatch.setattr(WarmSlot, "measure", measure)
    code, said = run(tmp_path, "cost.prices={A: 1.0, B: 2.5}")
    assert code == 0 and len(lost) == 2, said
    assert said.count("the slot lost the run") == 2
    records = read_records(tmp_path / "g" / "replicates.jsonl")
    assert sum(bool(r.get("infrastructure")) for r in records) == 2
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert not any(s["status"] == "failed" for s in summary["screen"])
    code, again = run(tmp_path, "cost.prices={A: 1.0, B: 2.5}")
    assert code == 0 and len(read_records(tmp_path / "g" / "replicates.jsonl")) == len(records), again
    assert json.loads((tmp_path / "g" / "summary.json").read_text())["winner"] == summary["winner"]


def test_each_type_needs_a_node_with_room_for_a_whole_slot_and_a_runs_deadline_follows_its_rate():
    shape = SlotShape(2, 2.0, 1.0, "one slot per priced GPU type")
    nodes = [{"Alive": True, "Resources": {"CPU": 8, "GPU": 2, "accelerator_type:A100": 1}},
             {"Alive": True, "Resources": {"CPU": 8, "GPU": 1, "accelerator_type:L4": 1}},
             {"Alive": False, "Resources": {"CPU": 8, "GPU": 4, "accelerator_type:L4": 1}}]
    check_room(["A100"], nodes, shape)
    with pytest.raises(ClusterError, match="no node of GPU type.s. L4 has room for a slot of 2 GPUs"):
        check_room(["A100", "L4"], nodes, shape)
    # a run's deadline history is its slot's, flags' and rate's: a fast type's short runs do not bound a slow one's
    fast, slow = (Job(slot, {"max_num_seqs": 8}, "candidate", 0, {}, {"rate": 4.0}) for slot in (0, 1))
    assert took_key(fast) != took_key(slow) != took_key(Job(1, {"max_num_seqs": 8}, "candidate", 0, {}, {"rate": 8.0}))
    assert took_key(Job(0, {"max_num_seqs": 8}, "candidate", 0, {})) == took_key(Job(1, {"max_num_seqs": 8}, "b", 1, {}))
