"""Starlette and FastAPI apps served by `cadeloop`, checked with httpx."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from server_harness import APPS, ServerProcess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def starlette(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    srv = ServerProcess("starlette_app:app", tmp=tmp_path_factory.mktemp("starlette")).start()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        c.server = srv  # type: ignore[attr-defined]
        yield c
    rc = srv.stop(signal.SIGINT)
    assert rc == 0, srv.log()
    assert "starlette_app: lifespan shutdown ran" in srv.log()


@pytest.fixture(scope="module")
def fastapi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    srv = ServerProcess("fastapi_app:app", app_dir=EXAMPLES, tmp=tmp_path_factory.mktemp("fastapi")).start()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        yield c
    assert srv.stop() == 0, srv.log()


def test_starlette_routing_path_query_state_and_middleware(starlette: httpx.Client) -> None:
    r = starlette.get("/users/42", params={"q": "x y"})
    assert r.json() == {"id": 42, "q": "x y", "db": "connected"}
    assert r.headers["x-stamp"] == "mw"
    assert starlette.get("/").text == "home"
    assert starlette.get("/users/notanint").status_code == 404


def test_starlette_forms_and_multipart_uploads(starlette: httpx.Client) -> None:
    assert starlette.post("/form", data={"a": "1", "b": "two"}).json() == {"a": "1", "b": "two"}
    payload = b"0123456789" * 50_000
    r = starlette.post("/form", data={"note": "hi"}, files={"upload": ("big.bin", payload, "application/octet-stream")})
    assert r.json() == {"note": "hi", "upload": {"filename": "big.bin", "size": len(payload), "head": "0123456789"}}


def test_starlette_streaming_and_file_responses(starlette: httpx.Client) -> None:
    r = starlette.get("/stream", params={"n": 4, "delay": 0.01})
    assert r.text == "part 0\npart 1\npart 2\npart 3\n"
    assert r.headers["transfer-encoding"] == "chunked"
    r = starlette.get("/file")
    assert r.content == (APPS / "static.txt").read_bytes()
    assert r.headers["content-length"] == str(len(r.content))


def test_starlette_background_tasks_run_after_the_response(starlette: httpx.Client) -> None:
    assert starlette.get("/background", params={"tag": "t1"}).text == "queued"
    deadline = time.monotonic() + 5
    while "t1" not in starlette.get("/done").json():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_starlette_exceptions_and_handlers(starlette: httpx.Client) -> None:
    assert starlette.get("/teapot").status_code == 418
    assert starlette.get("/teapot").json() == {"handled": "mapped by a handler"}
    r = starlette.get("/boom")
    assert r.status_code == 500
    server: ServerProcess = starlette.server  # type: ignore[attr-defined]
    server.wait_log("RuntimeError: starlette boom")


def test_fastapi_example(fastapi: httpx.Client) -> None:
    assert fastapi.get("/").json() == {"message": "Hello, World!"}
    assert fastapi.get("/items/5", params={"q": "abc"}).json() == {"item_id": 5, "q": "abc", "limit": 10}
    assert fastapi.get("/items/5?limit=3").json() == {"item_id": 5, "q": None, "limit": 3}
    assert fastapi.get("/items/five").status_code == 422
    r = fastapi.post("/items", json={"name": "pen", "price": 1.5, "tags": ["a"]})
    assert r.json() == {"created": {"name": "pen", "price": 1.5, "tags": ["a"]}, "total": 3.0}
    assert fastapi.post("/items", json={"name": "pen"}).status_code == 422
