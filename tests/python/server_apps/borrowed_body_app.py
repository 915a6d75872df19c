"""Responses whose bodies are large app objects, for test_response_bodies_borrowed.py.

- `/bytes?n=N`     one `bytes` body of N bytes (a module constant, sent as is)
- `/stream`        BODY four times as `more_body` messages, then an empty last one
- `/bytearray`     a 64 KiB `bytearray` of b"a", overwritten with b"b" as soon as send() returns
- `/subclass`      a 64 KiB body of a `bytes` subclass
- `/memoryview`    a memoryview of 64 KiB of b"m"
- `/refs`          JSON: sys.getrefcount of BODY and of the subclass body now
"""

import json
import sys

BODY = bytes(range(256)) * 256  # 64 KiB, every byte value
HALF = BODY[: 32 * 1024]


class Bytes(bytes):
    pass


SUB = Bytes(b"s" * 65536)


def query(scope):
    out = {}
    for part in scope["query_string"].decode().split("&"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


async def start(send, length=None):
    headers = [(b"content-type", b"application/octet-stream")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/bytes":
        n = int(query(scope).get("n", len(BODY)))
        body = BODY if n == len(BODY) else HALF if n == len(HALF) else BODY[:n]
        await start(send, len(body))
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        await start(send)
        for _ in range(4):
            await send({"type": "http.response.body", "body": BODY, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/bytearray":
        buf = bytearray(b"a" * 65536)
        await start(send, len(buf))
        await send({"type": "http.response.body", "body": buf})
        buf[:] = b"b" * 65536
    elif path == "/subclass":
        await start(send, len(SUB))
        await send({"type": "http.response.body", "body": SUB})
    elif path == "/memoryview":
        view = memoryview(b"m" * 65536)
        await start(send, len(view))
        await send({"type": "http.response.body", "body": view})
    elif path == "/refs":
        body = json.dumps({"body": sys.getrefcount(BODY), "sub": sys.getrefcount(SUB)}).encode()
        await start(send, len(body))
        await send({"type": "http.response.body", "body": body})
