"""An app for the fleet test (tests/python/test_fleet.py): says which instance served and whom it saw.

The instance's name comes from FLEET_NODE; `?delay=S` keeps the request in flight for S seconds,
so a graceful drain has requests to finish. Each request's `?id=` is appended to the file named by
FLEET_EVENTS when the app starts on it: a request a proxy retried elsewhere after it reached an app
shows up twice.
"""

import asyncio
import json
import os
from urllib.parse import parse_qs

from app_lifespan import serve_lifespan


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    events = os.environ.get("FLEET_EVENTS")
    if events and "id" in q:
        with open(events, "a") as f:
            f.write(q["id"] + "\n")
    delay = float(q.get("delay", "0"))
    if delay:
        await asyncio.sleep(delay)
    body = json.dumps({"node": os.environ.get("FLEET_NODE"), "client": scope["client"], "scheme": scope["scheme"],
                       "id": q.get("id")}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
