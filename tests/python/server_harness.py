"""Starts a real `cadeloop APP` server process for the server tests and talks to it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

APPS = Path(__file__).resolve().parent / "server_apps"
LISTENING = re.compile(r"listening on https?://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """`python -m cadeloop APP --port 0 ...` with stderr captured in a file."""

    def __init__(self, app: str, *args: str, tmp: Path, app_dir: Path = APPS, env: dict[str, str] | None = None):
        self.argv = [sys.executable, "-m", "cadeloop", app, "--host", "127.0.0.1", "--port", "0",
                     "--app-dir", str(app_dir), *args]
        self.log_path = tmp / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = LISTENING.search(self.log())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log())
            if m:
                return m
            time.sleep(0.02)
        raise AssertionError(f"{pattern!r} not in the server log:\n{self.log()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self._log.close()
        return rc

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


def wait_listening(proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> int:  # type: ignore[type-arg]
    """The port a server started some other way (serve() under `python -c`) says it listens on.

    Polls `log`, where the process writes its stderr, for the "listening on" line; fails with the
    log if the process exits or the line does not come within `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        m = LISTENING.search(log.read_text())
        if m:
            return int(m.group(1))
        time.sleep(0.02)


def raw_exchange(port: int, data: bytes, timeout: float = 5.0, shut: bool = False) -> bytes:
    """Sends `data` on a fresh connection and reads until the server closes it (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        except (socket.timeout, ConnectionResetError):
            pass
        return b"".join(chunks)


def rest_of(f) -> bytes:  # type: ignore[no-untyped-def]
    """What the server sends from here up to its close, from a socket file. A client that sends after its
    own `Connection: close` request may find the server's socket already closed, and its unread bytes then
    make the close a reset (RFC 9112 9.6): both end the connection, and neither carries an answer."""
    got = b""
    try:
        while chunk := f.read1(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def read_response(f) -> tuple[int, dict[str, str], bytes]:  # type: ignore[no-untyped-def]
    """Reads one HTTP/1.1 response (Content-Length or chunked) from a socket file."""
    status_line = f.readline()
    if not status_line:
        raise EOFError("connection closed before a response")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = f.read(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                while f.readline() not in (b"\r\n", b""):
                    pass
                break
            parts.append(f.read(size))
            f.readline()
        body = b"".join(parts)
    else:
        body = f.read()
    return status, headers, body


class SlowLoad:
    """Clients that keep sending `GET /slow?delay=...` (20 per connection) while a server drains.

    A response counts as complete when it is a 200 whose body starts with
    "slow done"; anything else that started is truncated. A request the
    server never took (the connection closed before a response began) counts
    as neither. `bodies` holds the complete responses' bodies.
    """

    def __init__(self, port: int, clients: int = 16, delay: float = 0.02) -> None:
        import threading

        self.port = port
        self.request = f"GET /slow?delay={delay} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        self.bodies: list[bytes] = []
        self.truncated = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]

    def start(self) -> SlowLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def _client(self) -> None:
        while not self._stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                return  # every listener is closed: the server stopped accepting
            with s:
                f = s.makefile("rb")
                for _ in range(20):
                    try:
                        s.sendall(self.request)
                        status, headers, body = read_response(f)
                    except (OSError, EOFError, ValueError, IndexError):
                        break  # closed before a response started: never taken by the server
                    with self._lock:
                        if status == 200 and body.startswith(b"slow done"):
                            self.bodies.append(body)
                        else:
                            self.truncated += 1
                    if headers.get("connection") == "close":
                        break
