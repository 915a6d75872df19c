"""A real browser against a real server: headless Chromium loads a page from
`cadeloop ws_browser_app:app --cores 2`, whose script opens four WebSockets
back to the same server, sends text (with non-ASCII characters), bytes and a
70,000-character message (Chromium offers permessage-deflate, so it goes
compressed both ways), and writes what came back into the DOM. The test reads
the DOM over the DevTools protocol (a headless `--dump-dom` does not wait for
WebSocket traffic) and checks every echo.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.sync.client import connect

from server_harness import ServerProcess
from test_stats_endpoint import chromium

pytestmark = pytest.mark.timeout(120)

READ_DOM = ("document.getElementById('done').textContent + '\\n' + "
            "document.getElementById('result').textContent")


def dom_result(url: str, profile: Path, timeout: float = 30.0) -> str:
    """Opens `url` in headless Chromium and returns #result once the page wrote #done."""
    err = profile.parent / f"{profile.name}-chromium.log"
    with open(err, "wb") as log:
        proc = subprocess.Popen([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                 f"--user-data-dir={profile}", "--remote-debugging-port=0", url],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        port = 0
        deadline = time.monotonic() + timeout
        while not port:
            if m := re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", err.read_text(errors="replace")):
                port = int(m.group(1))
            else:
                assert proc.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")
                time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None) as devtools:
            for call in range(1_000_000):
                devtools.send(json.dumps({"id": call, "method": "Runtime.evaluate",
                                          "params": {"expression": READ_DOM, "returnByValue": True}}))
                while (answer := json.loads(devtools.recv(timeout=10))).get("id") != call:
                    pass
                value = answer["result"]["result"].get("value") or ""
                if value.startswith("done\n"):
                    return value.removeprefix("done\n")
                assert time.monotonic() < deadline, f"the page did not finish: {value!r}"
                time.sleep(0.1)
        raise AssertionError("unreachable")
    finally:
        proc.terminate()
        proc.wait(30)


def test_chromium_page_echoes_over_websockets(tmp_path: Path) -> None:
    srv = ServerProcess("ws_browser_app:app", "--cores", "2", "--access-log", tmp=tmp_path).start()
    try:
        result = dom_result(srv.url + "/", tmp_path / "profile")
        assert result.splitlines() == [
            f"ws {i} [chat] echo:hello {i} \u00e9\u4e2d | bytes {i},3,2,1 | long 70005 echo:x | close 1000 true"
            for i in range(4)
        ], result
        # The page and its four WebSockets came through the server: the 101s and the closes are logged.
        for i in range(4):
            srv.wait_log(rf'"GET /ws\?n={i}" 101 ')
            srv.wait_log(rf'"GET /ws\?n={i}" 1000 ')
    finally:
        assert srv.stop() == 0, srv.log()
