"""An app for tests/python/test_body_delivery.py: what receive() hands it, message by message.

- `/messages`: reads the whole body and answers, as JSON, one [length, more_body] pair per http.request
  message, and the SHA-256 of the concatenated body.
- `/slow-messages`: the same, sleeping 10 ms after each message (a slow consumer).
- `/order/NAME`: notes NAME in the order the apps were called; `/order/NAME?report` answers that order.
"""

import asyncio
import hashlib
import json

STARTED: list[str] = []


async def answer(send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path.startswith("/order/"):
        STARTED.append(path.removeprefix("/order/"))
        while (await receive()).get("more_body", False):
            pass
        report = STARTED[:] if scope["query_string"] == b"report" else []
        if report:
            STARTED.clear()
        await answer(send, json.dumps(report).encode())
        return
    messages = []
    digest = hashlib.sha256()
    while True:
        message = await receive()
        assert message["type"] == "http.request", message
        messages.append([len(message["body"]), message["more_body"]])
        digest.update(message["body"])
        if path == "/slow-messages":
            await asyncio.sleep(0.01)
        if not message["more_body"]:
            break
    await answer(send, json.dumps({"messages": messages, "sha256": digest.hexdigest()}).encode())
