"""A fleet on this machine: two cadeloop instances on two "machines" behind nginx or HAProxy.

Each machine is a network namespace joined by veth pairs; the proxy runs in a third:

    this test (root namespace) CLIENT --veth-- LB:8080  [namespace lb: nginx or haproxy]
                                       10.71.1.1 --veth-- 10.71.1.2  [namespace a: cadeloop :8000, stats :9100]
                                       10.71.2.1 --veth-- 10.71.2.2  [namespace b: cadeloop :8000, stats :9100]

Under load from this process, both instances are restarted one after the other the way
docs/operations.md ("A fleet behind nginx or HAProxy") tells an operator to: SIGTERM (the
graceful drain: /readyz turns 503, the listener closes, requests in flight finish), wait for the
exit, start it again, wait until the proxy sends it traffic, then the other one. Every response
the load client gets is counted and must be a 200 with a correct body; each instance must have
answered requests after its SIGTERM (its drain finished them) and must see the client's address
forwarded by the proxy (--proxy-headers, --forwarded-allow-ips), not the proxy's.

It needs root (CAP_NET_ADMIN for `ip netns`), iproute2, curl, nginx and haproxy (scripts/setup);
without them it fails and says so. Namespace and interface names carry this process's pid and a
random tag, so parallel runs do not clash; the root-side subnet is one no route here uses.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from load_client import Load, Request

APPS = Path(__file__).resolve().parent / "server_apps"
PORT, STATS_PORT, LB_PORT = 8000, 9100, 8080
NODES = {"a": ("10.71.1.1", "10.71.1.2"), "b": ("10.71.2.1", "10.71.2.2")}  # (proxy side, instance side)
NEEDS = ("the fleet test builds network namespaces and veth pairs, so it needs root (CAP_NET_ADMIN) and "
         "iproute2, curl, nginx and haproxy (scripts/setup installs them)")


def run(*argv: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        pytest.fail(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}\n{NEEDS}")
    return r.stdout


def wait_until(what: str, ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class Net:
    """The namespaces, veth pairs and addresses; down() removes everything up() made."""

    def __init__(self) -> None:
        tag = f"{os.getpid():x}{secrets.token_hex(2)}"
        self.ns = {name: f"cadeloop-{tag}-{name}" for name in ("lb", "a", "b")}
        self.host_if = f"cl{tag}"  # the only name in the root namespace (15 characters at most)
        self.client_addr, self.lb_addr = self._free_subnet()
        self.made: list[str] = []

    @staticmethod
    def _free_subnet() -> tuple[str, str]:
        used = run("ip", "-4", "route", "show", "table", "all") + run("ip", "-4", "-o", "addr")
        for _ in range(100):
            prefix = f"10.{random.randint(200, 254)}.{random.randint(0, 255)}."
            if prefix not in used:
                return prefix + "1", prefix + "2"
        pytest.fail("no free 10.x.y.0/24 subnet for the test's veth pair")

    def exec(self, ns: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[ns], *argv]

    def up(self) -> None:
        for tool in ("ip", "curl", "nginx", "haproxy"):
            if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
                pytest.fail(f"{tool} is missing: {NEEDS}")
        for name, ns in self.ns.items():
            run("ip", "netns", "add", ns)
            self.made.append(ns)
            run(*self.exec(name, "ip", "link", "set", "lo", "up"))
        # This process <-> the proxy's namespace.
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "up0", "netns", self.ns["lb"])
        run("ip", "addr", "add", f"{self.client_addr}/24", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        run(*self.exec("lb", "ip", "addr", "add", f"{self.lb_addr}/24", "dev", "up0"))
        run(*self.exec("lb", "ip", "link", "set", "up0", "up"))
        # The proxy <-> each instance.
        for name, (lb_side, node_side) in NODES.items():
            run(*self.exec("lb", "ip", "link", "add", f"to-{name}", "type", "veth", "peer", "name", "eth0",
                           "netns", self.ns[name]))
            run(*self.exec("lb", "ip", "addr", "add", f"{lb_side}/24", "dev", f"to-{name}"))
            run(*self.exec("lb", "ip", "link", "set", f"to-{name}", "up"))
            run(*self.exec(name, "ip", "addr", "add", f"{node_side}/24", "dev", "eth0"))
            run(*self.exec(name, "ip", "link", "set", "eth0", "up"))

    def down(self) -> None:
        # Deleting a namespace deletes its veth ends, and with them their peers (our root-side one too).
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=20)


class Proc:
    """A process started in a namespace in its own process group, its output in a file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=dict(os.environ, **(env or {})))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture
def fleet_net() -> Iterator[tuple[Net, list[Proc]]]:
    """The network, and a list every started process goes into: all killed, then the network removed."""
    if os.geteuid() != 0:
        pytest.fail(f"not running as root: {NEEDS}")
    net = Net()
    procs: list[Proc] = []
    try:
        net.up()
        yield net, procs
    finally:
        for p in procs:
            p.kill()
        net.down()


class Node:
    """One cadeloop instance in its namespace, trusting the proxy's forwarded headers."""

    def __init__(self, net: Net, name: str, tmp: Path, procs: list[Proc]) -> None:
        self.net, self.name, self.tmp, self.procs = net, name, tmp, procs
        self.lb_side, self.addr = NODES[name]
        self.p: Proc | None = None
        self.starts = 0
        self.events = tmp / f"{name}-started-ids.txt"  # every request id the app started on, every run

    def started_ids(self) -> list[str]:
        return self.events.read_text().split() if self.events.exists() else []

    def start(self) -> None:
        self.starts += 1
        argv = self.net.exec(self.name, sys.executable, "-m", "cadeloop", "fleet_app:app", "--app-dir", str(APPS),
                             "--host", self.addr, "--port", str(PORT), "--cores", "2",
                             "--stats-host", self.addr, "--stats-port", str(STATS_PORT), "--grace", "10",
                             "--proxy-headers", "--forwarded-allow-ips", self.lb_side)
        self.p = Proc(argv, self.tmp / f"{self.name}-{self.starts}.log",
                      env={"FLEET_NODE": self.name, "FLEET_EVENTS": str(self.events)})
        self.procs.append(self.p)
        wait_until(f"instance {self.name} listening", self._listening, 30)
        wait_until(f"instance {self.name} ready", lambda: self.readyz() == 200, 10)

    def _listening(self) -> bool:
        assert self.p is not None
        assert self.p.proc.poll() is None, f"instance {self.name} exited:\n{self.p.log()}"
        return f"listening on http://{self.addr}:{PORT}" in self.p.log()

    def readyz(self) -> int:
        """/readyz as the proxy's namespace sees it (0: no answer)."""
        r = subprocess.run(self.net.exec("lb", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time",
                                         "1", f"http://{self.addr}:{STATS_PORT}/readyz"),
                           capture_output=True, text=True, timeout=10)
        return int(r.stdout or 0)


# Run in the proxy's namespace around one instance's SIGTERM: a slow request sent straight to the
# instance before the signal, /readyz polled after it, then the slow request's answer.
DRAIN_WATCH = r"""
import http.client, json, sys, time
addr, port, stats_port, probe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def readyz():
    try:
        c = http.client.HTTPConnection(addr, stats_port, timeout=5)
        c.request("GET", "/readyz")
        return c.getresponse().status
    except OSError:
        return 0
slow = http.client.HTTPConnection(addr, port, timeout=30)
slow.request("GET", "/work?delay=2&id=" + probe)
print(readyz(), flush=True)
sys.stdin.readline()  # the instance has the slow request and was sent SIGTERM
seen, deadline = [], time.monotonic() + 1.5
while time.monotonic() < deadline and 503 not in seen:
    seen.append(readyz())
    time.sleep(0.01)
r = slow.getresponse()
print(json.dumps({"readyz": seen, "status": r.status, "body": r.read().decode()}), flush=True)
"""


def nginx_conf(net: Net, tmp: Path) -> str:
    """The configuration docs/operations.md shows, with this test's addresses and paths."""
    upstreams = "\n".join(f"        server {addr}:{PORT} max_fails=1 fail_timeout=2s;" for _, addr in NODES.values())
    temp = "\n".join(f"    {kind}_temp_path {tmp}/nginx-{kind};" for kind in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""
user root;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp}/nginx-access.log;
{temp}
    upstream cadeloop {{
{upstreams}
        keepalive 32;
    }}
    server {{
        listen {net.lb_addr}:{LB_PORT};
        location / {{
            proxy_pass http://cadeloop;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_next_upstream error timeout http_502 http_503;
            proxy_connect_timeout 2s;
        }}
    }}
}}
"""


def haproxy_conf(net: Net) -> str:
    servers = "\n".join(f"    server {name} {addr}:{PORT}" for name, (_, addr) in NODES.items())
    return f"""
global
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout 503
frontend web
    bind {net.lb_addr}:{LB_PORT}
    option forwardfor
    default_backend cadeloop
backend cadeloop
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server check port {STATS_PORT} inter 500ms fall 1 rise 1
{servers}
"""


def start_proxy(kind: str, net: Net, tmp: Path, procs: list[Proc]) -> Proc:
    if kind == "nginx":
        conf = tmp / "nginx.conf"
        conf.write_text(nginx_conf(net, tmp))
        argv = net.exec("lb", "nginx", "-e", str(tmp / "nginx-error.log"), "-p", str(tmp), "-c", str(conf),
                        "-g", "daemon off;")
    else:
        conf = tmp / "haproxy.cfg"
        conf.write_text(haproxy_conf(net))
        argv = net.exec("lb", "haproxy", "-db", "-f", str(conf))
    proxy = Proc(argv, tmp / f"{kind}.log")
    procs.append(proxy)

    def answers() -> bool:
        assert proxy.proc.poll() is None, f"{kind} exited:\n{proxy.log()}"
        try:
            socket.create_connection((net.lb_addr, LB_PORT), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(f"{kind} listening on {net.lb_addr}:{LB_PORT}", answers, 10)
    return proxy


def is_fleet_answer(body: bytes) -> bool:
    try:
        return json.loads(body)["node"] in NODES
    except (ValueError, KeyError):
        return False


@pytest.mark.parametrize("proxy_kind", ["nginx", "haproxy"])
def test_rolling_restart_behind_a_proxy_fails_no_request(fleet_net: tuple[Net, list[Proc]], tmp_path: Path,
                                                         proxy_kind: str) -> None:
    net, procs = fleet_net
    nodes = {name: Node(net, name, tmp_path, procs) for name in NODES}
    for node in nodes.values():
        node.start()
    proxy = start_proxy(proxy_kind, net, tmp_path, procs)

    answers: list[tuple[float, str, str, str]] = []  # (when, instance, client address it saw, request id)

    def record(status: int, headers: dict[str, str], body: bytes) -> None:
        if status == 200 and is_fleet_answer(body):
            seen = json.loads(body)
            answers.append((time.monotonic(), seen["node"], seen["client"][0], seen["id"]))

    def served_by(name: str, since: float) -> int:
        return sum(1 for t, n, _, _ in list(answers) if n == name and t > since)

    # Slow requests keep some in flight at every instance when its SIGTERM comes.
    mix = [Request("GET", "/work?delay=0.3&id={n}", check=is_fleet_answer),
           Request("GET", "/work?id={n}", check=is_fleet_answer),
           Request("GET", "/work?delay=0.05&id={n}", check=is_fleet_answer)]
    load = Load(net.lb_addr, LB_PORT, mix, clients=8, on_response=record).start()
    try:
        start = time.monotonic()
        for name in NODES:
            wait_until(f"the proxy sending requests to {name}", lambda: served_by(name, start) >= 5, 15)
        for name, node in nodes.items():
            assert node.p is not None
            probe = f"drain-{name}"
            with subprocess.Popen(net.exec("lb", sys.executable, "-c", DRAIN_WATCH, node.addr, str(PORT),
                                           str(STATS_PORT), probe),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as watch:
                assert watch.stdout is not None and watch.stdin is not None
                assert watch.stdout.readline().strip() == "200", f"/readyz of {name} before its SIGTERM"
                wait_until(f"the slow request on {name}", lambda: probe in node.started_ids(), 10)
                node.p.proc.send_signal(signal.SIGTERM)
                watch.stdin.write("go\n")
                watch.stdin.flush()
                drain = json.loads(watch.stdout.readline())
                assert watch.wait(10) == 0
            assert 503 in drain["readyz"], f"/readyz of {name} within 1.5 s of its SIGTERM: {drain['readyz']}"
            assert drain["status"] == 200 and json.loads(drain["body"])["id"] == probe, drain
            assert node.p.proc.wait(15) == 0, node.p.log()
            node.start()
            restarted = time.monotonic()
            wait_until(f"the proxy sending requests to {name} again", lambda: served_by(name, restarted) >= 5, 15)
    finally:
        load.stop()
    summary = load.summary()
    assert load.failures == [], summary
    assert set(load.statuses) == {200}, summary
    assert load.completed > 100 and len(answers) == load.completed, summary
    clients = {c for _, _, c, _ in answers}
    assert clients == {net.client_addr}, f"the instances saw {clients}, not the client's address {net.client_addr}"
    # No request reached an app and was then done again elsewhere: the proxy retried only requests
    # no instance had started (connections refused by a closed listener, or a kept-alive connection
    # the draining instance closed as the proxy reused it), so every answer's id was started once,
    # by the instance that answered it.
    started = {name: [i for i in node.started_ids() if not i.startswith("drain-")] for name, node in nodes.items()}
    where: dict[str, list[str]] = {}
    for name, ids in started.items():
        for i in ids:
            where.setdefault(i, []).append(name)
    redone = {i: (n, where.get(i)) for _, n, _, i in answers if where.get(i) != [n]}
    assert redone == {}, f"requests started by an app, then retried or lost (answered by, started on): {redone}"
    assert len(where) == load.completed, "a request was started that no client got an answer for"
