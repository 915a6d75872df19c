"""bench/ws/app.py (the echo app) plus `GET /census`: the interpreter's Python objects by type.

For bench/ws/idle_memory.py: the census taken before and after the idle WebSockets are opened says
which Python objects each connection holds (GC-tracked objects by type, `sys.getsizeof` bytes, and
the allocator's block count). `/census` runs in the app's interpreter, so under sub-interpreters
it sees the app's objects.
"""

import gc
import json
import sys

from app import app as echo


def census() -> dict:
    types: dict[str, list[int]] = {}
    for o in gc.get_objects():
        c = types.setdefault(type(o).__name__, [0, 0])
        c[0] += 1
        c[1] += sys.getsizeof(o)
    return {"types": types, "blocks": sys.getallocatedblocks()}


async def census_response(send) -> None:
    gc.collect()
    body = json.dumps(census()).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def app(scope, receive, send):
    # A plain function returning the coroutine: a wrapping coroutine would add its own frame to
    # every connection's cost.
    if scope["type"] == "http" and scope["path"] == "/census":
        return census_response(send)
    return echo(scope, receive, send)
