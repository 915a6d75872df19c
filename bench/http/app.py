"""The one ASGI app every server in the HTTP benchmark serves.

Routes: `/` plaintext "Hello, World!", `/json` a small JSON document.
Raw ASGI, so the figures measure servers, not a framework.
"""

import json

PLAIN = b"Hello, World!"
PLAIN_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", str(len(PLAIN)).encode())]
JSON_HEADERS = [(b"content-type", b"application/json")]


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
    if scope["path"] == "/json":
        body = json.dumps({"message": "Hello, World!"}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": JSON_HEADERS + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": PLAIN_HEADERS})
    await send({"type": "http.response.body", "body": PLAIN})
