"""Open a local HTML file in headless Chromium and say what went wrong: console errors, uncaught script errors,
requests that failed or left the file (a report must reach no network), images that did not decode; and save a
screenshot. Spoken over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 in, fd 4 out, messages
ended by NUL), so no websocket client or browser driver is needed."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# without the background-networking flags Chromium dials out at start, which a closed network refuses
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]
BROKEN_IMAGES = "[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt || i.src)"
LOCAL = ("data:", "file:", "about:")


@dataclass
class PageCheck:
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    requests: list[str] = field(default_factory=list)  # failed requests, and any that left the file
    broken_images: list[str] = field(default_factory=list)
    screenshot: Path | None = None

    @property
    def problems(self) -> list[str]:
        return ([f"console: {e}" for e in self.errors] + [f"request: {r}" for r in self.requests]
                + [f"image not shown: {i[:80]}" for i in self.broken_images])


def require_chromium() -> None:
    """Skip without the browser, but fail in CI (CI=true), where .ci/run installs it."""
    import pytest

    if shutil.which(CHROMIUM) is None:
        message = f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


class Pipe:
    """One DevTools connection: numbered commands, their answers, and the events met on the way."""

    def __init__(self, to_browser: int, from_browser: int, deadline: float):
        self.out, self.inp, self.deadline = to_browser, from_browser, deadline
        self.buffer, self.next_id, self.events = b"", 0, []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic() if timeout is None else timeout
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer over DevTools in time")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def drain(self, seconds: float) -> None:
        """Events that arrive within `seconds` (late console errors, images that fail after load)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                self.events.append(self.receive(timeout=left))
            except TimeoutError:
                return


def check_page(page: Path, screenshot: Path, *, timeout_s: float = 60.0, width: int = 1200) -> PageCheck:
    """Load `page` in a fresh headless Chromium (an empty profile) and return what went wrong, with a full-page
    screenshot saved at `screenshot`."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()

    def as_fd_3_and_4() -> None:  # in the child: the pipe ends at the fds Chromium reads and writes
        a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.dup2(a, 3)
        os.dup2(b, 4)

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=as_fd_3_and_4, pass_fds=(3, 4))  # kept open after the dup
        os.close(to_child_r)
        os.close(from_child_w)
        try:
            return _inspect(Pipe(to_child_w, from_child_r, time.monotonic() + timeout_s), page, screenshot, width)
        finally:
            os.close(to_child_w)
            os.close(from_child_r)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _inspect(cdp: Pipe, page: Path, screenshot: Path, width: int) -> PageCheck:
    target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Network", "Page"):
        cdp.send(f"{domain}.enable", session=session)
    cdp.send("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
    cdp.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
    while not any(e.get("method") == "Page.loadEventFired" for e in cdp.events):
        cdp.events.append(cdp.receive())
    cdp.drain(0.5)
    found = PageCheck()
    broken = cdp.send("Runtime.evaluate", {"expression": BROKEN_IMAGES, "returnByValue": True}, session=session)
    found.broken_images = list(broken["result"].get("value") or [])
    for event in cdp.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.errors.append((details.get("exception") or {}).get("description") or details.get("text", ""))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.errors.append(params["entry"]["text"] + (f" ({params['entry'].get('url')})"
                                                           if params["entry"].get("url") else ""))
        elif method == "Network.loadingFailed":
            found.requests.append(f"failed: {params.get('errorText')} ({params.get('type')})")
        elif method == "Network.requestWillBeSent" and not params["request"]["url"].startswith(LOCAL):
            found.requests.append(f"left the file: {params['request']['url']}")
    size = cdp.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
    shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                               "clip": {"x": 0, "y": 0, "width": size["width"],
                                                        "height": min(size["height"], 16000), "scale": 1}},
                    session=session)
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    found.screenshot = screenshot
    with contextlib.suppress(RuntimeError, TimeoutError):  # it may close before it answers
        cdp.send("Browser.close")
    return found
