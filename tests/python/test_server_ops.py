"""Operations on a real server: the stats endpoint over every pair's shared counters, and the access log.

Each test starts `python -m cadeloop` with `--cores 2` in the isolation modes
this Python has (sub-interpreters on 3.13+, processes everywhere), sends a
known number of requests with real clients and checks what the endpoint and
the log say about them.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_harness import ServerProcess, read_response

SUBINTERPRETERS = sys.version_info >= (3, 13)
MODES = ["subinterpreters", "processes"] if SUBINTERPRETERS else ["processes"]
STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def stats_url(srv: ServerProcess) -> str:
    return f"http://127.0.0.1:{srv.wait_log(STATS.pattern).group(1)}"


def fresh_connection_gets(url: str, n: int) -> None:
    """n GETs, each on its own connection, so SO_REUSEPORT spreads them over the pairs."""
    for _ in range(n):
        with httpx.Client(timeout=10) as client:
            r = client.get(url + "/pair", headers={"connection": "close"})
            assert r.status_code == 200


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run scripts/setup (Debian package prometheus)"
    return path


@pytest.mark.parametrize("isolation", MODES)
def test_stats_endpoint_counts_every_request_of_both_pairs(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--stats-port", "0",
                        tmp=tmp_path).start()
    try:
        base = stats_url(srv)
        assert httpx.get(base + "/healthz").status_code == 200
        assert httpx.get(base + "/readyz").status_code == 200
        sent = 120
        fresh_connection_gets(srv.url, sent)
        with httpx.Client(timeout=10) as client:  # 30 more on one keep-alive connection
            for _ in range(30):
                assert client.get(srv.url + "/nothing-here").status_code == 404
        sent += 30
        deadline = time.monotonic() + 5
        while True:
            stats = httpx.get(base + "/stats").json()
            if stats["totals"]["responses"]["total"] == sent or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        totals, pairs = stats["totals"], stats["pairs"]
        assert stats["isolation"] == isolation
        assert len(pairs) == 2
        assert totals["requests"] == sent
        assert totals["responses"]["total"] == sent
        assert totals["responses"]["2xx"] == sent - 30
        assert totals["responses"]["4xx"] == 30
        assert sum(p["requests"] for p in pairs) == sent
        assert all(p["requests"] > 0 for p in pairs), "both pairs served"
        assert totals["latency_us"]["count"] == sent
        assert 0 < totals["latency_us"]["p50"] <= totals["latency_us"]["p99"]

        metrics = httpx.get(base + "/metrics").text
        check = subprocess.run([promtool(), "check", "metrics"], input=metrics, capture_output=True, text=True,
                               timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        counted = {int(m.group(1)): float(m.group(2)) for m in
                   re.finditer(r'^cadeloop_requests_total\{pair="(\d+)"\} (\S+)$', metrics, re.M)}
        assert sorted(counted) == [0, 1]
        assert sum(counted.values()) == sent
        assert re.search(r'^cadeloop_request_duration_seconds_count\{pair="0"\} ', metrics, re.M)
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("isolation", MODES)
def test_readyz_turns_503_at_sigterm_while_requests_in_flight_finish(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, "--stats-port", "0",
                        "--grace", "10", tmp=tmp_path).start()
    base = stats_url(srv)
    assert httpx.get(base + "/readyz").status_code == 200
    result: dict[str, object] = {}

    def slow() -> None:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /slow?delay=1.5 HTTP/1.1\r\nHost: t\r\n\r\n")
            result["response"] = read_response(s.makefile("rb"))

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)  # the slow request is in flight
    srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + 1.0
    ready = 200
    while time.monotonic() < deadline:
        ready = httpx.get(base + "/readyz").status_code
        if ready == 503:
            break
        time.sleep(0.02)
    assert ready == 503, "readyz did not turn 503 within 1 s of SIGTERM"
    assert httpx.get(base + "/healthz").status_code == 200, "healthz stays 200 during the drain"
    assert "response" not in result, "503 came before the request in flight finished"
    t.join(10)
    status, _, body = result["response"]  # type: ignore[misc]
    assert status == 200 and body.startswith(b"slow done")
    # The SIGTERM above stops it (a second one, once the drain is over, would find default handling).
    assert srv.proc.wait(20) == 0  # type: ignore[union-attr]
    srv.stop()


@pytest.mark.parametrize("isolation", MODES)
def test_the_response_in_flight_at_sigterm_says_connection_close(tmp_path: Path, isolation: str) -> None:
    # A keep-alive connection whose request is in flight when the drain begins: its response is the last one
    # on it, and it says so (Connection: close), so the client does not send its next request on a connection
    # that is closing (it would be lost in the race with the close, as a reset or an unanswered request).
    srv = ServerProcess("cores_app:app", "--cores", "1", "--isolation", isolation, "--grace", "10",
                        tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            f = s.makefile("rb")
            s.sendall(b"GET /slow?delay=0 HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, _ = read_response(f)
            assert status == 200 and headers.get("connection") != "close"  # kept alive before the drain
            s.sendall(b"GET /slow?delay=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            time.sleep(0.3)  # the request is in flight
            srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            status, headers, body = read_response(f)
            assert status == 200 and body.startswith(b"slow done")
            assert headers.get("connection") == "close", headers
            assert f.read() == b""
        assert srv.proc.wait(20) == 0  # type: ignore[union-attr]
    finally:
        srv.stop()


def pipelined_requests(port: int, connections: int, per_connection: int, path: str = "/pair") -> int:
    """Sends per_connection pipelined GETs on each of `connections` connections; returns the 200s read."""
    ok = 0
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            f = s.makefile("rb")
            sent = 0
            while sent < per_connection:
                batch = min(8, per_connection - sent)  # under the server's in-flight cap
                s.sendall(b"".join(f"GET {path}?n={sent + i} HTTP/1.1\r\nHost: t\r\nUser-Agent: ops-test\r\n\r\n".encode()
                                   for i in range(batch)))
                for _ in range(batch):
                    status, _, _ = read_response(f)
                    ok += status == 200
                sent += batch
    return ok


@pytest.mark.parametrize("fmt", ["default", "json"])
def test_access_log_writes_one_line_per_request(tmp_path: Path, fmt: str) -> None:
    log = tmp_path / "access.log"
    srv = ServerProcess("cores_app:app", "--cores", "2", "--access-log", "--access-log-format", fmt,
                        "--access-log-file", str(log), tmp=tmp_path).start()
    try:
        assert pipelined_requests(srv.port, 100, 100) == 10_000
    finally:
        assert srv.stop() == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 10_000, f"{len(lines)} access log lines for 10,000 requests"
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert {r["status"] for r in records} == {200}
        assert {r["method"] for r in records} == {"GET"}
        assert {r["path"] for r in records} == {"/pair"}
        assert len({r["query"] for r in records}) == 100  # n=0..99 on each connection
        assert {r["pair"] for r in records} <= {0, 1}
    else:
        pattern = re.compile(r'127\.0\.0\.1:\d+ "GET /pair\?n=\d+" 200 \d+ \d+us pair=[01]$')
        bad = [line for line in lines if not pattern.search(line)]
        assert not bad, bad[:3]


def test_bad_access_log_format_stops_start_up_with_one_line(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "cadeloop", "cores_app:app", "--access-log",
                        "--access-log-format", "{nosuchfield}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "access_log_format" in p.stderr and "nosuchfield" in p.stderr, p.stderr


def test_log_level_warning_hides_the_info_lines(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from server_harness import APPS

    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "cadeloop", "cores_app:app", "--port", str(port),
                                 "--app-dir", str(APPS), "--log-level", "warning"], stderr=f)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/pair").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    text = err.read_text()
    assert "listening on" not in text and "stopped:" not in text, text


def test_dashboard_draws_a_real_server_under_load(tmp_path: Path) -> None:
    from test_stats_endpoint import chart_plots, coloured_pixels, read_png, run_chromium

    srv = ServerProcess("cores_app:app", "--cores", "2", "--stats-port", "0", tmp=tmp_path).start()
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                client.get(srv.url + "/pair")

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        page = stats_url(srv) + "/"
        time.sleep(1.0)
        dom = run_chromium(["--dump-dom"], page, tmp_path / "profile-dom")
        plots = chart_plots(dom.stdout)
        assert plots, "no chart in the page"
        assert all(points > 0 for _, points in plots.values()), plots
        shot = tmp_path / "dashboard.png"
        out = run_chromium([f"--screenshot={shot}"], page, tmp_path / "profile-shot")
        assert shot.exists(), out.stderr
        assert read_png(shot)[:2] == (1200, 900)
        # Requests per second and latency move under load; connections and ring depths of a
        # steady two-connection load are flat lines on the axis (their points are checked above).
        for name in ("c-rps", "c-latency"):
            assert coloured_pixels(shot, plots[name][0]) > 40, f"chart {name} looks empty in the screenshot"
    finally:
        stop.set()
        for w in workers:
            w.join(10)
        assert srv.stop() == 0


@pytest.mark.parametrize("isolation", MODES)
def test_loop_stats_show_the_pair_that_runs_the_loop(tmp_path: Path, isolation: str) -> None:
    srv = ServerProcess("cores_app:app", "--cores", "2", "--isolation", isolation, tmp=tmp_path).start()
    try:
        with httpx.Client(timeout=10) as client:
            for _ in range(5):
                assert client.get(srv.url + "/pair").status_code == 200
            stats = client.get(srv.url + "/loop-stats").json()
        assert stats["page_index"] == stats["pair"]
        assert stats["requests"] >= 6  # the five on this connection and this one, maybe others
    finally:
        assert srv.stop() == 0
