"""The `gavel` command line's shape: every verb, its flags and its help, built whole for
whichever verb runs.

It loads only what declaring the flags needs (`parsers`, `options`, `verbflags`, the servers'
`options`): a daemon's command line, `gavel worker` idle on every node above all, carries none
of the client verbs, the HTTP API or the dashboard (`main` imports each where it runs).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from gavel import __version__
from gavel.cli import completion, options, verbflags
from gavel.cli.api import options as api_options
from gavel.cli.options import DEFAULT_NATS
from gavel.cli.parsers import (
    duration,
    non_negative_float,
    positive_int,
    wait_mode,
    whole,
)
from gavel.cli.parsers import port as _port
from gavel.cli.ui import options as ui_options

__all__ = ["DAEMONS", "WAIT_AS", "Parser", "build_parser", "print_error_json", "wait_modes"]


class Parser(argparse.ArgumentParser):
    """argparse, with `main` rule 2 for its own usage errors (every subparser is one of these)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            print_error_json(f"{self.prog}: {message}", 2)
        super().error(message)


def print_error_json(sentence: str, code: int) -> None:
    """`main` rule 2's object, on stdout."""
    print(json.dumps({"error": sentence, "exit_code": code}), flush=True)


#: The daemons, each configuring its logs from its own settings.
DAEMONS = ("broker", "worker", "gateway")


def _client(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("--nats", default=os.environ.get("GAVEL_NATS_URL", DEFAULT_NATS),
                   help="NATS URL (env GAVEL_NATS_URL; default %(default)s)")
    p.add_argument("--creds", default=os.environ.get("GAVEL_CREDS") or None, metavar="FILE",
                   help="NATS credentials: an nkey seed file (gavel auth init writes "
                   "operator.nk) or a .creds file (env GAVEL_CREDS)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gavel", description=(
        "A decentralized bidding scheduler: nodes bid over NATS, the broker awards the "
        "lowest load and commits the placement to git."))
    parser.add_argument("--version", action="version", version=f"gavel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _up_parser(sub)
    _daemon_parsers(sub)
    _workload_parsers(sub)
    _server_parsers(sub)
    _cluster_parsers(sub)
    _service_parsers(sub)
    _tool_parsers(sub)
    return parser


def _up_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    """`gavel up`: the embedded default."""
    up = sub.add_parser("up", help="run a local cluster: nats-server, a broker and workers")
    up.add_argument("--state", type=Path, default=Path(".gavel"),
                    help="directory for all state (default %(default)s)")
    up.add_argument("--workers", type=positive_int, default=4, help="number of workers")
    up.add_argument("--nats-port", type=_port, default=None,
                    help="port for the embedded nats-server (default: a free port)")
    up.add_argument("--restart-workers", action="store_true",
                    help="start a worker that exits again on its state, where it re-adopts "
                    "its running instances (default: its exit is said and the rest carry on)")
    up.add_argument("--demo", action="store_true",
                    help="submit demo workloads, show where they went and why, then exit")
    up.add_argument("--no-auth", dest="auth", action="store_false",
                    help="run nats-server open to anyone who reaches it (default: one nkey "
                    "per worker, the broker and operators, from `gavel auth init` under "
                    "STATE/auth)")

    up.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                    help="serve the broker's Prometheus metrics on this port (default: off)")
    up.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                    help="address the broker's metrics endpoint listens on "
                    "(default %(default)s)")
    up.add_argument("--log-format", choices=("text", "json"), default=None,
                    help="log format of the broker and workers (env GAVEL_LOG_FORMAT; "
                    "default text)")
    up.add_argument("--no-ui", dest="ui", action="store_false",
                    help="do not serve the web dashboard (default: served, its URL printed)")
    ui_options.add_options(up, prefix="ui-")
    up.add_argument("--no-api", dest="api", action="store_false",
                    help="do not serve the HTTP API (default: served, its URL printed)")
    api_options.add_options(up)
    up.add_argument("--no-gateway", dest="gateway", action="store_false",
                    help="run no gateway (default: an embedded Caddy, its admin API on "
                    "loopback, kept by `gavel gateway`, routes every spec that declares "
                    "routes)")
    up.add_argument("--gateway-port", type=_port, default=None, metavar="PORT",
                    help="loopback port the gateway serves on (default: a free port)")
    up.add_argument("--ha", action="store_true",
                    help="several brokers, one leader: three clustered nats-servers, a bare "
                    "state remote under STATE and three brokers (default: one of each)")


def _daemon_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """The daemons, their identities and their config files."""
    br = sub.add_parser("broker", help="run the broker", description=(
        "Run the broker. Settings come from --config FILE, then GAVEL_* environment "
        "variables, then flags, each overriding the one before."))
    options.add_options(br, options.BROKER_OPTIONS)

    wk = sub.add_parser("worker", help="run a worker agent on this host", description=(
        "Run a worker agent. Settings come from --config FILE, then GAVEL_* environment "
        "variables, then flags, each overriding the one before."))
    options.add_options(wk, options.WORKER_OPTIONS)

    gw = sub.add_parser("gateway", help="keep a Caddy's routes following every placement",
                        description=(
        "Run the gateway: an operator client of the broker that routes, through Caddy's "
        "admin API, every spec that declares routes to its healthy running replicas. "
        "Settings come from --config FILE, then GAVEL_* environment variables, then flags, "
        "each overriding the one before."))
    options.add_options(gw, options.GATEWAY_OPTIONS)

    au = sub.add_parser("auth", help="NATS identities: nkeys and the server's permissions")
    verbflags.auth_arguments(au)

    cf = sub.add_parser("config", help="check a broker or worker config file")
    cfs = cf.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    ck = cfs.add_parser("check", help="print the effective config (file, then GAVEL_* "
                        "environment), or exit 2 naming the bad field")
    ck.add_argument("file", help="TOML config file")
    ck.add_argument("--kind", choices=("broker", "worker", "gateway"), default=None,
                    help="which daemon reads it (default: told by the keys only one of them "
                    "reads: node_id or ports for a worker, ref or secrets for a broker, admin "
                    "for a gateway)")


def _workload_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """Submitting work and reading its state."""
    sm = sub.add_parser("submit", help="submit a workload spec (TOML or JSON)")
    _client(sm)
    sm.add_argument("spec", type=Path, help="spec file")
    sm.add_argument("--id", default="", help="instance id (default NAME-random)")
    sm.add_argument("--key", default="",
                    help="idempotency key (default: a new uuid4 per invocation); the request "
                    "is retried with it when the broker does not answer in time, and a "
                    "submission that landed under it is answered again, never made twice")
    sm.add_argument("--wait", action="store_const", const="end", default=None,
                    help="a job: wait for its end (a batch array: every task), exit 0 when "
                    "all succeeded, else 3 naming how many failed and the first failure's "
                    "reason; --wait=running (and --wait on a service): until running and "
                    "healthy (exit 0), or 3 with the reason: unschedulable, failed, or not "
                    "healthy within --timeout; --wait=end is --wait")
    # `--wait=MODE`, rewritten by `main` (a bare --wait must not take the spec for its value).
    sm.add_argument(WAIT_AS, dest="wait", type=wait_mode, help=argparse.SUPPRESS)
    sm.add_argument("--timeout", type=non_negative_float, default=None,
                    help="seconds --wait waits, 0 for no limit (default 30 for running, no "
                    "limit for a job's end)")

    st = sub.add_parser("status", help="instances and their states, or a service's replicas")
    _client(st)
    st.add_argument("instance", nargs="?", default="",
                    help="an instance id, or a service name (its replicas: node, state, "
                    "version, health)")


def _server_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """The dashboard and the HTTP API, each an operator client."""
    ui = sub.add_parser("ui", help="serve a live web dashboard of the cluster (read-only)",
                        description="Serve a read-only web dashboard of the cluster: nodes, "
                        "instances, services, live events, and every instance's auctions. It "
                        "listens on loopback unless --addr says otherwise; on any other address "
                        "it requires a token.")
    _client(ui, json_flag=False)
    ui_options.add_options(ui)

    ap = sub.add_parser("api", help="serve the HTTP API (OpenAPI at /openapi.json)",
                        description="Serve the cluster's API over HTTP: every verb of this "
                        "command, resource-shaped under /v1, JSON in and out, its OpenAPI "
                        "document at /openapi.json. It listens on loopback unless --api-addr "
                        "says otherwise; on any other address it requires a bearer token.")
    _client(ap, json_flag=False)
    api_options.add_options(ap)


def _cluster_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """The cluster's nodes, instances, events, output, routes and drains."""
    nd = sub.add_parser("nodes", help="nodes, their health and load; one NODE in detail")
    _client(nd)
    nd.add_argument("node", nargs="?", default="",
                    help="show this node in detail: what runs there, its commitments and "
                    "ports, its recent declines")

    wy = sub.add_parser("why", help="why an instance is where it is: every bid and decline")
    _client(wy)
    wy.add_argument("instance")

    ev = sub.add_parser("events", help="recent events, or --follow them live")
    _client(ev)
    ev.add_argument("instance", nargs="?", default="")
    ev.add_argument("--follow", action="store_true", help="stream events until interrupted")
    ev.add_argument("--since", type=duration, default=None, metavar="DURATION",
                    help="only events of the last DURATION (30s, 5m, 1h30m, 2d)")
    ev.add_argument("--limit", type=whole, default=100, metavar="N",
                    help="the newest N events the broker keeps (default %(default)s; 0: all)")

    lg = sub.add_parser("logs", help="an instance's output (a service's: its current "
                        "replicas', merged in time order), "
                        "read from its node", description=(
                            "Print an instance's stdout (or --stderr, or --all), read over NATS "
                            "from the node that holds it. A service's name prints its current "
                            "replicas' (--history: every replica it has a record of), merged "
                            "in the order written, each line prefixed with its instance id."))
    _client(lg)
    verbflags.logs_arguments(lg)

    ex = sub.add_parser("exec", help="run a command inside a running instance, its input and "
                        "output streamed from its node", description=(
                            "Run CMD in the instance's directory, environment (less its "
                            "secret values), cgroup and uid, or inside its container, on the "
                            "node that runs it; stdin, stdout and stderr are streamed, and "
                            "the exit status is the command's."))
    _client(ex, json_flag=False)
    verbflags.exec_arguments(ex)

    cn = sub.add_parser("cancel", help="stop an instance (SIGTERM, then SIGKILL after grace)")
    _client(cn)
    cn.add_argument("instance")

    rt = sub.add_parser("routes", help="what the gateway routes where: every route of every "
                        "live spec, and the replicas or directory it leads to")
    _client(rt)
    rt.add_argument("--nodes", default=os.environ.get("GAVEL_GATEWAY_NODES", ""),
                    metavar="FILE", help="the gateway's node book (`gavel gateway --nodes`; "
                    "env GAVEL_GATEWAY_NODES): upstreams as the gateway derives them with it")

    tu = sub.add_parser("tune", help="read, pin or release the broker's batch size, rounds in "
                        "flight and commit gap at runtime (not kept across a restart)")
    _client(tu)
    verbflags.tune_arguments(tu)

    dr = sub.add_parser("drain", help="make a node decline all new work")
    _client(dr)
    dr.add_argument("node")
    dr.add_argument("--undo", action="store_true", help="take the node back into service")
    dr.add_argument("--migrate", action="store_true",
                    help="also move its instances elsewhere, one by one")
    dr.add_argument("--deadline", type=duration, default=None, metavar="DURATION",
                    help="move the instances still there after DURATION (30s, 5m, 1h), one "
                    "by one as --migrate does")


def _service_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """The service verbs."""
    dp = sub.add_parser("deploy", help="create or update a service from its spec; "
                        "`deploy status NAME` shows a deploy's progress", description=(
                            "gavel deploy SPEC deploys a service (a spec with type = "
                            "\"service\"): a new one, or a new version of a running one, "
                            "rolled out update.max_parallel replicas at a time. gavel deploy "
                            "status NAME shows the versions, their replicas and the deploy."))
    _client(dp)
    dp.add_argument("target", nargs="+", metavar="SPEC | status NAME",
                    help="a service spec file (TOML or JSON), or `status` and a service name")
    dp.add_argument("--wait", action="store_true",
                    help="wait until every replica of the new version is healthy (exit 0), or "
                    "exit 3 with the reason the deploy failed or was rolled back")
    dp.add_argument("--timeout", type=non_negative_float, default=0.0,
                    help="seconds --wait waits at most (default 0: until the deploy ends)")

    dp.add_argument("--check-index", type=whole, default=None, metavar="N",
                    help="apply only if the service's version index is still N, as `gavel "
                    "plan` printed it (0: only if there is no such service)")
    pl = sub.add_parser("plan", help="where a spec would go and what it would change: a dry "
                        "run of the auction, nothing committed", description=(
                            "gavel plan SPEC asks the nodes for bids as a dry run and prints "
                            "where each instance would go and why, what a deploy would change "
                            "and stop, and the service's version index."))
    _client(pl)
    verbflags.plan_arguments(pl)

    sv = sub.add_parser("services", help="services, their versions, counts and deploys")
    _client(sv)

    sc = sub.add_parser("scale", help="set a service's number of replicas")
    _client(sc)
    sc.add_argument("name", help="service name")
    sc.add_argument("count", type=whole, help="replicas to keep (0 or more)")

    sp = sub.add_parser("stop", help="stop every replica of a service (its record stays; "
                        "deploy starts it again)")
    _client(sp)
    sp.add_argument("name", help="service name")

    rb = sub.add_parser("rollback", help="roll a service back: to its last healthy version, "
                        "or the one its last deploy came from, or --to VERSION")
    _client(rb)
    rb.add_argument("name", help="service name")
    rb.add_argument("--to", type=positive_int, default=0, metavar="VERSION",
                    help="the version to go back to (default: the last healthy one while "
                    "another runs, else the one the last deploy came from)")


def _tool_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """The simulator, the benchmark and shell completion."""
    sim_cli: ModuleType | None
    try:
        from gavel.cli import sim as sim_cli
    except ImportError:  # pragma: no cover - sim ships with the package
        sim_cli = None
    if sim_cli is not None:
        sim = sub.add_parser("sim", help="simulate bidding strategies in virtual time")
        sim_cli.add_arguments(sim)
    from gavel.cli import bench as bench_cli

    bn = sub.add_parser("bench", help="measure placements/s against the machine's ceilings")
    bench_cli.add_arguments(bn)

    co = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                        description="Print a completion script for SHELL, made from this "
                        "command line's own parser. bash: eval \"$(gavel completion bash)\" "
                        "in ~/.bashrc; zsh: eval \"$(gavel completion zsh)\" in ~/.zshrc.")
    co.add_argument("shell", choices=completion.SHELLS)


#: The hidden option `submit --wait=MODE` becomes (`wait_modes`).
WAIT_AS = "--wait-mode"


def wait_modes(argv: list[str]) -> list[str]:
    """`gavel submit ... --wait=MODE` as the hidden ``--wait-mode MODE``: `--wait` alone takes
    no value, so ``submit --wait spec.toml`` still reads spec.toml as the spec."""
    verb = next((a for a in argv if not a.startswith("-")), "")
    if verb != "submit":
        return argv
    out: list[str] = []
    for a in argv:
        out += [WAIT_AS, a.partition("=")[2]] if a.startswith("--wait=") else [a]
    return out
