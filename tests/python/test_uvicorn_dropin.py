"""A uvicorn deployment moved over by changing one word: proxy headers, root_path, uvicorn's flags and API.

Each test starts a real `cadeloop` process (or a Python one using the API)
and looks from outside: the scope the app saw, response headers, exit codes
and the one-line errors.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from server_harness import APPS, ServerProcess, wait_listening


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        srv = ServerProcess("dropin_app:app", *args, tmp=tmp_path, env=env).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.stop() == 0, srv.log()


def scope_of(srv: ServerProcess, path: str = "/x", headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = httpx.get(srv.url + path, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cadeloop", *args], capture_output=True, text=True, timeout=30,
                          env=env)


# ----------------------------------------------------------------------------------- behind a proxy

def test_x_forwarded_from_a_trusted_peer(serve: Any) -> None:
    srv = serve()  # the default trusts 127.0.0.1, as uvicorn's
    s = scope_of(srv, headers={"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "https"})
    assert s["client"] == ["203.0.113.7", 0]
    assert s["scheme"] == "https"
    plain = scope_of(srv)
    assert plain["client"][0] == "127.0.0.1" and plain["client"][1] != 0
    assert plain["scheme"] == "http"


def test_forwarded_rfc7239_with_quoted_ipv6_and_port(serve: Any) -> None:
    srv = serve()
    s = scope_of(srv, headers={"Forwarded": 'for="[2001:db8::1]:4711";proto=https, for=127.0.0.1;proto=http'})
    assert s["client"] == ["2001:db8::1", 0]
    assert s["scheme"] == "https"
    s = scope_of(srv, headers={"Forwarded": "for=198.51.100.4:8080;proto=HTTP"})
    assert s["client"] == ["198.51.100.4", 0] and s["scheme"] == "http"


def test_each_proxy_header_is_read_on_its_own_among_others(serve: Any) -> None:
    srv = serve()
    others = {"Accept": "*/*", "X-Forwarded-Host": "example.org", "X-Request-Id": "abc"}
    s = scope_of(srv, headers={**others, "x-forwarded-proto": "https"})
    assert s["scheme"] == "https" and s["client"][0] == "127.0.0.1"
    s = scope_of(srv, headers={**others, "X-FORWARDED-FOR": "203.0.113.8"})
    assert s["client"] == ["203.0.113.8", 0] and s["scheme"] == "http"
    s = scope_of(srv, headers={**others, "FORWARDED": "for=198.51.100.9;proto=https"})
    assert s["client"] == ["198.51.100.9", 0] and s["scheme"] == "https"


def test_untrusted_peer_headers_are_ignored(serve: Any) -> None:
    srv = serve("--forwarded-allow-ips", "10.0.0.1, 192.168.0.0/16")
    for headers in ({"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"},
                    {"Forwarded": "for=203.0.113.7;proto=https"}):
        s = scope_of(srv, headers=headers)
        assert s["client"][0] == "127.0.0.1" and s["client"][1] != 0
        assert s["scheme"] == "http"


def test_no_proxy_headers_ignores_them(serve: Any) -> None:
    srv = serve("--no-proxy-headers")
    s = scope_of(srv, headers={"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"})
    assert s["client"][0] == "127.0.0.1" and s["scheme"] == "http"


def test_right_most_untrusted_hop_and_star(serve: Any) -> None:
    srv = serve("--forwarded-allow-ips", "127.0.0.0/8,10.0.0.0/8")
    s = scope_of(srv, headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 10.1.2.3"})
    assert s["client"] == ["203.0.113.9", 0]  # a client cannot prepend a hop and be believed
    every = serve("--forwarded-allow-ips", "*")
    s = scope_of(every, headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 10.1.2.3"})
    assert s["client"] == ["198.51.100.1", 0]  # "*": the left-most, as uvicorn


def test_uvicorn_environment_variable(serve: Any) -> None:
    srv = serve(env={"FORWARDED_ALLOW_IPS": "10.9.9.9"})
    s = scope_of(srv, headers={"X-Forwarded-For": "203.0.113.7"})
    assert s["client"][0] == "127.0.0.1"


def test_unix_socket_peer_trusted_when_listed(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    for trust, expect in (("unix", "203.0.113.7"), ("127.0.0.1", None)):
        log = tmp_path / f"log-{trust}"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "cadeloop", "dropin_app:app", "--app-dir", str(APPS),
                                     "--uds", str(path), "--forwarded-allow-ips", trust], stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 20
            while "listening on" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            assert f"listening on http://unix:{path} (1 core pair" in log.read_text()
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(path))) as c:
                s = c.get("http://x/x", headers={"X-Forwarded-For": "203.0.113.7"}).json()
            assert (s["client"] or [None])[0] == expect
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


@pytest.mark.parametrize("value", ["10.0.0.300", "10.0.0.0/33", "example.com"])
def test_bad_forwarded_allow_ips_is_one_line(value: str) -> None:
    p = run_cli("dropin_app:app", "--app-dir", str(APPS), "--forwarded-allow-ips", value)
    assert p.returncode == 2
    assert p.stderr.startswith("cadeloop: --forwarded-allow-ips: forwarded_allow_ips: ")
    assert p.stderr.count("\n") == 1 and value.split(",")[0] in p.stderr


def test_bad_forwarded_allow_ips_from_the_environment() -> None:
    import os
    p = run_cli("dropin_app:app", "--app-dir", str(APPS), env=dict(os.environ, FORWARDED_ALLOW_IPS="nope"))
    assert p.returncode == 2
    assert p.stderr.startswith("cadeloop: FORWARDED_ALLOW_IPS: forwarded_allow_ips: "), p.stderr


# ----------------------------------------------------------------------------------- root_path

def test_root_path_is_in_path_and_raw_path_as_received(serve: Any) -> None:
    srv = serve("--root-path", "/api")
    s = scope_of(srv, "/items/caf%C3%A9")
    assert s["root_path"] == "/api"
    assert s["path"] == "/api/items/café"
    assert s["raw_path"] == "/items/caf%C3%A9"


# ----------------------------------------------------------------------------------- uvicorn's flags

def test_header_no_server_header_no_date_header(serve: Any) -> None:
    srv = serve("--header", "X-Frame-Options:DENY", "--header", "X-Team: edge")
    r = httpx.get(srv.url + "/x")
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-team"] == "edge"
    assert r.headers["server"] == "cadeloop" and "date" in r.headers
    bare = serve("--no-server-header", "--no-date-header")
    r = httpx.get(bare.url + "/x")
    assert "server" not in r.headers and "date" not in r.headers


def test_bad_header_is_one_line() -> None:
    p = run_cli("dropin_app:app", "--app-dir", str(APPS), "--header", "no colon here")
    assert p.returncode == 2
    assert p.stderr == "cadeloop: --header: headers: expected NAME:VALUE, got 'no colon here'\n"


def test_workers_and_timeouts_by_uvicorn_names(serve: Any) -> None:
    p = run_cli("dropin_app:app", "--workers", "3", "--timeout-keep-alive", "1", "--timeout-graceful-shutdown", "7",
                "--print-config")
    assert p.returncode == 0, p.stderr
    lines = {line.split(" = ")[0]: line for line in p.stdout.splitlines()}
    assert lines["cores"].startswith("cores = 3") and lines["cores"].endswith("# flag --workers")
    assert lines["keepalive_idle"].startswith('keepalive_idle = "1s"')
    assert lines["grace"].startswith('grace = "7s"')
    srv = serve("--workers", "1", "--timeout-keep-alive", "0.3")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"}" not in got:
            got += s.recv(65536)
        started = time.monotonic()
        assert s.recv(65536) == b""  # closed for idleness
        assert time.monotonic() - started < 3


def test_env_file_before_settings_and_app(serve: Any, tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("# comment\nexport DROPIN_VALUE='from the file'\nCADELOOP_ROOT_PATH=/mounted\n\n")
    srv = serve("--env-file", str(env))
    s = scope_of(srv)
    assert s["env"] == "from the file" and s["root_path"] == "/mounted"
    p = run_cli("dropin_app:app", "--env-file", str(tmp_path / "missing.env"))
    assert p.returncode == 2 and p.stderr.startswith("cadeloop: env_file: cannot read ")


def test_log_config_json_and_ini(serve: Any, tmp_path: Path) -> None:
    out = tmp_path / "app.log"
    cfg = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"f": {"class": "logging.FileHandler", "filename": str(out)}},
           "loggers": {"dropin": {"handlers": ["f"], "level": "INFO"}}}
    (tmp_path / "log.json").write_text(json.dumps(cfg))
    srv = serve("--log-config", str(tmp_path / "log.json"))
    scope_of(srv, "/log")
    assert "a record from the app" in out.read_text()
    ini_out = tmp_path / "ini.log"
    (tmp_path / "log.ini").write_text(textwrap.dedent(f"""\
        [loggers]
        keys=root,dropin
        [handlers]
        keys=f
        [formatters]
        keys=plain
        [logger_root]
        handlers=
        [logger_dropin]
        handlers=f
        qualname=dropin
        level=INFO
        [handler_f]
        class=FileHandler
        args=({str(ini_out)!r},)
        formatter=plain
        [formatter_plain]
        format=INI %(message)s
        """))
    srv = serve("--log-config", str(tmp_path / "log.ini"))
    scope_of(srv, "/log")
    assert "INI a record from the app" in ini_out.read_text()


def test_log_config_yaml_without_pyyaml_is_one_line(tmp_path: Path) -> None:
    # PyYAML is installed with the test requirements (Litestar needs it): hide it from the server.
    (tmp_path / "log.yaml").write_text("version: 1\n")
    hide = ("import runpy, sys; sys.modules['yaml'] = None; sys.argv[0] = 'cadeloop'; "
            "runpy.run_module('cadeloop', run_name='__main__', alter_sys=True)")
    p = subprocess.run([sys.executable, "-c", hide, "dropin_app:app", "--app-dir", str(APPS), "--log-config",
                        str(tmp_path / "log.yaml")], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert "needs PyYAML" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_log_config_yaml_with_pyyaml(serve: Any, tmp_path: Path) -> None:
    out = tmp_path / "yaml.log"
    (tmp_path / "log.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        disable_existing_loggers: false
        handlers:
          f: {{class: logging.FileHandler, filename: {str(out)!r}}}
        loggers:
          dropin: {{handlers: [f], level: INFO}}
        """))
    srv = serve("--log-config", str(tmp_path / "log.yaml"))
    scope_of(srv, "/log")
    assert "a record from the app" in out.read_text()


@pytest.mark.parametrize("flag, hint", [
    ("--reload-delay", "not supported"),
    ("--loop", "own event loop"),
    ("--timeout-worker-healthcheck", "uvicorn's; not supported"),
    ("--bind", "--host and --port"),
    ("--keep-alive", "--keepalive-idle"),
    ("--url-path-prefix", "--root-path"),
    ("--ssl-version", "--ssl-min-version"),
])
def test_other_servers_flags_get_a_hint(flag: str, hint: str) -> None:
    p = run_cli("dropin_app:app", flag, "x")
    assert p.returncode == 2
    line = p.stderr.splitlines()[-1]
    assert line.startswith(f'cadeloop: unknown flag "{flag}" (') and hint in line, p.stderr
    assert "max-headers" not in p.stderr


def test_proxy_headers_flag_is_known() -> None:
    p = run_cli("dropin_app:app", "--proxy-headers", "--forwarded-allow-ips", "*", "--print-config")
    assert p.returncode == 0, p.stderr
    assert 'proxy_headers = true' in p.stdout and 'forwarded_allow_ips = "*"' in p.stdout


# ----------------------------------------------------------------------------------- the API

def test_config_and_server_run(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import cadeloop
        config = cadeloop.Config("dropin_app:app", port=0, app_dir={str(APPS)!r}, root_path="/r",
                                 headers=[("X-Api", "yes")], forwarded_allow_ips=["10.0.0.1", "127.0.0.1"])
        server = cadeloop.Server(config)
        server.run()
        print("requests", server.stats.get("requests"))
    """)
    log = tmp_path / "api.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=out)
    port = wait_listening(proc, log)
    r = httpx.get(f"http://127.0.0.1:{port}/x", headers={"X-Forwarded-For": "203.0.113.5"})
    assert r.headers["x-api"] == "yes"
    assert r.json()["path"] == "/r/x" and r.json()["client"] == ["203.0.113.5", 0]
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log.read_text()
    assert b"requests 1" in stdout


def test_await_server_serve_and_should_exit(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import asyncio, json, urllib.request
        import cadeloop

        async def main():
            server = cadeloop.Server(cadeloop.Config("dropin_app:app", port=0, app_dir={str(APPS)!r}))
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.01)
            url = f"http://127.0.0.1:{{server.port}}/x"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())
            print("scope", json.loads(body)["path"], flush=True)
            server.should_exit = True
            await task
            print("stopped", server.stats.get("requests"), flush=True)

        asyncio.run(main())
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "scope /x" in p.stdout and "stopped 1" in p.stdout, p.stdout + p.stderr


def test_loop_run_still_runs_a_coroutine() -> None:
    import cadeloop

    async def answer() -> int:
        return 42

    assert cadeloop.run(answer()) == 42


def test_config_stub_is_current() -> None:
    """Editors see every setting of cadeloop.Config through config.pyi, generated from the table."""
    from cadeloop.config import stub

    committed = Path(__file__).resolve().parents[2] / "pyhost" / "cadeloop" / "config.pyi"
    assert committed.read_text() == stub(), "run scripts/gen-config-doc"
    assert "    proxy_headers: bool = True," in stub()


# ---------------------------------------------------------------------- counters and refusals

def test_limit_concurrency_refusals_are_counted_in_stats_and_metrics(tmp_path: Path) -> None:
    import re
    import threading

    srv = ServerProcess("cores_app:app", "--limit-concurrency", "1", "--stats-port", "0", tmp=tmp_path).start()
    try:
        stats_port = int(srv.wait_log(r"stats endpoint on http://127\.0\.0\.1:(\d+)/").group(1))
        codes: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            r = httpx.get(srv.url + "/slow", params={"delay": "1.0"}, timeout=20)
            with lock:
                codes.append(r.status_code)

        threads = [threading.Thread(target=one) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        refused = codes.count(503)
        assert sorted(codes) == [200] + [503] * 4, codes
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=10).json()
        assert stats["totals"]["concurrency_refusals"] == refused, stats["totals"]
        assert [p["concurrency_refusals"] for p in stats["pairs"]] == [refused], stats["pairs"]
        metrics = httpx.get(f"http://127.0.0.1:{stats_port}/metrics", timeout=10).text
        assert re.search(r'^cadeloop_concurrency_refusals_total\{pair="0"\} 4$', metrics, re.M), metrics
        assert "# TYPE cadeloop_concurrency_refusals_total counter" in metrics
    finally:
        assert srv.stop() == 0, srv.log()


def test_no_refusal_counted_without_the_limit(tmp_path: Path) -> None:
    srv = ServerProcess("cores_app:app", "--stats-port", "0", tmp=tmp_path).start()
    try:
        stats_port = int(srv.wait_log(r"stats endpoint on http://127\.0\.0\.1:(\d+)/").group(1))
        assert httpx.get(srv.url + "/slow", params={"delay": "0"}, timeout=10).status_code == 200
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=10).json()
        assert stats["totals"]["concurrency_refusals"] == 0
    finally:
        assert srv.stop() == 0, srv.log()


def _access_lines(path: Path, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(path.read_text() if path.exists() else "no access log")


def test_http2_prior_knowledge_preface_is_refused_and_closed(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    srv = ServerProcess("cores_app:app", "--access-log", "--access-log-format", "json", "--access-log-file",
                        str(log), "--stats-port", "0", tmp=tmp_path).start()
    try:
        stats_port = int(srv.wait_log(r"stats endpoint on http://127\.0\.0\.1:(\d+)/").group(1))
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            # The connection preface, then a SETTINGS frame, as an h2c client with prior knowledge sends.
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            got = b""
            while chunk := s.recv(4096):
                got += chunk
        assert time.monotonic() - started < 5  # answered and closed, never a hang
        assert got.startswith(b"HTTP/1.1 400 "), got  # a client error, not a 5xx
        assert b"connection: close" in got.lower() and b"\r\n\r\nHTTP/2 is not supported\n" in got
        records = _access_lines(log, 1)
        assert len(records) == 1 and records[0]["status"] == 400, records
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=10).json()["totals"]
        assert stats["protocol_errors"] == 1, stats
        assert stats["responses"]["4xx"] == 1 and stats["responses"]["5xx"] == 0, stats
        assert httpx.get(srv.url + "/slow", params={"delay": "0"}, timeout=10).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log()


def test_413_has_its_access_log_line_with_method_and_path(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    srv = ServerProcess("cores_app:app", "--max-body", "1000", "--access-log", "--access-log-format", "json",
                        "--access-log-file", str(log), tmp=tmp_path).start()
    try:
        r = httpx.post(srv.url + "/echo?x=1", content=b"x" * 5000, timeout=10)
        assert r.status_code == 413 and r.headers["connection"] == "close"
        records = _access_lines(log, 1)
        assert [(x["status"], x["method"], x["path"]) for x in records] == [(413, "POST", "/echo")], records
    finally:
        assert srv.stop() == 0, srv.log()
