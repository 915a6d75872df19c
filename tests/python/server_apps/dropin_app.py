"""An app for the uvicorn drop-in tests: echoes its scope as JSON, and shows the environment and logging."""

from __future__ import annotations

import json
import logging
import os

from app_lifespan import serve_lifespan


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    if scope["path"].endswith("/log"):
        logging.getLogger("dropin").warning("a record from the app")
    body = json.dumps({
        "client": scope["client"],
        "scheme": scope["scheme"],
        "path": scope["path"],
        "raw_path": scope["raw_path"].decode("latin-1"),
        "root_path": scope["root_path"],
        "env": os.environ.get("DROPIN_VALUE"),
    }).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
