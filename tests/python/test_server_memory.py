"""What idle keep-alive connections cost the server in memory (issue 4).

Acceptance: 10,000 idle keep-alive connections add at most 4 KiB each to the
server process's USS (unique set size: its private pages, clean and dirty, as
/proc/PID/smaps_rollup counts them). Each connection is made live the way a
browser leaves one: one request, its whole response read, then nothing.
"""

from __future__ import annotations

import errno
import os
import resource
import selectors
import socket
import time
from pathlib import Path

import pytest

from server_harness import ServerProcess

IDLE_CONNECTIONS = 10_000
BOUND_PER_CONNECTION = 4096  # bytes of USS per idle keep-alive connection
BATCH = 500  # connects in flight at once: well under the server's listen backlog (1024)
REQUEST = b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
RESPONSE_BODY = b"Hello, World!"
# Both processes hold one descriptor per connection, plus their own.
FDS_NEEDED = IDLE_CONNECTIONS + 1024


def uss_bytes(pid: int) -> int:
    """Private_Clean + Private_Dirty of every mapping of `pid`, in bytes."""
    kib = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            kib += int(line.split()[1])
    return kib * 1024


def open_sockets(pid: int) -> int:
    return sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if os.readlink(fd).startswith("socket:"))


@pytest.fixture
def many_fds():
    """RLIMIT_NOFILE high enough for this process and the server it starts (inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(FDS_NEEDED, min(soft, FDS_NEEDED * 2))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError) as exc:
        pytest.skip(f"RLIMIT_NOFILE cannot be raised to {want} (hard limit {hard}): {exc}")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class IdleClients:
    """Raw non-blocking client sockets, each left idle after one request and its full response."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.socks: list[socket.socket] = []
        self.sel = selectors.DefaultSelector()  # epoll: no FD_SETSIZE cap

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()
        self.sel.close()

    def open(self, n: int, timeout: float = 20.0) -> None:
        """Opens `n` more connections in batches and makes each one request/response."""
        while n > 0:
            batch = [self._connect() for _ in range(min(BATCH, n))]
            self._wait_connected(batch, timeout)
            self.exchange(batch, timeout)
            self.socks.extend(batch)
            n -= len(batch)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex(("127.0.0.1", self.port))
        assert rc in (0, errno.EINPROGRESS), f"connect: {os.strerror(rc)}"
        return s

    def _wait_connected(self, batch: list[socket.socket], timeout: float) -> None:
        for s in batch:
            self.sel.register(s, selectors.EVENT_WRITE)
        pending = len(batch)
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{pending} of {len(batch)} connects still pending"
            for key, _ in self.sel.select(timeout=1.0):
                s = key.fileobj
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                assert err == 0, f"connect failed after {len(self.socks)} connections: {os.strerror(err)}"
                self.sel.unregister(s)
                pending -= 1

    def exchange(self, batch: list[socket.socket], timeout: float) -> None:
        """One request on each socket of `batch`; returns once every response was read whole."""
        got: dict[socket.socket, bytearray] = {}
        for s in batch:
            assert s.send(REQUEST) == len(REQUEST)
            got[s] = bytearray()
            self.sel.register(s, selectors.EVENT_READ)
        pending = len(batch)
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{pending} of {len(batch)} responses missing"
            for key, _ in self.sel.select(timeout=1.0):
                s = key.fileobj
                data = s.recv(65536)
                assert data, f"server closed a connection before its response ({len(self.socks)} open)"
                buf = got[s]
                buf += data
                if complete_response(buf):
                    self.sel.unregister(s)
                    pending -= 1


def complete_response(buf: bytearray) -> bool:
    """Whether `buf` holds one whole 200 response to REQUEST (and nothing more)."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return False
    head = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
    assert head[0].startswith("HTTP/1.1 200"), head[0]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    assert headers.get("connection", "").lower() != "close", "the server meant to close a keep-alive connection"
    length = int(headers["content-length"])
    if len(buf) < head_end + 4 + length:
        return False
    assert bytes(buf[head_end + 4:]) == RESPONSE_BODY
    return True


def settle(pid: int, seconds: float = 1.0) -> int:
    """USS once it stops moving (the app thread may still be freeing per-request objects)."""
    time.sleep(seconds)
    last = uss_bytes(pid)
    for _ in range(10):
        time.sleep(0.2)
        now = uss_bytes(pid)
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


@pytest.mark.timeout(120)
def test_idle_keepalive_connections_cost_at_most_4_kib_each(tmp_path: Path, many_fds: None) -> None:
    server = ServerProcess("raw_app:app", "--keepalive-idle", "300", "--max-connections", "20000",
                           tmp=tmp_path).start()
    clients = IdleClients(server.port)
    try:
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= FDS_NEEDED
        server_limit = Path(f"/proc/{server.pid}/limits").read_text()
        soft = next(int(line.split()[3]) for line in server_limit.splitlines() if line.startswith("Max open files"))
        assert soft >= FDS_NEEDED, f"the server inherited RLIMIT_NOFILE {soft}"

        # Warm-up: code paths, the app's first requests, the allocator's arenas.
        warm = IdleClients(server.port)
        warm.open(100)
        warm.close()
        before = settle(server.pid)
        sockets_before = open_sockets(server.pid)

        t0 = time.monotonic()
        clients.open(IDLE_CONNECTIONS)
        opened_in = time.monotonic() - t0
        after = settle(server.pid)
        held = open_sockets(server.pid) - sockets_before
        per_connection = (after - before) / IDLE_CONNECTIONS
        print(f"\nidle keep-alive: {IDLE_CONNECTIONS} connections opened in {opened_in:.1f} s; "
              f"server USS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB, "
              f"{per_connection:.0f} bytes per connection (bound {BOUND_PER_CONNECTION}); "
              f"server holds {held} more sockets")
        assert held >= IDLE_CONNECTIONS, f"the server holds only {held} of the {IDLE_CONNECTIONS} connections"
        assert per_connection <= BOUND_PER_CONNECTION, (
            f"{per_connection:.0f} bytes of USS per idle keep-alive connection, over {BOUND_PER_CONNECTION}")

        # They are live keep-alive connections: a second request on some of them is answered ...
        clients.exchange(clients.socks[::97], timeout=20.0)
        # ... and so is a fresh connection.
        fresh = IdleClients(server.port)
        fresh.open(1)
        fresh.close()
        assert "Traceback" not in server.log(), server.log()
    finally:
        clients.close()
        server.stop()
