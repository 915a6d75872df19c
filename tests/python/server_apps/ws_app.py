"""A raw ASGI WebSocket app for tests/python/test_websocket.py, one behaviour per path.

What the app itself saw (disconnect codes, errors raised by send()) is appended
as JSON lines to the file named by WS_EVENTS, so a test can read it whatever
pair (interpreter or process) served the connection.
"""

import asyncio
import json
import os

from app_lifespan import serve_lifespan


def record(**event):
    path = os.environ.get("WS_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


async def lifespan(receive, send, scope):
    def startup():
        if "state" in scope:
            scope["state"]["started"] = "yes"

    await serve_lifespan(receive, send, startup)


async def http(scope, receive, send):
    body = f"http scope {scope['path']} upgrade={dict(scope['headers']).get(b'upgrade', b'').decode()}"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body.encode()})


async def echo(scope, receive, send):
    """Echoes each message; 'close:CODE:REASON' makes the server close."""
    assert (await receive())["type"] == "websocket.connect"
    chosen = next((p for p in scope["subprotocols"] if p in ("chat", "superchat")), None)
    await send({"type": "websocket.accept", "subprotocol": chosen,
                "headers": [(b"x-ws-test", b"yes")]})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            record(path=scope["path"], code=msg["code"], reason=msg.get("reason", ""))
            return
        text = msg.get("text")
        if text is not None and text.startswith("close:"):
            _, code, reason = text.split(":", 2)
            await send({"type": "websocket.close", "code": int(code), "reason": reason})
            continue
        if text is not None:
            await send({"type": "websocket.send", "text": text})
        else:
            await send({"type": "websocket.send", "bytes": msg["bytes"]})


async def scope_view(scope, receive, send):
    await receive()
    await send({"type": "websocket.accept"})
    view = {k: scope[k] for k in ("type", "scheme", "http_version", "path", "root_path", "subprotocols")}
    view["raw_path"] = scope["raw_path"].decode()
    view["query_string"] = scope["query_string"].decode()
    view["extensions"] = sorted(scope.get("extensions", {}))
    view["header_names"] = sorted({k.decode() for k, _ in scope["headers"]})
    view["client"] = list(scope["client"]) if scope["client"] else None
    view["server"] = list(scope["server"]) if scope["server"] else None
    view["state"] = dict(scope.get("state", {}))
    view["asgi"] = scope["asgi"]
    view["has_method"] = "method" in scope
    await send({"type": "websocket.send", "text": json.dumps(view)})
    await send({"type": "websocket.close"})


async def deny(scope, receive, send):
    await receive()
    await send({"type": "websocket.close", "code": 1008})
    msg = await receive()
    record(path=scope["path"], after_deny=msg["type"], code=msg.get("code"))


async def deny_custom(scope, receive, send):
    await receive()
    await send({"type": "websocket.http.response.start", "status": 418,
                "headers": [(b"content-type", b"text/plain"), (b"x-denied", b"teapot")]})
    await send({"type": "websocket.http.response.body", "body": b"no tea ", "more_body": True})
    await send({"type": "websocket.http.response.body", "body": b"for you"})


async def no_accept(scope, receive, send):
    await receive()


async def bad_accept_header(scope, receive, send):
    """websocket.accept with the header the query names: ?type (not bytes) or ?value (CR/LF)."""
    await receive()
    bad = (b"x-ok", "text") if scope["query_string"] == b"type" else (b"x-ok", b"a\r\nb")
    try:
        await send({"type": "websocket.accept", "headers": [bad]})
    except (TypeError, ValueError) as exc:
        record(path=scope["path"], error=f"{type(exc).__name__}: {exc}")
        raise


async def raise_before(scope, receive, send):
    await receive()
    raise RuntimeError("boom before accept")


async def raise_after(scope, receive, send):
    await receive()
    await send({"type": "websocket.accept"})
    await receive()
    raise RuntimeError("boom after accept")


async def return_after_accept(scope, receive, send):
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": "bye"})


async def send_after_close(scope, receive, send):
    """Waits for the client to go, then sends: the error is recorded."""
    await receive()
    await send({"type": "websocket.accept"})
    msg = await receive()
    while msg["type"] != "websocket.disconnect":
        msg = await receive()
    try:
        await send({"type": "websocket.send", "text": "too late"})
    except Exception as e:  # noqa: BLE001 - the type is what is recorded
        record(path=scope["path"], error=type(e).__name__, oserror=isinstance(e, OSError))
        return
    record(path=scope["path"], error=None)


async def send_after_own_close(scope, receive, send):
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": 1000})
    try:
        await send({"type": "websocket.send", "text": "too late"})
    except Exception as e:  # noqa: BLE001
        record(path=scope["path"], error=type(e).__name__, oserror=isinstance(e, OSError))


async def slow(scope, receive, send):
    """Accepts and reads nothing for DELAY seconds, then reads everything, counting."""
    await receive()
    await send({"type": "websocket.accept"})
    delay = float(dict(p.split("=") for p in scope["query_string"].decode().split("&") if p).get("delay", 3))
    await asyncio.sleep(delay)
    count = size = 0
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            break
        count += 1
        size += len(msg.get("bytes") or b"")
        if msg.get("text") == "done":
            await send({"type": "websocket.send", "text": f"{count - 1} {size}"})
    record(path=scope["path"], count=count, size=size)


async def flood(scope, receive, send):
    """Sends COUNT messages of SIZE bytes as fast as send() lets it, then 'end'."""
    await receive()
    await send({"type": "websocket.accept"})
    q = dict(p.split("=") for p in scope["query_string"].decode().split("&") if p)
    chunk = b"x" * int(q.get("size", 65536))
    for _ in range(int(q.get("count", 100))):
        await send({"type": "websocket.send", "bytes": chunk})
    await send({"type": "websocket.send", "text": "end"})
    msg = await receive()
    while msg["type"] != "websocket.disconnect":
        msg = await receive()


async def hold(scope, receive, send):
    """Accepts and waits for the end, recording the code (for the drain test)."""
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            record(path=scope["path"], code=msg["code"])
            return


ROUTES = {
    "/echo": echo, "/scope": scope_view, "/deny": deny, "/deny-custom": deny_custom,
    "/no-accept": no_accept, "/raise-before": raise_before, "/bad-accept-header": bad_accept_header, "/raise-after": raise_after,
    "/return-after-accept": return_after_accept, "/send-after-close": send_after_close,
    "/send-after-own-close": send_after_own_close, "/slow": slow, "/flood": flood, "/hold": hold,
}


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await lifespan(receive, send, scope)
    elif scope["type"] == "http":
        await http(scope, receive, send)
    else:
        await ROUTES.get(scope["path"], echo)(scope, receive, send)
