"""A Starlette app: routing, JSON, forms and uploads, streaming, files, background tasks, middleware, errors."""

import asyncio
import contextlib
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

DONE: list[str] = []
FILE = Path(__file__).with_name("static.txt")


@contextlib.asynccontextmanager
async def lifespan(app):
    yield {"db": "connected"}
    print("starlette_app: lifespan shutdown ran", flush=True)


async def home(request: Request):
    return PlainTextResponse("home")


async def user(request: Request):
    return JSONResponse({"id": request.path_params["uid"], "q": request.query_params.get("q"),
                         "db": request.state.db})


async def form(request: Request):
    data = await request.form()
    out = {}
    for k, v in data.multi_items():
        if hasattr(v, "read"):
            content = await v.read()
            out[k] = {"filename": v.filename, "size": len(content), "head": content[:10].decode()}
        else:
            out[k] = v
    return JSONResponse(out)


async def stream(request: Request):
    async def gen():
        for i in range(int(request.query_params.get("n", "5"))):
            yield f"part {i}\n"
            await asyncio.sleep(float(request.query_params.get("delay", "0")))
    return StreamingResponse(gen(), media_type="text/plain")


async def file(request: Request):
    return FileResponse(FILE)


async def background(request: Request):
    async def later(tag: str):
        await asyncio.sleep(0.05)
        DONE.append(tag)
    return PlainTextResponse("queued", background=BackgroundTask(later, request.query_params["tag"]))


async def done(request: Request):
    return JSONResponse(DONE)


async def boom(request: Request):
    raise RuntimeError("starlette boom")


async def teapot(request: Request):
    raise LookupError("mapped by a handler")


async def lookup_handler(request: Request, exc: Exception):
    return JSONResponse({"handled": str(exc)}, status_code=418)


class Stamp(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        response = await call_next(request)
        response.headers["x-stamp"] = "mw"
        return response


app = Starlette(
    routes=[Route("/", home), Route("/users/{uid:int}", user), Route("/form", form, methods=["POST"]),
            Route("/stream", stream), Route("/file", file), Route("/background", background), Route("/done", done),
            Route("/boom", boom), Route("/teapot", teapot)],
    middleware=[Middleware(Stamp)],
    exception_handlers={LookupError: lookup_handler},
    lifespan=lifespan,
)
