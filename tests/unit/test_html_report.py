"""report.html's renderer: text escaped, pictures inline, tables, nothing that reaches outside the file."""

from __future__ import annotations

import base64
import re
import struct
import zlib

from throttle_sweep.report import html_page
from throttle_sweep.report.html_page import Section, Table


def tiny_png(path):
    """A real 1x1 PNG, without matplotlib."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    body = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))
    path.write_bytes(body)
    return path


def test_every_text_is_escaped_and_no_markup_of_a_caller_survives():
    evil = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
    page = html_page.render(evil, evil, [Section(evil, text=[evil], tables=[Table([evil], [[evil]], caption=evil)])])
    assert "<script" not in page and "<img" not in page
    # title, h1, answer, heading, console text, caption, header cell, cell
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img src=x") == 8


def test_console_markup_is_removed_as_the_terminal_removes_it_and_brackets_of_numbers_stay():
    page = html_page.render("t", "[bold]CHEAPER[/]: ratio 0.9 [0.85, 0.95]",
                              [Section("s", text=["[red]failed[/] at [1, 2]", "a [/] stray tag"])])
    assert "CHEAPER: ratio 0.9 [0.85, 0.95]" in page and "failed at [1, 2]" in page
    assert "[bold]" not in page and "[red]" not in page and "a [/] stray tag" in page


def test_pictures_are_embedded_as_data_uris_and_a_missing_one_is_said(tmp_path):
    png = tiny_png(tmp_path / "cost.png")
    page = html_page.render("t", "a", [Section("pictures", pictures=[png, tmp_path / "absent.png"])])
    [data] = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(data) == png.read_bytes()
    assert "absent.png was not drawn" in page


def test_the_page_reaches_nothing_outside_itself(tmp_path):
    page = html_page.render("t", "a", [Section("s", text=["see http://example.com"],
                                                 pictures=[tiny_png(tmp_path / "p.png")])])
    assert not re.search(r'(src|href)="(?!data:)', page) and "<link" not in page and "<script" not in page
    assert "@import" not in page and "url(" not in page


def test_tables_have_a_header_a_row_per_item_and_numbers_formatted():
    table = Table(["rate", "met", "verdict"], [[1.23456789, 7, "holds"], [2.0, None, True]], caption="levels")
    page = html_page.render("t", "a", [Section("s", tables=[table])])
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    assert rows[0] == "<th>rate</th><th>met</th><th>verdict</th>"
    assert rows[1] == "<td class=num>1.235</td><td class=num>7</td><td class=short>holds</td>"
    assert rows[2] == "<td class=num>2</td><td class=short>-</td><td class=short>yes</td>"
    assert "<caption>levels</caption>" in page


def test_facts_keep_scalars_and_short_lists_of_a_summary():
    table = html_page.facts({"capacity_rps": 3.5, "capacity_ci": [3.0, 4.1], "levels": {"a": 1},
                               "runs": list(range(9)), "rates": [{"rate": 1}], "price": "$1"})
    assert table.rows == [("capacity_rps", "3.5"), ("capacity_ci", "[3, 4.1]"), ("price", "$1")]
    assert html_page.cell([3.0, 4.1234567]) == "[3, 4.123]"


def test_write_puts_report_html_in_the_folder(tmp_path):
    path = html_page.write(tmp_path, "measure", "ok", [])
    assert path == tmp_path / "report.html" and path.read_text().startswith("<!DOCTYPE html>")
