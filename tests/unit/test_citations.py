"""Every test file the package, the docs and the scripts cite exists: a reader sent to a test finds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITING = [*sorted((ROOT / "throttle_sweep").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")),
          ROOT / "README.md", *sorted((ROOT / "scripts").glob("*.py"))]
CITATION = re.compile(r"\btests/[\w/]+\.py\b")


def test_every_cited_test_file_exists():
    missing = [f"{path.relative_to(ROOT)} cites {cited}" for path in CITING
               for cited in CITATION.findall(path.read_text()) if not (ROOT / cited).is_file()]
    assert not missing, missing
