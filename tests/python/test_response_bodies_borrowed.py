"""Large response bodies sent from the app's own `bytes` object (issue 16 item 3: no copy of the app's bytes).

A `bytes` body of 16 KiB or more travels to the I/O side as the object itself: its reference goes with the
bytes and comes back to the app thread, which releases it once they are written, or dropped with their
connection. What a client and the app see:

- every such body arrives whole and unchanged, on its own, pipelined and as chunked `more_body` parts;
- a mutable body (`bytearray`) is still copied: one the app changes right after `send()` returns arrives as
  it was sent (red when bytearrays are borrowed too); a `bytes` subclass and a `memoryview` arrive whole;
- the app gets its objects back: after many responses, and after clients that reset mid-response, the body's
  reference count is what it was before them.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest

from server_harness import ServerProcess, read_response

BODY = bytes(range(256)) * 256


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess("borrowed_body_app:app", "--cores", "1", tmp=tmp_path_factory.mktemp("borrowed")).start()
    yield srv
    srv.stop()


def get(port: int, *paths: str) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses to `paths`, written pipelined on one connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(f"GET {p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in paths))
        f = s.makefile("rb")
        return [read_response(f) for _ in paths]


def refs(port: int) -> dict[str, int]:
    [(status, _, body)] = get(port, "/refs")
    assert status == 200
    return json.loads(body)


@pytest.mark.parametrize("n", [16 * 1024 - 1, 16 * 1024, 32 * 1024, 65536])
def test_a_bytes_body_arrives_whole(server: ServerProcess, n: int) -> None:
    [(status, headers, body)] = get(server.port, f"/bytes?n={n}")
    assert status == 200
    assert int(headers["content-length"]) == n
    assert body == BODY[:n]


def test_pipelined_and_chunked_bodies_arrive_in_order(server: ServerProcess) -> None:
    paths = ["/bytes?n=65536", "/stream", "/bytes?n=32768", "/bytes?n=100", "/stream", "/bytes?n=65536"]
    got = get(server.port, *paths)
    want = [BODY, BODY * 4, BODY[:32768], BODY[:100], BODY * 4, BODY]
    assert [s for s, _, _ in got] == [200] * len(paths)
    assert got[1][1].get("transfer-encoding") == "chunked"
    for (_, _, body), expected in zip(got, want):
        assert body == expected


def test_a_bytearray_changed_after_send_arrives_as_it_was_sent(server: ServerProcess) -> None:
    for _ in range(5):
        [(status, _, body)] = get(server.port, "/bytearray")
        assert status == 200
        assert body == b"a" * 65536


@pytest.mark.parametrize("path, byte", [("/subclass", b"s"), ("/memoryview", b"m")])
def test_other_buffer_types_arrive_whole(server: ServerProcess, path: str, byte: bytes) -> None:
    [(status, _, body)] = get(server.port, path)
    assert status == 200
    assert body == byte * 65536


def reset_mid_response(port: int, path: str) -> None:
    """Asks for `path`, reads a little of the response, then resets the connection."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    s.recv(1024)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_the_app_gets_its_body_objects_back(server: ServerProcess) -> None:
    before = refs(server.port)
    for _ in range(20):
        got = get(server.port, *["/bytes?n=65536"] * 5, "/stream", "/subclass")
        assert [len(b) for _, _, b in got] == [65536] * 5 + [4 * 65536, 65536]
    for _ in range(20):
        reset_mid_response(server.port, "/stream")
        reset_mid_response(server.port, "/bytes?n=65536")
    # The resets' responses are dropped when the server sees them: the references come back then.
    deadline = time.monotonic() + 10
    while (now := refs(server.port)) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now == before
