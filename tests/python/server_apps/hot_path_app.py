"""An app for the hot-path tests (tests/python/test_server_hot_path.py): numbered answers, slow ones, 64 KiB bodies."""

import asyncio
from urllib.parse import parse_qs

BODY_64K = b"x" * 65536


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/64k":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", b"65536")]})
        await send({"type": "http.response.body", "body": BODY_64K})
        return
    # /n?i=N[&delay=S]: answers "N" after S seconds, so a client can tell the answers apart.
    await asyncio.sleep(float(q.get("delay", "0")))
    body = q.get("i", "").encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
