"""`gavel up`: the embedded default — nats-server from the wheel, a broker, N workers, and a
gateway (a Caddy from the wheel, kept by `gavel gateway`).

Rules:
1. Everything lives under ``--state`` (state.git, auth/, nats/, workers/, caddy/, logs/);
   every part is a real child process speaking real NATS, exactly as it would on separate
   hosts — with its own nkey and only its own subjects (`gavel auth init`, reusing the keys
   of an earlier run; ``--no-auth`` leaves NATS open). Its own clients (the dashboard, the
   HTTP API, the demo, and the command it prints) ask as the named operator `ADMIN`
   (write), with an HTTP token of its own (`cli.api.operators`), so the broker's log and
   events name who asked. The gateway listens on a free loopback
   port (``--gateway-port``), Caddy's admin API on another, loopback only; the workers
   advertise 127.0.0.1; ``--no-gateway`` runs neither. ``--demo`` submits a few workloads,
   prints where each went and why, asks one of them something through the gateway, and
   exits. ``--metrics-port`` serves the broker's metrics; ``--log-format`` (or
   GAVEL_LOG_FORMAT) reaches every child.
2. Up means up: the nats-server is ours (`NatsServer.start`: not merely something on the
   port), the broker answers and every worker is healthy before the cluster is announced.
   A child that exits while starting stops everything this command started, and the
   command exits 1 with one sentence naming the child and what it said last (a
   ``--nats-port`` that is taken: exit 2); so does the broker, the nats-server or the
   gateway exiting later. A worker that exits later is said in one such sentence and the
   rest carry on, as a cluster does when it loses a node: its instances keep running
   unmanaged until the broker re-places them; ``--restart-workers`` starts it again on its
   state, and it re-adopts what still runs (`gavel.cli.supervise`).
3. Every way out (Ctrl-C, SIGTERM, a child's exit, a failed start) takes one path: the
   broker first, then the other children, then every instance a worker left running, then
   Caddy and NATS. The workers stop their instances, but with no broker to hear it the placements
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
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gavel.cli.api import app as api_app
from gavel.cli.api.operators import token_of
from gavel.cli.commands import UsageError
from gavel.cli.parsers import unusable_dir
from gavel.cli.supervise import OnExit, Supervisor
from gavel.cli.ui import app as ui_app
from gavel.cli.updemo import demo
from gavel.cli.upha import BROKERS, SERVERS, HaUp
from gavel.client import Client, ClientError
from gavel.gateway.caddyserver import Caddy
from gavel.shared.nodebook import KnownNode
from gavel.shared.roles import WRITE
from gavel.shared.timing import Timing, fast_banner
from gavel.transport import identity, nodebook
from gavel.transport.natsserver import NatsServer, NatsServerError, free_port

__all__ = ["up"]

#: `gavel up`'s waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()

STRATEGIES = ["least-loaded", "binpack", "spread", "headroom"]
#: How long the cluster may take to come up, and how often its children are looked at.
UP_TIMEOUT_S = _TIMING.up_s
WATCH_S = _TIMING.watch_s
SIZES = [(4.0, 4096), (2.0, 2048), (8.0, 8192), (4.0, 8192)]
#: The named operator `gavel up`'s own clients ask as (rule 1).
ADMIN = "admin"


async def _until_up(sup: Supervisor, url: str, operator: str | None, workers: int,
                    timeout: float) -> None:
    """Rule 2: until the broker answers and counts `workers` healthy nodes; any child that
    exits meanwhile ends the start, whatever its exit would mean later."""
    deadline = time.monotonic() + timeout
    client = None
    try:
        while time.monotonic() < deadline:
            gone = sup.first_exit()
            if gone:
                raise ClientError(gone)
            try:
                if client is None:
                    client = await Client.connect(url, operator, timeout=_TIMING.ask_s)
                reply = await client.nodes()
                if sum(1 for x in reply.nodes if x.health == "healthy") >= workers:
                    return
            except ClientError:
                pass
            await asyncio.sleep(_TIMING.ask_pause_s)
    finally:
        if client is not None:
            await client.close()
    raise ClientError(f"the cluster did not come up within {timeout:g}s; see the logs under "
                      f"{sup.children[0].log.parent}")


async def _who_leads(url: str, operator: str | None) -> str:
    """Rule 5's line: which broker leads, in which epoch."""
    async with await Client.connect(url, operator, timeout=_TIMING.glance_s) as client:
        try:
            reply = await client.nodes()
        except ClientError as exc:
            return f"no leader yet: {exc}"
    return f"{reply.leader} leads, epoch {reply.epoch}"


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


@dataclass
class _Cluster:
    """What one `gavel up` starts, in the order it starts it, and the one way out (`close`)."""

    args: argparse.Namespace
    state: Path
    ids: identity.Identities | None
    ha: HaUp | None
    servers: list[NatsServer]
    url: str
    sup: Supervisor
    brokers: int = 0
    caddy: Caddy | None = None
    gateway: str | None = None
    dashboard: ui_app.Dashboard | None = None
    api: api_app.ApiServer | None = None
    book: Path | None = None

    @property
    def operator(self) -> str | None:
        """The local admin's seed (rule 1): what `gavel up`'s own clients ask as."""
        return str(self.ids.operators.get(ADMIN, self.ids.operator)) if self.ids else None

    def creds(self, path: Path | None) -> list[str]:
        return ["--creds", str(path)] if path is not None else []

    def start_nats(self) -> None:
        try:
            if self.ha is not None:
                self.ha.make_remote()
            for one in self.servers:
                one.start()
        except NatsServerError as exc:
            port = self.args.nats_port
            if exc.port_taken and port is not None:
                raise UsageError(f"--nats-port {port} is taken by another process; choose "
                                 "another, or leave it out for a free one.") from None
            raise ClientError(f"{exc}; its log is {self.servers[0].log}") from None

    def start_brokers(self) -> None:
        args, logs = self.args, self.state / "logs"
        broker_creds = self.creds(self.ids.broker if self.ids else None)
        if self.ha is not None:  # rule 5
            for k in range(1, BROKERS + 1):
                self.sup.spawn(f"broker-{k}", self.ha.broker_args(
                    k, broker_creds, args.metrics_port, args.metrics_addr),
                    logs / f"broker-{k}.log")
        else:
            broker = ["broker", "--state", str(self.state), *broker_creds]
            if args.metrics_port is not None:
                broker += ["--metrics-port", str(args.metrics_port), "--metrics-addr",
                           args.metrics_addr]
            self.sup.spawn("broker", broker, logs / "broker.log")
        self.brokers = len(self.sup.children)

    def write_node_book(self) -> Path:
        """Where the cluster knows each worker to be (the gateway's node book): loopback and
        the port range it is started with, never what it advertises."""
        (self.state / "auth").mkdir(mode=0o700, parents=True, exist_ok=True)
        return nodebook.record(self.state / "auth", {
            f"node-{i + 1}": KnownNode(address="127.0.0.1", ports=_ports_of(i))
            for i in range(self.args.workers)}, merge=False)

    def start_gateway(self) -> None:
        if not getattr(self.args, "gateway", True):
            return
        book = self.book or self.write_node_book()
        try:
            self.caddy = Caddy(self.state / "caddy",
                               log=self.state / "logs" / "caddy.log").start()
        except (OSError, RuntimeError) as exc:  # no binary, or it would not start
            raise ClientError(f"cannot run the gateway's Caddy: {exc} (--no-gateway runs "
                              "without one)") from None
        port = getattr(self.args, "gateway_port", None) or free_port()
        self.gateway = f"http://127.0.0.1:{port}"
        self.sup.spawn("gateway", ["gateway", *self.creds(self.ids.operator if self.ids else None),
                                   "--admin", self.caddy.admin_url, "--listen",
                                   self.gateway.removeprefix("http://"), "--nodes",
                                   str(book), *_reserved(self.args)],
                       self.state / "logs" / "gateway.log")

    async def start_workers(self) -> None:
        """The broker answers first (so it hears their first heartbeats), then the workers,
        until all of them are healthy."""
        await _until_up(self.sup, self.url, self.operator, 0, UP_TIMEOUT_S)
        _private(self.state)  # the broker's repository exists now
        on_exit = OnExit.RESTART if getattr(self.args, "restart_workers", False) else OnExit.SAY
        for i in range(self.args.workers):
            node = f"node-{i + 1}"
            cpu, mem = SIZES[i % len(SIZES)]
            where = self.state / "workers" / node
            self.sup.spawn(
                f"worker {node}",
                ["worker", "--node-id", node,
                 *self.creds(self.ids.nodes[node] if self.ids else None),
                 "--strategy", STRATEGIES[i % len(STRATEGIES)],
                 "--labels", f"zone={'ab'[i % 2]}", "--cpu", str(cpu),
                 "--memory-mb", str(mem),
                 "--ports", "{}-{}".format(*_ports_of(i)),
                 "--state", str(where), "--advertise", "127.0.0.1"],
                self.state / "logs" / f"{node}.log", on_exit, state=where)
        await _until_up(self.sup, self.url, self.operator, self.args.workers, UP_TIMEOUT_S)

    async def announce(self) -> None:
        args, ids, url = self.args, self.ids, self.url
        gw = ", gateway" if self.gateway else ""
        if self.ha is not None:
            print(f"gavel up: {SERVERS} clustered nats-servers at {url}, {BROKERS} brokers "
                  f"({await _who_leads(url, self.operator)}) and {args.workers} workers"
                  f"{gw} up; state in {self.ha.remote}, logs under {self.state / 'logs'}")
        else:
            print(f"gavel up: nats-server at {url}, broker and {args.workers} workers{gw} "
                  f"up; state and logs under {self.state}")
        if banner := fast_banner(os.environ):
            print(banner)
        if self.caddy is not None:
            print(f"gateway: {self.gateway} (Caddy; its admin API on the unix socket "
                  f"{self.caddy.admin_socket}, never on a port)")
        print(f"NATS auth: one nkey per worker, the broker and operators in {ids.directory}"
              if ids else "NATS auth: off (--no-auth); anyone who reaches the server may "
              "use it")
        if args.metrics_port is not None:
            print(f"broker metrics: http://{args.metrics_addr}:{args.metrics_port}/metrics"
                  + (f" (broker-k: port {args.metrics_port} + k - 1)" if self.ha else ""))

    def watch(self) -> str:
        """Rules 2 and 5, once: say what exited, and why everything must stop ("": go on)."""
        now = time.monotonic()
        if self.ha is not None:
            said, fatal = self.ha.losses({c.name: c.proc.poll()
                                          for c in self.sup.children[:self.brokers]})
            more, gone = self.sup.check(now, self.sup.children[self.brokers:])
            said += more
            gone = fatal or gone
        else:
            said, gone = self.sup.check(now)
            server = self.servers[0]
            if not gone and (server.proc is None or server.proc.poll() is not None):
                gone = f"the nats-server exited; its log is {server.log}"
        for line in said:
            print(line, flush=True)
        return gone

    async def close(self) -> None:
        """Rule 3, whatever the way out: the dashboard, the brokers, the other children and
        what their workers left running, Caddy, NATS."""
        if self.dashboard is not None:
            await self.dashboard.close()
        if self.api is not None:
            await self.api.close()
        self.sup.stop(first=self.brokers)
        if self.caddy is not None:
            self.caddy.stop()
        for one in self.servers:
            one.stop()


def _plan(args: argparse.Namespace) -> _Cluster:
    """The refusals that come before anything starts, and what will be started."""
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
    if ids is not None:  # rule 1: the local admin, a named operator of its own
        ids = identity.add_operator(state, ADMIN, WRITE)
        token_of(ids.directory, ADMIN)
    ha = HaUp(state, ids.config.read_text() if ids else "") if ha_on else None
    server = NatsServer(port=args.nats_port, store_dir=state / "nats",
                        config=ids.config if ids else None, log=state / "logs" / "nats.log")
    servers = ha.cluster.servers if ha is not None else [server]
    url = ha.cluster.url if ha is not None else server.url
    env = {**os.environ, "GAVEL_NATS_URL": url}
    env.pop("GAVEL_CREDS", None)  # each child gets its own
    if args.log_format:
        env["GAVEL_LOG_FORMAT"] = args.log_format
    return _Cluster(args, state, ids, ha, servers, url, Supervisor(env))


async def _until_stopped(done: asyncio.Event, work: Any) -> bool:
    """Run `work` unless `done` is set first (Ctrl-C or SIGTERM while starting): True when
    the work finished, its exception raised."""
    starting = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(done.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, ClientError):
            await starting
        return False
    stopping.cancel()
    starting.result()
    return True


async def up(args: argparse.Namespace) -> int:
    cluster = _plan(args)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    try:
        cluster.start_nats()
        cluster.start_brokers()
        cluster.book = cluster.write_node_book()
        cluster.start_gateway()
        if not await _until_stopped(done, cluster.start_workers()):
            return 0  # stopped while starting: a clean stop
        await cluster.announce()
        if args.demo:
            async with await Client.connect(cluster.url, cluster.operator) as client:
                await demo(client, args.workers, cluster.ha.remote if cluster.ha
                           else cluster.state / "state.git", cluster.gateway)
            return 0
        if args.ui:  # rule 4
            cluster.dashboard = await ui_app.start(cluster.url, cluster.operator,
                                                   addr=args.ui_addr, port=args.ui_port,
                                                   token=args.ui_token)
            print(f"dashboard: {cluster.dashboard.announce()}")
        if getattr(args, "api", False):  # rule 4: the HTTP API (`gavel api`) too
            cluster.api = await api_app.start(
                cluster.url, cluster.operator, addr=args.api_addr, port=args.api_port,
                token=args.api_token, tls_cert=args.api_tls_cert, tls_key=args.api_tls_key,
                read_token=args.api_read_token,
                operators_dir=args.api_operators or (str(cluster.ids.directory)
                                                     if cluster.ids else ""))
            print(f"HTTP API: {cluster.api.announce()}")
        hint = f"GAVEL_CREDS={cluster.operator} " if cluster.operator else ""
        print(f"try: GAVEL_NATS_URL={cluster.url} {hint}gavel nodes   "
              "(Ctrl-C stops the cluster)", flush=True)  # the last line: everything is up
        while not done.is_set():  # rule 2, for as long as it runs
            gone = cluster.watch()
            if gone:
                raise ClientError(gone)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_S):
                    await done.wait()
        return 0
    finally:
        await cluster.close()
