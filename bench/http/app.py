"""The one ASGI app every server in the HTTP benchmark serves.

Routes (the workloads of bench/http/driver.py):

- `/`        plaintext "Hello, World!" (13 bytes)
- `/json`    a small JSON document (27 bytes)
- `/64k`     a 64 KiB body in one message
- `/stream`  1 MiB streamed as 16 messages of 64 KiB, no content-length (chunked)
- `/upload`  reads the whole request body, answers its length as text
- `/await`   awaits asyncio.sleep(0.001), then answers "Hello, World!"

Raw ASGI, so the figures measure servers, not a framework.
"""

import asyncio
import json

PLAIN = b"Hello, World!"
PLAIN_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", str(len(PLAIN)).encode())]
JSON_HEADERS = [(b"content-type", b"application/json")]
BODY_64K = b"x" * 65536
BODY_64K_HEADERS = [(b"content-type", b"application/octet-stream"), (b"content-length", b"65536")]
STREAM_CHUNK = b"y" * 65536
STREAM_CHUNKS = 16
STREAM_HEADERS = [(b"content-type", b"application/octet-stream")]


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/json":
        body = json.dumps({"message": "Hello, World!"}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": JSON_HEADERS + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/64k":
        await send({"type": "http.response.start", "status": 200, "headers": BODY_64K_HEADERS})
        await send({"type": "http.response.body", "body": BODY_64K})
        return
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
        for _ in range(STREAM_CHUNKS - 1):
            await send({"type": "http.response.body", "body": STREAM_CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": STREAM_CHUNK})
        return
    if path == "/upload":
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/await":
        await asyncio.sleep(0.001)
    await send({"type": "http.response.start", "status": 200, "headers": PLAIN_HEADERS})
    await send({"type": "http.response.body", "body": PLAIN})
