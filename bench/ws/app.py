"""The one ASGI app every server in the WebSocket benchmark serves.

`/ws` (any path) echoes each message back as it came, text or bytes; an
`http` request gets a plain 200 (the driver's readiness probe). Raw ASGI, so
the figures measure the servers, not a framework.
"""

PLAIN = b"ok"
PLAIN_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"2")]


async def app(scope, receive, send):
    kind = scope["type"]
    if kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if kind == "http":
        await send({"type": "http.response.start", "status": 200, "headers": PLAIN_HEADERS})
        await send({"type": "http.response.body", "body": PLAIN})
        return
    if kind != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return  # websocket.disconnect
        data = message.get("bytes")
        if data is not None:
            await send({"type": "websocket.send", "bytes": data})
        else:
            await send({"type": "websocket.send", "text": message["text"]})
