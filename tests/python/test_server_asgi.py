"""The ASGI bridge against a real `cadeloop raw_app:app` process, with real clients."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from server_harness import ServerProcess, raw_exchange, read_response


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("raw")
    srv = ServerProcess("raw_app:app", "--root-path", "/api", "--request-line-timeout", "0.5",
                        "--keepalive-idle", "1", "--send-high-mark", "262144", tmp=tmp).start()
    yield srv
    rc = srv.stop(signal.SIGTERM)
    log = srv.log()
    assert rc == 0, log
    assert "raw_app: lifespan shutdown ran" in log


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def events(client: httpx.Client) -> list[str]:
    return client.get("/events").json()


def wait_event(client: httpx.Client, prefix: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in events(client):
            if e.startswith(prefix):
                return e
        time.sleep(0.02)
    raise AssertionError(f"no {prefix!r} event: {events(client)}")


def test_hello(client: httpx.Client) -> None:
    r = client.get("/hello")
    assert r.status_code == 200
    assert r.content == b"Hello, World!"
    assert r.headers["content-length"] == "13"
    assert r.headers["server"] == "cadeloop"
    assert "date" in r.headers
    assert r.http_version == "HTTP/1.1"


def test_scope(client: httpx.Client, server: ServerProcess) -> None:
    r = client.get("/scope/caf%C3%A9%20x", params={"a": "1", "b": " "}, headers={"X-Custom": "V1"})
    s = r.json()
    assert s["type"] == "http"
    assert s["asgi"] == {"version": "3.0", "spec_version": "2.5"}
    assert s["http_version"] == "1.1"
    assert s["method"] == "GET"
    assert s["scheme"] == "http"
    assert s["path"] == "/api/scope/café x"  # root_path included (issue 14: ASGI, uvicorn 0.26+)
    assert s["raw_path"] == "/scope/caf%C3%A9%20x"
    assert s["query_string"] == "a=1&b=+"
    assert s["root_path"] == "/api"
    assert ["x-custom", "V1"] in s["headers"]
    assert all(k == k.lower() for k, _ in s["headers"])
    assert s["header_types"] == ["bytes/bytes"]
    assert s["client"][0] == "127.0.0.1" and isinstance(s["client"][1], int)
    assert s["server"] == ["127.0.0.1", server.port]
    assert s["state"] == {"greeting": "hello from lifespan"}


def test_each_connection_gets_its_own_client_address(server: ServerProcess) -> None:
    # Clients from two loopback addresses, alternating: scope["client"] is each connection's own
    # address and port, never the previous connection's.
    for source in ["127.0.0.2", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.1"]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(source, 0)) as s:
            s.sendall(b"GET /scope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status, _, body = read_response(s.makefile("rb"))
            assert status == 200
            assert json.loads(body)["client"] == [source, s.getsockname()[1]]


def test_http10_and_head(server: ServerProcess) -> None:
    out = raw_exchange(server.port, b"GET /scope HTTP/1.0\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["http_version"] == "1.0"
    out = raw_exchange(server.port, b"HEAD /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"Content-Length: 13\r\n" in out
    assert out.endswith(b"\r\n\r\n"), out  # no body bytes after the head


def test_205_reset_content_carries_no_body(server: ServerProcess) -> None:
    # RFC 9110 15.3.6: no content in a 205, whatever the app sends; framed with Content-Length: 0 so the
    # keep-alive connection's next response is read right.
    out = raw_exchange(server.port, b"GET /reset-content HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 205 Reset Content\r\n") and b"Content-Length: 0" in first, out
    assert b"not for the client" not in out and rest.startswith(b"HTTP/1.1 200 OK\r\n"), out


def test_request_bodies(client: httpx.Client) -> None:
    assert client.post("/echo", content=b"x" * 100_000).content == b"x" * 100_000

    def chunks() -> Iterator[bytes]:
        for i in range(50):
            yield b"%04d" % i

    assert client.post("/echo", content=chunks()).content == b"".join(b"%04d" % i for i in range(50))


def test_expect_continue(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        f = s.makefile("rb")
        assert f.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert f.readline() == b"\r\n"
        s.sendall(b"hello")
        status, _, body = read_response(f)
        assert (status, body) == (200, b"hello")


def test_pipelined_requests_answered_in_order(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /slow?delay=0.3 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /slow?delay=0.05 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        f = s.makefile("rb")
        bodies = [read_response(f)[2] for _ in range(4)]
    assert bodies == [b"slow done", b"Hello, World!", b"slow done", b"abc"]


def test_more_pipelined_requests_than_the_in_flight_cap(server: ServerProcess) -> None:
    # 16 requests fill the per-connection cap exactly; reading must resume for the next batch.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        f = s.makefile("rb")
        for batch in range(3):
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 16)
            assert [read_response(f)[2] for _ in range(16)] == [b"Hello, World!"] * 16, batch


def test_chunked_response(client: httpx.Client) -> None:
    r = client.get("/chunked")
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.content == b"one,two,three"


def test_app_exception_is_a_500_and_one_log_record(client: httpx.Client, server: ServerProcess) -> None:
    r = client.get("/raise")
    assert r.status_code == 500
    assert r.text == "Internal Server Error\n"
    m = server.wait_log(r"Exception in ASGI application\nTraceback \(most recent call last\):\n(?:.*\n)*?ValueError: boom from the app")
    assert "raw_app.py" in m.group(0)
    assert client.get("/hello").status_code == 200  # the server goes on


def test_exception_after_start_closes_the_connection(server: ServerProcess) -> None:
    out = raw_exchange(server.port, b"GET /raise-after-start HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"partial" in out
    assert not out.endswith(b"0\r\n\r\n")  # the chunked body was never terminated: the client sees a cut
    server.wait_log("ValueError: boom after start")


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/bad-status", "'status' in 'http.response.start' must be an int, got str"),
        ("/status-range", "invalid status 1000 in 'http.response.start'"),
        ("/bad-header", "header 0 in 'http.response.start' must be a (name, value) pair of bytes"),
        ("/bad-header-pair", "header 1 in 'http.response.start' must be a (name, value) pair of bytes"),
        ("/bad-header-value", "x-bad"),
        ("/bad-type", "unexpected ASGI message type 'http.response.bogus'"),
        ("/body-over-length", "response body longer than its content-length"),
        ("/body-under-length", "response body shorter than its content-length"),
        ("/body-before-start", "'http.response.body' sent before 'http.response.start'"),
        ("/no-response", "ASGI application returned without starting a response"),
    ],
)
def test_malformed_app_messages_are_500s_naming_the_problem(
    client: httpx.Client, server: ServerProcess, path: str, logged: str
) -> None:
    r = client.get(path)
    assert r.status_code == 500
    deadline = time.monotonic() + 5
    while logged not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert logged in server.log()


@pytest.mark.parametrize("shape", ["lists", "tuple", "generator", "mutated"])
def test_headers_in_any_iterable_of_pairs_and_as_they_were_at_start(client: httpx.Client, shape: str) -> None:
    r = client.get("/header-shapes", params={"shape": shape})
    assert r.status_code == 200 and r.text == shape
    assert (r.headers.get("x-one"), r.headers.get("x-two")) == ("1", "2")
    assert "x-late" not in r.headers and "x-changed" not in r.headers


@pytest.mark.parametrize(
    ("shape", "status", "header", "body"),
    [
        ("runtime-keys", 201, "runtime-keys", "part one, part two"),
        ("extra-keys", 202, "extra", "extra keys ignored"),
        ("headers-empty-the-message", 203, "emptied", "headers emptied the message"),
        ("more-body-empties-the-message", 200, "more", "body kept"),
    ],
)
def test_messages_are_read_by_their_keys_whatever_the_objects_and_whatever_the_app_does_meanwhile(
    client: httpx.Client, server: ServerProcess, shape: str, status: int, header: str, body: str
) -> None:
    # Keys equal to ASGI's names but other str objects (built at run time, a str subclass) are
    # those keys; keys ASGI does not define are ignored; the app's code that send() runs (a
    # header generator, a more_body's truth) may empty the message meanwhile, and what send()
    # read before stays what it was given.
    r = client.get("/message-shapes", params={"shape": shape})
    assert (r.status_code, r.headers.get("x-shape"), r.text) == (status, header, body)
    if shape == "headers-empty-the-message":
        assert r.headers["x-built"] == "at-run-time"
    assert client.get("/hello").status_code == 200


def test_header_lines_that_come_back_are_checked_as_the_first_time(server: ServerProcess) -> None:
    # The same header bytes in response after response (each response's own
    # list and tuples): every head says what its app sent, and a bad one is
    # refused every time, however often a good one came before it.
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for _ in range(5):
            for variant in ("a", "b", "bad", "a", "length", "close", "b"):
                r = c.get("/repeat-headers", params={"variant": variant})
                if variant in ("bad", "length"):
                    assert r.status_code == 500, (variant, r.status_code)
                    continue
                assert r.status_code == 200 and r.text == f"variant {variant}"
                assert r.headers["x-variant"] == variant
                assert r.headers["content-type"] == "text/plain"
                assert r.headers["content-length"] == str(len(r.text))
                assert "x-bad" not in r.headers
                assert (r.headers.get("connection") == "close") == (variant == "close")


def test_send_after_complete_raises_oserror(client: httpx.Client) -> None:
    assert client.get("/after-complete").text == "done"
    assert wait_event(client, "after-complete") == "after-complete: OSError"


def test_receive_and_send_kept_past_their_request_stay_that_requests(client: httpx.Client) -> None:
    # The server reuses the callables of finished requests that nothing else
    # holds; those an app kept must never serve another request.
    for _ in range(3):
        assert client.get("/keep-callables").text == "kept"
        r = client.get("/use-kept-callables")
        assert (r.status_code, r.text) == (
            200, "distinct, stale send: OSError, stale receive: http.disconnect"), r.text


def test_streaming_app_sees_the_disconnect(server: ServerProcess, client: httpx.Client) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"GET /stream?n=100000&delay=0.002 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"tick 0" in s.recv(4096)
    s.close()
    assert wait_event(client, "stream:") == "stream: ClientDisconnected"


def test_long_poll_sees_http_disconnect(server: ServerProcess, client: httpx.Client) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"GET /longpoll HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    s.close()
    assert wait_event(client, "longpoll:") == "longpoll: http.disconnect"


def test_client_that_stops_reading_keeps_server_memory_bounded(server: ServerProcess, client: httpx.Client) -> None:
    before = server.rss_kib()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.connect(("127.0.0.1", server.port))
    s.sendall(b"GET /big?mb=512 HTTP/1.1\r\nHost: x\r\n\r\n")
    peak = before
    for _ in range(20):  # the app would produce 512 MiB in well under this second without backpressure
        time.sleep(0.05)
        peak = max(peak, server.rss_kib())
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")
    s.close()
    assert (peak - before) < 64 * 1024, f"RSS grew {(peak - before) // 1024} MiB"
    gone = wait_event(client, "big:")
    assert int(gone.split()[-1]) < 64 << 20


def test_100_mib_upload_streams_with_bounded_memory(server: ServerProcess) -> None:
    total = 100 << 20
    before = server.rss_kib()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], server.rss_kib())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % total)
            for _ in range(100):
                s.sendall(block)
                digest.update(block)
            status, _, body = read_response(s.makefile("rb"))
    finally:
        done.set()
        sampler.join()
    assert status == 200
    result = json.loads(body)
    assert result["size"] == total and result["sha256"] == digest.hexdigest()
    assert result["chunks"] > 10  # streamed in pieces, never whole
    assert peak[0] - before < 64 * 1024, f"RSS grew {(peak[0] - before) // 1024} MiB"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /hello HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000000\r\n\r\n", 413),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /hello HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ],
)
def test_limits_are_answered_with_their_status(server: ServerProcess, request_bytes: bytes, status: int) -> None:
    out = raw_exchange(server.port, request_bytes)
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:200]


def test_slow_head_gets_408(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        t0 = time.monotonic()
        out = s.recv(4096)
    assert out.startswith(b"HTTP/1.1 408 ")
    assert 0.3 < time.monotonic() - t0 < 3


def test_idle_keepalive_connection_is_closed(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        f = s.makefile("rb")
        assert read_response(f)[0] == 200
        t0 = time.monotonic()
        assert f.read(1) == b""  # closed by the server after keepalive_idle
        assert 0.5 < time.monotonic() - t0 < 4


def test_the_idle_clock_starts_at_each_response_and_stops_while_a_request_is_in_flight(
        server: ServerProcess) -> None:
    # keepalive_idle is 1 s: requests 0.7 s apart keep the connection open well
    # past 1 s from the first response, a request the app answers after 1.6 s
    # is not cut as idle, and the close comes about 1 s after the last response.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        f = s.makefile("rb")

        def ask(target: bytes) -> bytes:
            s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = read_response(f)
            assert status == 200
            return body

        assert ask(b"/hello") == b"Hello, World!"
        for _ in range(3):
            time.sleep(0.7)
            assert ask(b"/hello") == b"Hello, World!"
        assert ask(b"/slow?delay=1.6") == b"slow done"
        t0 = time.monotonic()
        assert f.read(1) == b""
        assert 0.8 < time.monotonic() - t0 < 3
