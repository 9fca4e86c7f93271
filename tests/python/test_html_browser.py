"""The HTML report in a real headless Chromium (Debian's), driven over the
DevTools protocol: the page loads from a file with no network, the heatmap
is laid out and hit-testable, refused modules are highlighted and listed,
nothing is logged as an error, and a screenshot is taken (kept in
$MX2NV_SCREENSHOT_DIR when set)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import K3_MODULE, generate

websocket = pytest.importorskip("websocket")

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")


class Page:
    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            assert time.monotonic() < deadline, f"no {event}"
            self.events.append(json.loads(self.ws.recv()))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def errors(self) -> list[dict[str, Any]]:
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(e)
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(e)
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(e)
        return out


@pytest.fixture(scope="module")
def browser() -> Iterator[str]:
    exe = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if exe is None:
        pytest.skip("no Chromium found (scripts/test.sh installs Debian's chromium-headless-shell: scripts/test-deps.sh)")
    profile = tempfile.mkdtemp(prefix="report-browser-")
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={profile}",
                             "--window-size=1200,1600", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    endpoint = None
    deadline = time.monotonic() + 30
    while endpoint is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        found = re.search(r"DevTools listening on ws://([^/]+)/", line)
        if found:
            endpoint = found.group(1)
    if endpoint is None:
        proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"{exe} could not start headless here (no DevTools endpoint within 30 s)")
    try:
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(endpoint: str, html: Path) -> Page:
    targets = json.load(urllib.request.urlopen(f"http://{endpoint}/json/list", timeout=10))
    page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
    for domain in ("Page", "Runtime", "Log", "Network"):
        page.call(f"{domain}.enable")
    page.call("Page.navigate", url=html.resolve().as_uri())
    page.wait_for("Page.loadEventFired")
    return page


def screenshot(page: Page, name: str, tmp_path: Path) -> bytes:
    png = base64.b64decode(page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    keep = os.environ.get("MX2NV_SCREENSHOT_DIR")
    (Path(keep) if keep else tmp_path).mkdir(parents=True, exist_ok=True)
    ((Path(keep) if keep else tmp_path) / name).write_bytes(png)
    return png


HEATMAP_PROBE = """(() => {
  const maps = [...document.querySelectorAll('svg.heatmap')];
  const cells = [...document.querySelectorAll('svg.heatmap rect.cell')];
  const hitTest = c => { c.scrollIntoView({block: 'center', inline: 'center'});
    const r = c.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === c; };
  const hit = cells.filter(hitTest);
  window.scrollTo(0, 0);
  return {maps: maps.length, cells: cells.length, hit: hit.length,
          widths: maps.map(m => m.getBoundingClientRect().width),
          refused: document.querySelectorAll('svg.heatmap rect.refused').length,
          requests: performance.getEntriesByType('resource').length,
          text: document.body.innerText};
})()"""


def test_convert_report_renders(browser: str, tmp_path: Path, demo_src: Path, mx2nv_command: str) -> None:
    page_file = tmp_path / "convert.html"
    subprocess.run([mx2nv_command, "convert", str(demo_src), str(tmp_path / "dst"), "--html", str(page_file)],
                   check=True, capture_output=True)
    page = open_page(browser, page_file)
    probe = page.evaluate(HEATMAP_PROBE)
    assert probe["maps"] == 3 and all(w > 100 for w in probe["widths"])  # w1, w2, w3
    assert probe["cells"] > 0 and probe["hit"] == probe["cells"]  # every cell laid out and on top
    assert probe["refused"] == 0 and probe["requests"] == 0
    assert "Runtime verdicts" in probe["text"] and "Provenance" in probe["text"]
    # The verdicts are mx2nv gate's on DST, row for row.
    gate = json.loads(subprocess.run([mx2nv_command, "gate", str(tmp_path / "dst"), "--json"], capture_output=True,
                                     text=True).stdout)
    shown = page.evaluate("[...document.querySelectorAll('table.gate tr')].slice(1).map(r => "
                          "[...r.cells].map(c => c.innerText))")
    assert len(shown) == len(gate["verdicts"]) >= 3
    for row, verdict in zip(shown, gate["verdicts"]):
        assert row[:5] == [f"{verdict['runtime']} {verdict['version']}", verdict["backend"], verdict["gpus"],
                           verdict["dtype"], verdict["verdict"]]
    assert not any(e.get("method") == "Network.requestWillBeSent" and
                   not e["params"]["request"]["url"].startswith("file:") for e in page.events)
    screenshot(page, "convert-report.png", tmp_path)
    assert page.errors() == []


def test_refused_modules_are_highlighted_and_listed(browser: str, tmp_path: Path, mx2nv_command: str) -> None:
    src = generate(tmp_path / "src", "--layers", "2", "--experts", "4", "--set-span", f"{K3_MODULE}=20")
    page_file = tmp_path / "inspect.html"
    done = subprocess.run([mx2nv_command, "inspect", str(src), "--html", str(page_file)], capture_output=True)
    assert done.returncode == 1
    page = open_page(browser, page_file)
    probe = page.evaluate(HEATMAP_PROBE)
    assert probe["refused"] == 1
    assert K3_MODULE in probe["text"] and "refused" in probe["text"]
    # No NVFP4 checkpoint to judge yet: the page says so, and shows no verdict.
    assert "Not available: inspect reads the MXFP4 source" in probe["text"]
    assert page.evaluate("document.querySelectorAll('table.gate').length") == 0
    colour = page.evaluate("getComputedStyle(document.querySelector('svg.heatmap rect.refused')).fill")
    assert colour == "rgb(220, 38, 38)"
    screenshot(page, "inspect-refused.png", tmp_path)
    assert page.errors() == []
