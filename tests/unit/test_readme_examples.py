"""The examples of the README and the manual (docs/), read as a user runs them, page after page, in one
folder: no two of them measure into the same results folder with different configurations (the second
would be refused, or would mix runs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTING = ("mode", "backend", "engine.", "baseline.", "candidate.", "workload.", "+experiment", "+space", "~space",
           "space.", "cost.", "compare.")


def examples() -> list[list[str]]:
    """Every `$ python -m throttle_sweep ...` line of the pages, with its continuation lines."""
    lines, out, current = [line for page in PAGES for line in page.read_text().splitlines()], [], None
    for line in lines:
        text = line.strip()
        if current is not None:
            current += " " + text.rstrip("\\")
            if not text.endswith("\\"):
                out.append(current)
                current = None
            continue
        match = re.search(r"\$ (?:\S+=\S+ )*python -m throttle_sweep (.*)$", text)
        if match:
            current = match.group(1).rstrip("\\")
            if not text.endswith("\\"):
                out.append(current)
                current = None
    return [shlex.split(re.sub(r"\s+#.*$", "", cmd)) for cmd in out]


def folder(args: list[str]) -> str:
    keys = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith(("+space", "+experiment")))
    mode = keys.get("mode", "sweep" if any(a.startswith("+space=") for a in args) else "measure")
    if mode in ("sweep", "export"):
        space = next((a.split("=", 1)[1] for a in args if a.startswith("+space=")), "custom")
        return keys.get("study.name") or keys.get("run") or f"sweep-{space}"
    return keys.get("run", f"<new {mode} folder>")


def test_the_readme_has_examples_of_every_mode():
    found = {dict(a.split("=", 1) for a in args if a.startswith("mode=")).get("mode", "measure") for args in examples()}
    assert {"measure", "compare", "analyze", "export", "capacity", "plan"} <= found


def test_no_two_readme_examples_measure_into_one_folder_with_different_configurations():
    seen: dict[str, tuple[str, ...]] = {}
    for args in examples():
        if any(a in ("mode=analyze", "mode=export") for a in args):
            continue  # they read a folder, they measure nothing into it
        place = folder(args)
        if place.startswith("<new") or any(a.startswith(("ray.address=127.0.0.1:1", "study.storage=sqlite:////proc",
                                                         "results_dir=/proc")) for a in args):
            continue  # a new folder each time, or refused before a folder is used
        measured = tuple(sorted(a for a in args if a.startswith(SETTING)))
        assert seen.setdefault(place, measured) == measured, f"results/{place}: {seen[place]} and then {measured}"


def regenerator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("regenerate_examples", ROOT / "scripts" / "regenerate_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_that_runs_on_this_machine_alone_is_regenerated_not_typed():
    """An example of measure, compare or analyze on the embedded engine needs nothing but this checkout, so its
    output is written by running it (scripts/examples), never by hand: a shown output cannot go stale."""
    regen = regenerator()
    for page in PAGES:
        lines = page.read_text().splitlines()
        marked = {i for first, last in regen.blocks(lines) for i in range(first, last + 1)}
        for i, line in enumerate(lines):
            runs_alone = re.match(r"\$ python -m throttle_sweep mode=(measure|compare|analyze) ", line) and not re.search(
                r"backend=|results/demo|ray\.|results_dir=", line)
            if runs_alone:
                assert i in marked, f"{page.name}:{i + 1}: {line[:80]} is shown without its regenerated output"
        for first, last in regen.blocks(lines):
            assert regen.commands(lines[first:last + 1]), f"{page.name}:{first}: a marked block with no command"


def test_regenerated_output_collapses_progress_and_keeps_continued_commands_whole():
    regen = regenerator()
    body = ["$ python -m throttle_sweep mode=compare run=x \\", "    workload.num_requests=32", "old output",
            "$ echo hi", "hi"]
    assert regen.commands(body) == [body[:2], ["$ echo hi"]]
    printed = "compare ...\n\x1b[1mreplicate 1/8  elapsed 0s\x1b[0m\nreplicate 2/8  elapsed 5s\nverdict: CHEAPER\n"
    assert regen.shown(printed) == ["compare ...", "...", "verdict: CHEAPER"]
    estimated = "sweep ...\nreplicate 1/~93  elapsed 3s  ETA ?\nreplicate 2/~94  elapsed 46s\nprobes: done\n"
    assert regen.shown(estimated) == ["sweep ...", "...", "probes: done"]  # a count still estimated ('~') too


def test_an_excerpt_mark_keeps_the_first_and_last_lines_of_each_output():
    regen = regenerator()
    mark = regen.MARK.removesuffix(" -->") + "; shown: first 2 and last 1 lines -->"
    assert regen.blocks([mark, "```", "$ true", "```"]) == [(2, 2)]
    shape = regen.shape_of(mark)
    assert regen.excerpt([f"line {i}" for i in range(1, 8)], shape) == ["line 1", "line 2", "...", "line 7"]
    assert regen.excerpt(["a", "b", "c", "d"], shape) == ["a", "b", "c", "d"]  # nothing worth cutting
    assert regen.excerpt(["a", "b", "c", "d"], regen.shape_of(regen.MARK)) == ["a", "b", "c", "d"]


def test_a_mark_names_the_exit_statuses_an_example_may_end_with():
    regen = regenerator()
    assert regen.shape_of(regen.MARK).exits == {0}
    assert regen.shape_of(regen.MARK.removesuffix(" -->") + "; exit 0 or 1 -->").exits == {0, 1}
    try:
        regen.shape_of(regen.MARK.removesuffix(" -->") + "; shown: all -->")
    except SystemExit as error:
        assert "shown: all" in str(error)
    else:
        raise AssertionError("an unknown option of a mark was taken")


def test_each_block_is_written_back_as_it_is_done_so_a_later_failure_keeps_it(tmp_path):
    regen = regenerator()
    page = tmp_path / "page.md"
    page.write_text("\n".join([regen.MARK, "```", "$ echo one", "stale", "```", "text",
                               regen.MARK, "```", "$ echo two; exit 3", "stale", "```"]) + "\n")
    try:
        regen.regenerate(page)
    except SystemExit as error:
        assert "exit 3" in str(error)
    else:
        raise AssertionError("a failing example was taken as output")
    text = page.read_text().splitlines()
    assert text[2:5] == ["$ echo one", "one", "```"] and text[-3:] == ["$ echo two; exit 3", "stale", "```"]


def test_the_whole_output_of_an_excerpt_is_kept_where_asked(tmp_path, monkeypatch):
    regen = regenerator()
    log = tmp_path / "full.log"
    monkeypatch.setenv("EXAMPLES_FULL_OUTPUT", str(log))
    shape = regen.shape_of(regen.MARK.removesuffix(" -->") + "; shown: first 1 and last 1 lines -->")
    assert regen.run(["$ seq 5"], tmp_path, shape) == ["1", "...", "5"]
    assert log.read_text().splitlines() == ["$ seq 5", "1", "2", "3", "4", "5"]


def test_examples_named_to_skip_are_left_as_they_are(tmp_path):
    regen = regenerator()
    page = tmp_path / "page.md"
    page.write_text("\n".join([regen.MARK, "```", "$ echo slow", "old", "```",
                               regen.MARK, "```", "$ echo quick", "old", "```"]) + "\n")
    assert regen.main([str(page), "--skip", "slow"]) == 0
    assert page.read_text().splitlines() == [regen.MARK, "```", "$ echo slow", "old", "```",
                                             regen.MARK, "```", "$ echo quick", "quick", "```"]
