"""The package's layout holds its shape: few modules at the top, and engines/ the bottom layer (it imports
nothing of throttle_sweep above it, so any engine can be used and tested alone)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "throttle_sweep"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] == "throttle_sweep"}


def test_the_top_of_the_package_holds_at_most_five_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 5, top


def test_engines_import_nothing_above_them():
    allowed = ("throttle_sweep.engines", "throttle_sweep.errors", "throttle_sweep.models")
    above = {}
    for path in sorted((PACKAGE / "engines").rglob("*.py")):
        wrong = sorted(m for m in imported_modules(path)
                       if not m.startswith(allowed) and m != "throttle_sweep")
        if wrong:
            above[str(path.relative_to(PACKAGE))] = wrong
    assert not above, above


def test_every_package_says_what_it_holds():
    bare = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py")
            if "conf" not in p.parts and "models" not in p.parts and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not bare, bare


def test_every_test_file_has_a_name_of_its_own():
    """Test folders are not packages: two test files of one name in one pytest run fail its collection."""
    tests = PACKAGE.parent / "tests"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
