"""The watchdog: stuck pairs and frozen processes, against real server processes.

A request that blocks its app thread in `time.sleep()` (watchdog_app.py's
/block) leaves that pair's app with work and no progress. After
`stuck_timeout` the pair must be marked stuck: new connections are served by
the other pair (none hangs), /stats and /metrics say `stuck`, the log carries
the app thread's Python stack once, /readyz stays 200 while one pair serves
and turns 503 when every pair is stuck; the pair serves again once the app
returns. A worker or serving process frozen with SIGSTOP stops beating: it is
killed and restarted. Both Pythons: sub-interpreter pairs (3.13) and worker
processes (3.11, and 3.13 with --isolation processes).
"""

from __future__ import annotations

import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server_harness import ServerProcess, read_response

SUBINTERPRETERS = sys.version_info >= (3, 13)
MODES = ["subinterpreters", "processes"] if SUBINTERPRETERS else ["processes"]
STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def get(port: int, path: str, timeout: float = 5.0, host: str = "x") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        status, _, body = read_response(s.makefile("rb"))
        return status, body


class Blocker:
    """A client whose request blocks one pair's app thread in time.sleep(secs)."""

    def __init__(self, port: int, secs: float, until: Path | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=secs + 30)
        query = f"secs={secs}" + (f"&until={until}" if until is not None else "")
        self.sock.sendall(f"GET /block?{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        self.answer: tuple[int, bytes] | None = None
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        try:
            status, _, body = read_response(self.sock.makefile("rb"))
            self.answer = (status, body)
        except (OSError, EOFError, ValueError, IndexError):
            pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(30)


def start(tmp_path: Path, isolation: str, timeout: str = "1") -> tuple[ServerProcess, int]:
    srv = ServerProcess("watchdog_app:app", "--cores", "2", "--isolation", isolation, "--stats-port", "0",
                        "--stuck-timeout", timeout, tmp=tmp_path).start()
    return srv, int(srv.wait_log(STATS.pattern).group(1))


def stats(stats_port: int) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=5).json()  # type: ignore[no-any-return]


def wait_stuck(stats_port: int, count: int, timeout: float = 10.0) -> list[int]:
    """Polls /stats until `count` pairs are stuck; their indices."""
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = stats(stats_port)
        stuck = [p["index"] for p in doc["pairs"] if p["state"] == "stuck"]
        if len(stuck) >= count:
            return stuck
        time.sleep(0.05)
    raise AssertionError(f"{count} stuck pair(s) expected: {doc}")


def readyz(stats_port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{stats_port}/readyz", timeout=5).status_code


@pytest.mark.parametrize("isolation", MODES)
def test_a_blocked_pair_is_stuck_and_the_other_pair_takes_new_connections(tmp_path: Path, isolation: str) -> None:
    # stuck_timeout 2: the checks below have 4 s before the stuck process would be killed.
    srv, stats_port = start(tmp_path, isolation, timeout="2")
    release = tmp_path / "release"
    blocker = None
    try:
        blocker = Blocker(srv.port, 60, until=release)
        (stuck,) = wait_stuck(stats_port, 1)
        other = 1 - stuck
        doc = stats(stats_port)
        assert doc["totals"]["pairs_stuck"] == 1 and doc["pairs"][stuck]["stuck_episodes"] == 1, doc
        metrics = httpx.get(f"http://127.0.0.1:{stats_port}/metrics", timeout=5).text
        assert f'cadeloop_pair_state{{pair="{stuck}",state="stuck"}} 1' in metrics, metrics
        assert f'cadeloop_stuck_episodes_total{{pair="{stuck}"}} 1' in metrics, metrics
        assert readyz(stats_port) == 200
        # New connections: every one answered, and by the pair that is not stuck (a hang would
        # time out: half of them went to the stuck pair before the watchdog).
        for _ in range(10):
            status, body = get(srv.port, "/pair", timeout=2)
            assert status == 200 and body.startswith(f"pair {other} ".encode()), (body, srv.log())
        # The log: one line naming the pair, and its app thread's Python stack, once.
        srv.wait_log(rf"cadeloop: pair {stuck} is stuck: its app thread made no progress for 2 s")
        srv.wait_log(rf"pair {stuck}: stuck: the app thread's Python stack \(most recent call last\):\n"
                     rf"(  File .*\n.*\n)*  File \"[^\"]*watchdog_app\.py\", line \d+, in app\n"
                     rf"\s+time\.sleep\(")
        assert srv.log().count("the app thread's Python stack") == 1, srv.log()
        # The app returns: the pair progresses, accepts again and serves.
        release.touch()
        blocker.thread.join(10)
        assert blocker.answer is not None and blocker.answer[0] == 200, srv.log()
        srv.wait_log(rf"pair {stuck} progresses again")
        seen = set()
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.add(get(srv.port, "/pair", timeout=2)[1].split()[1])
        assert seen == {b"0", b"1"}, srv.log()
        assert [p["state"] for p in stats(stats_port)["pairs"]] == ["serving", "serving"]
        assert "the watchdog kills" not in srv.log()
    finally:
        release.touch()
        if blocker is not None:
            blocker.close()
        rc = srv.stop()
    assert rc == 0, srv.log()


@pytest.mark.parametrize("isolation", MODES)
def test_readyz_is_503_only_when_every_pair_is_stuck(tmp_path: Path, isolation: str) -> None:
    # stuck_timeout 3: the second pair is marked stuck at least 2 s before the first one's
    # process is killed (no progress for three timeouts).
    srv, stats_port = start(tmp_path, isolation, timeout="3")
    blockers = []
    try:
        blockers.append(Blocker(srv.port, 60))
        wait_stuck(stats_port, 1)
        assert readyz(stats_port) == 200
        # The stuck pair does not accept: this one reaches the other pair.
        blockers.append(Blocker(srv.port, 60))
        deadline = time.monotonic() + 10
        seen = []
        while time.monotonic() < deadline:
            r = httpx.get(f"http://127.0.0.1:{stats_port}/readyz", timeout=5)
            seen.append((r.status_code, r.text))
            if r.status_code == 503:
                break
            time.sleep(0.05)
        assert seen[-1] == (503, "not ready: every pair is stuck\n"), (seen, srv.log())
        assert httpx.get(f"http://127.0.0.1:{stats_port}/healthz", timeout=5).status_code == 200
        # Both processes are killed and restarted: ready again.
        deadline = time.monotonic() + 20
        while (readyz(stats_port) != 200 or stats(stats_port)["restarts"] < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert readyz(stats_port) == 200 and stats(stats_port)["restarts"] == 2, srv.log()
        assert get(srv.port, "/pair", timeout=2)[0] == 200
    finally:
        for b in blockers:
            b.close()
        rc = srv.stop()
    assert rc == 0, srv.log()


@pytest.mark.parametrize("isolation", MODES)
def test_a_pair_stuck_for_good_has_its_process_killed_and_restarted(tmp_path: Path, isolation: str) -> None:
    srv, stats_port = start(tmp_path, isolation)
    blocker = None
    try:
        blocker = Blocker(srv.port, 60)
        (stuck,) = wait_stuck(stats_port, 1)
        pid = stats(stats_port)["pairs"][stuck]["pid"]
        srv.wait_log(rf"\(pid {pid}\) made no progress for \d+\.\ds \(stuck\); the watchdog kills it")
        srv.wait_log(rf"\(pid {pid}\) killed by SIGKILL; restarting it")
        blocker.thread.join(10)
        assert blocker.answer is None  # its connection died with the process
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                seen.add(get(srv.port, "/pair", timeout=2)[1].split()[1])
            except (OSError, EOFError, ValueError, IndexError):
                time.sleep(0.01)
        assert seen == {b"0", b"1"}, srv.log()
        doc = stats(stats_port)
        assert doc["restarts"] == 1 and doc["pairs"][stuck]["pid"] != pid, doc
    finally:
        if blocker is not None:
            blocker.close()
        rc = srv.stop()
    assert rc == 0, srv.log()


@pytest.mark.parametrize("isolation", MODES)
def test_a_stopped_process_is_killed_and_restarted(tmp_path: Path, isolation: str) -> None:
    srv, stats_port = start(tmp_path, isolation)
    try:
        pid = stats(stats_port)["pairs"][0]["pid"]
        assert pid != srv.pid
        import os

        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        srv.wait_log(rf"\(pid {pid}\) stopped beating for \d+\.\ds \(the process is stopped\); the watchdog kills it")
        srv.wait_log(rf"\(pid {pid}\) killed by SIGKILL; restarting it")
        print(f"{isolation}: killed {time.monotonic() - stopped_at:.1f} s after SIGSTOP")
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                seen.add(get(srv.port, "/pair", timeout=2)[1].split()[1])
            except (OSError, EOFError, ValueError, IndexError):
                time.sleep(0.01)
        assert seen == {b"0", b"1"}, srv.log()
        doc = stats(stats_port)
        assert doc["restarts"] == 1 and doc["pairs"][0]["pid"] != pid, doc
        assert readyz(stats_port) == 200
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_stuck_timeout_0_turns_the_watchdog_off(tmp_path: Path) -> None:
    srv, stats_port = start(tmp_path, MODES[0], timeout="0")
    blocker = None
    try:
        blocker = Blocker(srv.port, 2.0)
        time.sleep(1.5)
        assert [p["state"] for p in stats(stats_port)["pairs"]] == ["serving", "serving"]
        blocker.thread.join(10)
        assert blocker.answer is not None and blocker.answer[0] == 200
        assert "is stuck" not in srv.log()
    finally:
        if blocker is not None:
            blocker.close()
        rc = srv.stop()
    assert rc == 0, srv.log()
