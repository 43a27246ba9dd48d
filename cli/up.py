"""`gavel up`: the embedded default — nats-server from the wheel, a broker, N workers, and a
gateway (a Caddy from the wheel, kept by `gavel gateway`).

Rule: everything lives under ``--state`` (state.git, auth/, nats/, workers/, caddy/, logs/);
every part is a real child process speaking real NATS, exactly as it would on separate hosts
— with its own nkey and only its own subjects (`gavel auth init`, reusing the keys of an
earlier run; ``--no-auth`` leaves NATS open). The gateway listens on a free loopback port
(``--gateway-port``), Caddy's admin API on another, loopback only; the workers advertise
127.0.0.1; ``--no-gateway`` runs neither. ``--demo`` submits a few workloads, prints where
each went and why, asks one of them something through the gateway, and exits.
``--metrics-port`` serves the broker's metrics; ``--log-format`` (or GAVEL_LOG_FORMAT)
reaches every child. Unless ``--no-ui``, the web dashboard (`gavel ui`) runs in this process
as an operator client, and its URL is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gavel.cli.commands import UsageError
from gavel.cli.parsers import unusable_dir
from gavel.cli.ui import app as ui_app
from gavel.gateway.caddyserver import Caddy
from gavel.shared.api import (
    EventsReply,
    EventsRequest,
    NodesReply,
    NodesRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import Spec
from gavel.shared.reasons import render
from gavel.shared.spec import Route
from gavel.transport import identity
from gavel.transport.client import BrokerRefused, ClientError, call, connect, wait_healthy
from gavel.transport.natsserver import NatsServer, free_port

__all__ = ["up"]

STRATEGIES = ["least-loaded", "binpack", "spread", "headroom"]
#: The demo's web workload: answers every GET with its instance and node, on its $PORT.
WEB = ("import http.server as h, os\n"
       "class H(h.BaseHTTPRequestHandler):\n"
       "    def do_GET(self):\n"
       "        b = ('hello from %s on %s\\n' % (os.environ['GAVEL_INSTANCE_ID'],"
       " os.environ['GAVEL_NODE_ID'])).encode()\n"
       "        self.send_response(200)\n"
       "        self.send_header('Content-Length', str(len(b)))\n"
       "        self.end_headers()\n"
       "        self.wfile.write(b)\n"
       "    def log_message(self, *args):\n"
       "        pass\n"
       "h.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")
SIZES = [(4.0, 4096), (2.0, 2048), (8.0, 8192), (4.0, 8192)]


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-m", "gavel", *args], stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def demo_specs() -> list[Spec]:
    py = sys.executable
    return [
        Spec(name="hello", command=[py, "-c", "print('hello from gavel')"], cpu=0.5,
             memory_mb=128),
        Spec(name="web", command=[py, "-c", WEB], cpu=1.0, memory_mb=512, ports=["http"],
             routes=[Route(path="/web", port="http")]),
        Spec(name="report-eu", command=[py, "-c", "print('eu batch done')"], cpu=1.0,
             memory_mb=256, labels={"zone": "b"}),
        Spec(name="big", command=[py, "-c", "print('big job done')"], cpu=6.0,
             memory_mb=4096),
        Spec(name="needs-gpu", command=[py, "-c", "print('never runs')"], cpu=1.0,
             labels={"gpu": "true"}),
    ]


def _get(url: str) -> tuple[int, str]:
    """One GET: its status and body (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


async def _through_gateway(url: str, timeout: float = 20.0) -> None:
    """The demo's request through the gateway, once the route to `web` is in place."""
    deadline = time.monotonic() + timeout
    status, body = 0, ""
    while time.monotonic() < deadline:
        try:
            status, body = await asyncio.to_thread(_get, url)
        except OSError as exc:
            status, body = 0, str(exc)
        if status == 200:
            break
        await asyncio.sleep(0.2)
    print("\nthrough the gateway (a Caddy routing /web to the web workload):")
    if status == 200:
        print(f"  GET {url} -> 200 {body.strip()}")
    else:
        print(f"  GET {url} got no answer from web within {timeout:g}s "
              f"({status or 'unreachable'} {body.strip()[:80]}); see logs/gateway.log")


async def _demo(nc: Any, workers: int, state: Path, gateway: str | None = None) -> None:
    await wait_healthy(nc, workers, 30)
    nodes = await call(nc, "nodes", NodesRequest(), NodesReply)
    print(f"\n{len(nodes.nodes)} workers bidding:")
    for n in nodes.nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(n.labels.items()))
        print(f"  {n.node_id:<8} {n.strategy:<13} {n.capacity.cpu:g} cpu "
              f"{n.capacity.memory_mb} MB  {labels}")
    ids = []
    refused = []  # the broker turns away what no node could ever hold (--workers 2: big)
    for spec in demo_specs():
        try:
            reply = await call(nc, "submit", SubmitRequest(spec=spec), SubmitReply)
        except BrokerRefused as exc:
            refused.append(f"  {spec.name:<18} refused: {exc}")
            continue
        ids.append(reply.instance_id)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = await call(nc, "status", StatusRequest(), StatusReply)
        if all(i.state not in ("queued", "scheduled") for i in st.instances):
            break
        await asyncio.sleep(0.2)
    print("\nwhere each workload went, and why:")
    for iid in ids:
        why = await call(nc, "why", WhyRequest(instance_id=iid), WhyReply)
        a = why.auctions[0] if why.auctions else None
        if a is None:
            print(f"  {iid:<18} {why.instance.state}")
        elif a.winner:
            others = [f"{b.node_id} {b.load:.2f}" for b in a.bids if b.node_id != a.winner]
            declined = [f"{d.node_id}: {render(d.reason, d.detail)}" for d in a.declines]
            print(f"  {iid:<18} -> {a.winner} (lowest load {a.load:.2f}"
                  + (", tie broken on node id" if a.tie_broken else "") + ")"
                  + (f"; other bids: {', '.join(others)}" if others else "")
                  + (f"; declined: {'; '.join(declined)}" if declined else ""))
        else:
            print(f"  {iid:<18} unschedulable: {a.summary}")
    for line in refused:
        print(line)
    if gateway is not None:
        await _through_gateway(f"{gateway}/web")
    await asyncio.sleep(2.5)
    evs = await call(nc, "events", EventsRequest(limit=0), EventsReply)
    print("\nwhat the workers reported:")
    for e in evs.events:
        if e.type in ("running", "exited", "failed"):
            extra = f" exit {e.exit_code}" if e.exit_code is not None else ""
            print(f"  {e.instance_id:<18} {e.type:<8} on {e.node_id}{extra}")
    print(f"\nthe deployment is in git: git --git-dir {state / 'state.git'} log --stat")


async def up(args: argparse.Namespace) -> int:
    state: Path = args.state.resolve()
    why = unusable_dir(state / "logs")
    if why:
        raise UsageError(f"--state {state}: cannot keep gavel's state there ({why}).")
    nodes = [f"node-{i + 1}" for i in range(args.workers)]
    ids = identity.init(state, nodes) if args.auth else None
    server = NatsServer(port=args.nats_port, store_dir=state / "nats",
                        config=ids.config if ids else None, log=state / "logs" / "nats.log")
    server.start()
    env = {**os.environ, "GAVEL_NATS_URL": server.url}
    env.pop("GAVEL_CREDS", None)  # each child gets its own, below

    def creds(path: Path | None) -> list[str]:
        return ["--creds", str(path)] if path is not None else []

    if args.log_format:
        env["GAVEL_LOG_FORMAT"] = args.log_format
    broker = ["broker", "--state", str(state), *creds(ids.broker if ids else None)]
    if args.metrics_port is not None:
        broker += ["--metrics-port", str(args.metrics_port), "--metrics-addr", args.metrics_addr]
    procs = [_spawn(broker, state / "logs" / "broker.log", env)]
    for i, node in enumerate(nodes):
        cpu, mem = SIZES[i % len(SIZES)]
        procs.append(_spawn(
            ["worker", "--node-id", node, *creds(ids.nodes[node] if ids else None),
             "--strategy", STRATEGIES[i % len(STRATEGIES)],
             "--labels", f"zone={'ab'[i % 2]}", "--cpu", str(cpu), "--memory-mb", str(mem),
             "--ports", f"{21000 + 100 * i}-{21000 + 100 * i + 99}",
             "--state", str(state / "workers" / node), "--advertise", "127.0.0.1"],
            state / "logs" / f"{node}.log", env))
    operator = str(ids.operator) if ids else None
    caddy = None
    gateway = None
    if getattr(args, "gateway", True):
        try:
            caddy = Caddy(state / "caddy", log=state / "logs" / "caddy.log").start()
        except (OSError, RuntimeError) as exc:  # no binary, or it would not start
            _stop(procs)
            server.stop()
            raise ClientError(f"cannot run the gateway's Caddy: {exc} (--no-gateway runs "
                              "without one)") from None
        gateway = f"http://127.0.0.1:{getattr(args, 'gateway_port', None) or free_port()}"
        procs.append(_spawn(["gateway", *creds(ids.operator if ids else None), "--admin",
                             caddy.admin_url, "--listen", gateway.removeprefix("http://")],
                            state / "logs" / "gateway.log", env))
    print(f"gavel up: nats-server at {server.url}, broker and {args.workers} workers"
          + (", gateway" if gateway else "") + f"; state and logs under {state}")
    if caddy is not None:
        print(f"gateway: {gateway} (Caddy; its admin API at {caddy.admin_url}, loopback only)")
    print(f"NATS auth: one nkey per worker, the broker and operators in {ids.directory}"
          if ids else "NATS auth: off (--no-auth); anyone who reaches the server may use it")
    if args.metrics_port is not None:
        print(f"broker metrics: http://{args.metrics_addr}:{args.metrics_port}/metrics")
    dashboard: ui_app.Dashboard | None = None
    try:
        if args.demo:
            nc = await connect(server.url, operator)
            try:
                await _demo(nc, args.workers, state, gateway)
            finally:
                await nc.close()
            return 0
        hint = f"GAVEL_CREDS={operator} " if operator else ""
        print(f"try: GAVEL_NATS_URL={server.url} {hint}gavel nodes   "
              "(Ctrl-C stops the cluster)")
        if args.ui:
            dashboard = await ui_app.start(server.url, operator, addr=args.ui_addr,
                                           port=args.ui_port, token=args.ui_token)
            print(f"dashboard: {dashboard.announce()}")
        sys.stdout.flush()
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        return 0
    finally:
        if dashboard is not None:
            await dashboard.close()
        _stop(procs)
        if caddy is not None:
            caddy.stop()
        server.stop()
