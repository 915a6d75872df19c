"""Solo mode (`--solo-max-batch`, `--solo-spin-us`) against a real `cadeloop` server process.

While a pair's I/O thread has nothing to do it hands the pair's sockets to the app thread, which serves them
from its own loop (one thread, no hand-over per request); it gives them back past solo_max_batch messages in
one pass, and the I/O thread takes them back for a stop or from an app thread stuck in Python (a steal). A
client must see exactly what it sees with two threads: every answer right and in order, bodies whole, a
request read while the app blocks, a prompt stop, a graceful drain. The counters written on exit
(`--stats-json-on-exit`) show that solo mode really ran. Both Pythons: sub-interpreter pairs (3.13) and worker
processes (3.11, and 3.13 with --isolation processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from websockets.sync.client import connect

from server_harness import ServerProcess, read_response
from server_taskset import echo_in_order, one_cpu_server, pipelined_clients

MODES = ["subinterpreters", "processes"] if sys.version_info >= (3, 13) else ["processes"]
STATS = re.compile(r"stats endpoint on http://127\.0\.0\.1:(\d+)/")


def solo_server(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[ServerProcess, Path]:
    """solo_app on one pair, its counters written to the returned file on exit."""
    stats = tmp_path / f"stats-{time.monotonic_ns()}.json"
    srv = ServerProcess("solo_app:app", "--cores", "1", *flags, "--stats-json-on-exit", str(stats), tmp=tmp_path,
                        env=env)
    return srv.start(), stats


def totals(stats: Path) -> dict[str, int]:
    doc: dict[str, int] = json.loads(stats.read_text())
    return doc


def stop_and_count(srv: ServerProcess, stats: Path, signalled: bool = False) -> dict[str, int]:
    """Stops the server (waits for it if it was `signalled` already: a second signal cuts a drain short)."""
    if signalled:
        assert srv.proc is not None
        srv.proc.wait(15)
    rc = srv.stop()
    assert rc == 0, srv.log()
    return totals(stats)


def request(s: socket.socket, method: str, path: str, body: bytes = b"", chunks: list[bytes] | None = None) -> None:
    if chunks is not None:
        framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + framed)
    else:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)


def answered(s: socket.socket) -> bool:
    """Whether the server has sent anything on `s` yet (without waiting)."""
    return bool(select.select([s], [], [], 0)[0])


# ------------------------------------------------------------ one connection


@pytest.mark.parametrize("isolation", MODES)
def test_one_connection_many_requests_and_bodies_in_order(tmp_path: Path, isolation: str) -> None:
    srv, stats = solo_server(tmp_path, "--isolation", isolation)
    sizes = [0, 1, 100, 4096, 16 * 1024, 64 * 1024, 64 * 1024 + 1]
    try:
        echo_in_order(srv.port, 200)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            f = s.makefile("rb")
            for size in sizes:
                body = os.urandom(size)
                request(s, "POST", "/echo", body)
                assert read_response(f)[::2] == (200, body), size
            # Chunked uploads: many small chunks, and a few big ones.
            for chunks in ([b"a" * 7] * 300, [os.urandom(30_000), os.urandom(40_000), b"z"]):
                whole = b"".join(chunks)
                request(s, "POST", "/upload", chunks=chunks)
                status, _, got = read_response(f)
                assert status == 200 and json.loads(got) == {"size": len(whole),
                                                            "sha256": hashlib.sha256(whole).hexdigest()}
        # Connection: close: the answer, then the server closes (a timeout here would raise).
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
                s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                with s.makefile("rb") as f:
                    assert read_response(f)[::2] == (200, b"hello")
                    assert f.read() == b""
    finally:
        t = stop_and_count(srv, stats)
    n = 200 + len(sizes) + 2 + 5
    assert t["requests"] == t["responses"] == n, t
    assert t["solo_passes"] > 0 and t["solo_handoffs"] >= 1, t
    # One thread served them: hardly a wake-up between the threads per request.
    assert t["wakeups_to_app"] + t["wakeups_to_io"] < n / 4, t


def test_a_body_that_comes_slowly_and_a_client_that_goes_away(tmp_path: Path) -> None:
    # The app thread waits in its loop for the rest of a body (and for a disconnect) while it serves the
    # sockets itself: each piece must wake it, and so must the client's close.
    stats = tmp_path / "stats.json"
    srv = ServerProcess("raw_app:app", "--cores", "1", "--stats-json-on-exit", str(stats), tmp=tmp_path).start()
    try:
        echo_in_order(srv.port, 5)
        pieces = [os.urandom(1000 + i) for i in range(6)]
        whole = b"".join(pieces)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(f"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {len(whole)}\r\n\r\n".encode())
            for piece in pieces:
                time.sleep(0.05)
                s.sendall(piece)
            with s.makefile("rb") as f:
                status, _, got = read_response(f)
        assert status == 200 and json.loads(got)["sha256"] == hashlib.sha256(whole).hexdigest()
        assert json.loads(got)["size"] == len(whole)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /longpoll HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
        deadline = time.monotonic() + 5
        while (events := httpx.get(srv.url + "/events").json()) == [] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert events == ["longpoll: http.disconnect"], events
    finally:
        t = stop_and_count(srv, stats)
    assert t["solo_passes"] > 0 and t["solo_handoffs"] >= 1, t


# ------------------------------------------------------ an app that blocks


def test_a_request_is_read_while_the_handler_blocks_the_app_thread(tmp_path: Path) -> None:
    srv, stats = solo_server(tmp_path)
    try:
        echo_in_order(srv.port, 5)  # the pair is idle after these: the app thread has the sockets
        time.sleep(0.2)
        blocker = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        request(blocker, "GET", "/block?secs=1.5")
        time.sleep(0.2)  # the handler is in time.sleep() now
        fast = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        request(fast, "GET", "/hello")
        # A request without Host: the I/O thread answers it with a 400 by itself, so it comes while the app
        # thread still sleeps only if the I/O thread took the sockets back.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as bad:
            bad.sendall(b"GET /hello HTTP/1.1\r\n\r\n")
            status, _, _ = read_response(bad.makefile("rb"))
            assert status == 400
            assert not answered(blocker) and not answered(fast), "the 400 came after the blocked handler ended"
        # The app thread answers in order: the blocked handler first, then the request read meanwhile.
        assert read_response(blocker.makefile("rb"))[::2] == (200, b"blocked 1.5")
        assert read_response(fast.makefile("rb"))[::2] == (200, b"hello")
        blocker.close()
        fast.close()
        echo_in_order(srv.port, 5)
    finally:
        t = stop_and_count(srv, stats)
    assert t["solo_steals"] >= 1 and t["solo_passes"] > 0, t


def test_an_app_thread_still_blocked_is_not_handed_the_sockets_again(tmp_path: Path) -> None:
    # Once the I/O thread took the sockets from an app thread blocked in a handler, it should keep them until
    # that thread is back in its loop: each hand-over to a thread that cannot serve them leaves every
    # connection of the pair unserved until the next steal (5-10 ms later). One 1 s block: one steal.
    srv, stats = solo_server(tmp_path)
    try:
        echo_in_order(srv.port, 3)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            request(s, "GET", "/block?secs=1")
            with s.makefile("rb") as f:
                assert read_response(f)[::2] == (200, b"blocked 1.0")
        echo_in_order(srv.port, 3)
    finally:
        t = stop_and_count(srv, stats)
    assert 1 <= t["solo_steals"] <= 3, {k: t[k] for k in ("solo_steals", "solo_handoffs", "solo_passes")}


def test_a_slow_reader_of_4_mib_while_the_app_blocks_does_not_hang(tmp_path: Path) -> None:
    srv, stats = solo_server(tmp_path)
    try:
        echo_in_order(srv.port, 3)
        reader = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        request(reader, "GET", "/big?mb=4")
        time.sleep(0.2)  # the response fills the socket buffers and waits for the reader
        blocker = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        request(blocker, "GET", "/block?secs=0.5")
        time.sleep(0.1)
        fast = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        request(fast, "POST", "/echo", b"meanwhile")
        # Now read the 4 MiB: all of it comes, while and after the app blocks.
        status, headers, body = read_response(reader.makefile("rb"))
        assert status == 200 and len(body) == 4 << 20 and body == b"y" * (4 << 20)
        assert read_response(blocker.makefile("rb"))[::2] == (200, b"blocked 0.5")
        assert read_response(fast.makefile("rb"))[::2] == (200, b"meanwhile")
        for s in (reader, blocker, fast):
            s.close()
        echo_in_order(srv.port, 3)
    finally:
        t = stop_and_count(srv, stats)
    assert t["requests"] == t["responses"] == 9 and t["solo_passes"] > 0, t


@pytest.mark.parametrize("solo_max_batch", ["8", "0"], ids=["solo", "two-threads"])
def test_a_reading_client_gets_its_response_while_slow_readers_hold_the_staging_gate(
        tmp_path: Path, solo_max_batch: str) -> None:
    # test_server_hardening.py's gate test on one pair, solo on and off: 20 readers that never read fill the
    # staging gate (a 1 MiB budget), the app's waiting sends shed the slowest; a client that reads must still
    # get its 2 MiB. In solo mode it gets nothing: the request is read, the app thread sleeps, no byte comes.
    # (The gate stays closed on stale counts: ten connections whose bytes were all written hold 128 KiB each
    # of the 1.25 MiB budget in pyhost/asgi/bridge.hpp's staged_total_, their next sends wait at the gate, so
    # none asks for a drained notice, and shed_stalled() finds no connection waiting for one to cut.)
    srv = ServerProcess("hostile_app:app", "--cores", "1", "--memory-budget", "1MiB", "--write-timeout", "60",
                        "--solo-max-batch", solo_max_batch, tmp=tmp_path).start()
    readers = []
    try:
        for _ in range(20):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.settimeout(10)
            reader.connect(("127.0.0.1", srv.port))
            reader.sendall(b"GET /big?mb=64 HTTP/1.1\r\nHost: x\r\n\r\n")
            readers.append(reader)
        time.sleep(0.5)
        assert httpx.get(srv.url + "/hello", timeout=5).text == "hello"
        resp = httpx.get(srv.url + "/big?mb=2", timeout=5)
        assert resp.status_code == 200 and len(resp.content) == 2 << 20
    finally:
        for reader in readers:
            reader.close()
        assert srv.stop() == 0, srv.log()


# ------------------------------------------------------------------- stops


@pytest.mark.parametrize("isolation", MODES)
def test_sigterm_while_the_app_thread_holds_the_sockets_exits_at_once(tmp_path: Path, isolation: str) -> None:
    srv, stats = solo_server(tmp_path, "--isolation", isolation)
    echo_in_order(srv.port, 10)
    time.sleep(0.3)  # idle: the I/O thread has handed the sockets over and sleeps
    t0 = time.monotonic()
    rc = srv.stop(timeout=5)
    assert rc == 0 and time.monotonic() - t0 < 5, srv.log()
    t = totals(stats)
    assert t["requests"] == 10 and t["solo_handoffs"] >= 1 and t["solo_passes"] > 0, t


def test_sigterm_during_a_long_streaming_response_drains_it_whole(tmp_path: Path) -> None:
    srv, stats = solo_server(tmp_path, "--grace", "10")
    echo_in_order(srv.port, 3)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        request(s, "GET", "/stream?n=40&delay=0.02")
        with s.makefile("rb") as f:
            assert f.readline().startswith(b"HTTP/1.1 200")
            srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            rest = f.read()  # the server closes the connection after the last chunk (it drains)
    lines = [line for line in rest.split(b"\r\n") if line.startswith((b"tick", b"end"))]
    assert lines == [b"tick %d\n" % i for i in range(40)] + [b"end\n"], rest[-200:]
    assert rest.endswith(b"0\r\n\r\n"), rest[-200:]
    t = stop_and_count(srv, stats, signalled=True)
    assert t["requests"] == t["responses"] == 4 and t["solo_passes"] > 0, t


@pytest.mark.parametrize("solo_max_batch", ["8", "0"], ids=["solo", "two-threads"])
def test_the_io_thread_sleeps_while_a_drain_waits_for_a_slow_stream(tmp_path: Path, solo_max_batch: str) -> None:
    # A drain that waits ~1 s for a stream that sends a line every 25 ms: the I/O thread has something to do
    # 40 times, so a few hundred passes at most. It must not spin through the drain (a CPU at 100 % for up to
    # `grace` seconds): runtime/io_thread.cpp park() refuses to sleep while stop_requested is set.
    srv, stats = solo_server(tmp_path, "--grace", "10", "--solo-max-batch", solo_max_batch)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        request(s, "GET", "/stream?n=40&delay=0.025")
        with s.makefile("rb") as f:
            assert f.readline().startswith(b"HTTP/1.1 200")
            srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            assert f.read().endswith(b"end\n\r\n0\r\n\r\n")
    t = stop_and_count(srv, stats, signalled=True)
    assert t["io_passes"] < 5000, {k: t[k] for k in ("io_passes", "io_parks", "requests")}


# ------------------------------------------------------- many connections


@pytest.mark.parametrize(("one_cpu", "cores"), [(True, "1"), (False, "1"), (False, "2")],
                         ids=["one-cpu", "any-cpu", "two-pairs"])
def test_64_connections_pipelined_every_answer_right(tmp_path: Path, one_cpu: bool, cores: str) -> None:
    stats = tmp_path / "stats.json"
    flags = ("--stats-json-on-exit", str(stats))
    if one_cpu:
        srv = one_cpu_server(tmp_path, *flags)
    else:
        srv = ServerProcess("raw_app:app", "--cores", cores, *flags, tmp=tmp_path).start()
    try:
        echo_in_order(srv.port, 20)  # alone on the pair: solo mode
        assert pipelined_clients(srv.port, clients=64, batches=4, depth=4, timeout=20) == []
        echo_in_order(srv.port, 20)
    finally:
        t = stop_and_count(srv, stats)
    assert t["requests"] == t["responses"] == 64 * 4 * 4 + 40, t
    # Both modes: the app thread served alone (passes), the sockets went back to the I/O thread under the
    # burst (a pass read more than solo_max_batch messages) and were handed over again once it was quiet.
    assert t["solo_passes"] > 0 and t["solo_handoffs"] >= 2, t


# -------------------------------------------------------- WebSocket, TLS


def test_websocket_echo_on_one_connection(tmp_path: Path) -> None:
    srv, stats = solo_server(tmp_path)
    try:
        with connect(f"ws://127.0.0.1:{srv.port}/ws", max_size=None) as ws:
            for i in range(100):
                ws.send(f"text {i}")
                assert ws.recv() == f"text {i}"
            for size in (0, 1, 125, 126, 65535, 65536, 200_000):
                data = os.urandom(size)
                ws.send(data)
                assert ws.recv() == data
    finally:
        t = stop_and_count(srv, stats)
    assert t["solo_passes"] > 0 and t["solo_handoffs"] >= 1, t


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(d / "cert.pem"), append=True)
    return d / "ca.pem", d / "cert.pem", d / "key.pem"


def test_tls_requests_and_websocket_on_one_connection(tmp_path: Path, certs: tuple[Path, Path, Path]) -> None:
    ca, cert, key = certs
    srv, stats = solo_server(tmp_path, "--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with httpx.Client(verify=ctx, base_url=f"https://127.0.0.1:{srv.port}", timeout=10) as client:
            for i in range(50):
                r = client.post("/echo", content=f"tls {i}".encode())
                assert (r.status_code, r.content, r.http_version) == (200, f"tls {i}".encode(), "HTTP/1.1")
            big = os.urandom(64 * 1024)
            assert client.post("/echo", content=big).content == big
            r = client.get("/big?mb=1")
            assert r.status_code == 200 and r.content == b"y" * (1 << 20)
        with connect(f"wss://127.0.0.1:{srv.port}/ws", ssl=ctx, max_size=None) as ws:
            for i in range(30):
                ws.send(f"secure {i}")
                assert ws.recv() == f"secure {i}"
    except Exception as e:
        # A failure here shows the server's own account too: whether the
        # second connection's handshake was done, failed or timed out.
        e.add_note(f"server counters: {stop_and_count(srv, stats)}")
        raise
    t = stop_and_count(srv, stats)
    assert t["requests"] >= 52 and t["solo_passes"] > 0, t
    # Two connections, each with a full handshake: the requests' and the WebSocket's.
    assert t["tls_handshakes"] == 2 and t["tls_fail_timeout"] == t["tls_fail_closed"] == 0, t


# ------------------------------------------------------------- settings


def test_solo_max_batch_0_keeps_the_two_threads(tmp_path: Path) -> None:
    srv, stats = solo_server(tmp_path, "--solo-max-batch", "0")
    try:
        echo_in_order(srv.port, 50)
    finally:
        t = stop_and_count(srv, stats)
    assert t["requests"] == 50 and t["solo_passes"] == 0 and t["solo_handoffs"] == 0, t
    assert t["solo_steals"] == 0, t


@pytest.mark.parametrize("flags", [("--solo-spin-us", "0"), ("--solo-max-batch", "1"),
                                   ("--solo-spin-us", "1000", "--solo-max-batch", "65536")],
                         ids=["no-spin", "batch-1", "long-spin-huge-batch"])
def test_extreme_solo_settings_answer_right(tmp_path: Path, flags: tuple[str, ...]) -> None:
    srv, stats = solo_server(tmp_path, *flags)
    try:
        echo_in_order(srv.port, 50)
        assert pipelined_clients(srv.port, clients=8, batches=4, depth=8) == []
        echo_in_order(srv.port, 50)
    finally:
        t = stop_and_count(srv, stats)
    assert t["requests"] == t["responses"] == 100 + 8 * 4 * 8 and t["solo_passes"] > 0, t


@pytest.mark.parametrize(("args", "env", "name"), [
    (["--solo-max-batch", "-1"], {}, "solo_max_batch"),
    (["--solo-max-batch", "65537"], {}, "solo_max_batch"),
    ([], {"CADELOOP_SOLO_SPIN_US": "abc"}, "solo_spin_us"),
    (["--solo-spin-us", "-3"], {}, "solo_spin_us"),
    (["--solo-busy-passes", "-1"], {}, "solo_busy_passes"),
], ids=["batch-negative", "batch-too-big", "spin-env-not-a-number", "spin-negative", "busy-negative"])
def test_a_bad_solo_setting_is_refused_with_one_line(args: list[str], env: dict[str, str], name: str) -> None:
    r = subprocess.run([sys.executable, "-m", "cadeloop", "solo_app:app", "--port", "0", *args],
                       capture_output=True, text=True, timeout=30, env=dict(os.environ, **env))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0].lower(), r.stderr  # the setting, or its CADELOOP_ variable
    if env:
        assert "CADELOOP_SOLO_SPIN_US" in lines[0], r.stderr


def test_the_stats_endpoint_shows_solo_mode(tmp_path: Path) -> None:
    srv = ServerProcess("solo_app:app", "--cores", "1", "--stats-port", "0", tmp=tmp_path).start()
    try:
        port = int(srv.wait_log(STATS.pattern).group(1))
        echo_in_order(srv.port, 20)
        doc: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5).json()
        for part in (doc["pairs"][0], doc["totals"]):
            assert {"solo_handoffs", "solo_steals", "solo_passes"} <= part.keys(), part
        assert doc["pairs"][0]["solo_passes"] > 0 and doc["pairs"][0]["solo_handoffs"] >= 1, doc
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "# TYPE cadeloop_solo_total counter" in metrics, metrics
        found = dict(re.findall(r'^cadeloop_solo_total\{pair="0",event="(\w+)"\} (\d+)$', metrics, re.M))
        assert found.keys() == {"handoff", "steal", "app_pass"} and int(found["app_pass"]) > 0, metrics
    finally:
        assert srv.stop() == 0, srv.log()
