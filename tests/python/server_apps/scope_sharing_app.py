"""Reports the scope it got, after mutating it the way middleware may, for test_scope_sharing.py.

Every request and WebSocket answers with its own scope's method, path, raw_path, query_string,
headers and client as JSON, after appending a header to scope["headers"] and rebinding those
keys: the next request and the next connection must see none of that.
"""

import json


def report(scope) -> bytes:
    seen = {
        "path": scope["path"],
        "raw_path": scope["raw_path"].decode("latin-1"),
        "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in scope["headers"]],
        "client": list(scope["client"]),
        "subprotocols": list(scope.get("subprotocols", [])),
        "server": list(scope["server"]),
        "http_version": scope["http_version"],
        "added_key": "added-by-the-app" in scope,
        "method": scope.get("method"),
        "query_string": scope.get("query_string", b"").decode("latin-1"),
    }
    scope["headers"].append((b"x-added-by-the-app", b"1"))
    scope["path"] = "/changed-by-the-app"
    scope["client"] = ("203.0.113.1", 1)
    scope["server"] = ("203.0.113.2", 2)
    scope["http_version"] = "2"
    scope["method"] = "MUTATED"
    scope["raw_path"] = b"/changed-by-the-app"
    scope["query_string"] = b"changed=by-the-app"
    scope["added-by-the-app"] = True
    return json.dumps(seen).encode()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            kind = m["type"].rsplit(".", 1)[1]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["type"] == "http":
        while (await receive()).get("more_body"):
            pass
        body = report(scope)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": report(scope).decode()})
    await receive()  # websocket.disconnect (or the client's message)
