"""An app that refuses the lifespan scope (raises), served normally with --lifespan auto."""


async def app(scope, receive, send):
    if scope["type"] != "http":
        raise RuntimeError(f"unsupported scope {scope['type']}")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"no lifespan here"})
