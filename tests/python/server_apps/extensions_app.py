"""ASGI response extensions: http.response.pathsend (raw and through Starlette's FileResponse) and
http.response.trailers. The file to send is named by the `file` query parameter."""

import json
from urllib.parse import parse_qs

from starlette.responses import FileResponse


def query(scope):
    return {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}


async def read_body(receive):
    while True:
        message = await receive()
        if not message.get("more_body"):
            return


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    q = query(scope)
    path = scope["path"]
    await read_body(receive)
    if path == "/extensions":
        body = json.dumps(sorted(scope.get("extensions", {}))).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    elif path == "/raw":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        try:
            await send({"type": "http.response.pathsend", "path": q["file"]})
        except (OSError, ValueError) as e:
            print(f"extensions_app: pathsend refused: {type(e).__name__}", flush=True)
            raise
    elif path == "/starlette":
        await FileResponse(q["file"])(scope, receive, send)
    elif path == "/trailers":
        await send({"type": "http.response.start", "status": 200, "trailers": True,
                    "headers": [(b"content-type", b"text/plain"), (b"trailer", b"x-checksum, x-count")]})
        chunks = int(q.get("chunks", "3"))
        for i in range(chunks):
            await send({"type": "http.response.body", "body": f"part {i}\n".encode(), "more_body": i + 1 < chunks})
        await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"abc123")], "more_trailers": True})
        await send({"type": "http.response.trailers", "headers": [(b"x-count", str(chunks).encode())],
                    "more_trailers": False})
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"no such route"})
