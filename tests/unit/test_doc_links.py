"""Every link of the README and the manual leads somewhere: a file of this checkout, and a heading of it where
the link names one (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", head.strip().lower()).replace(" ", "-") for head in heads}


def broken(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{page.name}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            out.append(f"{page.name}: {target}: no such heading")
    return out


def test_every_link_of_the_pages_leads_to_a_file_and_heading_that_exist():
    assert [b for page in PAGES for b in broken(page)] == []


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[here](#a-page) [gone](#nowhere) [file](missing.md)\n")
    assert broken(page) == ["page.md: #nowhere: no such heading", "page.md: missing.md: no such file"]
