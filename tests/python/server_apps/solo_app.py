"""An app for the solo-mode tests (tests/python/test_server_solo.py): fast routes, one that blocks its thread.

/echo answers the request body; /upload its size and sha256; /hello a fixed text; /block?secs=N blocks the app
thread in time.sleep() (inside the async handler) and then answers "blocked N"; /big?mb=N answers N MiB in 64 KiB
chunks; /stream?n=N&delay=S sends N lines, one every S seconds. A WebSocket on any path echoes what it gets.
"""

import asyncio
import hashlib
import json
import time
from urllib.parse import parse_qs

from app_lifespan import serve_lifespan


async def respond(send, body, status=200):
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def websocket_echo(receive, send):
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": m.get("text"), "bytes": m.get("bytes")})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    if scope["type"] == "websocket":
        return await websocket_echo(receive, send)
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    path = scope["path"]
    body, h = b"", hashlib.sha256()
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    if path == "/echo":
        return await respond(send, body)
    if path == "/upload":
        h.update(body)
        return await respond(send, json.dumps({"size": len(body), "sha256": h.hexdigest()}).encode())
    if path == "/hello":
        return await respond(send, b"hello")
    if path == "/block":
        secs = float(q.get("secs", "0.3"))
        time.sleep(secs)  # the whole app thread waits: no other task, no socket served by it
        return await respond(send, f"blocked {secs}".encode())
    if path == "/big":
        total = int(q.get("mb", "4")) << 20
        chunk = b"y" * 65536
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(total).encode())]})
        for sent in range(0, total, len(chunk)):
            await send({"type": "http.response.body", "body": chunk, "more_body": sent + len(chunk) < total})
        return
    if path == "/stream":
        n, delay = int(q.get("n", "50")), float(q.get("delay", "0.02"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(n):
            await send({"type": "http.response.body", "body": b"tick %d\n" % i, "more_body": True})
            await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b"end\n"})
        return
    return await respond(send, b"not found", status=404)
