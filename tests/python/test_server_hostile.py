"""Hostile clients against a real `cadeloop APP` server, from outside: raw sockets only.

Each test is one way a client abuses the protocol that an audit found the
server answering wrongly; the conformance suites (test_websocket_conformance,
test_server_hardening, test_server_asgi) cover the well-behaved refusals.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from server_harness import ServerProcess, raw_exchange

pytestmark = pytest.mark.timeout(120)

MASK = b"\x5a\xc3\x17\x9e"


def masked_frame(opcode: int, payload: bytes) -> bytes:
    assert len(payload) < 126
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + MASK + bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))


def rss_kib(pid: int) -> int:
    """Resident memory of the server and its worker processes (isolation by processes)."""
    pids, total = [pid], 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(c) for c in (task / "children").read_text().split()]
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def ws_open(port: int, rcvbuf: int | None = None) -> tuple[socket.socket, bytes]:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return s, rest


def dropped_after(s: socket.socket, data: bytes, wait: float) -> bool:
    """Whether the server has dropped `s` after `wait` seconds more of the client reading nothing: a dropped
    connection refuses more bytes (the server's close with our unread bytes in its buffer is a reset); one
    still held just does not take them. Closes `s`."""
    try:
        time.sleep(wait)
        s.settimeout(2)
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        pass
    finally:
        s.close()
    return False


def get_body(port: int, path: str) -> bytes:
    """The body of GET `path` on a fresh connection the server closes after its answer."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    return raw_exchange(port, request).partition(b"\r\n\r\n")[2]


def wait_events(port: int, done, timeout: float = 10.0) -> bytes:  # type: ignore[no-untyped-def]
    """The app's /events body once `done(body)` holds, or the last one after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done(events := get_body(port, "/events")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return events


@pytest.fixture(scope="module")
def ws_server(tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess("ws_app:app", tmp=tmp_path_factory.mktemp("hostile-ws")).start()
    yield srv
    assert srv.stop() == 0, srv.log()


def test_a_ping_flood_from_a_client_that_reads_no_pong_stops_being_read(ws_server: ServerProcess) -> None:
    # Every ping gets a pong (RFC 6455 5.5.2); a client that sends pings and reads none of the pongs
    # must not make the server queue pongs without end: it stops reading that client (TCP pushes back),
    # holds little memory, and when the client reads again every pong comes, then the echo.
    ping = masked_frame(0x9, b"p" * 125)
    pong = bytes([0x8A, 125]) + b"p" * 125
    batch = ping * 512
    s, rest = ws_open(ws_server.port, rcvbuf=4096)
    assert rest == b""
    before = rss_kib(ws_server.pid)
    sent, cap = 0, 256 << 20
    s.settimeout(1.0)
    deadline = time.monotonic() + 5
    try:
        while sent < cap and time.monotonic() < deadline:
            sent += s.send(batch[sent % len(batch):])
    except (socket.timeout, BlockingIOError):
        pass  # the server stopped reading: the flood is held back by TCP
    grown_mib = (rss_kib(ws_server.pid) - before) / 1024
    assert sent < 64 << 20, f"the server took {sent >> 20} MiB of pings from a client that reads nothing"
    assert grown_mib < 64, f"server memory grew {grown_mib:.0f} MiB"

    # The client reads again: every ping is answered in order, then the connection still echoes.
    got = bytearray()
    cut = sent % len(ping)  # the flood may have stopped inside a frame: it is finished below
    want = (sent // len(ping) + (1 if cut else 0)) * len(pong)
    reader_done = threading.Event()

    def read_all() -> None:
        s.settimeout(30)
        while len(got) < want + 2 + 4:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got.extend(chunk)
        reader_done.set()

    t = threading.Thread(target=read_all)
    t.start()
    s.settimeout(30)
    s.sendall(ping[cut:] if cut else b"")
    s.sendall(masked_frame(0x1, b"done"))
    t.join(40)
    s.close()
    assert reader_done.is_set()
    assert bytes(got[:want]) == pong * (want // len(pong))
    assert bytes(got[want:]) == b"\x81\x04done"


def test_a_ping_flooder_that_never_reads_is_dropped_by_the_ping_timeout(tmp_path: Path) -> None:
    # Not read while it reads nothing, the flooder sends no frame the server sees: the ping clock runs,
    # and the client that never answers is dropped (it holds no connection slot for ever).
    srv = ServerProcess("ws_app:app", "--ws-ping-interval", "1s", "--ws-ping-timeout", "1s", tmp=tmp_path).start()
    try:
        s, _ = ws_open(srv.port, rcvbuf=4096)
        batch = masked_frame(0x9, b"p" * 125) * 512
        s.settimeout(1.0)
        sent, deadline = 0, time.monotonic() + 5
        try:
            while time.monotonic() < deadline:
                sent += s.send(batch[sent % len(batch):])
        except socket.timeout:
            pass
        assert sent < 64 << 20
        # ping interval + ping timeout, with room, still reading nothing
        assert dropped_after(s, batch, 3.5), "the server still holds a client that has read nothing for seconds"
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_websocket_client_that_sends_and_never_reads_is_cut_by_the_write_timeout(tmp_path: Path) -> None:
    # The echo app's send() waits for this client to read, so it takes no message and the server stops
    # reading the client (its queue is full): no frame arrives, no ping is due. The output the client
    # never reads is what cuts it, after write_timeout, as for HTTP; the app's send() sees the end.
    srv = ServerProcess("ws_app:app", "--write-timeout", "1s", "--ws-ping-interval", "1s",
                        "--ws-ping-timeout", "1s", tmp=tmp_path).start()
    try:
        s, _ = ws_open(srv.port, rcvbuf=4096)
        payload = b"x" * 60000
        message = bytes([0x82, 0xFE]) + struct.pack("!H", len(payload)) + MASK + \
            bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
        s.settimeout(1.0)
        sent, dropped, deadline = 0, False, time.monotonic() + 5
        try:
            while time.monotonic() < deadline:
                sent += s.send(message[sent % len(message):])
        except socket.timeout:
            pass
        except (ConnectionResetError, BrokenPipeError):
            dropped = True  # cut while still sending: write_timeout is short here
        assert sent < 64 << 20
        if dropped:
            s.close()
        else:
            dropped = dropped_after(s, message * 10, 4)  # write_timeout, with room
        assert dropped, "the server still holds a client that has read nothing for seconds"
    finally:
        assert srv.stop() == 0, srv.log()


@pytest.mark.parametrize("request_bytes", [
    b"POST /answer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /answer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET /answer HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /answer-while-waiting HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello",  # half of it
])
def test_receive_after_the_response_is_complete_is_http_disconnect(tmp_path: Path, request_bytes: bytes) -> None:
    # ASGI HTTP spec, http.disconnect: "sent to the application if receive is called after a response
    # has been sent"; uvicorn does the same, whatever body the app left unread.
    srv = ServerProcess("after_response_app:app", tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(request_bytes)
            f = s.makefile("rb")
            assert f.readline().startswith(b"HTTP/1.1 200 ")
        assert wait_events(srv.port, bool) == b"http.disconnect"
    finally:
        assert srv.stop() == 0, srv.log()


def reset(s: socket.socket) -> None:
    """Closes `s` with a reset (SO_LINGER 0), as a client that crashes or is killed does."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@pytest.mark.parametrize("request_bytes, event", [
    (b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 5000, "upload: http.disconnect"),
    (b"GET /big?mb=64 HTTP/1.1\r\nHost: x\r\n\r\n", "big: gone"),
    (b"GET /big?mb=64&raise=1 HTTP/1.1\r\nHost: x\r\n\r\n", "big: gone"),
], ids=["mid-upload", "mid-download", "mid-download-send-raises"])
def test_an_app_that_ends_when_its_client_resets_is_no_app_error(tmp_path: Path, request_bytes: bytes,
                                                                    event: str) -> None:
    # The client resets mid-upload or mid-download; the app sees http.disconnect (or send() raises)
    # and returns, as ASGI asks (or lets send()'s ClientDisconnected through). That is no app error:
    # uvicorn logs "returned without starting response" only when the client is still there, so a
    # client that resets cannot fill the error log or the app_errors counter.
    srv = ServerProcess("hostile_app:app", "--stats-port", "0", tmp=tmp_path).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(request_bytes)
        time.sleep(0.3)  # the app has the head and is reading the body or writing the response
        reset(s)
        assert event.encode() in wait_events(srv.port, lambda body: event.encode() in body)
        stats_port = int(srv.wait_log(r"stats endpoint on http://127\.0\.0\.1:(\d+)/").group(1))
        assert json.loads(get_body(stats_port, "/stats"))["totals"]["app_errors"] == 0
    finally:
        assert srv.stop() == 0, srv.log()
    assert "ASGI application" not in srv.log(), srv.log()


@pytest.mark.parametrize("opening", [b"1;", b"1;name=", b'1;name="'], ids=["name", "value", "quoted-value"])
def test_a_chunk_extension_that_never_ends_gets_413_at_once(tmp_path: Path, opening: bytes) -> None:
    # max_chunk_extension_bytes (16 KiB) bounds the extensions of a chunk while they arrive, not only
    # once a name or value ends: a client streaming one endless extension (the attack of Node's
    # CVE-2024-22019) is refused at once, not read until a timeout while the app waits for a body.
    srv = ServerProcess("hostile_app:app", tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + opening)
            s.sendall(b"e" * (32 << 10))
            t0 = time.monotonic()
            s.settimeout(3)
            try:
                answer = s.recv(65536)
            except socket.timeout:
                answer = b""
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert time.monotonic() - t0 < 3
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_chunk_size_of_endless_leading_zeros_is_cut_by_the_body_timeout(tmp_path: Path) -> None:
    # "000...0" never ends a chunk-size line and carries no body byte. body_timeout is the time
    # without a byte of the body, so framing that never delivers one cannot hold the connection
    # and the app's receive() for ever by just keeping bytes flowing.
    srv = ServerProcess("hostile_app:app", "--body-timeout", "1s", tmp=tmp_path).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            s.settimeout(0.5)
            cut, t0 = False, time.monotonic()
            while not cut and time.monotonic() - t0 < 6:
                try:
                    s.sendall(b"0" * 1024)
                    time.sleep(0.05)
                except (BrokenPipeError, ConnectionResetError, socket.timeout):
                    cut = True
                try:
                    answer = s.recv(65536, socket.MSG_DONTWAIT)
                    cut = cut or answer == b"" or answer.startswith(b"HTTP/1.1 408 ")
                except (BlockingIOError, socket.timeout):
                    pass
                except ConnectionResetError:
                    cut = True
        assert cut, "the server still reads a chunk size of zeros after 6 s (body_timeout 1 s)"
        assert time.monotonic() - t0 < 4
        events = json.loads(wait_events(srv.port, lambda body: json.loads(body) != [], timeout=5))
        assert events.count("upload: http.disconnect") == 1
    finally:
        assert srv.stop() == 0, srv.log()

