from __future__ import annotations

import json

import pytest

from throttle_sweep.cost import Price, usd_per_mtok
from throttle_sweep.errors import ConfigError, RecordError
from throttle_sweep.records import SCHEMA_VERSION, append_record, read_records


def rec(i, **extra):
    return {"schema_version": SCHEMA_VERSION, "record_id": f"r{i}", "run_id": "x", "arm": "baseline",
            "flags": {"max_num_seqs": 1}, "position": i, "status": "ok", **extra}


def test_round_trip_appends(tmp_path):
    path = tmp_path / "run" / "replicates.jsonl"
    for i in range(3):
        append_record(path, rec(i))
    assert [r["position"] for r in read_records(path)] == [0, 1, 2]


def test_unknown_major_version_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(0, schema_version="2.0"))
    with pytest.raises(RecordError, match=r"r.jsonl:1: schema_version '2.0' is not readable"):
        read_records(path)


def test_newer_minor_version_is_read(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(0, schema_version="1.7"))
    assert len(read_records(path)) == 1


def test_torn_last_line_is_skipped_but_corruption_inside_is_not(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(0))
    with open(path, "a") as handle:
        handle.write('{"schema_version": "1.0", "rec')  # the process died mid-write
    assert len(read_records(path)) == 1
    append_record(path, rec(1))
    with pytest.raises(RecordError, match=":2: not valid JSON"):
        read_records(path)


def test_missing_fields_are_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"schema_version": "1.0", "arm": "baseline"}) + "\n")
    with pytest.raises(RecordError, match="record_id, run_id, flags, position, status"):
        read_records(path)


def test_cost_formula_matches_the_published_example():
    # $1.39/h, and a run that makes 1e6 tokens in 1937 s costs $0.748 per million.
    assert usd_per_mtok(Price(1.39, 1), 1937.0, 1_000_000) == pytest.approx(0.748, abs=5e-4)
    assert usd_per_mtok(Price(2.0, 4), 3600.0, 2_000_000) == pytest.approx(4.0)
    assert usd_per_mtok(Price(), 10.0, 0) is None


@pytest.mark.parametrize("price, key", [(Price(0.0, 1), "usd_per_gpu_hour"), (Price(-1, 1), "usd_per_gpu_hour"),
                                        (Price(1.0, 0), "gpus")])
def test_bad_price(price, key):
    with pytest.raises(ConfigError, match=f"cost.{key}"):
        price.check()
