"""A raw ASGI app exercising the bridge: every route is one behaviour a test checks."""

import asyncio
import hashlib
import json
import subprocess
from urllib.parse import parse_qs

from app_lifespan import serve_lifespan

EVENTS: list[str] = []  # what the app saw (read back through /events)
KEPT: list = []  # (receive, send) of earlier requests, kept past their end by /keep-callables


async def respond(send, status=200, body=b"", headers=None):
    await send({"type": "http.response.start", "status": status, "headers": headers or [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive):
    size, chunks, h = 0, 0, hashlib.sha256()
    while True:
        m = await receive()
        assert m["type"] == "http.request", m
        size += len(m["body"])
        h.update(m["body"])
        chunks += 1
        if not m.get("more_body", False):
            return size, chunks, h.hexdigest()


class Key(str):
    """A str subclass: a message key that is not the interned name."""


def made(name: str):
    """`name` as an equal str built at run time, not the interned literal."""
    return "".join(list(name))


async def message_shapes(send, shape):
    if shape == "runtime-keys":  # equal keys that are other objects than the names
        await send({made("type"): made("http.response.start"), made("status"): 201,
                    Key("headers"): [(b"x-shape", b"runtime-keys")], made("trailers"): False})
        await send({made("type"): "http.response.body", Key("body"): b"part one, ", made("more_body"): True})
        await send({Key("type"): "http.response.body", made("body"): b"part two"})
        return
    if shape == "extra-keys":  # keys ASGI does not define are ignored, whatever they are
        extra = {f"x{i}": i for i in range(40)} | {b"status": 500, 7: "seven", ("body",): b"no"}
        await send(extra | {"type": "http.response.start", "status": 202, "headers": [(b"x-shape", b"extra")]})
        await send({"more_body": False, **extra, "body": b"extra keys ignored", "type": "http.response.body"})
        return
    if shape == "headers-empty-the-message":  # iterating the headers takes every key out of the message
        message = {"type": "http.response.start", "status": 203, "trailers": False}

        def pairs():
            message.clear()
            yield (b"x-shape", "emptied".encode())
            yield (b"x-built", b"at-" + b"run-time")

        message["headers"] = pairs()
        await send(message)
        await send({"type": "http.response.body", "body": b"headers emptied the message"})
        return
    if shape == "more-body-empties-the-message":  # more_body's truth takes the body out of the message
        message = {"type": "http.response.body"}

        class Last:
            def __bool__(self):
                message.clear()
                return False

        message["body"] = b"".join([b"body ", b"kept"])
        message["more_body"] = Last()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-shape", b"more")]})
        await send(message)
        return
    raise ValueError(f"no shape {shape!r}")


async def lifespan(scope, receive, send):
    def startup():
        scope["state"]["greeting"] = "hello from lifespan"

    await serve_lifespan(receive, send, startup, lambda: print("raw_app: lifespan shutdown ran", flush=True))


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(scope, receive, send)
    # Routes within the mount, as Starlette does: path starts with root_path (ASGI, uvicorn 0.26+).
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if path == "/hello":
        return await respond(send, body=b"Hello, World!")
    if path == "/spawn":  # a child that inherits every inheritable descriptor and outlives the response
        child = subprocess.Popen(["sleep", q.get("s", "3")], close_fds=False)
        KEPT.append(child)  # reaped when the server stops
        return await respond(send, body=b"spawned %d" % child.pid)
    if path.startswith("/scope"):
        s = {k: v for k, v in scope.items() if k not in ("headers", "raw_path", "query_string", "state")}
        s["headers"] = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]]
        s["raw_path"] = scope["raw_path"].decode("latin-1")
        s["query_string"] = scope["query_string"].decode("latin-1")
        s["state"] = scope.get("state")
        s["header_types"] = sorted({type(k).__name__ + "/" + type(v).__name__ for k, v in scope["headers"]})
        return await respond(send, body=json.dumps(s).encode(), headers=[(b"content-type", b"application/json")])
    if path == "/echo":
        body = b""
        while True:
            m = await receive()
            body += m["body"]
            if not m.get("more_body"):
                break
        return await respond(send, body=body)
    if path == "/upload":
        size, chunks, digest = await read_body(receive)
        return await respond(send, body=json.dumps({"size": size, "chunks": chunks, "sha256": digest}).encode())
    if path == "/raise":
        raise ValueError("boom from the app")
    if path == "/raise-after-start":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise ValueError("boom after start")
    if path == "/bad-status":
        await send({"type": "http.response.start", "status": "200", "headers": []})
        return
    if path == "/status-range":
        return await respond(send, status=1000)
    if path == "/bad-header":
        await send({"type": "http.response.start", "status": 200, "headers": [("x-str", "not bytes")]})
        return
    if path == "/header-shapes":  # the iterables and pairs ASGI apps send as headers
        shape = q.get("shape", "")
        pairs = [(b"x-one", b"1"), (b"x-two", b"2")]
        headers = {
            "lists": [list(p) for p in pairs],
            "tuple": tuple(pairs),
            "generator": (p for p in pairs),
            "mutated": list(pairs),
        }[shape]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if shape == "mutated":  # after start: the head keeps what start() was given
            headers.append((b"x-late", b"3"))
            headers[0] = (b"x-changed", b"0")
        await send({"type": "http.response.body", "body": shape.encode()})
        return
    if path == "/repeat-headers":  # header lines that come back request after request
        variant = q.get("variant", "")
        body = f"variant {variant}".encode()
        headers = [(b"content-type", b"text/plain"), (b"x-variant", variant.encode()),
                   (b"content-length", str(len(body)).encode())]
        if variant == "close":
            headers.append((b"connection", b"close"))
        elif variant == "bad":
            headers.append((b"x-bad", b"a\r\nb"))
        elif variant == "length":  # a Content-Length that disagrees with an earlier one
            headers.append((b"Content-Length", b"3"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/message-shapes":  # messages as apps may build them, read the same
        return await message_shapes(send, q.get("shape", ""))
    if path == "/bad-header-pair":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-ok", b"1"), (b"a", b"b", b"c")]})
        return
    if path == "/bad-header-value":
        return await respond(send, headers=[(b"x-bad", b"a\r\nb")])
    if path == "/body-over-length":  # the app's own Content-Length, a body longer in one message
        return await respond(send, body=b"hello", headers=[(b"content-length", b"3")])
    if path == "/body-under-length":
        return await respond(send, body=b"hi", headers=[(b"content-length", b"10")])
    if path == "/reset-content":  # 205 with a body the server must not send
        return await respond(send, status=205, body=b"not for the client")
    if path == "/bad-type":
        await send({"type": "http.response.bogus"})
        return
    if path == "/body-before-start":
        await send({"type": "http.response.body", "body": b"x"})
        return
    if path == "/no-response":
        return
    if path == "/keep-callables":
        KEPT.append((receive, send))
        return await respond(send, body=b"kept")
    if path == "/use-kept-callables":
        # An earlier request's receive and send, kept by the app: still that
        # request's (it is over), never this one's.
        old_receive, old_send = KEPT.pop()
        seen = ["distinct" if old_send is not send and old_receive is not receive else "the same objects"]
        try:
            await old_send({"type": "http.response.start", "status": 500, "headers": []})
            seen.append("stale send accepted")
        except OSError as exc:
            seen.append(f"stale send: {type(exc).__name__}")
        message = await old_receive()
        seen.append(f"stale receive: {message['type']}")
        return await respond(send, body=", ".join(seen).encode())
    if path == "/after-complete":
        await respond(send, body=b"done")
        try:
            await send({"type": "http.response.body", "body": b"again"})
        except OSError as exc:
            EVENTS.append(f"after-complete: {type(exc).__name__}")
        return
    if path == "/stream":
        n, delay = int(q.get("n", "1000")), float(q.get("delay", "0.01"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        try:
            for i in range(n):
                await send({"type": "http.response.body", "body": b"tick %d\n" % i, "more_body": True})
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": b""})
        except OSError as exc:
            EVENTS.append(f"stream: {type(exc).__name__}")
        return
    if path == "/longpoll":
        m = await receive()
        assert m["type"] == "http.request"
        m = await receive()  # nothing more to read: this waits for the client to go
        EVENTS.append(f"longpoll: {m['type']}")
        return
    if path == "/big":
        total = int(q.get("mb", "64")) << 20
        chunk = b"x" * 65536
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(total).encode())]})
        sent = 0
        try:
            while sent < total:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                sent += len(chunk)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            EVENTS.append(f"big: gone after {sent}")
        return
    if path == "/slow":
        await asyncio.sleep(float(q.get("delay", "0.2")))
        return await respond(send, body=b"slow done")
    if path == "/events":
        return await respond(send, body=json.dumps(EVENTS).encode())
    if path == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    return await respond(send, status=404, body=b"not found")
