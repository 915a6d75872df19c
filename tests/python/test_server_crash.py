"""A pair that crashes, a drain cut short, and start-up hygiene, against real server processes.

A request that calls `os._exit(1)` or segfaults takes down the process its
pair runs in: a worker process (3.11, `--isolation processes`) or the
serving process of the sub-interpreter pairs (3.13). The port must answer
again within 1 s, one log line must name the death, /stats and /metrics must
count the restart, and SIGTERM afterwards must still exit 0.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
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

DEATHS = {
    "exit": r"exited with code 1 \(pair \d called os\._exit\(1\) at \S*crash_app\.py:\d+\)",
    "segv": r"killed by SIGSEGV",
}


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        status, _, body = read_response(s.makefile("rb"))
        return status, body


@pytest.mark.parametrize("kind", ["exit", "segv"])
@pytest.mark.parametrize("isolation", MODES)
def test_a_crashing_request_leaves_the_port_dark_for_under_a_second(tmp_path: Path, isolation: str, kind: str) -> None:
    srv = ServerProcess("crash_app:app", "--cores", "2", "--isolation", isolation, "--stats-port", "0",
                        tmp=tmp_path).start()
    stats_port = int(srv.wait_log(STATS.pattern).group(1))
    try:
        crashed_at = time.monotonic()
        with pytest.raises((OSError, EOFError, ValueError, IndexError)):
            get(srv.port, f"/{kind}")
        # Until the port answers again; each try on a fresh connection (any pair may take it).
        answered_after = None
        while time.monotonic() - crashed_at < 10:
            try:
                status, _ = get(srv.port, "/pair", timeout=2)
                if status == 200:
                    answered_after = time.monotonic() - crashed_at
                    break
            except (OSError, EOFError, ValueError, IndexError):
                time.sleep(0.01)
        assert answered_after is not None and answered_after < 1.0, (answered_after, srv.log())
        print(f"{isolation} {kind}: answered again after {answered_after * 1000:.0f} ms")
        line = srv.wait_log(rf"cadeloop: .*\(pid \d+\) {DEATHS[kind]}; restarting it").group(0)
        if isolation == "subinterpreters":
            assert re.search(r"the serving process of pair \d \(pid", line), line
        else:
            assert re.search(r"pair \d \(pid", line), line
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=5).json()
        assert stats["restarts"] == 1, stats
        metrics = httpx.get(f"http://127.0.0.1:{stats_port}/metrics", timeout=5).text
        assert "\ncadeloop_restarts_total 1\n" in metrics
        # Both pairs serve again (the dead one once its process restarted).
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                seen.add(get(srv.port, "/pair")[1].split()[1])
            except (OSError, EOFError, ValueError, IndexError):
                time.sleep(0.01)  # queued on the dead pair's socket as it died: reset
        assert seen == {b"0", b"1"}, srv.log()
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()


@pytest.mark.parametrize("isolation", MODES)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("path", ["/hold", "/block?secs=60"])
def test_a_second_signal_ends_the_drain_at_once(tmp_path: Path, isolation: str, sig: int, path: str) -> None:
    srv = ServerProcess("crash_app:app", "--cores", "2", "--isolation", isolation, "--grace", "60",
                        tmp=tmp_path).start()
    held = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    held.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    time.sleep(0.5)
    assert srv.proc is not None
    srv.proc.send_signal(sig)
    time.sleep(0.5)
    started = time.monotonic()
    rc = srv.stop(sig)
    took = time.monotonic() - started
    held.close()
    name = signal.Signals(sig).name
    assert f"{name} again: cutting the drain short" in srv.log()
    assert took < 5, (took, srv.log())
    # An app that took the cancellation ends cleanly (0); one blocked outside its loop is killed (1).
    assert rc == (0 if path == "/hold" else 1), (rc, srv.log())


def test_a_second_signal_ends_the_drain_of_one_pair(tmp_path: Path) -> None:
    srv = ServerProcess("crash_app:app", "--grace", "60", tmp=tmp_path).start()
    held = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    held.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.5)
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    started = time.monotonic()
    rc = srv.stop(signal.SIGTERM)
    assert time.monotonic() - started < 5, srv.log()
    held.close()
    assert rc == 0, srv.log()
    assert "SIGTERM again: cutting the drain short" in srv.log()


def _lower_nofile(soft: int, hard: int):  # type: ignore[no-untyped-def]
    def go() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return go


def test_soft_fd_limit_is_raised_to_the_hard_limit_and_a_low_one_is_named(tmp_path: Path) -> None:
    import subprocess

    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cadeloop", "crash_app:app", "--port", "0", "--app-dir",
             str(Path(__file__).parent / "server_apps"), "--max-connections", "10000"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=_lower_nofile(256, 2048))
        try:
            deadline = time.monotonic() + 30
            while "listening on" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            limits = Path(f"/proc/{proc.pid}/limits").read_text()
            soft = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits)
            assert soft is not None and soft.groups() == ("2048", "2048"), limits
            text = log.read_text()
            warnings = [line for line in text.splitlines() if "open files" in line]
            assert len(warnings) == 1, text
            assert "2048" in warnings[0] and "max_connections" in warnings[0], warnings
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()


def test_a_high_enough_fd_limit_gives_no_warning(tmp_path: Path) -> None:
    srv = ServerProcess("crash_app:app", "--max-connections", "100", tmp=tmp_path).start()
    rc = srv.stop()
    assert rc == 0
    assert "open files" not in srv.log(), srv.log()


def test_clients_leaving_a_streamed_response_log_no_error(tmp_path: Path) -> None:
    srv = ServerProcess("crash_app:app", "--log-level", "debug", tmp=tmp_path).start()

    def leave() -> None:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /stream?n=2000 HTTP/1.1\r\nHost: x\r\n\r\n")
            got = 0
            while got < 64 * 1024:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    threads = [threading.Thread(target=leave) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    time.sleep(1.0)
    status, body = get(srv.port, "/pair")
    assert status == 200
    rc = srv.stop()
    log = srv.log()
    assert rc == 0, log
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log
    # One debug line per client that left (not an app error): at most one each.
    assert 1 <= log.count("client disconnected during the response") <= 50, log


@pytest.mark.parametrize("isolation", MODES)
def test_serving_processes_one_puts_every_pair_in_one_process(tmp_path: Path, isolation: str) -> None:
    # Sub-interpreter pairs: serving_processes 1 puts both pairs in one serving process, so a
    # crash takes both (the line names them). Worker processes are one per pair whatever it says.
    srv = ServerProcess("crash_app:app", "--cores", "2", "--isolation", isolation, "--serving-processes", "1",
                        tmp=tmp_path).start()
    try:
        children = Path(f"/proc/{srv.pid}/task/{srv.pid}/children").read_text().split()
        assert len(children) == (1 if isolation == "subinterpreters" else 2), srv.log()
        with pytest.raises((OSError, EOFError, ValueError, IndexError)):
            get(srv.port, "/exit")
        line = srv.wait_log(r"cadeloop: .*\(pid \d+\) exited with code 1.*; restarting it").group(0)
        if isolation == "subinterpreters":
            assert "the serving process of pairs 0, 1 (pid" in line, line
        else:
            assert re.search(r"cadeloop: pair \d \(pid", line), line
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()
