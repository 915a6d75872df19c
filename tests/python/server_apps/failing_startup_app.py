"""An app whose lifespan startup fails."""


async def app(scope, receive, send):
    assert scope["type"] == "lifespan"
    await receive()
    await send({"type": "lifespan.startup.failed", "message": "database unreachable"})
