"""An app whose requests can end its process (tests/python/test_server_crash.py).

/exit calls os._exit(1), /segv reads address 0 (a segfault), /pair says which
core pair answered, /block blocks the app thread in time.sleep(secs) (a stuck
app no cancellation reaches), /hold awaits the request's disconnect (an app
holding a request open), /stream?n=N sends N chunks 5 ms apart.
"""

import asyncio
import ctypes
import os
import time
from urllib.parse import parse_qs

from cadeloop.server import current_pair

from app_lifespan import serve_lifespan


async def respond(send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    path = scope["path"]
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if path == "/exit":
        os._exit(1)
    if path == "/segv":
        ctypes.string_at(0)
    if path == "/block":
        time.sleep(float(q.get("secs", "60")))
    if path == "/hold":
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for _ in range(int(q.get("n", "1000"))):
            await send({"type": "http.response.body", "body": b"x" * 4096, "more_body": True})
            await asyncio.sleep(0.005)
        await send({"type": "http.response.body", "body": b""})
        return
    await respond(send, f"pair {current_pair()} pid {os.getpid()}\n".encode())
