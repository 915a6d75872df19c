"""`--reload` (uvicorn's development flag): an edit to the app file is served by the next request."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from server_harness import ServerProcess

APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}})
    await send({{"type": "http.response.body", "body": b"{version}"}})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_text(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None  # between the old server and the new one
    return r.text if r.status_code == 200 else None


def test_an_edit_to_the_app_is_served_after_a_reload(tmp_path: Path) -> None:
    app_dir = tmp_path / "src"
    app_dir.mkdir()
    (app_dir / "reload_site.py").write_text(APP.format(version="version one"))
    (app_dir / "notes.txt").write_text("not watched")
    port = free_port()
    srv = ServerProcess("reload_site:app", "--reload", "--grace", "5", tmp=tmp_path, app_dir=app_dir)
    # --port 0 would give each restart another port: the server runs on a fixed one.
    srv.argv[srv.argv.index("--port") + 1] = str(port)
    srv.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        assert get_text(url) == "version one"
        srv.wait_log(r"reload: watching .*src \(\*\.py; not ")
        # A file that is not watched changes nothing.
        (app_dir / "notes.txt").write_text("still not watched")
        time.sleep(1.0)
        assert "changed; restarting" not in srv.log()
        # Whole seconds apart: a file system with coarse timestamps still sees the edit.
        time.sleep(1.0)
        (app_dir / "reload_site.py").write_text(APP.format(version="version two"))
        deadline = time.monotonic() + 30
        while get_text(url) != "version two":
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.1)
        assert "reload_site.py changed; restarting the server" in srv.log()
        assert srv.log().count("listening on http://") == 2
    finally:
        rc = srv.stop(signal.SIGTERM)
    assert rc == 0, srv.log()


def test_reload_with_more_than_one_core_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "reload_site.py").write_text(APP.format(version="x"))
    p = subprocess.run([sys.executable, "-m", "cadeloop", "reload_site:app", "--reload", "--workers", "2",
                        "--app-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("cadeloop: --reload: serves one core pair") and "(flag --workers)" in p.stderr
