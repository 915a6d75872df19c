"""Hostile and careless TLS clients against a real `cadeloop APP --ssl-certfile C --ssl-keyfile K`, from
outside: the TLS records are made with the ssl module's memory BIOs so each byte on the wire is the
test's choice (test_tls.py covers the well-behaved clients and the refused handshakes)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
import trustme

from server_harness import ServerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("hostile-tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    (d / "cert.pem").write_bytes(b"".join(b.bytes() for b in issued.cert_chain_pems))
    (d / "key.pem").write_bytes(issued.private_key_pem.bytes())
    srv = ServerProcess("hostile_app:app", "--ssl-certfile", str(d / "cert.pem"), "--ssl-keyfile",
                        str(d / "key.pem"), tmp=d).start()
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    yield srv, ctx
    assert srv.stop() == 0, srv.log()


class RawTls:
    """A TLS client over a plain socket: the test decides when each record, and the FIN, go out."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.flush()
                data = self.sock.recv(65536)
                assert data, "the server closed during the handshake"
                self.incoming.write(data)
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.outgoing.read())

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self.flush()

    def read_to_end(self) -> tuple[bytes, str]:
        """Plain text until the connection ends, and how it ended."""
        text = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return text, "reset"
            if not data:
                return text, "eof"
            self.incoming.write(data)
            try:
                while chunk := self.tls.read(65536):
                    text += chunk
                return text, "close_notify"
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as e:
                return text, f"alert: {e.reason}"


def test_a_request_followed_by_a_tcp_half_close_is_answered(tls_server) -> None:  # type: ignore[no-untyped-def]
    # The client sends its request and shuts down its sending side without a close_notify (as
    # plain-TCP habits do). The request is whole, so it is answered, as over plain HTTP (the
    # hostile tests there); OpenSSL 3 calls that EOF a fatal "unexpected eof" and sent a
    # decode_error alert instead of the response. HTTP's own framing tells a cut request apart.
    srv, ctx = tls_server
    for _ in range(5):  # the EOF and the request often arrive in one read; not always
        c = RawTls(srv.port, ctx)
        c.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        c.sock.shutdown(socket.SHUT_WR)
        text, end = c.read_to_end()
        c.sock.close()
        assert text.startswith(b"HTTP/1.1 200 ") and text.endswith(b"\r\n\r\nhello"), (text, end)
        assert not end.startswith("alert"), end
