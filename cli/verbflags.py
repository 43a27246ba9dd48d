"""The client verbs' flags, apart from the verbs: the command line is built whole for every
verb, and a daemon's (`gavel worker` above all, idle on every node) then loads none of the
client, its readouts or the HTTP servers. Each verb's module does what its flags ask."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gavel.cli.parsers import at_most, duration, non_negative_float, positive_int, whole
from gavel.shared import subjects
from gavel.shared.errors import BadInput
from gavel.shared.nodebook import KnownNode, entry
from gavel.shared.roles import ROLES
from gavel.shared.tuning import AUCTIONS_MOST, BATCH_MOST, GAP_MS_MOST

__all__ = ["auth_arguments", "exec_arguments", "logs_arguments", "node_entry", "node_ids",
           "plan_arguments", "split_exec", "tune_arguments"]


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


def auth_arguments(parser: argparse.ArgumentParser) -> None:
    """`gavel auth`'s actions and their flags (`auth`)."""
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


def logs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instance", help="instance id, or a service's name (every replica)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new output until the instance ends (or Ctrl-C)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stderr", dest="streams", action="store_const", const=["stderr"],
                       help="the instance's stderr instead of its stdout")
    which.add_argument("--all", dest="streams", action="store_const",
                       const=["stdout", "stderr"],
                       help="both: its stdout to stdout, its stderr to stderr")
    p.set_defaults(streams=["stdout"])
    p.add_argument("--tail", type=whole, default=None, metavar="N",
                   help="only the last N lines (of each stream)")
    p.add_argument("--since", type=duration, default=None, metavar="DURATION",
                   help="only output of the last DURATION (30s, 5m, 1h30m), to the second")
    p.add_argument("--node", default="", metavar="NODE",
                   help="ask this node directly, without the status API")
    p.add_argument("--history", action="store_true",
                   help="a service's every replica it has a record of, ended ones too "
                   "(default: its current replicas)")


def split_exec(argv: list[str]) -> tuple[list[str], list[str]]:
    """``exec ... -- CMD ...`` as (what argparse reads, the command): everything after the
    first ``--`` is the command's, options like its ``-c`` included."""
    verb = next((a for a in argv if not a.startswith("-")), "")
    if verb != "exec" or "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def exec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("instance", help="the instance to run the command in")
    p.usage = "gavel exec [options] INSTANCE -- CMD [ARG ...]"
    p.add_argument("--tty", "-t", action="store_true",
                   help="give the command a terminal (an interactive shell)")
    p.add_argument("--timeout", type=duration, default=0.0, metavar="DURATION",
                   help="end the session after DURATION (default: the node's, one hour)")
    p.add_argument("--node", default="", metavar="NODE",
                   help="ask this node directly, without the status API")


def tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-max", type=at_most(positive_int, BATCH_MOST), default=None,
                   metavar="N", help=f"pin the requests a round carries (1 to {BATCH_MOST})")
    p.add_argument("--max-auctions", type=at_most(positive_int, AUCTIONS_MOST), default=None,
                   metavar="N", help=f"pin the rounds in flight (1 to {AUCTIONS_MOST})")
    p.add_argument("--commit-gap-ms", type=at_most(non_negative_float, GAP_MS_MOST),
                   default=None, metavar="MS",
                   help=f"pin the least time between commits (0 to {GAP_MS_MOST:g} ms)")
    p.add_argument("--auto", action="store_true",
                   help="tune every value again, as a broker started without them does")


def plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="a job or service spec file (TOML or JSON)")
