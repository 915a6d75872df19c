"""An app whose requests can block their app thread (tests/python/test_server_watchdog.py).

/block?until=PATH blocks the app thread in time.sleep() until the file PATH
exists (the test releases it), /block?secs=N for N seconds; /pair says which
core pair answered.
"""

import os
import time
from urllib.parse import parse_qs

from cadeloop.server import current_pair

from app_lifespan import serve_lifespan


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/block":
        deadline = time.monotonic() + float(q.get("secs", "60"))
        while time.monotonic() < deadline and not ("until" in q and os.path.exists(q["until"])):
            time.sleep(0.05)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": f"pair {current_pair()} pid {os.getpid()}\n".encode()})
