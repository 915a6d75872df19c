"""The stats endpoint of a real server: the Host allow-list (DNS rebinding), probes under many
idle connections, and what /readyz says about stuck pairs (through a reader of known pairs)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import httpx

from cadeloop import _core
from server_harness import ServerProcess, read_response

STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def exchange(port: int, head: str) -> tuple[int, bytes, bool]:
    """(status, body, closed by the server) of one request sent raw."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.encode())
        f = s.makefile("rb")
        status, _, body = read_response(f)
        s.settimeout(2)
        try:
            closed = f.read(1) == b""
        except (TimeoutError, OSError):
            closed = False
        return status, body, closed


def test_a_host_outside_stats_allowed_hosts_gets_421(tmp_path: Path) -> None:
    srv = ServerProcess("crash_app:app", "--stats-port", "0", "--stats-allowed-hosts", "localhost, Stats.Internal",
                        tmp=tmp_path).start()
    port = int(srv.wait_log(STATS.pattern).group(1))
    try:
        for host in ("evil.example", "evil.example:%d" % port, "127.0.0.1", "localhost.evil.example"):
            status, body, closed = exchange(port, f"GET /stats HTTP/1.1\r\nHost: {host}\r\n\r\n")
            assert (status, closed) == (421, True), (host, status, body)
            assert b"stats_allowed_hosts" in body and b"requests" not in body
        # No Host at all (HTTP/1.0): not allowed either.
        assert exchange(port, "GET /healthz HTTP/1.0\r\n\r\n")[0] == 421
        for host in ("localhost", f"localhost:{port}", "STATS.internal", "stats.internal:1"):
            status, body, _ = exchange(port, f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
            assert status == 200, (host, status, body)
        assert httpx.get(f"http://localhost:{port}/stats", timeout=5).json()["pairs"]
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_without_the_setting_any_host_is_answered() -> None:
    ep = _core.StatsEndpoint(lambda: [{"state": "serving"}], "127.0.0.1", 0, {})
    try:
        assert exchange(ep.port, "GET /healthz HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")[0] == 200
    finally:
        ep.close()


def test_200_idle_connections_on_the_stats_port_leave_the_probes_answered(tmp_path: Path) -> None:
    srv = ServerProcess("crash_app:app", "--cores", "2", "--stats-port", "0", tmp=tmp_path).start()
    port = int(srv.wait_log(STATS.pattern).group(1))
    idle = []
    try:
        for i in range(200):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 3 == 0:
                c.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # a head that never ends
            idle.append(c)
        for path in ("/healthz", "/readyz"):
            status, body, _ = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert status == 200, (path, status, body)
    finally:
        for c in idle:
            c.close()
        rc = srv.stop()
    assert rc == 0, srv.log()


def _endpoint(states: list[str]) -> Any:
    return _core.StatsEndpoint(lambda: [{"state": s} for s in states], "127.0.0.1", 0, {})


def test_readyz_with_stuck_pairs() -> None:
    for states, expected in (
        (["stuck", "serving"], (200, "ready\n")),
        (["serving", "stuck"], (200, "ready\n")),
        (["stuck", "stuck"], (503, "not ready: every pair is stuck\n")),
        (["stuck"], (503, "not ready: pair 0 is stuck\n")),
        (["stuck", "starting"], (503, "not ready: pair 1 is starting\n")),
    ):
        ep = _endpoint(states)
        try:
            r = httpx.get(f"http://127.0.0.1:{ep.port}/readyz", timeout=5)
            assert (r.status_code, r.text) == expected, states
            doc = httpx.get(f"http://127.0.0.1:{ep.port}/stats", timeout=5).json()
            assert [p["state"] for p in doc["pairs"]] == states
            assert doc["totals"]["pairs_stuck"] == states.count("stuck")
        finally:
            ep.close()
