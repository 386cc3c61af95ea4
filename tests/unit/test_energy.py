"""Energy per token from NVML's energy counter, on a fake NVML whose counters follow the fake engine's clock."""

from __future__ import annotations

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement import energy
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.energy import NO_NVML, Meter, energy_note, meter_for, open_meter
from throttle_sweep.measurement.replicate import measure_on, one_line
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.settings.sections import price_from

# 20 requests, 8 at a time: the last 4 run with the engine part-full, so the steady window ends before the run
SPEC = WorkloadSpec(num_requests=20, prompt_len=16, output_len=16, concurrency=8, warmup_requests=0)
FLAGS = {"max_num_seqs": 8}


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - NVML's own name
    pass


class FakeNVML:
    """The NVML calls energy.py makes: each GPU draws its own constant power on `clock` (the engine's)."""

    NVMLError, NVMLError_NotSupported = NVMLError, NVMLError_NotSupported

    def __init__(self, watts: list[float], clock=lambda: 0.0, supported: bool = True) -> None:
        self.watts, self.clock, self.supported = watts, clock, supported
        self.reads = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.watts):
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return int(uuid.removeprefix("GPU-"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if not self.supported:
            raise NVMLError_NotSupported("Not Supported")
        self.reads += 1
        return round(1e6 + self.watts[handle] * self.clock() * 1000)  # millijoules, from some origin


def measured(price=None, energy_for=None, flags=FLAGS, **knobs):
    """One replicate on the fake engine, with the meter `energy_for(session)` gives."""
    session = FakeEngine(FakeKnobs(**knobs)).start(flags)
    return measure_on(session, flags, SPEC, price or Price(), {}, energy=energy_for(session) if energy_for else None)


def two_gpus(session, watts=(300.0, 200.0)):
    return open_meter(2, nvml=lambda: FakeNVML(list(watts), clock=session.now), env={})


def test_joules_per_output_token_come_from_the_counters_over_the_steady_window_summed_over_the_gpus():
    record = measured(energy_for=two_gpus)
    steady = record["steady"]
    assert record["status"] == "ok" and 0 < steady["drain_share"] < 1  # the window ends before the run does
    assert steady["energy_j"] == pytest.approx(500.0 * steady["window_s"], rel=1e-6)  # 300 W + 200 W
    assert steady["j_per_output_token"] == pytest.approx(steady["energy_j"] / steady["output_tokens"])
    assert record["energy_j"] == pytest.approx(500.0 * record["wall_s"], rel=1e-6)
    assert record["j_per_output_token"] == pytest.approx(record["energy_j"] / record["output_tokens"])
    assert "energy_off" not in record


def test_the_engines_gpus_are_the_ones_this_process_sees():
    nvml = FakeNVML([100.0, 0.0, 0.0, 400.0], clock=lambda: 1.0)
    meter = open_meter(2, nvml=lambda: nvml, env={"CUDA_VISIBLE_DEVICES": "3,GPU-0"})
    assert isinstance(meter, Meter) and meter.joules() == pytest.approx(2e3 + 500.0)  # GPUs 3 and 0, not 0 and 1
    assert "sees 1" in open_meter(2, nvml=lambda: nvml, env={"CUDA_VISIBLE_DEVICES": "2"})


def test_without_nvml_energy_is_off_and_said_once_for_the_whole_run():
    def missing():
        raise ImportError("No module named 'pynvml'")

    assert open_meter(1, nvml=missing) == NO_NVML
    records = [measured(energy_for=lambda s: NO_NVML) for _ in range(3)]
    assert all(r["status"] == "ok" and "energy_j" not in r and "energy_j" not in r["steady"] for r in records)
    assert energy_note(records) == "energy: not measured (no NVIDIA GPU / NVML)"
    assert "J/" not in one_line(records[0], Price())


def test_a_gpu_without_the_counter_turns_energy_off_once_per_process(monkeypatch):
    monkeypatch.setattr(energy, "_meters", {})
    opened = []

    def opener(gpus):
        opened.append(gpus)
        return open_meter(gpus, nvml=lambda: FakeNVML([300.0], supported=False), env={})

    reasons = [meter_for("vllm", FLAGS, opener=opener) for _ in range(3)]
    assert opened == [1] and reasons[0] == reasons[2] and "not supported" in reasons[0]
    records = [measured(energy_for=lambda s: reasons[0]) for _ in range(2)]
    assert [r["energy_off"] for r in records] == [reasons[0]] * 2 and records[0]["status"] == "ok"
    assert energy_note(records) == f"energy: not measured ({reasons[0]})"
    assert meter_for("fake", FLAGS, opener=opener) is None and meter_for("twin", FLAGS, opener=opener) is None


def test_a_price_of_energy_adds_exactly_the_energy_the_window_used():
    plain = measured(Price(2.0, 1), energy_for=two_gpus)
    priced = measured(Price(2.0, 1, usd_per_kwh=0.15), energy_for=two_gpus)
    for r in (plain, priced):
        assert r["status"] == "ok"
    s, p = plain["steady"], priced["steady"]
    assert s["window_s"] == p["window_s"] and s["energy_j"] == pytest.approx(p["energy_j"])  # the virtual clock
    energy_usd_per_mtok = p["energy_j"] / 3.6e6 * 0.15 / (p["output_tokens"] / 1e6)
    assert p["usd_per_mtok"] == pytest.approx(s["usd_per_mtok"] + energy_usd_per_mtok, rel=1e-12)
    assert p["usd_per_mtok"] == pytest.approx(
        (2.0 * p["window_s"] / 3600 + p["energy_j"] / 3.6e6 * 0.15) / (p["output_tokens"] / 1e6))
    assert priced["usd_per_mtok"] == pytest.approx(
        (2.0 * priced["wall_s"] / 3600 + priced["energy_j"] / 3.6e6 * 0.15) / (priced["output_tokens"] / 1e6))
    line = one_line(priced, Price(2.0, 1, usd_per_kwh=0.15))
    assert "plus the measured energy at $0.15/kWh" in line
    assert f"{p['j_per_output_token']:.3g} J/output token" in line


def test_a_price_of_energy_with_no_reading_fails_the_replicate_rather_than_price_it_without():
    record = measured(Price(2.0, 1, usd_per_kwh=0.15), energy_for=lambda s: NO_NVML)
    assert record["status"] == "failed" and "cost.usd_per_kwh=0.15" in record["reason"]
    assert NO_NVML in record["reason"]


def test_usd_per_kwh_without_an_energy_counter_is_refused_before_any_engine_starts(monkeypatch, tmp_path):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(energy, "load_nvml", missing)
    cfg = compose_cfg("backend=vllm", "cost.usd_per_kwh=0.12", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=r"cost\.usd_per_kwh=0\.12 .*no energy counter.*no NVIDIA GPU / NVML"):
        price_from(cfg)
    with pytest.raises(ConfigError, match=r"cost\.usd_per_kwh"):
        measure_cmd.run(cfg, None)
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
    for backend in ("fake", "twin", "endpoint"):
        with pytest.raises(ConfigError, match=rf"cost\.usd_per_kwh=0\.12 .*backend={backend}"):
            price_from(compose_cfg(f"backend={backend}", "cost.usd_per_kwh=0.12"))
    for mode in (["mode=capacity"], ["mode=sweep", "study.objective=goodput"]):
        with pytest.raises(ConfigError, match=r"cost\.usd_per_kwh=0\.12 .*prices capacity at a request rate"):
            price_from(compose_cfg("backend=vllm", *mode, "cost.usd_per_kwh=0.12"))
    # on Ray the slots' GPUs are not this machine's: each replicate is checked where it runs
    assert price_from(compose_cfg("backend=vllm", "ray.enabled=true", "cost.usd_per_kwh=0.12")).usd_per_kwh == 0.12
    with pytest.raises(ConfigError, match=r"cost\.usd_per_kwh must be > 0"):
        price_from(compose_cfg("backend=fake", "cost.usd_per_kwh=-1"))
    assert price_from(compose_cfg("backend=fake")).usd_per_kwh is None


def test_compare_and_sweep_show_joules_per_token_beside_the_cost_and_say_the_price_includes_energy(tmp_path):
    import optuna

    from throttle_sweep.report.comparison import lines as compare_lines
    from throttle_sweep.report.comparison import write
    from throttle_sweep.stats.analysis import analyse
    from throttle_sweep.stats.verdict import Thresholds
    from throttle_sweep.sweep.driver import SweepResult
    from throttle_sweep.sweep.options import SweepSettings
    from throttle_sweep.sweep.report import lines as sweep_lines
    from throttle_sweep.sweep.trials import trial_summary

    price = Price(2.0, 1, usd_per_kwh=0.15)
    records = []
    for position, arm in enumerate(["baseline", "candidate", "candidate", "baseline"] * 2):
        flags = {"max_num_seqs": 8 if arm == "baseline" else 4}
        watts = (300.0 if arm == "baseline" else 100.0, 0.0)
        record = measured(price, energy_for=lambda s, w=watts: two_gpus(s, w), flags=flags, noise_sd=0.02,
                          seed=position)
        records.append({**record, "arm": arm, "position": position, "flags": flags})
    analysis = analyse(records, Thresholds())
    joules = {arm: analysis.joules(arm) for arm in ("baseline", "candidate")}
    assert joules["baseline"] > joules["candidate"] > 0
    out = compare_lines(analysis, Thresholds(), price)
    assert f"(mean {joules['candidate']:.3g} J/output token)" in out[1]
    assert "plus the measured energy at $0.15/kWh" in "\n".join(out)
    summary_md = write(tmp_path, analysis, Thresholds(), price, plot=False)["md"].read_text()
    assert "| J/output token |" in summary_md

    attrs = trial_summary(analysis, SweepSettings(n_trials=1))
    assert attrs["j_per_output_token"] == pytest.approx(joules["candidate"])
    study = optuna.create_study()
    dist = {"max_num_seqs": optuna.distributions.IntDistribution(1, 8)}
    study.add_trial(optuna.trial.create_trial(params={"max_num_seqs": 4}, distributions=dist, values=[0.5],
                                              user_attrs={**attrs, "constraints": [0.0]}))
    table = sweep_lines(SweepResult(study, [], None, []), price, 0)
    assert "J/tok" in table[0] and f"{joules['candidate']:.3g}" in table[1]
    assert "plus the measured energy at $0.15/kWh" in "\n".join(table)
    assert "J/tok" not in sweep_lines(SweepResult(optuna.create_study(), [], None, []), Price(), 0)[0]


def test_a_slot_prices_its_replicates_energy_and_leaves_the_engines_unmeasured_warm_up_unpriced(monkeypatch):
    import itertools

    from throttle_sweep.cluster import host
    from throttle_sweep.cluster.slot import WarmSlot

    ticks = itertools.count()  # each reading one second on: 100 J a reading
    meter = open_meter(1, nvml=lambda: FakeNVML([100.0], clock=lambda: float(next(ticks))), env={})
    monkeypatch.setattr(host, "meter_for", lambda backend, flags: meter)
    slot = WarmSlot(FakeEngine(FakeKnobs()), SPEC, Price(2.0, 1, usd_per_kwh=0.15), run_id="t", environment={},
                    engine_warmup="first")
    try:
        record = slot.measure(FLAGS, "baseline", 0, {"stage": "search"})
    finally:
        slot.close()
    assert record["status"] == "ok" and record["engine_warmup_s"] > 0 and record["usd_per_kwh"] == 0.15
    assert record["energy_j"] == pytest.approx(200.0) and record["steady"]["energy_j"] == pytest.approx(100.0)
