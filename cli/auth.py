"""`gavel auth init`: its flags and what it prints; the keys and permissions themselves are
`gavel.transport.identity`'s."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gavel.cli.api.operators import TOKEN_SUFFIX, token_of
from gavel.cli.parsers import positive_int
from gavel.shared import subjects
from gavel.shared.errors import BadInput
from gavel.shared.nodebook import KnownNode, entry
from gavel.shared.roles import ROLES
from gavel.transport import nodebook
from gavel.transport.identity import add_operator, init

__all__ = ["add_arguments", "node_entry", "node_ids", "run_cli"]


def node_entry(text: str) -> tuple[str, KnownNode]:
    """``NAME=ADDRESS:FIRST-LAST`` (argparse ``type=``)."""
    try:
        return entry(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def node_ids(text: str) -> list[str]:
    """``a,b,c`` -> the node ids, each checked (argparse ``type=``)."""
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma list of node ids, e.g. a,b,c")
    for name in out:
        if not subjects.is_node_id(name):
            raise argparse.ArgumentTypeError(
                f"node id {name!r} must be 1-64 letters, digits, '-' or '_'")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError("node ids must be distinct")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gavel auth init`'s flags."""
    actions = parser.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    ini = actions.add_parser("init", help="make nkeys for the broker, operators and each node, "
                             "and the nats-server config that limits each to its subjects",
                             description=(
                                 "Write DIR/auth/<node>.nk (one nkey seed per node, mode "
                                 "0600), broker.nk, operator.nk and DIR/auth/nats.conf. "
                                 "Existing seeds are kept; the config lists the nodes named "
                                 "now and by earlier runs (DIR/auth/node-ids), never a stray "
                                 "seed file; delete a node's seed and run init to revoke it."))
    ini.add_argument("--state", type=Path, required=True, metavar="DIR",
                     help="state directory; the keys go to DIR/auth")
    which = ini.add_mutually_exclusive_group()
    which.add_argument("--nodes", type=positive_int, default=None, metavar="N",
                       help="nodes node-1 .. node-N (the names `gavel up` gives its workers)")
    which.add_argument("--node-ids", type=node_ids, default=None, metavar="A,B,C",
                       help="these node ids")
    ini.add_argument("--node", type=node_entry, action="append", default=[],
                     metavar="NAME=ADDRESS:FIRST-LAST[:/WORKDIR]",
                     help="a node, and where the cluster knows it to be: the address a "
                     "gateway reaches its instances at, its port range and, optionally, the "
                     "directory it keeps its instances' directories in (repeatable; "
                     "recorded in DIR/auth/nodes.json, which `gavel gateway --nodes` reads: "
                     "routes then never follow what a node advertises)")
    _operator_arguments(actions)


def _operator_arguments(actions: Any) -> None:
    """`gavel auth operator add NAME --role read|write`."""
    op = actions.add_parser("operator", help="operators of their own: one identity each, "
                            "with a role")
    verbs = op.add_subparsers(dest="operator_command", required=True, metavar="ACTION")
    add = verbs.add_parser("add", help="make (or re-role) operator NAME's identity",
                           description=(
                               "Write DIR/auth/operators/NAME.nk (kept if it exists), record "
                               "NAME's role in DIR/auth/operators.json and write "
                               "DIR/auth/nats.conf again (reload nats-server). A reader calls "
                               "only the verbs that change nothing; a writer calls every verb "
                               "and may exec. Each operator's answers come to an inbox only "
                               "it may read."))
    add.add_argument("name", metavar="NAME", help="the operator's name (letters, digits, "
                     "'-', '_')")
    add.add_argument("--role", choices=ROLES, required=True, help="what it may do")
    add.add_argument("--state", type=Path, required=True, metavar="DIR",
                     help="state directory; the keys go to DIR/auth")
    add.add_argument("--http-token", action="store_true",
                     help="also write its HTTP API bearer token, DIR/auth/operators/"
                     "NAME.token (kept if it exists): `gavel api --api-operators DIR/auth` "
                     "serves its requests as NAME")


def run_cli(args: argparse.Namespace) -> int:
    if args.auth_command == "operator":
        ids = add_operator(args.state.resolve(), args.name, args.role)
        print(f"operator {args.name} ({args.role}): --creds {ids.operators[args.name]}")
        if args.http_token:
            token_of(ids.directory, args.name)
            print(f"its HTTP API token: {ids.operators[args.name].with_suffix(TOKEN_SUFFIX)}"
                  f"   (gavel api --api-operators {ids.directory})")
        print(f"nats-server config: {ids.config}   (reload nats-server to apply it)")
        return 0
    nodes: list[str] = (args.node_ids if args.node_ids is not None
                        else [f"node-{i + 1}" for i in range(args.nodes or 0)])
    book = dict(args.node)
    nodes += [name for name in book if name not in nodes]
    ids = init(args.state.resolve(), nodes)
    if book:
        print(f"node book: {nodebook.record(ids.directory, book)}   (gavel gateway --nodes)")
    print(f"nats-server config: {ids.config}")
    print(f"  run: nats-server -c {ids.config} -js -sd {args.state.resolve() / 'nats'}")
    print(f"broker:    --creds {ids.broker}")
    print(f"operators: --creds {ids.operator}   (or GAVEL_CREDS)")
    for name, path in ids.nodes.items():
        print(f"node {name}: --creds {path}")
    return 0
