"""`gavel up`: the embedded default — nats-server from the wheel, a broker, N workers, and a
gateway (a Caddy from the wheel, kept by `gavel gateway`).

Rules:
1. Everything lives under ``--state`` (state.git, auth/, nats/, workers/, caddy/, logs/);
   every part is a real child process speaking real NATS, exactly as it would on separate
   hosts — with its own nkey and only its own subjects (`gavel auth init`, reusing the keys
   of an earlier run; ``--no-auth`` leaves NATS open). The gateway listens on a free loopback
   port (``--gateway-port``), Caddy's admin API on another, loopback only; the workers
   advertise 127.0.0.1; ``--no-gateway`` runs neither. ``--demo`` submits a few workloads,
   prints where each went and why, asks one of them something through the gateway, and
   exits. ``--metrics-port`` serves the broker's metrics; ``--log-format`` (or
   GAVEL_LOG_FORMAT) reaches every child.
2. Up means up: the nats-server is ours (`NatsServer.start`: not merely something on the
   port), the broker answers and every worker is healthy before the cluster is announced.
   A child that exits - while starting or later - stops everything this command started,
   and the command exits 1 with one sentence naming the child and what it said last (a
   ``--nats-port`` that is taken: exit 2).
3. Stopping (Ctrl-C, SIGTERM) stops the broker first, then the other children, then Caddy
   and NATS. The workers stop their instances, but with no broker to hear it the placements
   stay in git: started again on the same state, each worker fetches what its node.json
   still lists and runs that same attempt again (a worker's shutdown is not the instance's
   failure), instead of the broker re-placing work it saw fail as the workers went.
4. Unless ``--no-ui``, the web dashboard (`gavel ui`) runs in this process once the cluster
   is up, an operator client of it like the CLI, and its URL is printed; it stops before the
   children do. So does the HTTP API (`gavel api`), unless ``--no-api``.
5. ``--ha`` runs three clustered nats-servers, a bare state remote and three brokers, one
   of which leads (`gavel.cli.upha`), and says which; the state is then the remote's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gavel.cli.api import app as api_app
from gavel.cli.commands import UsageError
from gavel.cli.demoimage import IMAGE, container_spec
from gavel.cli.parsers import unusable_dir
from gavel.cli.ui import app as ui_app
from gavel.cli.upha import BROKERS, SERVERS, HaUp
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
from gavel.shared.nodebook import KnownNode
from gavel.shared.reasons import render
from gavel.shared.spec import Route
from gavel.shared.timing import fast_banner
from gavel.transport import identity, nodebook
from gavel.transport.client import BrokerRefused, ClientError, call, connect, wait_healthy
from gavel.transport.natsserver import NatsServer, NatsServerError, free_port

__all__ = ["up"]

STRATEGIES = ["least-loaded", "binpack", "spread", "headroom"]
#: How long the cluster may take to come up, and how often its children are looked at.
UP_TIMEOUT_S = 60.0
WATCH_S = 0.5
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


@dataclass
class _Child:
    name: str
    log: Path
    proc: subprocess.Popen[bytes]

    def last_words(self) -> str:
        """The last line the child wrote to its log (what it said on its way out)."""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                     if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""


def _spawn(name: str, args: list[str], log: Path, env: dict[str, str]) -> _Child:
    with open(log, "ab") as out:  # the child holds its own copy
        # -P: the directory the user stands in is not on the child's sys.path, so a folder
        # named gavel there (a clone's parent) cannot shadow the installed gavel.
        proc = subprocess.Popen([sys.executable, "-P", "-m", "gavel", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    return _Child(name, log, proc)


def _stop(children: list[_Child], grace_s: float = 15.0, brokers: int = 1) -> None:
    """Rule 3: SIGTERM the first `brokers` (the brokers) and wait for them to go, then the
    rest together; SIGKILL whatever is still there after `grace_s`."""
    for group in (children[:brokers], children[brokers:]):
        for c in group:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in group:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()


def _exited(children: list[_Child]) -> str:
    """Rule 2: a sentence about the first child that is no longer running, or ""."""
    for c in children:
        code = c.proc.poll()
        if code is not None:
            said = c.last_words()
            return (f"the {c.name} exited with status {code}"
                    + (f" ({said})" if said else "") + f"; its log is {c.log}")
    return ""


async def _until_up(children: list[_Child], url: str, operator: str | None,
                    workers: int, timeout: float) -> None:
    """Rule 2: until the broker answers and counts `workers` healthy nodes, watching the
    children."""
    deadline = time.monotonic() + timeout
    nc = None
    try:
        while time.monotonic() < deadline:
            gone = _exited(children)
            if gone:
                raise ClientError(gone)
            try:
                if nc is None:
                    nc = await connect(url, operator)
                reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=2)
                if sum(1 for x in reply.nodes if x.health == "healthy") >= workers:
                    return
            except ClientError:
                pass
            await asyncio.sleep(0.2)
    finally:
        if nc is not None:
            await nc.close()
    raise ClientError(f"the cluster did not come up within {timeout:g}s; see the logs under "
                      f"{children[0].log.parent}")


async def _who_leads(url: str, operator: str | None) -> str:
    """Rule 5's line: which broker leads, in which epoch."""
    nc = await connect(url, operator)
    try:
        reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=5)
    except ClientError as exc:
        return f"no leader yet: {exc}"
    finally:
        await nc.close()
    return f"{reply.leader} leads, epoch {reply.epoch}"


def any_user_python() -> str:
    """An interpreter any uid may run (the demo's workloads run as uids of their own,
    `worker.isolation`): this one if it and every directory to it are open to all, else
    python3 on the system's path. The demo's workloads use the standard library only."""
    real = Path(sys.executable).resolve()
    with contextlib.suppress(OSError):
        if all(p.stat().st_mode & 0o001 for p in (real, *real.parents)):
            return sys.executable
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def demo_specs() -> list[Spec]:
    py = any_user_python()
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


async def _demo(nc: Any, workers: int, git_dir: Path, gateway: str | None = None) -> None:
    await wait_healthy(nc, workers, 30)
    nodes = await call(nc, "nodes", NodesRequest(), NodesReply)
    print(f"\n{len(nodes.nodes)} workers bidding:")
    for n in nodes.nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(n.labels.items()))
        print(f"  {n.node_id:<8} {n.strategy:<13} {n.capacity.cpu:g} cpu "
              f"{n.capacity.memory_mb} MB  {labels}")
    ids = []
    refused = []  # the broker turns away what no node could ever hold (--workers 2: big)
    container, no_container = await asyncio.to_thread(container_spec)
    for spec in [*demo_specs(), *([container] if container else [])]:
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
    print(f"\na container: image {IMAGE}, placed as hello-container above" if container
          else f"\n{no_container}")
    if gateway is not None:
        await _through_gateway(f"{gateway}/web")
    await asyncio.sleep(2.5)
    evs = await call(nc, "events", EventsRequest(limit=0), EventsReply)
    print("\nwhat the workers reported:")
    for e in evs.events:
        if e.type in ("running", "exited", "failed"):
            extra = f" exit {e.exit_code}" if e.exit_code is not None else ""
            print(f"  {e.instance_id:<18} {e.type:<8} on {e.node_id}{extra}")
    print(f"\nthe deployment is in git: git --git-dir {git_dir} log --stat")


def _ports_of(i: int) -> tuple[int, int]:
    """The port range of the i-th worker (from 0)."""
    return 21000 + 100 * i, 21000 + 100 * i + 99


def _reserved(args: argparse.Namespace) -> list[str]:
    """The cluster's own ports the gateway cannot see for itself: the dashboard's and the
    brokers' metrics, when they are fixed."""
    ports = [p for p in (getattr(args, "ui_port", None), args.metrics_port) if p]
    if args.metrics_port and getattr(args, "ha", False):
        ports += [args.metrics_port + k for k in range(1, BROKERS)]
    return ["--reserved-ports", ",".join(map(str, ports))] if ports else []


def _private(state: Path) -> None:
    """Nothing of the cluster's is an instance's to read (`worker.isolation`): the state
    directory passable but not listable, everything in it but the workers' own directories
    (which keep each instance's directory reachable, and private to it) root's alone."""
    with contextlib.suppress(OSError):
        state.chmod(0o711)
        for entry in state.iterdir():
            if entry.name != "workers" and entry.is_dir() and not entry.is_symlink():
                entry.chmod(0o700)


async def up(args: argparse.Namespace) -> int:
    state: Path = args.state.resolve()
    why = unusable_dir(state / "logs")
    if why:
        raise UsageError(f"--state {state}: cannot keep gavel's state there ({why}).")
    _private(state)
    ha_on = bool(getattr(args, "ha", False))
    if ha_on and args.nats_port is not None:
        raise UsageError(f"--nats-port names one server, and --ha runs {SERVERS} on free "
                         "ports: leave --nats-port out.")
    nodes = [f"node-{i + 1}" for i in range(args.workers)]
    ids = identity.init(state, nodes) if args.auth else None
    ha = HaUp(state, ids.config.read_text() if ids else "") if ha_on else None
    server = NatsServer(port=args.nats_port, store_dir=state / "nats",
                        config=ids.config if ids else None, log=state / "logs" / "nats.log")
    servers = ha.cluster.servers if ha is not None else [server]
    url = ha.cluster.url if ha is not None else server.url
    try:
        if ha is not None:
            ha.make_remote()
        for one in servers:
            one.start()
    except NatsServerError as exc:
        for one in servers:
            one.stop()
        if exc.port_taken and args.nats_port is not None:
            raise UsageError(f"--nats-port {args.nats_port} is taken by another process; "
                             "choose another, or leave it out for a free one.") from None
        raise ClientError(f"{exc}; its log is {servers[0].log}") from None
    env = {**os.environ, "GAVEL_NATS_URL": url}
    env.pop("GAVEL_CREDS", None)  # each child gets its own, below

    def creds(path: Path | None) -> list[str]:
        return ["--creds", str(path)] if path is not None else []

    if args.log_format:
        env["GAVEL_LOG_FORMAT"] = args.log_format
    broker_creds = creds(ids.broker if ids else None)
    if ha is not None:  # rule 5
        children = [_spawn(f"broker-{k}", ha.broker_args(k, broker_creds, args.metrics_port,
                                                         args.metrics_addr),
                           state / "logs" / f"broker-{k}.log", env)
                    for k in range(1, BROKERS + 1)]
    else:
        broker = ["broker", "--state", str(state), *broker_creds]
        if args.metrics_port is not None:
            broker += ["--metrics-port", str(args.metrics_port), "--metrics-addr",
                       args.metrics_addr]
        children = [_spawn("broker", broker, state / "logs" / "broker.log", env)]
    n_brokers = len(children)
    # Where the cluster knows each worker to be (the gateway's node book): loopback and the
    # port range it is started with, never what it advertises.
    (state / "auth").mkdir(mode=0o700, parents=True, exist_ok=True)
    book = nodebook.record(state / "auth", {
        node: KnownNode(address="127.0.0.1", ports=_ports_of(i)) for i, node in enumerate(nodes)},
        merge=False)
    operator = str(ids.operator) if ids else None
    caddy = None
    gateway = None

    async def start() -> None:
        """The broker, then (once it answers, so it hears their first heartbeats) the
        workers, until all of them are up."""
        await _until_up(children, url, operator, 0, UP_TIMEOUT_S)
        _private(state)  # the broker's repository exists now
        for i, node in enumerate(nodes):
            cpu, mem = SIZES[i % len(SIZES)]
            children.append(_spawn(
                f"worker {node}",
                ["worker", "--node-id", node, *creds(ids.nodes[node] if ids else None),
                 "--strategy", STRATEGIES[i % len(STRATEGIES)],
                 "--labels", f"zone={'ab'[i % 2]}", "--cpu", str(cpu),
                 "--memory-mb", str(mem),
                 "--ports", "{}-{}".format(*_ports_of(i)),
                 "--state", str(state / "workers" / node), "--advertise", "127.0.0.1"],
                state / "logs" / f"{node}.log", env))
        await _until_up(children, url, operator, args.workers, UP_TIMEOUT_S)

    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    if getattr(args, "gateway", True):
        try:
            caddy = Caddy(state / "caddy", log=state / "logs" / "caddy.log").start()
        except (OSError, RuntimeError) as exc:  # no binary, or it would not start
            _stop(children, brokers=n_brokers)
            for one in servers:
                one.stop()
            raise ClientError(f"cannot run the gateway's Caddy: {exc} (--no-gateway runs "
                              "without one)") from None
        gateway = f"http://127.0.0.1:{getattr(args, 'gateway_port', None) or free_port()}"
        children.append(_spawn("gateway", ["gateway", *creds(ids.operator if ids else None),
                                           "--admin", caddy.admin_url, "--listen",
                                           gateway.removeprefix("http://"), "--nodes",
                                           str(book), *_reserved(args)],
                               state / "logs" / "gateway.log", env))
    dashboard: ui_app.Dashboard | None = None
    api: api_app.ApiServer | None = None
    try:
        starting = asyncio.ensure_future(start())
        stopping = asyncio.ensure_future(done.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # Ctrl-C (or SIGTERM) while starting: a clean stop
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientError):
                await starting
            return 0
        stopping.cancel()
        starting.result()  # ClientError: a child exited, or the cluster did not come up
        if ha is not None:
            print(f"gavel up: {SERVERS} clustered nats-servers at {url}, {BROKERS} brokers "
                  f"({await _who_leads(url, operator)}) and {args.workers} workers"
                  + (", gateway" if gateway else "") + f" up; state in {ha.remote}, logs "
                  f"under {state / 'logs'}")
        else:
            print(f"gavel up: nats-server at {url}, broker and {args.workers} workers"
                  + (", gateway" if gateway else "") + f" up; state and logs under {state}")
        if banner := fast_banner(os.environ):
            print(banner)
        if caddy is not None:
            print(f"gateway: {gateway} (Caddy; its admin API on the unix socket "
                  f"{caddy.admin_socket}, never on a port)")
        print(f"NATS auth: one nkey per worker, the broker and operators in {ids.directory}"
              if ids else "NATS auth: off (--no-auth); anyone who reaches the server may "
              "use it")
        if args.metrics_port is not None:
            print(f"broker metrics: http://{args.metrics_addr}:{args.metrics_port}/metrics"
                  + (f" (broker-k: port {args.metrics_port} + k - 1)" if ha else ""))
        if args.demo:
            nc = await connect(url, operator)
            try:
                await _demo(nc, args.workers, ha.remote if ha else state / "state.git",
                            gateway)
            finally:
                await nc.close()
            return 0
        if args.ui:  # rule 4
            dashboard = await ui_app.start(url, operator, addr=args.ui_addr,
                                           port=args.ui_port, token=args.ui_token)
            print(f"dashboard: {dashboard.announce()}")
        if getattr(args, "api", False):  # rule 4: the HTTP API (`gavel api`) too
            api = await api_app.start(url, operator, addr=args.api_addr, port=args.api_port,
                                      token=args.api_token, tls_cert=args.api_tls_cert,
                                      tls_key=args.api_tls_key)
            print(f"HTTP API: {api.announce()}")
        hint = f"GAVEL_CREDS={operator} " if operator else ""
        print(f"try: GAVEL_NATS_URL={url} {hint}gavel nodes   "
              "(Ctrl-C stops the cluster)", flush=True)  # the last line: everything is up
        while not done.is_set():  # rule 2, for as long as it runs
            if ha is not None:  # rule 5
                said, fatal = ha.losses({c.name: c.proc.poll() for c in children[:n_brokers]})
                for line in said:
                    print(line, flush=True)
                gone = fatal or _exited(children[n_brokers:])
            else:
                gone = _exited(children)
                if not gone and (server.proc is None or server.proc.poll() is not None):
                    gone = f"the nats-server exited; its log is {server.log}"
            if gone:
                raise ClientError(gone)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_S):
                    await done.wait()
        return 0
    finally:
        if dashboard is not None:
            await dashboard.close()
        if api is not None:
            await api.close()
        _stop(children, brokers=n_brokers)  # rule 3: the brokers first
        if caddy is not None:
            caddy.stop()
        for one in servers:
            one.stop()
