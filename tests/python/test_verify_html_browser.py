"""`verify --html` in a real browser: the dense fixture's page loads from disk in headless Chromium
without a console error or a network request, sorts its tables on a header click, and renders
charts (the screenshot is neither blank nor colourless).
VERIFY_HTML_SCREENSHOT=PATH keeps the screenshot (docs/verify-report.png is made that way).

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
separated by NUL bytes on file descriptors 3 and 4), so only the standard library is needed. The
screenshot PNG is decoded with zlib. Without Chromium the test is skipped, unless CI=true.
"""

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest

WIDTH, HEIGHT = 1400, 2000
# The page's series and verdict colours (Okabe-Ito), as RGB.
CHART_COLOURS = {
    (0x00, 0x72, 0xB2),
    (0xE6, 0x9F, 0x00),
    (0x00, 0x9E, 0x73),
    (0xCC, 0x79, 0xA7),
    (0x56, 0xB4, 0xE9),
    (0xD5, 0x5E, 0x00),
}


def chromium_path():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def chromium():
    path = chromium_path()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium not found (set CHROMIUM or install chromium); required when CI=true")
        pytest.skip("Chromium not found (set CHROMIUM to run the browser test)")
    return path


class Browser:
    """Headless Chromium with the DevTools protocol on a pipe, attached to one page."""

    def __init__(self, exe, profile):
        # Chromium reads commands from fd 3 and writes replies and events to fd 4. The pipe ends go
        # above 9 first so that placing them on 3 and 4 cannot overwrite one with the other.
        to_r, self._to_browser = (high_fd(fd) for fd in os.pipe())
        self._from_browser, from_w = (high_fd(fd) for fd in os.pipe())
        err_r, err_w = (high_fd(fd) for fd in os.pipe())
        argv = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={WIDTH},{HEIGHT}",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.pid = os.posix_spawn(
            exe,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                (os.POSIX_SPAWN_DUP2, to_r, 3),
                (os.POSIX_SPAWN_DUP2, from_w, 4),
            ],
        )
        for fd in (to_r, from_w, err_w):
            os.close(fd)
        self._stderr_fd = err_r
        self.stderr = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._buf = b""
        self._next_id = 0
        self.events = []
        self.session = None

    def _drain_stderr(self):
        with os.fdopen(self._stderr_fd, "rb") as f:
            for line in f:
                self.stderr.append(line.decode(errors="replace"))

    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("no reply from Chromium; stderr:\n" + "".join(self.stderr[-30:]))
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe; stderr:\n" + "".join(self.stderr[-30:]))
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=True, timeout=30):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e["method"] == method:
                    return e
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise AssertionError(f"script error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def attach(self):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, session=False
        )
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
        )

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        os.close(self._to_browser)
        os.close(self._from_browser)


def high_fd(fd):
    """`fd` moved to a descriptor above 9, close-on-exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def console_problems(events):
    """Console errors, uncaught exceptions and browser log errors (CSP violations, failed loads)."""
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a)) for a in p["args"]))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append("log: " + p["entry"]["text"])
    return out


def decode_png(data):
    """(width, height, channels, rows of bytes) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        else:
            assert ftype == 0, f"bad PNG filter {ftype}"
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def pixel_stats(png):
    """Luminance variance over all pixels and the number of pixels in each chart colour."""
    width, height, bpp, rows = decode_png(png)
    n = s = s2 = 0
    colours = {}
    for row in rows:
        for x in range(0, width * bpp, bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            lum = (299 * r + 587 * g + 114 * b) // 1000
            n += 1
            s += lum
            s2 += lum * lum
            if (r, g, b) in CHART_COLOURS:
                colours[(r, g, b)] = colours.get((r, g, b), 0) + 1
    mean = s / n
    return width, height, s2 / n - mean * mean, colours


def test_dense_report_renders_in_chromium(escha_convert, repo_root, chromium, tmp_path):
    page = tmp_path / "dense report.html"
    run = subprocess.run(
        [
            str(escha_convert),
            "verify",
            "fixtures/dense",
            "--base",
            "fixtures/dense-base",
            "--html",
            str(page),
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert page.is_file()
    url = page.resolve().as_uri()

    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(chromium, profile)
        try:
            browser.attach()
            browser.send("Page.navigate", {"url": url})
            browser.wait_for("Page.loadEventFired")
            assert browser.evaluate("document.readyState") == "complete"
            assert browser.evaluate("document.querySelectorAll('svg').length") >= 3

            # Click-sort: the ratio column of the coded table, ascending then descending.
            sort = """(function () {
                var t = document.getElementById('coded-table');
                var heads = Array.prototype.map.call(t.tHead.rows[0].cells, function (c) { return c.textContent; });
                var i = heads.indexOf('ratio'), n = heads.indexOf('tensor');
                function col(j, attr) {
                    return Array.prototype.map.call(t.tBodies[0].rows, function (r) {
                        return attr ? parseFloat(r.cells[j].getAttribute('data-v')) : r.cells[j].textContent;
                    });
                }
                t.tHead.rows[0].cells[i].click();
                var up = col(i, true), order = t.tHead.rows[0].cells[i].getAttribute('aria-sort');
                t.tHead.rows[0].cells[i].click();
                var down = col(i, true);
                t.tHead.rows[0].cells[n].click();
                return {up: up, down: down, order: order, names: col(n, false)};
            })()"""
            got = browser.evaluate(sort)
            assert got["order"] == "ascending"
            assert len(got["up"]) == 25
            assert got["up"] == sorted(got["up"]), got["up"]
            assert got["down"] == sorted(got["up"], reverse=True), got["down"]
            assert got["names"] == sorted(got["names"], key=lambda s: [int(p) if p.isdigit() else p for p in s.split(".")])

            # Back to the top, then a screenshot of the window.
            browser.evaluate("window.scrollTo(0, 0)")
            shot = browser.send("Page.captureScreenshot", {"format": "png"})
            png = base64.b64decode(shot["data"])
            if os.environ.get("VERIFY_HTML_SCREENSHOT"):
                Path(os.environ["VERIFY_HTML_SCREENSHOT"]).write_bytes(png)

            problems = console_problems(browser.events)
            requests = [
                e["params"]["request"]["url"]
                for e in browser.events
                if e["method"] == "Network.requestWillBeSent" and e["params"]["request"]["url"] != url
            ]
        finally:
            browser.close()

    assert not problems, "console errors:\n" + "\n".join(problems)
    assert not requests, f"the page fetched {requests}"
    width, height, variance, colours = pixel_stats(png)
    assert (width, height) == (WIDTH, HEIGHT)
    assert variance > 200, f"screenshot looks blank (luminance variance {variance:.1f})"
    present = {c for c, n in colours.items() if n >= 20}
    assert len(present) >= 4, f"too few chart colours in the screenshot: {colours}"
