"""The one settings table: precedence across file, environment, flags and serve(), one-line errors
from every source before anything is imported or bound, --print-config, and the generated reference."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from server_harness import APPS, ServerProcess, read_response, wait_listening

import cadeloop
from cadeloop import config as cfg

ROOT = Path(__file__).resolve().parents[2]
MARKER_APP = """
from pathlib import Path
Path(__file__).with_name("imported").write_text("imported")

async def app(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CADELOOP_")}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def marker_dir(tmp_path: Path) -> Path:
    (tmp_path / "marker_app.py").write_text(MARKER_APP)
    return tmp_path


def run_watched(argv: list[str], env: dict[str, str], port: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs argv to its end while trying to connect to `port`; fails if anything ever accepted there."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    connected = False
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            connected = connected or s.connect_ex(("127.0.0.1", port)) == 0
        time.sleep(0.002)
    out, err = proc.communicate(timeout=30)
    assert not connected, f"something listened on {port}: {err}"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cadeloop", *args], capture_output=True, text=True,
                          env=env if env is not None else clean_env(), cwd=cwd, timeout=60)


# --------------------------------------------------------------------------- the table in Python


def test_config_fields_are_the_table() -> None:
    assert [f.name for f in dataclasses.fields(cfg.Config)] == list(cfg.SETTINGS)
    c = cfg.Config()
    for name, row in cfg.SETTINGS.items():
        assert getattr(c, name) == row["default"], name


def test_config_checks_and_normalises_through_the_table() -> None:
    c = cfg.Config(max_body="16MiB", keepalive_idle="500ms", grace=2, max_url=4096, stats_port=None)
    assert (c.max_body, c.keepalive_idle, c.grace, c.max_url) == (16 << 20, 0.5, 2.0, 4096)
    assert isinstance(c.grace, float)
    with pytest.raises(ValueError, match=r"^max_pipelined: must be between 1 and 1024, got 5000$"):
        cfg.Config(max_pipelined=5000)
    with pytest.raises(cfg.SettingError, match=r'^port: expected an integer, got "80"$'):
        cfg.Config(port="80")
    with pytest.raises(ValueError, match="^uds and fd cannot both be given$"):
        cfg.Config(uds="/tmp/x.sock", fd=3)
    assert cfg.Config(max_body=None).core_options()["max_body"] == 2**64 - 1
    assert cfg.Config(cores=64).cores == 64


def test_from_env_and_from_toml(tmp_path: Path) -> None:
    c = cfg.Config.from_env(environ={"CADELOOP_MAX_BODY": "none", "CADELOOP_ACCESS_LOG": "yes", "HOME": "/"})
    assert c.max_body is None and c.access_log is True
    c = cfg.Config.from_env(prefix="MYAPP_", environ={"MYAPP_PORT": "9001", "CADELOOP_PORT": "1"})
    assert c.port == 9001
    f = tmp_path / "cadeloop.toml"
    f.write_text('app = "main:app"\nkeepalive_idle = "30s"\nlog_level = "debug"\n')
    c = cfg.Config.from_toml(f)
    assert (c.app, c.keepalive_idle, c.log_level) == ("main:app", 30.0, "debug")


def test_serve_refuses_an_unknown_keyword_with_a_suggestion() -> None:
    with pytest.raises(TypeError, match=r'^unknown setting "max_bdy" \(did you mean "max_body"\?\)$'):
        cadeloop.serve("x:app", max_bdy=1)
    with pytest.raises(ValueError, match=r'^max_body: expected a size like "16MiB", got -1$'):
        cadeloop.serve("x:app", max_body=-1)


# --------------------------------------------------------------------------- precedence on the wire


def body_limit(port: int) -> int:
    """The largest body /echo accepts (413 above), probed between 1 and 100 bytes."""

    def accepted(n: int) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n
                      + b"x" * n)
            status, _, _ = read_response(s.makefile("rb"))
            return status == 200

    lo, hi = 0, 100
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if accepted(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def write_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cadeloop.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_precedence_on_the_wire_file_env_flag(tmp_path: Path) -> None:
    conf = write_file(tmp_path, "max_body = 10\n")
    cases = [
        ({}, (), 10),
        ({"CADELOOP_MAX_BODY": "20B"}, (), 20),
        ({"CADELOOP_MAX_BODY": "20B"}, ("--max-body", "30"), 30),
    ]
    for env, flags, limit in cases:
        srv = ServerProcess("raw_app:app", "--config", str(conf), *flags, tmp=tmp_path, env=env)
        srv.env = clean_env(**env)
        srv.start()
        try:
            assert body_limit(srv.port) == limit, (env, flags)
        finally:
            assert srv.stop() == 0, srv.log()


def test_precedence_on_the_wire_serve_arguments_win(tmp_path: Path) -> None:
    conf = write_file(tmp_path, "max_body = 10\nkeepalive_idle = \"1s\"\n")
    code = (
        "import cadeloop, sys\n"
        f"sys.path.insert(0, {str(APPS)!r})\n"
        "import raw_app\n"
        "cadeloop.serve(raw_app.app, '127.0.0.1', 0, max_body=40, grace=1)\n"
    )
    log = tmp_path / "serve.log"
    env = clean_env(CADELOOP_CONFIG=str(conf), CADELOOP_MAX_BODY="20")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            port = wait_listening(proc, log)
            assert body_limit(port) == 40
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 0, log.read_text()


def test_app_may_come_from_the_file(tmp_path: Path) -> None:
    conf = write_file(tmp_path, f'app = "raw_app:app"\napp_dir = {str(APPS)!r}\n'.replace("'", '"'))
    srv = ServerProcess("raw_app:app", tmp=tmp_path, env={})
    srv.argv = [sys.executable, "-m", "cadeloop", "--config", str(conf), "--port", "0"]
    srv.env = clean_env()
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_response(s.makefile("rb"))[2] == b"Hello, World!"
    finally:
        assert srv.stop() == 0, srv.log()


# --------------------------------------------------------------------------- --print-config


def test_print_config_shows_every_value_and_its_source(tmp_path: Path) -> None:
    conf = write_file(tmp_path, """\
        # settings for the test
        max_body = "16MiB"
        keepalive_idle = 3
        grace = "2m"
        """)
    p = cli("main:app", "--print-config", "--config", str(conf), "--grace", "90s", "--no-access-log",
            env=clean_env(CADELOOP_KEEPALIVE_IDLE="1500ms", CADELOOP_STATS_PORT="9100"))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    lines = {line.split(" = ")[0]: line for line in p.stdout.splitlines()}
    assert list(lines) == list(cfg.SETTINGS)

    def shown(name: str) -> tuple[str, str]:
        left, _, origin = lines[name].partition("  # ")
        return left.split(" = ", 1)[1].strip(), origin

    assert shown("app") == ('"main:app"', "argument APP")
    assert shown("max_body") == ('"16MiB"', f"{conf}:2")
    assert shown("keepalive_idle") == ('"1.5s"', "env CADELOOP_KEEPALIVE_IDLE")
    assert shown("grace") == ('"90s"', "flag --grace")
    assert shown("access_log") == ("false", "flag --no-access-log")
    assert shown("stats_port") == ("9100", "env CADELOOP_STATS_PORT")
    assert shown("port") == ("8000", "default")
    assert shown("max_url") == ('"8KiB"', "default")


def test_print_config_needs_no_app_and_imports_nothing(marker_dir: Path) -> None:
    p = cli("--print-config", "--app-dir", str(marker_dir), env=clean_env(CADELOOP_APP="marker_app:app"))
    assert p.returncode == 0, p.stderr
    assert 'app = "marker_app:app"' in p.stdout and "# env CADELOOP_APP" in p.stdout
    assert not (marker_dir / "imported").exists()


# --------------------------------------------------------------------------- every bad value stops start-up

BAD_FILE = [
    ('port = "8000"', 'port: expected an integer, got "8000"'),
    ("max_pipelined = 5000", "max_pipelined: must be between 1 and 1024, got 5000"),
    ('max_bdy = "16MiB"', 'unknown setting "max_bdy" (did you mean "max_body"?)'),
    ('keepalive_idle = "30 parsecs"', 'keepalive_idle: expected a duration like "30s", got "30 parsecs"'),
    ("max_body = -1", 'max_body: expected a size like "16MiB", got -1'),
]
BAD_ENV = [
    ("CADELOOP_ACCESS_LOG", "perhaps", 'CADELOOP_ACCESS_LOG: expected true or false, got "perhaps"'),
    ("CADELOOP_MAX_PIPELINED", "5000", "CADELOOP_MAX_PIPELINED: max_pipelined: must be between 1 and 1024, got 5000"),
    ("CADELOOP_MAX_BDY", "1", 'unknown setting "CADELOOP_MAX_BDY" (did you mean "CADELOOP_MAX_BODY"?)'),
    ("CADELOOP_MAX_BODY", "16XB", 'CADELOOP_MAX_BODY: expected a size like "16MiB", got "16XB"'),
]
BAD_FLAG = [
    (("--backlog", "lots"), '--backlog: expected an integer, got "lots"'),
    (("--max-pipelined", "5000"), "--max-pipelined: max_pipelined: must be between 1 and 1024, got 5000"),
    (("--max-bdy", "1"), 'unknown flag "--max-bdy" (did you mean "--max-body"?)'),
    (("--keepalive-idle", "30parsecs"), '--keepalive-idle: expected a duration like "30s", got "30parsecs"'),
    (("--lifespan", "maybe"), '--lifespan: expected one of "auto", "on" or "off", got "maybe"'),
]
BAD_SERVE = [
    ("access_log='yes'", "ValueError", 'access_log: expected true or false, got "yes"'),
    ("max_pipelined=5000", "ValueError", "max_pipelined: must be between 1 and 1024, got 5000"),
    ("max_bdy=1", "TypeError", 'unknown setting "max_bdy" (did you mean "max_body"?)'),
    ("max_body='16XB'", "ValueError", 'max_body: expected a size like "16MiB", got "16XB"'),
]


def assert_refused(p: subprocess.CompletedProcess[str], line: str, marker_dir: Path) -> None:
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"cadeloop: {line}\n"
    assert not (marker_dir / "imported").exists(), "the app was imported before the settings were checked"


@pytest.mark.parametrize("entry,line", BAD_FILE)
def test_bad_value_in_the_file(marker_dir: Path, entry: str, line: str) -> None:
    conf = marker_dir / "cadeloop.toml"
    conf.write_text(f"# line 1\nhost = \"127.0.0.1\"\n{entry}\n")
    port = free_port()
    p = run_watched([sys.executable, "-m", "cadeloop", "marker_app:app", "--config", str(conf), "--port", str(port)],
                    clean_env(), port, marker_dir)
    assert_refused(p, f"{conf}:3: {line}", marker_dir)


def test_bad_file_named_by_the_environment(marker_dir: Path) -> None:
    conf = marker_dir / "cadeloop.toml"
    conf.write_text("max_body = -1\n")
    port = free_port()
    p = run_watched([sys.executable, "-m", "cadeloop", "marker_app:app", "--port", str(port)],
                    clean_env(CADELOOP_CONFIG="cadeloop.toml"), port, marker_dir)
    assert_refused(p, 'cadeloop.toml:1: max_body: expected a size like "16MiB", got -1', marker_dir)
    p = cli("marker_app:app", "--config", "missing.toml", cwd=marker_dir)
    assert_refused(p, "missing.toml: cannot read the settings file: No such file or directory", marker_dir)


@pytest.mark.parametrize("name,value,line", BAD_ENV)
def test_bad_value_in_the_environment(marker_dir: Path, name: str, value: str, line: str) -> None:
    port = free_port()
    p = run_watched([sys.executable, "-m", "cadeloop", "marker_app:app", "--port", str(port)],
                    clean_env(**{name: value}), port, marker_dir)
    assert_refused(p, line, marker_dir)


@pytest.mark.parametrize("flag,line", BAD_FLAG)
def test_bad_value_in_a_flag(marker_dir: Path, flag: tuple[str, str], line: str) -> None:
    port = free_port()
    p = run_watched([sys.executable, "-m", "cadeloop", "marker_app:app", "--port", str(port), *flag],
                    clean_env(), port, marker_dir)
    assert_refused(p, line, marker_dir)


@pytest.mark.parametrize("argument,exc,line", BAD_SERVE)
def test_bad_value_given_to_serve(marker_dir: Path, argument: str, exc: str, line: str) -> None:
    port = free_port()
    code = (
        "import sys, cadeloop\n"
        "try:\n"
        f"    cadeloop.serve('marker_app:app', '127.0.0.1', {port}, app_dir={str(marker_dir)!r}, {argument})\n"
        "except (TypeError, ValueError) as e:\n"
        "    print(f'{\"ValueError\" if isinstance(e, ValueError) else \"TypeError\"}: {e}', file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    p = run_watched([sys.executable, "-c", code], clean_env(), port, marker_dir)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"{exc}: {line}\n"
    assert not (marker_dir / "imported").exists()


def test_a_later_source_does_not_hide_a_bad_earlier_one(marker_dir: Path) -> None:
    # The flag would override the variable, but a bad variable is still a mistake to report.
    p = cli("marker_app:app", "--max-body", "1MiB", env=clean_env(CADELOOP_MAX_BODY="lots"), cwd=marker_dir)
    assert_refused(p, 'CADELOOP_MAX_BODY: expected a size like "16MiB", got "lots"', marker_dir)


# --------------------------------------------------------------------------- the generated reference


def test_the_reference_is_current() -> None:
    p = cli("--print-reference")
    assert p.returncode == 0, p.stderr
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert p.stdout == committed, (
        "docs/configuration.md differs from what the settings table generates; regenerate it with "
        "scripts/gen-config-doc (python -m cadeloop --print-reference > docs/configuration.md)"
    )
    for name, row in cfg.SETTINGS.items():
        assert f"`{name}`" in committed and row["flag"] in committed
