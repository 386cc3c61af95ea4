from __future__ import annotations

import json

import pytest

from throttle_sweep.errors import ConfigError, RecordError
from throttle_sweep.measurement.cost import Price, usd_per_mtok
from throttle_sweep.store.records import SCHEMA_VERSION, RecordLog, append_record, read_records


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
    path.write_text(path.read_text() + "\n" + json.dumps(rec(2)) + "\n")  # a bad line with a newline is damage
    with pytest.raises(RecordError, match=":2: not valid JSON"):
        read_records(path)


def test_a_torn_line_is_judged_by_its_missing_newline_even_when_it_ends_in_a_brace(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(0))
    with open(path, "a") as handle:
        handle.write('{"schema_version": "1.0", "flags": {"max_num_seqs": 1}')  # cut right after a nested '}'
    assert [r["record_id"] for r in read_records(path)] == ["r0"]


def test_opening_the_log_repairs_a_torn_tail_so_later_appends_stay_readable(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, rec(0))
    torn = '{"schema_version": "1.0", "record_id": "r1", "fla'
    with open(path, "a") as handle:
        handle.write(torn)
    said = []
    log = RecordLog(path, say=said.append)
    assert [r["record_id"] for r in log.records] == ["r0"]
    assert len(said) == 1 and "torn" in said[0] and str(path) in said[0]
    kept = list(tmp_path.glob("r.jsonl.torn-*"))
    assert len(kept) == 1 and kept[0].read_text() == torn  # cut out, not thrown away
    log.append(rec(1))
    log.append(rec(2))
    assert [r["record_id"] for r in read_records(path)] == ["r0", "r1", "r2"]
    assert [r["record_id"] for r in log.records] == ["r0", "r1", "r2"]
    assert RecordLog(path, say=said.append).records == log.records and len(said) == 1  # nothing more to repair


def test_a_log_on_a_new_file_starts_empty(tmp_path):
    log = RecordLog(tmp_path / "new" / "r.jsonl", say=pytest.fail)
    assert log.records == []
    log.append(rec(0))
    assert read_records(tmp_path / "new" / "r.jsonl")[0]["record_id"] == "r0"


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
