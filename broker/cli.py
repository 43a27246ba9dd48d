"""The `gavel` command line: the embedded default (`up`), the daemons, and the client verbs.

Rule: bad flags and bad spec files exit 2 with one sentence naming the problem; a broker
that cannot be reached exits 1 with a sentence naming the URL; no traceback reaches a user.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from broker import commands
from shared.strategies import names as strategy_names

__all__ = ["main"]

DEFAULT_NATS = "nats://127.0.0.1:4222"


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"label {part!r} is not of the form key=value")
        out[key] = value
    return out


_NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _node_id(text: str) -> str:
    if not _NODE_ID.match(text):
        raise argparse.ArgumentTypeError(
            f"node id {text!r} must be 1-64 letters, digits, '-' or '_' (it becomes one NATS "
            "subject token)")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


def _port_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(f"port range {text!r} is not of the form FIRST-LAST")
    a, b = _port(lo), _port(hi)
    if a > b:
        raise argparse.ArgumentTypeError(f"port range {text!r} ends before it starts")
    return a, b


def _client(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("--nats", default=os.environ.get("GAVEL_NATS_URL", DEFAULT_NATS),
                   help="NATS URL (env GAVEL_NATS_URL; default %(default)s)")
    p.add_argument("--creds", default=os.environ.get("GAVEL_CREDS"),
                   help="NATS credentials file (env GAVEL_CREDS)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gavel", description=(
        "A decentralized bidding scheduler: nodes bid over NATS, the broker awards the "
        "lowest load and commits the placement to git."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run a local cluster: nats-server, a broker and workers")
    up.add_argument("--state", type=Path, default=Path(".gavel"),
                    help="directory for all state (default %(default)s)")
    up.add_argument("--workers", type=_positive_int, default=4, help="number of workers")
    up.add_argument("--nats-port", type=_port, default=None,
                    help="port for the embedded nats-server (default: a free port)")
    up.add_argument("--demo", action="store_true",
                    help="submit demo workloads, show where they went and why, then exit")

    br = sub.add_parser("broker", help="run the broker")
    _client(br, json_flag=False)
    br.add_argument("--state", type=Path, required=True, help="state directory (holds state.git)")
    br.add_argument("--ref", default="refs/heads/main",
                    help="active ref; a tag or commit id pins the deployment (read-only)")
    br.add_argument("--secrets", type=Path, default=None,
                    help="TOML file of name = \"value\" secrets resolved at award time")

    wk = sub.add_parser("worker", help="run a worker agent on this host")
    _client(wk, json_flag=False)
    wk.add_argument("--node-id", required=True, type=_node_id,
                    help="this node's id (letters, digits, '-' and '_')")
    wk.add_argument("--strategy", default="least-loaded", choices=strategy_names(),
                    help="bidding strategy (default %(default)s)")
    wk.add_argument("--strategy-param", action="append", default=[], metavar="KEY=VALUE",
                    help="strategy parameter, e.g. ceiling=0.7 for headroom (repeatable)")
    wk.add_argument("--labels", type=_labels, default={}, help="k=v,k2=v2")
    wk.add_argument("--cpu", type=_positive_float, default=None,
                    help="cpu capacity (default: detected)")
    wk.add_argument("--memory-mb", type=_positive_int, default=None,
                    help="memory capacity in MB (default: detected)")
    wk.add_argument("--ports", type=_port_range, default=(20000, 20999),
                    help="port range to assign from (default 20000-20999)")
    wk.add_argument("--state", type=Path, default=None,
                    help="local state directory (default ./.gavel-worker-NODE)")

    sm = sub.add_parser("submit", help="submit a workload spec (TOML or JSON)")
    _client(sm)
    sm.add_argument("spec", type=Path, help="spec file")
    sm.add_argument("--id", default="", help="instance id (default NAME-random)")
    sm.add_argument("--wait", action="store_true",
                    help="wait until placed (exit 0) or unschedulable (exit 3 with the reason)")
    sm.add_argument("--timeout", type=_positive_float, default=30.0,
                    help="seconds --wait waits (default %(default)s)")

    st = sub.add_parser("status", help="instances and their states")
    _client(st)
    st.add_argument("instance", nargs="?", default="")

    nd = sub.add_parser("nodes", help="nodes, their health and load")
    _client(nd)

    wy = sub.add_parser("why", help="why an instance is where it is: every bid and decline")
    _client(wy)
    wy.add_argument("instance")

    ev = sub.add_parser("events", help="recent events, or --follow them live")
    _client(ev)
    ev.add_argument("instance", nargs="?", default="")
    ev.add_argument("--follow", action="store_true", help="stream events until interrupted")

    cn = sub.add_parser("cancel", help="stop an instance (SIGTERM, then SIGKILL after grace)")
    _client(cn)
    cn.add_argument("instance")

    dr = sub.add_parser("drain", help="make a node decline all new work")
    _client(dr)
    dr.add_argument("node")
    dr.add_argument("--undo", action="store_true", help="take the node back into service")
    dr.add_argument("--migrate", action="store_true",
                    help="also move its instances elsewhere, one by one")

    try:
        from sim import cli as sim_cli
    except ImportError:  # pragma: no cover - sim ships with the package
        sim_cli = None
    if sim_cli is not None:
        sim = sub.add_parser("sim", help="simulate bidding strategies in virtual time")
        sim_cli.add_arguments(sim)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("GAVEL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    try:
        if args.command == "sim":
            from sim import cli as sim_cli

            return sim_cli.run(args)
        return asyncio.run(commands.dispatch(args))
    except commands.UsageError as exc:
        print(f"gavel {args.command}: {exc}", file=sys.stderr)
        return 2
    except commands.ClientError as exc:
        print(f"gavel {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
