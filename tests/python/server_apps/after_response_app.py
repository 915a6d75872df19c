"""An app for test_server_hostile.py: what receive() gives once the response is complete."""

import asyncio

from app_lifespan import serve_lifespan

EVENTS: list[str] = []  # what receive() gave after the response (read back through /events)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    if scope["path"] == "/events":
        body = ",".join(EVENTS).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["path"] == "/answer-while-waiting":  # a receive() waits for a body that is not coming
        assert (await receive())["more_body"]  # the first half; the rest never comes
        waiting = asyncio.ensure_future(receive())
        await asyncio.sleep(0.2)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        try:
            EVENTS.append((await asyncio.wait_for(waiting, 5))["type"])
        except asyncio.TimeoutError:
            EVENTS.append("timeout")
        return
    # Answers without reading the request body, then asks for the next event.
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
    try:
        message = await asyncio.wait_for(receive(), 5)
        EVENTS.append(message["type"])
    except asyncio.TimeoutError:
        EVENTS.append("timeout")
