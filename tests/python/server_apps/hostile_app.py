"""An app for the slow- and hostile-client tests: uploads, big streamed responses, the Host it sees."""

import asyncio
import json
from urllib.parse import parse_qs

from app_lifespan import serve_lifespan

EVENTS: list[str] = []  # what the app saw (read back through /events)
SHARED_CHUNK = b"x" * 65536  # /big?shared=1 sends this one object (a static asset), not a fresh one per request


async def respond(send, body, status=200):
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    path = scope["path"]
    if path == "/hello":
        return await respond(send, b"hello")
    if path == "/upload":
        size = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                EVENTS.append("upload: http.disconnect")
                return
            size += len(m["body"])
            if not m.get("more_body"):
                break
        return await respond(send, b"got %d" % size)
    if path == "/big":
        query = parse_qs(scope["query_string"].decode())
        mb = int(query.get("mb", ["16"])[0])
        chunk = SHARED_CHUNK if query.get("shared") == ["1"] else b"x" * 65536
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(mb << 20).encode())]})
        sent = 0
        try:
            while sent < mb << 20:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            EVENTS.append("big: gone")
            if query.get("raise") == ["1"]:
                raise  # as an app that does not catch the disconnect does
        return
    if path == "/hold":  # answers after ?s= seconds without reading the request body
        await asyncio.sleep(float(parse_qs(scope["query_string"].decode()).get("s", ["3"])[0]))
        return await respond(send, b"held")
    if path == "/host":
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        return await respond(send, json.dumps({"host": hosts, "server": scope.get("server")}).encode())
    if path == "/events":
        return await respond(send, json.dumps(EVENTS).encode())
    return await respond(send, b"not found", 404)
