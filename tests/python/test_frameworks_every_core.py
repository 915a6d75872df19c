"""Django, Litestar, Quart, FastAPI and Starlette with `--cores 2` in auto isolation.

Each framework's app is written into the test's directory (Django's project
is made by `django-admin startproject`), served by a real `cadeloop` process
with two core pairs and `--isolation auto`, asked for an async and a sync
view on fresh connections until both pairs answered, and stopped with
SIGTERM: the process must exit 0 well within the grace period, with no
traceback in its log. Each app answers with a token made of a uuid drawn when
its module was imported and the pid of the process answering, so two tokens
mean two pairs (two sub-interpreters or two worker processes) served. A plain
ASGI app with a ThreadPoolExecutor of its own is checked the same way.

What auto chose is asserted too (and written in docs/compatibility.md): the
isolation line names the mode and, for a fallback, its cause.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from server_harness import ServerProcess

GRACE = 10.0

#: token(): which interpreter (a uuid made when it imported the app) in which process (worker
#: processes inherit the module imported before the fork) answers.
TOKEN = "import os, uuid\nIMPORTED = uuid.uuid4().hex\ndef token():\n    return f'{os.getpid()}-{IMPORTED}'\n"

STARLETTE = TOKEN + textwrap.dedent("""
    import threading
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request):
        return JSONResponse({"view": "async", "token": token()})

    def sync_hello(request):
        return JSONResponse({"view": "sync", "token": token(), "thread": threading.current_thread().name})

    app = Starlette(routes=[Route("/async", hello), Route("/sync", sync_hello)])
""")

FASTAPI = TOKEN + textwrap.dedent("""
    import threading
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/async")
    async def hello():
        return {"view": "async", "token": token()}

    @app.get("/sync")
    def sync_hello():
        return {"view": "sync", "token": token(), "thread": threading.current_thread().name}
""")

LITESTAR = TOKEN + textwrap.dedent("""
    import threading
    from litestar import Litestar, get

    @get("/async")
    async def hello() -> dict:
        return {"view": "async", "token": token()}

    @get("/sync", sync_to_thread=True)
    def sync_hello() -> dict:
        return {"view": "sync", "token": token(), "thread": threading.current_thread().name}

    app = Litestar([hello, sync_hello])
""")

QUART = TOKEN + textwrap.dedent("""
    import threading
    from quart import Quart

    app = Quart(__name__)

    @app.get("/async")
    async def hello():
        return {"view": "async", "token": token()}

    @app.get("/sync")
    def sync_hello():
        return {"view": "sync", "token": token(), "thread": threading.current_thread().name}
""")

#: A plain ASGI app with a pool of its own: its idle threads must not hold the stop (in a
#: sub-interpreter they end through threading's exit hooks, as at a process's exit).
OWN_POOL = TOKEN + textwrap.dedent("""
    import asyncio, json, threading
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=2)

    def work(view):
        return {"view": view, "token": token(), "thread": threading.current_thread().name}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        view = scope["path"].strip("/")
        body = work(view) if view == "async" else await asyncio.get_running_loop().run_in_executor(pool, work, view)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})
""")

DJANGO_VIEWS = TOKEN + textwrap.dedent("""
    import threading
    from django.http import JsonResponse

    async def hello(request):
        return JsonResponse({"view": "async", "token": token()})

    def sync_hello(request):
        return JsonResponse({"view": "sync", "token": token(), "thread": threading.current_thread().name})
""")


def django_project(root: Path) -> str:
    """A project made by `django-admin startproject mysite` in root, with one async and one sync view."""
    django_admin = Path(sys.executable).parent / "django-admin"
    subprocess.run([str(django_admin), "startproject", "mysite", str(root)], check=True,
                   capture_output=True, timeout=60)
    (root / "mysite" / "views.py").write_text(DJANGO_VIEWS)
    urls = root / "mysite" / "urls.py"
    text = urls.read_text()
    assert "urlpatterns = [" in text
    urls.write_text("from . import views\n" + text.replace(
        "urlpatterns = [",
        "urlpatterns = [\n    path('async', views.hello),\n    path('sync', views.sync_hello),", 1))
    return "mysite.asgi:application"


def module_app(source: str, name: str):  # type: ignore[no-untyped-def]
    def make(root: Path) -> str:
        (root / f"{name}.py").write_text(source)
        return f"{name}:app"
    return make


FRAMEWORKS = {
    "django": django_project,
    "litestar": module_app(LITESTAR, "litestar_site"),
    "quart": module_app(QUART, "quart_site"),
    "fastapi": module_app(FASTAPI, "fastapi_site"),
    "starlette": module_app(STARLETTE, "starlette_site"),
    "own-pool": module_app(OWN_POOL, "own_pool_site"),
}

#: What `--isolation auto` chooses for each framework on 3.13 (3.11 has processes only).
AUTO_ON_313 = {
    "django": "subinterpreters",
    "litestar": "processes",  # msgspec refuses sub-interpreters
    "quart": "subinterpreters",
    "fastapi": "processes",  # pydantic_core refuses sub-interpreters
    "starlette": "subinterpreters",
    "own-pool": "subinterpreters",
}
ISOLATION_LINE = re.compile(r"isolation (subinterpreters|processes) \((.*)\)")


def get(url: str) -> dict[str, str]:
    """A GET on a fresh connection (SO_REUSEPORT spreads connections over the pairs)."""
    with httpx.Client(timeout=10) as client:
        r = client.get(url, headers={"connection": "close"})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_framework_serves_on_two_pairs_and_stops_cleanly(tmp_path: Path, framework: str) -> None:
    root = tmp_path / "app"
    root.mkdir()
    app = FRAMEWORKS[framework](root)
    srv = ServerProcess(app, "--cores", "2", "--isolation", "auto", "--grace", str(GRACE),
                        tmp=tmp_path, app_dir=root).start(timeout=60)
    try:
        tokens: set[str] = set()
        for _ in range(200):
            a = get(srv.url + "/async")
            s = get(srv.url + "/sync")
            assert a["view"] == "async" and s["view"] == "sync"
            assert s["thread"] != "MainThread", s  # the sync view ran on a worker thread
            tokens |= {a["token"], s["token"]}
            if len(tokens) >= 2:
                break
        assert len(tokens) == 2, f"one pair answered every request: {tokens}\n{srv.log()}"
    finally:
        started = time.monotonic()
        rc = srv.stop(signal.SIGTERM, timeout=GRACE + 20)
        took = time.monotonic() - started
    log = srv.log()
    assert rc == 0, log
    assert took < GRACE, f"stopping took {took:.1f}s\n{log}"
    assert "Traceback" not in log and "RuntimeError" not in log, log
    m = ISOLATION_LINE.search(log)
    assert m, log
    expected = AUTO_ON_313[framework] if sys.version_info >= (3, 13) else "processes"
    assert m.group(1) == expected, log
    assert f"2 core pairs, isolation {expected}" in log, log
