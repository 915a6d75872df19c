"""An app that says which core pair served it (tests/python/test_server_cores.py).

Lifespan startup and shutdown append a line to the file named by
CORES_APP_EVENTS (if set): "startup pair=I pid=P" / "shutdown pair=I pid=P".
"""

import asyncio
import json
import os
import threading
import time
from urllib.parse import parse_qs

from cadeloop import _core
from cadeloop.server import current_pair

from app_lifespan import serve_lifespan

if os.environ.get("CORES_APP_FAIL_IN_SUBINTERPRETER") and not _core.in_main_interpreter():
    raise RuntimeError("cores_app refuses to load in a sub-interpreter")


def _event(what: str) -> None:
    path = os.environ.get("CORES_APP_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} pair={current_pair()} pid={os.getpid()}\n")


def _burn(ms: float) -> int:
    end = time.perf_counter() + ms / 1000
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


async def respond(send, body: bytes, content_type: bytes = b"text/plain") -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send, lambda: _event("startup"), lambda: _event("shutdown"))
    path = scope["path"]
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if path == "/pair":
        body = {"pair": current_pair(), "pid": os.getpid(), "main_interpreter": _core.in_main_interpreter(),
                "thread": threading.get_ident(), "cpus": sorted(os.sched_getaffinity(0))}
        return await respond(send, json.dumps(body).encode(), b"application/json")
    if path == "/threads":
        # Threads the app starts and leaves running: the pair must account for them when it ends.
        secs = float(q.get("secs", "1"))
        started = []
        threading.Thread(target=time.sleep, args=(secs,)).start()
        started.append("thread")
        try:
            import _thread

            _thread.start_new_thread(time.sleep, (secs,))
            started.append("raw")
        except RuntimeError as exc:
            started.append(f"raw refused: {exc}")
        return await respond(send, json.dumps(started).encode(), b"application/json")
    if path == "/loop-stats":
        pair = asyncio.get_running_loop().stats()["pair"]
        body = {"pair": current_pair(), "page_index": pair["index"], "requests": pair["requests"]}
        return await respond(send, json.dumps(body).encode(), b"application/json")
    if path == "/cpu":
        _burn(float(q.get("ms", "5")))
        return await respond(send, b"done")
    if path == "/slow":
        await asyncio.sleep(float(q.get("delay", "0.2")))
        return await respond(send, f"slow done {current_pair()} {os.getpid()}".encode())
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"not found"})
