"""report.html: one self-contained page per results folder, for a person who does not read the terminal.

Every mode hands this module what it already made (its answer, its console lines, its tables, its PNGs) and
gets one file back: pictures embedded as data: URIs, a short inline style, no script and no link, so the page
opens anywhere, offline, and can be mailed as it is. All text is escaped here, so no caller writes HTML."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.errors import MarkupError
from rich.text import Text

NAME = "report.html"

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222;
       line-height: 1.45; }
h1 { font-size: 1.5rem; margin-bottom: .3rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
.answer { background: #eef5ee; border-left: 4px solid #3a7d44; padding: .6rem .9rem; font-size: 1.05rem; }
pre { background: #f6f6f6; padding: .6rem .8rem; overflow-x: auto; font-size: .85rem; white-space: pre-wrap; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
caption { text-align: left; font-weight: 600; padding-bottom: .3rem; }
th, td { border: 1px solid #ccc; padding: .25rem .6rem; text-align: left; vertical-align: top; }
td.num, td.short { white-space: nowrap; }
.wide { overflow-x: auto; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
.missing { color: #a33; }
"""


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    caption: str = ""


@dataclass(frozen=True)
class Section:
    heading: str
    text: Sequence[str] = ()  # console lines, shown as the terminal shows them (rich markup removed)
    tables: Sequence[Table] = ()
    pictures: Sequence[Path] = field(default_factory=tuple)  # PNGs, embedded


def plain(line: str) -> str:
    """A console line as the terminal shows it: rich markup such as [bold red]...[/] removed."""
    try:
        return Text.from_markup(line, emoji=False).plain
    except MarkupError:  # brackets that only look like markup: the terminal would not have printed it either
        return line


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) or v is None for v in value):
        return "[" + ", ".join(cell(v) for v in value) + "]"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def facts(data: Mapping[str, Any], *, caption: str = "", keys: Iterable[str] | None = None) -> Table:
    """Key and value, one row each, of the scalar (and short numeric list) entries of a summary; values as text,
    aligned left under one another."""
    chosen = list(keys) if keys is not None else list(data)
    rows = [(k, cell(data[k])) for k in chosen if k in data and not isinstance(data[k], dict)
            and (not isinstance(data[k], list) or (len(data[k]) <= 4 and all(
                isinstance(v, (int, float)) or v is None for v in data[k])))]
    return Table(("", "value"), rows, caption)


def flag_words(flags: Mapping[str, Any]) -> str:
    """`max_num_seqs=8 block_size=16`: a configuration for a title."""
    return " ".join(f"{k}={v}" for k, v in flags.items()) or "vLLM's defaults"


def render(title: str, answer: str, sections: Sequence[Section]) -> str:
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>", f'<p class="answer">{esc(plain(answer))}</p>']
    for section in sections:
        body.append(f"<h2>{esc(section.heading)}</h2>")
        if section.text:
            body.append("<pre>" + esc("\n".join(plain(line) for line in section.text)) + "</pre>")
        body.extend(table_html(t) for t in section.tables)
        body.extend(picture_html(p) for p in section.pictures)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def table_html(table: Table) -> str:
    esc = html.escape
    out = ['<div class="wide"><table>']
    if table.caption:
        out.append(f"<caption>{esc(table.caption)}</caption>")
    out.append("<tr>" + "".join(f"<th>{esc(str(h))}</th>" for h in table.header) + "</tr>")
    for row in table.rows:
        out.append("<tr>" + "".join(f"<td{kind(v)}>{esc(cell(v))}</td>" for v in row) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def kind(value: Any) -> str:
    """Numbers right-aligned; a short cell (an interval, a flag) kept on one line; long text wraps."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return " class=num"
    return " class=short" if len(cell(value)) <= 48 else ""


def picture_html(path: Path) -> str:
    """The PNG inline as a data: URI; a picture that was not drawn is said, not linked."""
    name = html.escape(path.name)
    if not path.is_file():
        return f'<p class="missing">picture {name} was not drawn</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{name}">'
            f"<figcaption>{name}</figcaption></figure>")


def write(folder: Path, title: str, answer: str, sections: Sequence[Section], *, name: str = NAME) -> Path:
    path = folder / name
    path.write_text(render(title, answer, sections), encoding="utf-8")
    return path
