"""Slow and hostile clients against a real server: bodies that never come, readers that never
read, the memory budget, RFC 9112 host and request-line rules, and the Unix socket's mode.

Every test uses raw sockets and small counts: a handful of hostile connections against a
server whose budgets are set small for the test (bench/slow_clients.py runs thousands
against the defaults).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_harness import APPS, ServerProcess, raw_exchange, read_response

STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def stats_of(srv: ServerProcess) -> dict:  # type: ignore[type-arg]
    port = int(srv.wait_log(STATS.pattern).group(1))
    return httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()["totals"]


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        status, _, body = read_response(s.makefile("rb"))
        return status, body


def events(port: int) -> list[str]:
    return json.loads(get(port, "/events")[1])


def wait_for(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def slow_body(port: int) -> socket.socket:
    """A POST whose head says 10 body bytes that never come."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    return s


def read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while b := s.recv(65536):
            chunks.append(b)
    except (socket.timeout, ConnectionResetError):
        pass
    return b"".join(chunks)


# ---------------------------------------------------------------- slow bodies


def test_stalled_bodies_get_408_and_a_normal_client_is_served(tmp_path: Path) -> None:
    # Eight bodies that never come fill the in-flight budget of 8: without a body timeout the
    # pair stops accepting until they leave, and the normal client waits forever.
    srv = ServerProcess("hostile_app:app", "--max-requests-in-flight", "8", "--body-timeout", "1",
                        "--stats-port", "0", tmp=tmp_path).start()
    try:
        attackers = [slow_body(srv.port) for _ in range(8)]
        time.sleep(0.3)
        t0 = time.monotonic()
        status, body = get(srv.port, "/hello", timeout=8)
        assert (status, body) == (200, b"hello")
        assert time.monotonic() - t0 < 5
        for s in attackers:
            answer = read_all(s)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            s.close()
        wait_for(lambda: events(srv.port).count("upload: http.disconnect") == 8)
        assert stats_of(srv)["body_timeouts"] == 8
    finally:
        assert srv.stop() == 0


def test_requests_waiting_for_their_body_do_not_stop_accepting(tmp_path: Path) -> None:
    # Default body_timeout (10 s), an in-flight budget of 4 held by bodies that do not come:
    # they cost the app a waiting coroutine, not work, so the pair keeps accepting and the
    # new client is served at once (before, it waited until the attackers left).
    srv = ServerProcess("hostile_app:app", "--max-requests-in-flight", "4", tmp=tmp_path).start()
    try:
        attackers = [slow_body(srv.port) for _ in range(4)]
        time.sleep(0.5)
        t0 = time.monotonic()
        assert get(srv.port, "/hello", timeout=8) == (200, b"hello")
        assert time.monotonic() - t0 < 3
        for s in attackers:
            assert not _readable(s)  # still waiting: nothing was cut to make room
            s.close()
    finally:
        assert srv.stop() == 0


def test_a_body_below_the_minimum_rate_is_cut(tmp_path: Path) -> None:
    # One byte every 0.3 s never stalls for body_timeout (1 s) but stays far below 1 KiB/s.
    srv = ServerProcess("hostile_app:app", "--body-timeout", "1", "--body-min-rate", "1024",
                        "--stats-port", "0", tmp=tmp_path).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        answered_while_sending = False
        for _ in range(30):  # at most 9 s, 30 bytes
            if _readable(s):
                answered_while_sending = True
                break
            time.sleep(0.3)
            try:
                s.sendall(b"a")
            except OSError:
                answered_while_sending = True
                break
        assert answered_while_sending
        assert read_all(s).startswith(b"HTTP/1.1 408 ")
        s.close()
        # A body that keeps a good pace is not cut.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as ok:
            ok.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 6000\r\nConnection: close\r\n\r\n")
            for _ in range(6):
                time.sleep(0.3)
                ok.sendall(b"b" * 1000)
            assert read_all(ok).endswith(b"got 6000")
        assert stats_of(srv)["body_timeouts"] == 1
    finally:
        assert srv.stop() == 0


def _readable(s: socket.socket) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


# ---------------------------------------------------------------- slow readers


def rss_mib(srv: ServerProcess) -> float:
    """RSS of the server and its children (worker processes) in MiB."""
    total = 0
    pids = [srv.pid]
    try:
        children = Path(f"/proc/{srv.pid}/task/{srv.pid}/children").read_text().split()
        pids += [int(p) for p in children]
    except OSError:
        pass
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def slow_reader(port: int, mb: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /big?mb={mb} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def test_readers_that_never_read_are_cut_by_the_write_timeout(tmp_path: Path) -> None:
    srv = ServerProcess("hostile_app:app", "--write-timeout", "1", "--stats-port", "0",
                        tmp=tmp_path).start()
    try:
        readers = [slow_reader(srv.port, 64) for _ in range(4)]
        wait_for(lambda: events(srv.port).count("big: gone") == 4, timeout=15)
        assert stats_of(srv)["write_timeouts"] == 4
        for s in readers:
            s.close()
        assert get(srv.port, "/hello") == (200, b"hello")
    finally:
        assert srv.stop() == 0


def test_a_pipelined_response_waiting_behind_a_slow_one_is_not_cut_by_the_write_timeout(
        tmp_path: Path) -> None:
    # The second response is ready at once but must wait for the first (1.5 s, three times
    # write_timeout): nothing can be written meanwhile, so no write deadline runs, and the
    # client gets both in order.
    srv = ServerProcess("hostile_app:app", "--write-timeout", "0.5", "--stats-port", "0",
                        tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /hold?s=1.5 HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            f = s.makefile("rb")
            assert read_response(f)[::2] == (200, b"held")
            assert read_response(f)[::2] == (200, b"hello")
        assert stats_of(srv)["write_timeouts"] == 0
    finally:
        assert srv.stop() == 0


def test_the_memory_budget_bounds_unsent_bytes_and_rss_and_cuts_the_slowest(tmp_path: Path) -> None:
    # 32 readers that never read, each asking for 64 MiB: each may have send_high_mark (1 MiB)
    # staged by the app, but the pair holds at most memory_budget (8 MiB) unsent: the
    # connections stalled the longest are cut as the app's bytes arrive.
    srv = ServerProcess("hostile_app:app", "--memory-budget", "8MiB", "--stats-port", "0",
                        tmp=tmp_path).start()
    try:
        base = rss_mib(srv)
        readers = [slow_reader(srv.port, 64) for _ in range(32)]
        wait_for(lambda: stats_of(srv)["budget_cuts"] >= 8, timeout=15)
        time.sleep(0.5)
        stats = stats_of(srv)
        assert stats["unsent_bytes"] <= (8 << 20) + (1 << 20)
        grown = rss_mib(srv) - base
        assert grown < 32 + 96, f"RSS grew by {grown:.0f} MiB"
        assert "big: gone" in events(srv.port)
        for s in readers:
            s.close()
        assert get(srv.port, "/hello") == (200, b"hello")
    finally:
        assert srv.stop() == 0


def test_a_reading_client_gets_its_big_response_while_slow_readers_hold_the_gate(tmp_path: Path) -> None:
    # 20 readers that never read fill the app side's staging gate (1.25 x a 1 MiB budget) many
    # times over. A send() over 4 KiB then waits before its bytes are copied, and the reader
    # whose app has waited longest for it to drain is cut, so a client that reads still gets
    # its 2 MiB, and a short response passes the gate at once.
    srv = ServerProcess("hostile_app:app", "--memory-budget", "1MiB", "--write-timeout", "60",
                        tmp=tmp_path).start()
    readers: list[socket.socket] = []
    try:
        readers = [slow_reader(srv.port, 64) for _ in range(20)]
        time.sleep(0.5)
        assert get(srv.port, "/hello") == (200, b"hello")
        r = httpx.get(f"{srv.url}/big?mb=2", timeout=10)
        assert r.status_code == 200 and len(r.content) == 2 << 20
        assert events(srv.port).count("big: gone") >= 1
    finally:
        for s in readers:  # closed here too when an assertion fails (else the next test meets their GC)
            s.close()
        assert srv.stop() == 0


def held_upload(port: int, size: int) -> socket.socket:
    """A POST whose app answers after 3 s without reading its body: the body sits unread in the server."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST /hold?s=3 HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
    s.sendall(b"u" * size)
    return s


def test_requests_over_the_memory_budget_get_503(tmp_path: Path) -> None:
    # Body bytes the app has not read count against the budget and are never cut (only unsent
    # output is): 8 uploads of 256 KiB (body_window) each keep the pair over a 1 MiB budget until
    # their app answers them, 3 s later. Meanwhile every new request gets 503 and a close.
    srv = ServerProcess("hostile_app:app", "--memory-budget", "1MiB", "--body-window", "256KiB",
                        "--stats-port", "0", tmp=tmp_path).start()
    try:
        assert get(srv.port, "/hello") == (200, b"hello")
        uploads = [held_upload(srv.port, 256 << 10) for _ in range(8)]
        wait_for(lambda: get(srv.port, "/hello")[0] == 503, timeout=2)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive asked: closed anyway
            f = s.makefile("rb")
            status, headers, _ = read_response(f)
            assert status == 503
            assert headers.get("connection") == "close"
            assert f.read() == b""
        assert stats_of(srv)["budget_refusals"] >= 2
        # The app answers each accepted upload after 3 s: the bytes leave the budget. The first
        # four (1 MiB) are always accepted; a later one whose head came in after the pair was
        # over the budget (a loaded machine reads the uploads one by one) is itself refused.
        statuses = []
        for s in uploads:
            s.settimeout(10)
            statuses.append(read_response(s.makefile("rb"))[0])
            s.close()
        assert statuses[:4] == [200] * 4 and set(statuses) <= {200, 503}, statuses
        assert get(srv.port, "/hello") == (200, b"hello")
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- drain delay


def readyz(stats_port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{stats_port}/readyz", timeout=2).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.parametrize("cores", ["1", "2"])
def test_drain_delay_serves_on_while_readyz_says_503(tmp_path: Path, cores: str) -> None:
    srv = ServerProcess("hostile_app:app", "--drain-delay", "5", "--cores", cores, "--stats-port", "0",
                        tmp=tmp_path).start()
    stats_port = int(srv.wait_log(STATS.pattern).group(1))
    assert readyz(stats_port) == 200
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    wait_for(lambda: readyz(stats_port) == 503, timeout=2)
    # The load balancer has not taken the instance out yet: new connections, and requests on a
    # kept-alive one, are still served during the delay.
    with httpx.Client(base_url=srv.url, timeout=5) as client:
        for _ in range(3):
            r = client.post("/upload", content=b"abc")
            assert (r.status_code, r.content) == (200, b"got 3")
            assert get(srv.port, "/hello") == (200, b"hello")
    srv.proc.wait(15)
    assert time.monotonic() - signalled >= 5
    assert srv.stop() == 0  # it exited by itself: only its code is read
    assert "drain_delay" in srv.log()


def test_a_second_signal_cuts_the_drain_delay_short(tmp_path: Path) -> None:
    srv = ServerProcess("hostile_app:app", "--drain-delay", "60", tmp=tmp_path).start()
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGTERM)
    srv.wait_log("drain_delay")
    signalled = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(15)
    assert time.monotonic() - signalled < 10
    assert srv.stop() == 0


# ---------------------------------------------------------------- protocol strictness


@pytest.mark.parametrize("request_bytes", [
    b"GET /host HTTP/1.1\r\nHost: a, b\r\n\r\n",
    b"GET /host HTTP/1.1\r\nHost: a b\r\n\r\n",
    b"GET /host HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /host HTTP/1.1\r\n\r\n",
    b"GET /host HTTP/1.1\r\nHost: user@a\r\n\r\n",
    b"GET http:///host HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST * HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
], ids=["host-list", "host-space", "two-hosts", "no-host", "host-userinfo", "absolute-empty-host",
        "get-asterisk", "post-asterisk"])
def test_bad_hosts_and_targets_get_400_and_a_close(tmp_path: Path, request_bytes: bytes) -> None:
    srv = ServerProcess("hostile_app:app", tmp=tmp_path).start()
    try:
        answer = raw_exchange(srv.port, request_bytes)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"connection: close" in answer.lower()
    finally:
        assert srv.stop() == 0


def test_an_http09_request_line_gets_400_at_once(tmp_path: Path) -> None:
    srv = ServerProcess("hostile_app:app", tmp=tmp_path).start()
    try:
        # A 0.9 client sends the line and waits: the answer comes without another byte.
        t0 = time.monotonic()
        answer = raw_exchange(srv.port, b"GET /hello\r\n", timeout=8)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert time.monotonic() - t0 < 5
        assert raw_exchange(srv.port, b"GET /hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    finally:
        assert srv.stop() == 0


def test_the_absolute_form_host_wins_and_options_asterisk_is_served(tmp_path: Path) -> None:
    srv = ServerProcess("hostile_app:app", tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"GET http://real.example:8443/host HTTP/1.1\r\nHost: other.example\r\n"
                      b"Connection: close\r\n\r\n")
            status, _, body = read_response(s.makefile("rb"))
        assert status == 200
        seen = json.loads(body)
        assert seen["host"] == ["real.example:8443"]
        assert seen["server"][0] == "127.0.0.1"  # the socket's address, whatever the Host says
        answer = raw_exchange(srv.port, b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 404 "), answer  # reached the app, which knows no '*'
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- the Unix socket's mode


@pytest.mark.parametrize("mode", [None, "0600"])
def test_the_unix_socket_mode_ignores_the_umask(tmp_path: Path, mode: str | None) -> None:
    path = tmp_path / "s.sock"
    argv = [sys.executable, "-m", "cadeloop", "hostile_app:app", "--app-dir", str(APPS), "--uds", str(path)]
    if mode is not None:
        argv += ["--uds-mode", mode]
    log = open(tmp_path / "uds.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.umask(0))
    try:
        wait_for(lambda: path.exists() and "listening on" in (tmp_path / "uds.log").read_text(), timeout=30)
        assert stat.S_IMODE(path.stat().st_mode) == (0o660 if mode is None else 0o600)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(path))
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_response(s.makefile("rb"))[:1] == (200,)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        log.close()


def test_a_bad_uds_mode_is_named_in_one_line(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "cadeloop", "hostile_app:app", "--app-dir", str(APPS),
                        "--uds", str(tmp_path / "s.sock"), "--uds-mode", "0999"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "uds-mode" in lines[0] and "0999" in lines[0], p.stderr
