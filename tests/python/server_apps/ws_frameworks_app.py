"""FastAPI and Starlette WebSocket endpoints for tests/python/test_websocket_frameworks.py.

`fastapi_app` serves /ws/echo (receive_text/send_text), /ws/iter (iter_text),
/ws/room (a broadcast to every connection of the pair), /ws/sub
(subprotocols) and /ws/deny (close before accept); `starlette_app` serves
/ws/endpoint (a WebSocketEndpoint). Disconnects are appended to WS_EVENTS.
"""

import json
import os

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from starlette.applications import Starlette
from starlette.endpoints import WebSocketEndpoint
from starlette.routing import WebSocketRoute


def record(**event):
    path = os.environ.get("WS_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


fastapi_app = FastAPI()
ROOM: set[WebSocket] = set()


@fastapi_app.get("/")
async def home():
    return {"ok": True}


@fastapi_app.websocket("/ws/echo")
async def echo(websocket: WebSocket):
    await websocket.accept()
    try:
        while True:
            text = await websocket.receive_text()
            await websocket.send_text(f"echo: {text}")
    except WebSocketDisconnect as e:
        record(path="/ws/echo", code=e.code)


@fastapi_app.websocket("/ws/iter")
async def iterate(websocket: WebSocket):
    await websocket.accept()
    async for text in websocket.iter_text():
        await websocket.send_text(text.upper())
    record(path="/ws/iter", ended=True)


@fastapi_app.websocket("/ws/room")
async def room(websocket: WebSocket):
    await websocket.accept()
    ROOM.add(websocket)
    await websocket.send_json({"members": len(ROOM)})
    try:
        while True:
            text = await websocket.receive_text()
            for member in list(ROOM):
                await member.send_text(text)
    except WebSocketDisconnect:
        pass
    finally:
        ROOM.discard(websocket)


@fastapi_app.websocket("/ws/sub")
async def sub(websocket: WebSocket):
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol="v2" if "v2" in offered else None)
    await websocket.send_json(offered)
    await websocket.close()


@fastapi_app.websocket("/ws/deny")
async def deny(websocket: WebSocket):
    await websocket.close(code=1008)


class Endpoint(WebSocketEndpoint):
    encoding = "text"

    async def on_receive(self, websocket, data):
        await websocket.send_text(f"starlette: {data}")

    async def on_disconnect(self, websocket, close_code):
        record(path="/ws/endpoint", code=close_code)


starlette_app = Starlette(routes=[WebSocketRoute("/ws/endpoint", Endpoint)])
