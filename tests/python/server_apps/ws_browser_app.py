"""A page and its WebSocket for tests/python/test_websocket_browser.py (headless Chromium).

`/` is an HTML page whose script opens WebSockets back to the server it came
from, sends text and binary messages, and writes what came back into the DOM
(`#result`, then `#done`). `/ws` answers each text message with "echo:" and
the text, and each binary message with its bytes reversed, so the page shows
that the app, not only the socket, handled them.
"""

from app_lifespan import serve_lifespan

PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>ws</title></head>
<body><pre id="result">pending</pre><pre id="done"></pre>
<script>
const lines = [];
function one(i) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://${location.host}/ws?n=${i}`, ["chat"]);
    ws.binaryType = "arraybuffer";
    const got = [];
    ws.onopen = () => {
      ws.send(`hello ${i} \\u00e9\\u4e2d`);
      ws.send(new Uint8Array([1, 2, 3, i]));
      ws.send("x".repeat(70000));
    };
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        got.push(e.data.length > 100 ? `long ${e.data.length} ${e.data.slice(0, 6)}` : e.data);
      } else {
        got.push("bytes " + Array.from(new Uint8Array(e.data)).join(","));
      }
      if (got.length === 3) ws.close(1000, "done");
    };
    ws.onclose = (e) => resolve(`ws ${i} [${ws.protocol}] ${got.join(" | ")} | close ${e.code} ${e.wasClean}`);
    ws.onerror = () => reject(new Error(`ws ${i} error`));
  });
}
Promise.all([0, 1, 2, 3].map(one)).then(
  (all) => { document.getElementById("result").textContent = all.join("\\n"); },
  (err) => { document.getElementById("result").textContent = "failed: " + err.message; },
).finally(() => { document.getElementById("done").textContent = "done"; });
</script></body></html>
"""


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8")]})
        await send({"type": "http.response.body", "body": PAGE})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept", "subprotocol": "chat" if "chat" in scope["subprotocols"] else None})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None:
            await send({"type": "websocket.send", "text": "echo:" + message["text"]})
        else:
            await send({"type": "websocket.send", "bytes": message["bytes"][::-1]})
