"""An ASGI app for the TLS tests: it shows what the scope says about the connection."""

import json


def _tls_view(scope):
    tls = scope.get("extensions", {}).get("tls")
    if tls is None:
        return None
    return {
        "tls_version": tls.get("tls_version"),
        "cipher_suite": tls.get("cipher_suite"),
        "has_server_cert": bool(tls.get("server_cert")),
        "client_cert_chain": len(tls.get("client_cert_chain") or []),
        "client_cert_name": tls.get("client_cert_name"),
        "client_cert_error": tls.get("client_cert_error"),
    }


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps({"scheme": scope["scheme"], "tls": _tls_view(scope)})})
        while True:
            m = await receive()
            if m["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": m.get("text"), "bytes": m.get("bytes")})
    size = 0
    while True:
        m = await receive()
        size += len(m.get("body", b""))
        if not m.get("more_body"):
            break
    if scope["path"].startswith("/big/"):
        n = int(scope["path"].rsplit("/", 1)[1])
        chunk = b"x" * 65536
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", str(n).encode())]})
        while n > 0:
            piece = chunk[: min(n, len(chunk))]
            n -= len(piece)
            await send({"type": "http.response.body", "body": piece, "more_body": n > 0})
        return
    body = json.dumps({"scheme": scope["scheme"], "received": size, "tls": _tls_view(scope)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
