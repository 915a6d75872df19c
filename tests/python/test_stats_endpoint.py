"""The stats endpoint through cadeloop._core.StatsEndpoint, over a reader with
known, changing numbers: each URL with httpx, /metrics through promtool, and
the dashboard drawn by headless Chromium (a screenshot with non-empty charts).

Needs only _core (no server wiring). promtool and chromium come from Debian
(scripts/setup installs them); if one is missing the test fails and says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cadeloop import _core

BUCKETS = 241  # net::latency_buckets::count


def bucket_of(us: int) -> int:
    """net::latency_buckets::index_of."""
    if us < 8:
        return us
    e = us.bit_length() - 1
    if e >= 32:
        return BUCKETS - 1
    return 8 + (e - 3) * 8 + ((us >> (e - 3)) & 7)


class FakePairs:
    """Two pairs whose counters grow with every read, like a server under load."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reads = 0
        self.state = "serving"

    def __call__(self) -> list[dict[str, Any]]:
        with self.lock:
            self.reads += 1
            n = self.reads
            state = self.state
        pairs = []
        for index in range(2):
            k = index + 1
            buckets = [0] * BUCKETS
            buckets[bucket_of(100 * k)] = 60 * n
            buckets[bucket_of(1000 * k)] = 30 * n
            buckets[bucket_of(10_000 * k)] = 10 * n
            pairs.append(
                {
                    "index": index,
                    "pid": os.getpid(),
                    "state": state,
                    "started_unix_ms": 1_700_000_000_000,
                    "requests": 100 * n * k,
                    "responses": 100 * n * k,
                    "responses_2xx": 95 * n * k,
                    "responses_5xx": 5 * n * k,
                    "bytes_in": 1000 * n,
                    "bytes_out": 5000 * n,
                    "connections_open": (n % 7) + k,
                    "connections_accepted": 10 * n,
                    "requests_in_flight": n % 3,
                    "inbound_depth": (n * k) % 5,
                    "outbound_depth": (n + k) % 4,
                    "wakeups_to_app": 3 * n,
                    "wakeups_to_io": 4 * n,
                    "spins": 10 * n,
                    "spin_hits": 8 * n,
                    "loop_ticks": 50 * n,
                    "solo_handoffs": 2 * n * k,
                    "solo_steals": n * k,
                    "solo_passes": 40 * n * k,
                    "latency_buckets": buckets,
                    "latency_count": 100 * n,
                    "latency_sum_us": (60 * 100 + 30 * 1000 + 10 * 10_000) * k * n,
                }
            )
        return pairs


INFO = {"isolation": "subinterpreters", "python_version": "3.13.1", "cadeloop_version": "0.1.0"}


@pytest.fixture
def fake() -> FakePairs:
    return FakePairs()


@pytest.fixture
def endpoint(fake: FakePairs) -> Iterator[Any]:
    ep = _core.StatsEndpoint(fake, "127.0.0.1", 0, INFO)
    try:
        yield ep
    finally:
        ep.close()


def url(ep: Any, path: str) -> str:
    return f"http://127.0.0.1:{ep.port}{path}"


# ---- JSON ----------------------------------------------------------------------


def test_stats_json_has_the_numbers(endpoint: Any, fake: FakePairs) -> None:
    r = httpx.get(url(endpoint, "/stats"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    n = fake.reads
    assert doc["isolation"] == "subinterpreters"
    assert doc["python_version"] == "3.13.1"
    assert doc["cadeloop_version"] == "0.1.0"
    assert doc["ready"] is True and doc["draining"] is False
    assert doc["uptime_s"] >= 0
    assert [p["index"] for p in doc["pairs"]] == [0, 1]
    p1 = doc["pairs"][1]
    assert p1["requests"] == 200 * n
    assert p1["responses"] == {"total": 200 * n, "1xx": 0, "2xx": 190 * n, "3xx": 0, "4xx": 0, "5xx": 10 * n}
    assert p1["state"] == "serving" and p1["pid"] == os.getpid()
    assert p1["spins"] == 10 * n and p1["spin_hits"] == 8 * n
    assert (p1["solo_handoffs"], p1["solo_steals"], p1["solo_passes"]) == (4 * n, 2 * n, 80 * n)
    lat = p1["latency_us"]
    assert lat["count"] == 100 * n
    # Bucket upper bounds: at or above the value, at most 1/8 above.
    assert 200 <= lat["p50"] <= 225
    assert 2000 <= lat["p90"] <= 2250
    assert 20_000 <= lat["p99"] <= 22_500
    assert 20_000 <= lat["p99.9"] <= 22_500
    t = doc["totals"]
    assert t["requests"] == 300 * n
    assert t["pairs"] == 2 and t["pairs_serving"] == 2
    assert len(t["latency_histogram"]["le_us"]) == BUCKETS
    assert t["latency_histogram"]["le_us"][-1] is None
    assert sum(t["latency_histogram"]["counts"]) == 200 * n


def test_numbers_change_between_reads(endpoint: Any) -> None:
    a = httpx.get(url(endpoint, "/stats")).json()["totals"]["requests"]
    b = httpx.get(url(endpoint, "/stats")).json()["totals"]["requests"]
    assert b > a


def test_over_a_stats_region(tmp_path: Path) -> None:
    # The production reader: the pairs' shared pages. Fresh pages hold no
    # pair yet, so the endpoint reports them unused and is not ready.
    region = _core.StatsRegion(3)
    ep = _core.StatsEndpoint(region, "127.0.0.1", 0, INFO)
    try:
        doc = httpx.get(url(ep, "/stats")).json()
        assert [(p["index"], p["state"], p["requests"]) for p in doc["pairs"]] == [
            (0, "unused", 0),
            (1, "unused", 0),
            (2, "unused", 0),
        ]
        assert doc["totals"]["pairs"] == 3 and doc["totals"]["pairs_serving"] == 0
        r = httpx.get(url(ep, "/readyz"))
        assert (r.status_code, r.text) == (503, "not ready: pair 0 is unused\n")
        metrics = httpx.get(url(ep, "/metrics")).text
        assert 'cadeloop_pair_state{pair="2",state="unused"} 1' in metrics
        check = subprocess.run([promtool(), "check", "metrics"], input=metrics, capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        ep.close()
    del region  # the endpoint kept it alive while it ran; now it may go


# ---- Prometheus ------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run scripts/setup (it installs Debian's prometheus package)")
    return path


def test_metrics_pass_promtool(endpoint: Any, fake: FakePairs) -> None:
    r = httpx.get(url(endpoint, "/metrics"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    check = subprocess.run([promtool(), "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"promtool: {check.stdout}{check.stderr}"
    assert check.stdout.strip() == "" and check.stderr.strip() == "", check.stdout + check.stderr
    assert 'cadeloop_requests_total{pair="1"}' in r.text
    n = fake.reads
    for event, value in (("handoff", 4 * n), ("steal", 2 * n), ("app_pass", 80 * n)):
        assert f'cadeloop_solo_total{{pair="1",event="{event}"}} {value}\n' in r.text, r.text
    assert "# TYPE cadeloop_request_duration_seconds histogram" in r.text


def test_promtool_catches_a_bad_exposition(endpoint: Any) -> None:
    # The check above can fail: a counter without _total is refused.
    bad = httpx.get(url(endpoint, "/metrics")).text.replace("cadeloop_spins_total", "cadeloop_spins")
    check = subprocess.run([promtool(), "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert check.returncode != 0
    assert "cadeloop_spins" in check.stdout + check.stderr


def test_histogram_buckets_are_cumulative(endpoint: Any) -> None:
    text = httpx.get(url(endpoint, "/metrics")).text
    for pair in ("0", "1"):
        rows = []
        for line in text.splitlines():
            prefix = f'cadeloop_request_duration_seconds_bucket{{pair="{pair}",le="'
            if line.startswith(prefix):
                le, value = line[len(prefix) :].split('"} ')
                rows.append((float(le), int(value)))
        assert rows[-1][0] == float("inf")
        assert [le for le, _ in rows] == sorted(le for le, _ in rows)
        assert [v for _, v in rows] == sorted(v for _, v in rows)
        count = next(
            int(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(f'cadeloop_request_duration_seconds_count{{pair="{pair}"}}')
        )
        assert rows[-1][1] == count > 0


# ---- probes and errors -----------------------------------------------------------------


def test_probes_and_draining(endpoint: Any, fake: FakePairs) -> None:
    assert httpx.get(url(endpoint, "/healthz")).status_code == 200
    assert httpx.get(url(endpoint, "/readyz")).status_code == 200
    with fake.lock:
        fake.state = "starting"
    r = httpx.get(url(endpoint, "/readyz"))
    assert (r.status_code, r.text) == (503, "not ready: pair 0 is starting\n")
    with fake.lock:
        fake.state = "serving"
    assert httpx.get(url(endpoint, "/readyz")).status_code == 200
    endpoint.set_draining()
    assert endpoint.draining
    r = httpx.get(url(endpoint, "/readyz"))
    assert (r.status_code, r.text) == (503, "not ready: draining\n")
    assert httpx.get(url(endpoint, "/healthz")).status_code == 200
    assert httpx.get(url(endpoint, "/stats")).json()["draining"] is True


def test_restarts_are_counted(endpoint: Any) -> None:
    assert httpx.get(url(endpoint, "/stats")).json()["restarts"] == 0
    endpoint.count_restart()
    endpoint.count_restart()
    assert endpoint.restarts == 2
    assert httpx.get(url(endpoint, "/stats")).json()["restarts"] == 2
    metrics = httpx.get(url(endpoint, "/metrics")).text
    assert "# TYPE cadeloop_restarts_total counter\ncadeloop_restarts_total 2\n" in metrics


def test_404_405_and_bad_requests(endpoint: Any) -> None:
    assert httpx.get(url(endpoint, "/nope")).status_code == 404
    r = httpx.post(url(endpoint, "/stats"), content=b"x")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 ")
    assert b"Connection: close\r\n" in data


def test_reader_errors_are_500(endpoint: Any, fake: FakePairs) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("region unmapped")

    ep = _core.StatsEndpoint(broken, "127.0.0.1", 0, INFO)
    try:
        r = httpx.get(url(ep, "/stats"))
        assert r.status_code == 500 and "region unmapped" in r.text
        assert httpx.get(url(ep, "/healthz")).status_code == 200
    finally:
        ep.close()


def test_bind_error_is_one_line(endpoint: Any, fake: FakePairs) -> None:
    with pytest.raises(ValueError, match=rf"^stats endpoint: cannot listen on 127\.0\.0\.1:{endpoint.port}: "):
        _core.StatsEndpoint(fake, "127.0.0.1", endpoint.port, INFO)


def test_close_is_idempotent(fake: FakePairs) -> None:
    ep = _core.StatsEndpoint(fake, "127.0.0.1", 0, INFO)
    port = ep.port
    ep.close()
    ep.close()
    assert ep.closed
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz")


# ---- starvation and EMFILE ------------------------------------------------------------------


def probe(port: int, path: str = "/healthz", timeout: float = 5.0) -> tuple[int, float]:
    """(status, seconds) of one GET on a fresh connection."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return int(data.split(b" ", 2)[1]), time.monotonic() - started


def test_idle_connections_cannot_starve_the_probes(endpoint: Any) -> None:
    idle = []
    try:
        for i in range(200):
            c = socket.create_connection(("127.0.0.1", endpoint.port), timeout=5)
            if i % 2:
                c.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # half a head: a slow client
            idle.append(c)
        time.sleep(0.2)
        for path in ("/healthz", "/readyz", "/stats"):
            status, took = probe(endpoint.port, path)
            assert status == 200 and took < 0.5, (path, status, took)
        # A client that keeps its connection busy is never the one closed: only idle ones go.
        with httpx.Client() as client:
            for _ in range(3):
                assert client.get(url(endpoint, "/healthz")).status_code == 200
    finally:
        for c in idle:
            c.close()


_EMFILE_SERVER = """
import resource, sys, time
from cadeloop import _core
ep = _core.StatsEndpoint(lambda: [], "127.0.0.1", 0, {})
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(ep.port, flush=True)
time.sleep(60)
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` (clock ticks to seconds)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_the_endpoint_backs_off_instead_of_spinning() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _EMFILE_SERVER], stdout=subprocess.PIPE, text=True)
    clients = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(60):  # more than the 32 descriptors the endpoint's process may hold
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)  # it accepted what it could; the rest wait in the backlog: EMFILE on every accept
        before = cpu_seconds(proc.pid)
        time.sleep(2.0)
        used = cpu_seconds(proc.pid) - before
        print(f"endpoint process CPU under EMFILE: {used / 2.0:.1%}")
        assert used < 0.05, f"{used:.2f} s of CPU in 2 s: the endpoint spins on EMFILE"
        for c in clients[:40]:
            c.close()  # descriptors come back: the queued connections are served
        time.sleep(0.3)
        assert probe(port)[0] == 200
    finally:
        for c in clients:
            c.close()
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ---- the dashboard in headless Chromium -----------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.fail("chromium is missing: run scripts/setup (it installs Debian's chromium package)")


def run_chromium(args: list[str], target: str, profile: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        "--window-size=1200,900",
        "--virtual-time-budget=6000",
        *args,
        target,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def read_png(path: Path) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw rows without filter bytes) of an 8-bit RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return width, height, channels, bytes(out)


def coloured_pixels(png: Path, rect: tuple[int, int, int, int]) -> int:
    """Pixels inside rect whose colour is saturated: data lines (axes, grid
    and text are grey)."""
    width, height, channels, rows = read_png(png)
    x0, y0, w, h = rect
    count = 0
    for y in range(max(0, y0), min(height, y0 + h)):
        base = y * width * channels
        for x in range(max(0, x0), min(width, x0 + w)):
            r, g, b = rows[base + x * channels : base + x * channels + 3]
            if max(r, g, b) - min(r, g, b) > 60:
                count += 1
    return count


def chart_plots(dom: str) -> dict[str, tuple[tuple[int, int, int, int], int]]:
    """{canvas id: (plot rect, points drawn)} from the dumped DOM."""
    found = {}
    for m in re.finditer(r"<canvas ([^>]*)>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        if "data-plot" in attrs:
            x, y, w, h = (int(v) for v in attrs["data-plot"].split(","))
            found[attrs["id"]] = ((x, y, w, h), int(attrs.get("data-points", "0")))
    return found


def test_dashboard_draws_in_headless_chromium(endpoint: Any, fake: FakePairs, tmp_path: Path) -> None:
    page = url(endpoint, "/")
    html = httpx.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")

    dom = run_chromium(["--dump-dom"], page, tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr
    plots = chart_plots(dom.stdout)
    assert set(plots) == {"c-rps", "c-latency", "c-conns", "c-rings"}, dom.stdout[-2000:]
    for name, (_, points) in plots.items():
        assert points >= 6, f"{name} drew {points} points"
    assert fake.reads >= 4, "the page did not poll /stats"

    shot = tmp_path / "dashboard.png"
    out = run_chromium([f"--screenshot={shot}"], page, tmp_path / "profile-shot")
    assert out.returncode == 0 and shot.exists(), out.stderr
    for name, (rect, _) in plots.items():
        assert coloured_pixels(shot, rect) > 40, f"chart {name} looks empty in the screenshot"

    # The control: the same page with no /stats to poll draws nothing, and
    # the pixel count above says so.
    offline = tmp_path / "offline.html"
    offline.write_text(html.text)
    dead = tmp_path / "offline.png"
    out = run_chromium([f"--screenshot={dead}"], offline.as_uri(), tmp_path / "profile-dead")
    assert out.returncode == 0 and dead.exists(), out.stderr
    for name, (rect, _) in plots.items():
        assert coloured_pixels(dead, rect) == 0, f"chart {name} has colour without data"


def test_dashboard_screenshot_script(endpoint: Any, tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "dashboard-screenshot"
    out = tmp_path / "shot.png"
    env = {**os.environ, "CADELOOP_CHROMIUM_PROFILE": str(tmp_path / "profile")}
    done = subprocess.run([str(script), url(endpoint, "/"), str(out)], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    width, height, _, _ = read_png(out)
    assert (width, height) == (1200, 900)
    assert json.loads(done.stdout.splitlines()[-1])["drawn_points"] > 0
