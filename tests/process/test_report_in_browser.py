"""report.html opened as a person opens it: a real capacity study on the fake engine, its report loaded in a real
headless Chromium that must show no console error, no failed request, no request at all beyond the file, and
every picture decoded; a screenshot is kept. The checker is first shown a bad page, so that a pass means
something. Outside CI the browser may be absent (skipped); with CI=true its absence fails."""

from __future__ import annotations

import pytest

from tests import browser
from tests.process.test_user_paths import cli, ok


@pytest.fixture
def chromium():
    browser.require_chromium()


def test_a_missing_browser_fails_in_ci_and_is_skipped_elsewhere(monkeypatch):
    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        browser.require_chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        browser.require_chromium()


def test_the_checker_catches_a_broken_picture_a_script_error_and_a_request_to_the_network(tmp_path, chromium):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><h1>bad</h1><img src="data:image/png;base64,AAAA" alt="corrupt">'
                   '<img src="gone.png" alt="gone"><img src="http://example.invalid/x.png" alt="far">'
                   '<script>console.error("said"); notAFunction();</script></body></html>')
    found = browser.check_page(bad, tmp_path / "bad.png")
    assert sorted(found.broken_images) == ["corrupt", "far", "gone"]
    assert any("notAFunction is not defined" in e for e in found.errors) and "said" in found.errors
    assert any("ERR_FILE_NOT_FOUND" in e and "gone.png" in e for e in found.errors)
    assert "left the file: http://example.invalid/x.png" in found.requests
    assert any("ERR_FILE_NOT_FOUND" in r for r in found.requests)


def test_a_capacity_studys_report_renders_cleanly_offline_with_its_picture(tmp_path, chromium):
    ok(cli(tmp_path, "mode=capacity", "backend=fake", "run=cap", "workload.num_requests=100", "capacity.run_s=20",
           "capacity.knee_rates=4", "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "plots=true"))
    report = tmp_path / "results" / "cap" / "report.html"
    shot = tmp_path / "report.png"
    found = browser.check_page(report, shot)
    print(f"screenshot: {shot}")
    assert found.problems == []
    assert 'alt="capacity.png"' in report.read_text()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
