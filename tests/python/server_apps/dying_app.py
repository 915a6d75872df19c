"""An app whose process dies during lifespan startup (supervision tests): os._exit, no message."""

import os


async def app(scope, receive, send):
    assert scope["type"] == "lifespan"
    await receive()
    os._exit(7)
