"""WebSocket conformance (RFC 6455, RFC 7692), organised like Autobahn's case categories.

Each test drives a real `cadeloop ws_app:app --cores 2` server with raw
sockets: it writes frames byte for byte as a client (or a broken client) would
and reads what the server writes back. The categories, with Autobahn's numbers:

    1 framing, 2 pings and pongs, 3 reserved bits, 4 opcodes, 5 fragmentation,
    6 UTF-8, 7 close handling, 9 limits, 12/13 compression,
    plus the opening handshake (RFC 6455 4.1, 4.2).

Every test runs against each isolation mode the interpreter has: on 3.12+
sub-interpreters and processes (`--isolation processes`), on 3.11 processes.
docs/websockets.md ("Conformance") lists which rule each test guards.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from server_harness import ServerProcess

pytestmark = pytest.mark.timeout(120)

MAX_SIZE = 128 * 1024  # the server's ws_max_size in these tests
MODES = ["subinterpreters", "processes"] if sys.version_info >= (3, 12) else ["processes"]


@pytest.fixture(scope="module", params=MODES)
def port(request, tmp_path_factory: pytest.TempPathFactory):
    srv = ServerProcess("ws_app:app", "--cores", "2", "--isolation", request.param, "--ws-max-size", "128KiB",
                        tmp=tmp_path_factory.mktemp("wsconf"))
    srv.start()
    yield srv.port
    assert srv.stop() == 0, srv.log()


# --------------------------------------------------------------------------- a raw client


MASK = b"\x5a\xc3\x17\x9e"


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0, masked: bool = True,
          length: int | None = None) -> bytes:
    """One client frame; `rsv` is the RSV1-3 bits as 0x40/0x20/0x10, `length` overrides the length field."""
    n = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mask_bit | n])
    elif n <= 0xFFFF:
        head += bytes([mask_bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    return head + MASK + bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))


def close_frame(code: int | None = None, reason: bytes = b"") -> bytes:
    return frame(0x8, b"" if code is None else struct.pack("!H", code) + reason)


@dataclass
class Frame:
    fin: bool
    rsv: int
    opcode: int
    payload: bytes

    @property
    def close_code(self) -> int | None:
        assert self.opcode == 0x8
        return struct.unpack("!H", self.payload[:2])[0] if len(self.payload) >= 2 else None


class Client:
    """A raw socket after a successful handshake (or the refused response)."""

    def __init__(self, port: int, path: str = "/echo", extensions: str | None = None,
                 request: bytes | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if request is None:
            key = base64.b64encode(os.urandom(16)).decode()
            request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                       f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                       + (f"Sec-WebSocket-Extensions: {extensions}\r\n" if extensions else "") + "\r\n").encode()
        self.sock.sendall(request)
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.head = head.decode("latin-1")
        self.status = int(self.head.split(" ", 2)[1]) if self.head else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in
                        (line.partition(":") for line in self.head.split("\r\n")[1:])}

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def recv_frame(self) -> Frame | None:
        """The next server frame, or None at end of stream."""
        if not self._fill(2):
            return None
        b0, b1 = self.buf[0], self.buf[1]
        assert b1 & 0x80 == 0, "a server frame must not be masked"
        n, at = b1 & 0x7F, 2
        if n == 126:
            assert self._fill(4)
            n, at = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            assert self._fill(10)
            n, at = struct.unpack("!Q", self.buf[2:10])[0], 10
        assert self._fill(at + n), "stream ended inside a frame"
        f = Frame(bool(b0 & 0x80), b0 & 0x70, b0 & 0x0F, self.buf[at:at + n])
        self.buf = self.buf[at + n:]
        return f

    def recv_message(self) -> Frame:
        """The next data frame, skipping nothing: a ping or close here fails the test."""
        f = self.recv_frame()
        assert f is not None and f.opcode in (0x1, 0x2), f
        return f

    def expect_close(self, code: int | None) -> None:
        """The server's close frame with `code` (None: empty), then the TCP close; nothing else before it."""
        f = self.recv_frame()
        assert f is not None and f.opcode == 0x8, f"expected a close frame with {code}, got {f}"
        assert f.close_code == code, f"close code {f.close_code}, expected {code} ({f.payload!r})"
        self.expect_eof()

    def expect_eof(self, timeout: float = 10.0) -> None:
        self.sock.settimeout(timeout)
        rest = self.buf + self.sock.recv(65536)
        while True:
            assert rest == b"", f"bytes after the end: {rest[:80]!r}"
            more = self.sock.recv(65536)
            if not more:
                return
            rest = more

    def echo_works(self, text: bytes = b"still here") -> None:
        self.send(frame(0x1, text))
        f = self.recv_message()
        assert (f.opcode, f.payload) == (0x1, text)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(port):
    clients: list[Client] = []

    def make(*args, **kwargs) -> Client:
        c = Client(port, *args, **kwargs)
        clients.append(c)
        if kwargs.get("request") is None:
            assert c.status == 101, c.head
        return c

    yield make
    for c in clients:
        c.close()


# --------------------------------------------------------------------------- 1 framing


@pytest.mark.parametrize("size", [0, 125, 126, 127, 65535, 65536, MAX_SIZE])
@pytest.mark.parametrize("opcode", [0x1, 0x2])
def test_1_payload_lengths_of_every_encoding_echo(client, opcode: int, size: int) -> None:
    c = client()
    payload = (b"*" * size)
    c.send(frame(opcode, payload))
    f = c.recv_message()
    assert (f.fin, f.opcode, len(f.payload), f.payload == payload) == (True, opcode, size, True)


def test_1_a_frame_sent_one_byte_at_a_time_echoes(client) -> None:
    c = client()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = frame(0x1, b"chopped" * 40)
    for i in range(len(data)):
        c.send(data[i:i + 1])
    assert c.recv_message().payload == b"chopped" * 40


def test_1_many_frames_in_one_write_echo_in_order(client) -> None:
    c = client()
    c.send(b"".join(frame(0x2, bytes([i]) * i) for i in range(50)))
    assert [c.recv_message().payload for _ in range(50)] == [bytes([i]) * i for i in range(50)]


def test_1_unmasked_client_frame_is_1002(client) -> None:
    c = client()
    c.send(frame(0x1, b"hello", masked=False))
    c.expect_close(1002)


def test_1_length_with_the_top_bit_set_is_1002(client) -> None:
    c = client()
    c.send(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 1 << 63) + MASK)
    c.expect_close(1002)


# --------------------------------------------------------------------------- 2 pings and pongs


@pytest.mark.parametrize("payload", [b"", b"hello", bytes(range(125))])
def test_2_ping_gets_a_pong_with_its_payload(client, payload: bytes) -> None:
    c = client()
    c.send(frame(0x9, payload))
    f = c.recv_frame()
    assert f == Frame(True, 0, 0xA, payload)
    c.echo_works()


def test_2_ping_over_125_bytes_is_1002(client) -> None:
    c = client()
    c.send(frame(0x9, b"x" * 126))
    c.expect_close(1002)


def test_2_unsolicited_pong_is_ignored(client) -> None:
    c = client()
    c.send(frame(0xA, b"unasked"))
    c.echo_works()


def test_2_ten_pings_get_ten_pongs_in_order(client) -> None:
    c = client()
    c.send(b"".join(frame(0x9, f"p{i}".encode()) for i in range(10)))
    assert [c.recv_frame() for _ in range(10)] == [Frame(True, 0, 0xA, f"p{i}".encode()) for i in range(10)]


# --------------------------------------------------------------------------- 3 reserved bits


@pytest.mark.parametrize(("opcode", "rsv"), [(0x1, 0x40), (0x1, 0x20), (0x2, 0x10), (0x9, 0x30), (0x8, 0x70)])
def test_3_reserved_bits_without_an_extension_are_1002(client, opcode: int, rsv: int) -> None:
    c = client()
    c.send(frame(opcode, b"", rsv=rsv))
    c.expect_close(1002)


# --------------------------------------------------------------------------- 4 opcodes


@pytest.mark.parametrize("opcode", [0x3, 0x4, 0x5, 0x6, 0x7, 0xB, 0xC, 0xD, 0xE, 0xF])
def test_4_reserved_opcodes_are_1002(client, opcode: int) -> None:
    c = client()
    c.send(frame(opcode, b"x"))
    c.expect_close(1002)


# --------------------------------------------------------------------------- 5 fragmentation


def test_5_fragments_assemble_into_one_message(client) -> None:
    c = client()
    c.send(frame(0x1, b"frag", fin=False) + frame(0x0, b"men", fin=False) + frame(0x0, b"ted"))
    f = c.recv_message()
    assert (f.opcode, f.payload) == (0x1, b"fragmented")


def test_5_one_byte_fragments_of_a_binary_message(client) -> None:
    c = client()
    data = bytes(range(40))
    c.send(frame(0x2, data[:1], fin=False) + b"".join(frame(0x0, data[i:i + 1], fin=i == len(data) - 1)
                                                        for i in range(1, len(data))))
    assert c.recv_message().payload == data


def test_5_a_ping_between_fragments_is_answered_first(client) -> None:
    c = client()
    c.send(frame(0x1, b"one ", fin=False) + frame(0x9, b"mid") + frame(0x0, b"two"))
    assert c.recv_frame() == Frame(True, 0, 0xA, b"mid")
    assert c.recv_message().payload == b"one two"


def test_5_fragmented_ping_is_1002(client) -> None:
    c = client()
    c.send(frame(0x9, b"pi", fin=False) + frame(0x0, b"ng"))
    c.expect_close(1002)


def test_5_continuation_without_a_message_is_1002(client) -> None:
    c = client()
    c.send(frame(0x0, b"orphan"))
    c.expect_close(1002)


def test_5_new_message_inside_a_fragmented_one_is_1002(client) -> None:
    c = client()
    c.send(frame(0x1, b"start", fin=False) + frame(0x1, b"again"))
    c.expect_close(1002)


# --------------------------------------------------------------------------- 6 UTF-8


@pytest.mark.parametrize("text", ["κόσμε", "\U0001F600 emoji", "\u00e9\u4e2d\U00010348", "\ufeffBOM", "\ud7ff\ue000"])
def test_6_valid_utf8_echoes(client, text: str) -> None:
    c = client()
    c.send(frame(0x1, text.encode()))
    assert c.recv_message().payload.decode() == text


def test_6_a_code_point_split_across_fragments_is_valid(client) -> None:
    c = client()
    data = "κόσμε".encode()
    c.send(frame(0x1, data[:1], fin=False) + frame(0x0, data[1:4], fin=False) + frame(0x0, data[4:]))
    assert c.recv_message().payload == data


@pytest.mark.parametrize("payload", [
    b"\xff", b"\xc0\xaf",            # invalid byte, overlong '/'
    b"\xed\xa0\x80",                 # a UTF-16 surrogate
    b"\xf4\x90\x80\x80",             # above U+10FFFF
    b"ok\xce",                       # the message ends inside a sequence
], ids=["ff", "overlong", "surrogate", "above-max", "truncated"])
def test_6_invalid_utf8_text_is_1007(client, payload: bytes) -> None:
    c = client()
    c.send(frame(0x1, payload))
    c.expect_close(1007)


def test_6_invalid_utf8_fails_fast_before_the_message_ends(client) -> None:
    # Autobahn 6.4: the first fragment is already invalid; the server must not wait for the rest.
    c = client()
    c.send(frame(0x1, b"abc\xed\xa0\x80", fin=False))
    c.expect_close(1007)


def test_6_invalid_utf8_across_fragments_is_1007(client) -> None:
    c = client()
    c.send(frame(0x1, b"\xce", fin=False) + frame(0x0, b"\x41"))
    c.expect_close(1007)


def test_6_binary_messages_are_not_checked(client) -> None:
    c = client()
    c.send(frame(0x2, b"\xff\xfe\xed\xa0\x80"))
    assert c.recv_message().payload == b"\xff\xfe\xed\xa0\x80"


# --------------------------------------------------------------------------- 7 close handling


@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999])
def test_7_a_valid_close_code_is_echoed(client, code: int) -> None:
    c = client()
    c.send(close_frame(code, b"bye"))
    c.expect_close(code)


def test_7_empty_close_gets_an_empty_close(client) -> None:
    c = client()
    c.send(close_frame())
    c.expect_close(None)


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535])
def test_7_an_invalid_close_code_is_1002(client, code: int) -> None:
    c = client()
    c.send(close_frame(code))
    c.expect_close(1002)


def test_7_close_with_a_1_byte_payload_is_1002(client) -> None:
    c = client()
    c.send(frame(0x8, b"\x03"))
    c.expect_close(1002)


def test_7_close_reason_of_123_bytes_is_fine(client) -> None:
    c = client()
    c.send(close_frame(1000, b"r" * 123))
    c.expect_close(1000)


def test_7_close_reason_not_utf8_is_1007(client) -> None:
    c = client()
    c.send(close_frame(1000, b"\xff\xfe"))
    c.expect_close(1007)


def test_7_frames_after_the_close_are_ignored(client) -> None:
    c = client()
    c.send(close_frame(1000) + frame(0x1, b"too late") + frame(0x9, b"late ping"))
    c.expect_close(1000)  # no echo and no pong before or after the close


def test_7_close_inside_a_fragmented_message_is_echoed(client) -> None:
    c = client()
    c.send(frame(0x1, b"half", fin=False) + close_frame(1000))
    c.expect_close(1000)


# --------------------------------------------------------------------------- 9 limits


def test_9_a_message_over_ws_max_size_is_1009(client) -> None:
    c = client()
    # The length alone decides: the payload is never sent, and the close comes anyway.
    c.send(frame(0x2, b"", length=MAX_SIZE + 1))
    c.expect_close(1009)


def test_9_fragments_summing_over_ws_max_size_are_1009(client) -> None:
    c = client()
    half = b"h" * (MAX_SIZE // 2)
    c.send(frame(0x2, half, fin=False) + frame(0x0, half, fin=False) + frame(0x0, b"!"))
    c.expect_close(1009)


def test_9_a_message_of_exactly_ws_max_size_echoes(client) -> None:
    c = client()
    half = b"h" * (MAX_SIZE // 2)
    c.send(frame(0x2, half, fin=False) + frame(0x0, half))
    assert len(c.recv_message().payload) == MAX_SIZE


# --------------------------------------------------------------------------- 12/13 compression


def deflate(data: bytes, obj=None) -> bytes:
    obj = obj or zlib.compressobj(wbits=-15)
    out = obj.compress(data) + obj.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def inflate(data: bytes, obj=None) -> bytes:
    obj = obj or zlib.decompressobj(wbits=-15)
    return obj.decompress(data + b"\x00\x00\xff\xff")


def extension_params(header: str) -> set[str]:
    name, *params = [p.strip() for p in header.split(";")]
    assert name == "permessage-deflate"
    return set(params)


@pytest.mark.parametrize(("offer", "answer"), [
    ("permessage-deflate", set()),
    # The client lets the server choose: it caps the client's window at 4 KiB (less memory per connection).
    ("permessage-deflate; client_max_window_bits", {"client_max_window_bits=12"}),
    ("permessage-deflate; server_no_context_takeover", {"server_no_context_takeover"}),
    ("permessage-deflate; client_no_context_takeover", {"client_no_context_takeover"}),
    ("permessage-deflate; server_max_window_bits=10", {"server_max_window_bits=10"}),
    ("permessage-deflate; client_max_window_bits=9", {"client_max_window_bits=9"}),
    ("permessage-deflate; server_max_window_bits=8, permessage-deflate", set()),  # one it cannot honour, then one it can
])
def test_12_negotiation_answers_the_parameters_of_the_accepted_offer(client, offer: str, answer: set[str]) -> None:
    c = client(extensions=offer)
    params = extension_params(c.headers["sec-websocket-extensions"])
    # The server may add what it always does (server_no_context_takeover); what the client asked for is answered.
    assert answer <= params, params
    assert params <= {"server_no_context_takeover", "client_no_context_takeover", *answer}, params


def test_12_an_unknown_extension_is_not_negotiated(client) -> None:
    c = client(extensions="x-webkit-deflate-frame")
    assert "sec-websocket-extensions" not in c.headers
    c.send(frame(0x1, b"plain", rsv=0x40))  # RSV1 means nothing without the extension
    c.expect_close(1002)


@pytest.mark.parametrize("size", [10, 1000, 100_000])
def test_12_compressed_messages_echo_and_come_back_compressed_when_it_pays(client, size: int) -> None:
    c = client(extensions="permessage-deflate; client_no_context_takeover")
    text = ("compress me " * (size // 12 + 1))[:size].encode()
    c.send(frame(0x1, deflate(text), rsv=0x40))
    f = c.recv_message()
    assert f.opcode == 0x1
    got = inflate(f.payload) if f.rsv == 0x40 else f.payload
    assert got == text
    if size >= 1000:
        assert f.rsv == 0x40 and len(f.payload) < size // 4


def test_12_context_takeover_across_messages(client) -> None:
    c = client(extensions="permessage-deflate")
    sender = zlib.compressobj(wbits=-15)
    for i in range(5):
        text = f"message {i} with some words repeated words repeated".encode()
        c.send(frame(0x1, deflate(text, sender), rsv=0x40))
        f = c.recv_message()
        assert (inflate(f.payload) if f.rsv else f.payload) == text


def test_12_fragmented_compressed_message(client) -> None:
    c = client(extensions="permessage-deflate; client_no_context_takeover")
    text = b"fragmented and compressed " * 20
    z = deflate(text)
    c.send(frame(0x1, z[:5], fin=False, rsv=0x40) + frame(0x0, z[5:]))
    f = c.recv_message()
    assert (inflate(f.payload) if f.rsv else f.payload) == text


def test_12_rsv1_on_a_continuation_is_1002(client) -> None:
    c = client(extensions="permessage-deflate")
    c.send(frame(0x1, deflate(b"abc")[:2], fin=False, rsv=0x40) + frame(0x0, deflate(b"abc")[2:], rsv=0x40))
    c.expect_close(1002)


def test_12_rsv1_on_a_control_frame_is_1002(client) -> None:
    c = client(extensions="permessage-deflate")
    c.send(frame(0x9, b"p", rsv=0x40))
    c.expect_close(1002)


def test_13_a_decompression_bomb_is_1009(client) -> None:
    c = client(extensions="permessage-deflate; client_no_context_takeover")
    bomb = deflate(b"\0" * (4 * MAX_SIZE))
    assert len(bomb) < MAX_SIZE // 100
    c.send(frame(0x2, bomb, rsv=0x40))
    c.expect_close(1009)


def test_13_corrupt_deflate_data_is_1007(client) -> None:
    c = client(extensions="permessage-deflate; client_no_context_takeover")
    c.send(frame(0x2, b"\xff\xff\xff\xff garbage", rsv=0x40))
    c.expect_close(1007)


def test_13_compressed_text_that_is_not_utf8_is_1007(client) -> None:
    c = client(extensions="permessage-deflate; client_no_context_takeover")
    c.send(frame(0x1, deflate(b"abc\xed\xa0\x80"), rsv=0x40))
    c.expect_close(1007)


# --------------------------------------------------------------------------- opening handshake


def handshake(port: int, version: str = "1.1", method: str = "GET", extra: str = "") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"{method} /echo HTTP/{version}\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()


def test_handshake_accept_key_is_rfc_6455s(port: int) -> None:
    c = Client(port, request=b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    try:
        assert c.status == 101
        assert c.headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455 1.3
        assert c.headers["upgrade"].lower() == "websocket"
    finally:
        c.close()


def test_handshake_http10_upgrade_is_400_and_closed(port: int) -> None:
    # RFC 6455 4.1: the opening handshake needs HTTP/1.1 or higher. It is refused in the I/O thread
    # (400, then the connection closes); the app never sees it as an ordinary request.
    c = Client(port, request=handshake(port, "1.0"))
    try:
        assert c.status == 400, c.head
        c.sock.settimeout(10)
        body = c.buf
        while chunk := c.sock.recv(65536):
            body += chunk
        assert b"http scope" not in body  # ws_app's answer to an http request
    finally:
        c.close()


@pytest.mark.parametrize(("extra", "status"), [
    ("Sec-WebSocket-Version: 13\r\n", 426),      # two version headers
    ("Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\n", 400),  # two keys
])
def test_handshake_duplicate_fields_are_refused(port: int, extra: str, status: int) -> None:
    c = Client(port, request=handshake(port, extra=extra))
    try:
        assert c.status == status, c.head
    finally:
        c.close()


def test_handshake_key_not_16_bytes_is_400(port: int) -> None:
    req = handshake(port).replace(b"Sec-WebSocket-Key: ", b"Sec-WebSocket-Key: c2hvcnQ=\r\nX-Old-Key: ")
    c = Client(port, request=req)
    try:
        assert c.status == 400, c.head
    finally:
        c.close()


def test_handshake_pipelined_request_after_an_upgrade_is_read_as_frames(port: int) -> None:
    # The client must wait for the 101 before sending more (RFC 6455 4.1). Bytes sent right after the
    # upgrade request belong to the WebSocket stream: "GET ..." is an unmasked frame with RSV bits
    # set, so the server answers 101 and then closes with 1002; it never answers it as HTTP.
    c = Client(port, request=handshake(port) + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        assert c.status == 101, c.head
        c.expect_close(1002)
    finally:
        c.close()


def test_handshake_pipelined_request_after_a_denied_upgrade_is_not_served(port: int) -> None:
    req = handshake(port).replace(b"/echo", b"/deny") + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"
    c = Client(port, request=req)
    try:
        assert c.status == 403, c.head
        c.sock.settimeout(10)
        rest = c.buf
        while chunk := c.sock.recv(65536):
            rest += chunk
        assert b"HTTP/1.1" not in rest and b"http scope" not in rest, rest
    finally:
        c.close()


def test_handshake_frames_sent_with_the_request_wait_for_the_accept(port: int) -> None:
    # A masked frame right behind the head (allowed by some clients' eager sends) is kept until the app
    # accepted and then echoed, not lost or read as HTTP.
    c = Client(port, request=handshake(port) + frame(0x1, b"early"))
    try:
        assert c.status == 101, c.head
        assert c.recv_message().payload == b"early"
    finally:
        c.close()


def test_server_survives_the_suite(port: int) -> None:
    # After every broken client above, a fresh connection still echoes.
    c = Client(port)
    try:
        assert c.status == 101
        c.echo_works()
    finally:
        c.close()
