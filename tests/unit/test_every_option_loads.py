"""Every shipped config option, composed with every mode's loader: it loads, or it is refused with the tool's
own error (ThrottleSweepError, a line that names what is wrong). A loader that crashes on an option a user
can pick (a KeyError, a TypeError) fails here, before a user meets it. Each mode also loads its complete
default: a test that cannot pass by refusing everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.settings.analyze import load_analyze
from throttle_sweep.settings.capacity import load_capacity
from throttle_sweep.settings.compare import load_compare
from throttle_sweep.settings.export import load_export
from throttle_sweep.settings.goodput import load_goodput
from throttle_sweep.settings.plan import load_plan
from throttle_sweep.settings.recheck import load_recheck
from throttle_sweep.settings.schema import CONF_DIR
from throttle_sweep.settings.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]
SLO = ("slo.p95_ttft_s=1.0", "slo.p95_tpot_s=0.1", "workload.num_requests=64")
# each mode's loader, and what it needs to load on the embedded default
MODES = {
    "compare": (load_compare, ("mode=compare",)),
    "sweep": (load_sweep, ("mode=sweep", "+space=batching")),
    "goodput": (load_goodput, ("mode=sweep", "study.objective=goodput", "+space=batching", *SLO)),
    "capacity": (load_capacity, ("mode=capacity", *SLO)),
    "analyze": (load_analyze, ("mode=analyze",)),
    "export": (load_export, ("mode=export", "study.name=none_here")),
    "recheck": (load_recheck, ("mode=recheck", "study.name=none_here")),
    "plan": (load_plan, ("mode=plan", "study.name=none_here", f"plan.demand={ROOT / 'examples/demand-day.csv'}")),
}
NEEDS_A_STUDY = {"analyze", "export", "recheck", "plan"}  # their default refuses: nothing was measured yet


def options() -> list[tuple[str, ...]]:
    """Every option of every config group, as the overrides that choose it."""
    conf = Path(CONF_DIR)
    chosen = [(f"engine={p.stem}",) for p in sorted((conf / "engine").glob("*.yaml"))]
    for p in sorted((conf / "workload").glob("*.yaml")):
        extra = (f"workload.trace={ROOT / 'examples/mooncake-synthetic.jsonl'}",) if p.stem == "trace" else ()
        chosen.append((f"workload={p.stem}", *extra))
    for group in ("space", "experiment"):
        chosen += [(f"+{group}={p.stem}",) for p in sorted((conf / group).glob("*.yaml"))]
    return chosen


def load(mode: str, backend: str, extra: tuple[str, ...], tmp_path: Path) -> str:
    loader, needs = MODES[mode]
    overrides = [f"backend={backend}", *needs, *extra]
    if any(o.startswith("+space=") for o in extra):  # one space at a time: the option's
        overrides = [o for o in overrides if not o.startswith("+space=")] + [o for o in extra if o.startswith("+space=")]
    try:
        loader(compose_cfg(*overrides, tmp_path=tmp_path))
    except ThrottleSweepError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip().splitlines()[0], exc
        return f"refused: {exc}"
    return "loaded"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_loads_its_complete_default(mode, tmp_path):
    told = load(mode, "fake", (), tmp_path)
    if mode in NEEDS_A_STUDY:
        assert told.startswith("refused:") and ("none_here" in told or "input=" in told), told
    else:
        assert told == "loaded", told


@pytest.mark.exhaustive
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_option_loads_or_is_refused_by_name(mode, tmp_path):
    """Each option on the fake engine, and each engine option on every backend (the backend decides which
    engine checks run: vLLM's flags, the twin's GPU, a server's or endpoint's settings)."""
    outcomes = {("fake", *extra): load(mode, "fake", extra, tmp_path) for extra in options()}
    for backend in ("vllm", "twin", "server", "endpoint"):
        for extra in (o for o in options() if o[0].startswith("engine=")):
            outcomes[(backend, *extra)] = load(mode, backend, extra, tmp_path)
    assert len(outcomes) >= 15
    if mode in ("compare", "capacity"):
        assert outcomes[("vllm", "engine=tiny_cpu")] == "loaded", outcomes[("vllm", "engine=tiny_cpu")]


def test_a_shipped_space_is_named_as_the_package_names_it_not_by_where_it_is_installed(tmp_path):
    from throttle_sweep.settings.sweep import space_file

    compose_cfg("mode=sweep", "+space=batching", tmp_path=tmp_path)
    assert space_file("batching") == "throttle_sweep/conf/space/batching.yaml"
