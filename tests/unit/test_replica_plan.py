"""mode=plan (#48 item 2): the replicas a day of demand needs, read from a finished capacity study or goodput
sweep: the arithmetic, the interval's lower bound (sure) and censored capacities, GPU types, and bad input
refused by name. The studies' summary.json files are written by the code that writes them in a real study
(capacity/report.summary, sweep/goodput/report.costed_summary), so their keys are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.capacity.knee import Knee
from throttle_sweep.capacity.rates import ALWAYS_MET, FOUND
from throttle_sweep.capacity.report import summary as capacity_summary
from throttle_sweep.capacity.slo import Slo
from throttle_sweep.commands import plan as plan_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.replica_plan.day import plan_day, totals
from throttle_sweep.replica_plan.demand import Bucket, read_demand
from throttle_sweep.replica_plan.studied import Served
from throttle_sweep.sweep.goodput.pick import Costed
from throttle_sweep.sweep.goodput.report import costed_summary

ROOT = Path(__file__).resolve().parents[2]
SLO = Slo(0.5, 0.1, 0.9)


TWO_GPUS = Price(2.0, 2)  # $2 a GPU-hour, 2 GPUs a replica


def capacity_study(folder: Path, rate: float | None, low: float | None, high: float | None,
                   price: Price = TWO_GPUS, status: str = FOUND) -> Path:
    """A capacity study's summary.json as mode=capacity writes it."""
    search = SimpleNamespace(status=status, runs=[1] * 8, low=low, high=high, best=lambda: None)
    knee = Knee(rate, low, high, ()) if status == FOUND else None
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(capacity_summary(search, knee, [], SLO, price)))
    return folder


def costed(label: str, rate: float | None, low: float | None, high: float | None, price: Price,
           params: dict | None = None, above: bool = False) -> Costed:
    levels = () if not above else (SimpleNamespace(rate=rate),)
    return Costed(label, params or {"max_num_seqs": 6}, price, Knee(None if above else rate, low, high, levels,
                                                                     above=above), 64.0, 0.9)


def goodput_study(folder: Path, winner: Costed | None, *, cheapest: Costed | None = None,
                  types: dict[str, Costed] | None = None) -> Path:
    """A goodput sweep's summary.json as sweep/goodput/report.answer writes it (the parts mode=plan reads)."""
    entries = [c for c in (winner, cheapest, *(types or {}).values()) if c is not None]
    summary: dict = {"slo": vars(SLO), "target_rps": 50.0, "price": "at an assumed $1.39/GPU-hour x 1 GPU",
                     "screen": [], "confirmed": [costed_summary(c, 50.0) for c in entries],
                     "winner": None if winner is None else {**costed_summary(winner, 50.0), "tied": [],
                                                            "cheaper_than_baseline": True}}
    if cheapest is not None:
        summary["cheapest_not_shown"] = costed_summary(cheapest, 50.0)
    if types:
        summary["gpu_types"] = {t: {"usd_per_gpu_hour": c.price.usd_per_gpu_hour, "cheapest": costed_summary(c, 50.0)}
                                for t, c in types.items()}
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def demand_csv(path: Path, rows: list[tuple[float, float]], header: str = "start_s,requests_per_s") -> Path:
    path.write_text("# a test curve\n" + header + "\n" + "".join(f"{s:g},{r:g}\n" for s, r in rows))
    return path


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    console = Console(record=True, width=250)
    code = plan_cmd.run(compose_cfg("mode=plan", *args, tmp_path=tmp_path), console)
    return code, console.export_text()


HOURLY = [(0, 10), (3600, 22), (7200, 0)]


def test_replicas_per_bucket_from_the_estimate_and_the_lower_bound_and_the_days_cost(tmp_path):
    """12 req/s a replica [10, 15], 2 GPUs at $2: 10, 22 and 0 req/s need 1, 2, 0 at the estimate and 1, 3, 0 at
    the lower bound; the peak's 2 all day cost 12 GPU-hours against the plan's 6."""
    capacity_study(tmp_path / "cap", 12.0, 10.0, 15.0)
    code, said = run(tmp_path, "study.name=cap", f"plan.demand={demand_csv(tmp_path / 'd.csv', HOURLY)}", "plots=false")
    assert code == 0, said
    plan = json.loads((tmp_path / "cap" / "plan.json").read_text())
    assert [b["replicas"] for b in plan["buckets"]] == [1, 2, 0]
    assert [b["replicas_sure"] for b in plan["buckets"]] == [1, 3, 0]
    assert [b["duration_s"] for b in plan["buckets"]] == [3600, 3600, 3600]  # the last as long as the one before
    t = plan["totals"]
    assert t["estimate"]["gpu_hours"] == pytest.approx(6) and t["estimate"]["usd"] == pytest.approx(12)
    assert t["sure"]["gpu_hours"] == pytest.approx(8) and t["sure"]["usd"] == pytest.approx(16)
    assert t["estimate"]["peak_replicas"] == 2 and t["estimate"]["peak_all_day"]["usd"] == pytest.approx(24)
    assert t["estimate"]["not_autoscaling_usd"] == pytest.approx(12)
    assert t["sure"]["peak_all_day"]["usd"] == pytest.approx(36)  # 3 replicas x 2 GPUs x 3 h x $2
    assert t["mean_rps"] == pytest.approx(32 / 3) and t["average_demand_replicas"] == 1
    assert "6 GPU-hours, $12.00" in said and "16.00" in said and "12 GPU-hours, $24.00, $12.00 more" in said
    assert not (tmp_path / "cap" / "plan.png").exists()


def test_an_open_lower_bound_gives_no_sure_count_and_says_so():
    plan = plan_day([Bucket(0, 3600, 30.0)], Served("trial 1", 20.0, None, 25.0, 1, 1.0))
    assert plan.rows[0].replicas == 2 and plan.rows[0].sure is None
    assert plan.sure() is None and totals(plan)["sure"] is None


def test_a_censored_capacity_plans_its_sure_count_from_the_lower_bound_and_says_the_estimate_is_a_bound(tmp_path):
    goodput_study(tmp_path / "g", costed("trial 2", 40.0, 40.0, None, Price(1.0, 1), above=True))
    code, said = run(tmp_path, "study.name=g", f"plan.demand={demand_csv(tmp_path / 'd.csv', [(0, 100), (1800, 30)])}",
                     "plots=false")
    assert code == 0, said
    plan = json.loads((tmp_path / "g" / "plan.json").read_text())
    assert plan["capacity_at_least"] is True
    assert [b["replicas"] for b in plan["buckets"]] == [3, 1] == [b["replicas_sure"] for b in plan["buckets"]]
    assert "capacity at least 40 req/s" in said and "at most what the demand needs" in said
    assert plan["totals"]["hours"] == pytest.approx(1.0)  # half-hour rows: the last as long as the one before


def test_a_sweep_without_a_winner_plans_its_cheapest_estimate_and_says_so(tmp_path):
    goodput_study(tmp_path / "g", None, cheapest=costed("trial 1", 69.5, None, 78.6, Price(1.39, 1)))
    code, said = run(tmp_path, "study.name=g", f"plan.demand={demand_csv(tmp_path / 'd.csv', HOURLY)}", "plots=false")
    assert code == 0, said
    assert "no winner" in said and "cheapest estimate, trial 1" in said and "no replica count is sure" in said
    plan = json.loads((tmp_path / "g" / "plan.json").read_text())
    assert plan["config"] == "trial 1" and plan["totals"]["sure"] is None
    assert plan["totals"]["estimate"]["usd"] == pytest.approx(2 * 1.39)  # 1 + 1 + 0 replica-hours


def test_with_no_winner_nor_estimate_the_cheapest_confirmed_capacity_is_planned_or_the_one_named(tmp_path):
    """A sweep whose candidates' confirmations found no capacity (winner null): the baseline's is the one there."""
    base = costed("baseline", 3.4, None, 29.1, Price(1.39, 1), {"max_num_seqs": 1})
    lost = costed("trial 1", None, None, 45.7, Price(1.39, 1))
    goodput_study(tmp_path / "g", None, types=None)
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    summary["confirmed"] = [costed_summary(base, 50.0), costed_summary(lost, 50.0)]
    (tmp_path / "g" / "summary.json").write_text(json.dumps(summary))
    demand = demand_csv(tmp_path / "d.csv", HOURLY)
    code, said = run(tmp_path, "study.name=g", f"plan.demand={demand}", "plots=false")
    assert code == 0, said
    assert "no winner" in said and "the cheapest confirmed configuration with a capacity, baseline" in said
    assert [b["replicas"] for b in json.loads((tmp_path / "g" / "plan.json").read_text())["buckets"]] == [3, 7, 0]
    code, said = run(tmp_path, "study.name=g", f"plan.demand={demand}", "plan.config=baseline", "plots=false")
    assert code == 0 and "chosen by plan.config" in said
    for label, words in (("trial 1", "plan.config='trial 1': its confirmation found no capacity"),
                         ("trial 9", "plan.config='trial 9': study 'g' confirmed no such configuration; it confirmed: "
                                     "baseline, trial 1")):
        with pytest.raises(ConfigError) as err:
            run(tmp_path, "study.name=g", f"plan.demand={demand}", f"plan.config={label}")
        assert words in str(err.value)
    capacity_study(tmp_path / "cap", 12.0, 10.0, 15.0)
    with pytest.raises(ConfigError, match="plan.config='baseline': a capacity study measured one configuration"):
        run(tmp_path, "study.name=cap", f"plan.demand={demand}", "plan.config=baseline")


def test_each_gpu_type_is_planned_at_its_own_capacity_and_price(tmp_path):
    a = costed("trial 0", 20.0, 18.0, 22.0, Price(1.0, 1), {"gpu_type": "A", "max_num_seqs": 6})
    b = costed("trial 1", 50.0, 45.0, 55.0, Price(3.0, 1), {"gpu_type": "B", "max_num_seqs": 7})
    goodput_study(tmp_path / "g", a, types={"A": a, "B": b})
    code, said = run(tmp_path, "study.name=g", f"plan.demand={demand_csv(tmp_path / 'd.csv', HOURLY)}", "plots=false")
    assert code == 0, said
    types = json.loads((tmp_path / "g" / "plan.json").read_text())["gpu_types"]
    assert types["A"]["estimate"]["usd"] == pytest.approx((1 + 2 + 0) * 1.0)  # 10, 22, 0 req/s at 20 a replica
    assert types["B"]["estimate"]["usd"] == pytest.approx((1 + 1 + 0) * 3.0)
    assert types["B"]["sure"]["peak_all_day"]["usd"] == pytest.approx(1 * 3 * 3.0)
    assert "  A: trial 0" in said and "  B: trial 1" in said


def test_a_trace_is_counted_in_buckets_of_plan_bucket_s():
    buckets = read_demand(str(ROOT / "examples" / "mooncake-synthetic.jsonl"), 5.0)
    assert sum(b.rps * b.duration_s for b in buckets) == pytest.approx(50)  # its 50 requests over 15.7 s
    assert [b.start_s for b in buckets] == [0, 5, 10, 15] and {b.duration_s for b in buckets} == {5.0}


def test_a_csv_trace_is_bucketed_and_a_demand_csvs_last_row_lasts_plan_bucket_s(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{t},10,10\n" for t in (0, 1, 2, 65, 70)))
    assert [(b.start_s, b.rps) for b in read_demand(str(trace), 60.0)] == [(0, 3 / 60), (60, 2 / 60)]
    curve = read_demand(str(demand_csv(tmp_path / "d.csv", HOURLY)), 600.0)
    assert [b.duration_s for b in curve] == [3600, 3600, 600]


def test_the_shipped_day_has_24_hourly_rows_with_a_daytime_peak():
    buckets = read_demand(str(ROOT / "examples" / "demand-day.csv"))
    assert len(buckets) == 24 and {b.duration_s for b in buckets} == {3600.0}
    peak = max(buckets, key=lambda b: b.rps)
    assert 8 <= peak.start_s / 3600 <= 18 and peak.rps > 4 * min(b.rps for b in buckets)


@pytest.mark.parametrize(("text", "words"), [
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("start_s,requests_per_s\n", "a header and no rows"),
    ("start,rps\n0,1\n", "missing: start_s, requests_per_s"),
    ("start_s,requests_per_s\n0,1\n3600,lots\n", "d.csv:3: requests_per_s must be a number, but got 'lots'"),
    ("start_s,requests_per_s\n0,1\n3600,-2\n", "d.csv:3: requests_per_s must be a rate >= 0 (requests/s), but got -2"),
    ("start_s,requests_per_s\n0,1\n3600,2\n3600,3\n", "d.csv:4: start_s 3600 is not after line 3's 3600"),
    ("start_s,requests_per_s\n0,1\n3600\n", "d.csv:3: 1 field(s) where the header has 2: no requests_per_s"),
    ("start_s,requests_per_s\n0,nan\n", "d.csv:2: requests_per_s must be a rate >= 0"),
])
def test_a_bad_demand_file_is_refused_naming_the_line_and_what_is_wrong(tmp_path, text, words):
    capacity_study(tmp_path / "cap", 12.0, 10.0, 15.0)
    (tmp_path / "d.csv").write_text(text)
    with pytest.raises(ConfigError) as err:
        run(tmp_path, "study.name=cap", f"plan.demand={tmp_path / 'd.csv'}")
    assert words in str(err.value)
    assert not (tmp_path / "cap" / "plan.json").exists()


def test_bad_studies_and_keys_are_refused_by_name_before_any_work(tmp_path):
    demand = demand_csv(tmp_path / "d.csv", HOURLY)
    cases = {"no study.name": (("plan.demand=x",), "mode=plan needs study.name=NAME"),
             "no demand": (("study.name=cap",), "mode=plan needs plan.demand=PATH"),
             "no such study": (("study.name=nope", f"plan.demand={demand}"), "no such study"),
             "no demand file": (("study.name=cap", "plan.demand=missing.csv"), "plan.demand: cannot read 'missing.csv'"),
             "bad bucket": (("study.name=cap", f"plan.demand={demand}", "plan.bucket_s=-1"),
                            "plan.bucket_s must be a positive number")}
    capacity_study(tmp_path / "cap", 12.0, 10.0, 15.0)
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "study.db").write_text("")
    cases["cost sweep"] = (("study.name=sweep", f"plan.demand={demand}"), "is a cost sweep")
    (tmp_path / "elsewhere").mkdir()  # a cost sweep whose study lives in another storage: its config.yaml says
    (tmp_path / "elsewhere" / "config.yaml").write_text("space: {max_num_seqs: {}}\nstudy: {objective: cost}\n")
    cases["cost sweep, its study elsewhere"] = (("study.name=elsewhere", f"plan.demand={demand}"), "is a cost sweep")
    (tmp_path / "going").mkdir()
    (tmp_path / "going" / "config.yaml").write_text("mode: capacity\n")
    cases["unfinished"] = (("study.name=going", f"plan.demand={demand}"), "has no summary.json: the study has not "
                                                                          "finished")
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "summary.json").write_text(json.dumps({"ratio": 0.3, "ci": [0.2, 0.4], "verdict": "CHEAPER"}))
    cases["a comparison"] = (("study.name=cmp", f"plan.demand={demand}"), "is not a capacity or goodput study")
    capacity_study(tmp_path / "none", None, None, None)
    cases["no capacity"] = (("study.name=none", f"plan.demand={demand}"), "has no confirmed capacity (its knee")
    capacity_study(tmp_path / "above", None, 100.0, None, status=ALWAYS_MET)
    cases["always met"] = (("study.name=above", f"plan.demand={demand}"), "its SLO held up to capacity.max_rate")
    goodput_study(tmp_path / "g", None)
    cases["no winner"] = (("study.name=g", f"plan.demand={demand}"), "has no confirmed capacity")
    for name, (args, words) in cases.items():
        with pytest.raises(ConfigError) as err:
            run(tmp_path, *args)
        assert words in str(err.value), name
