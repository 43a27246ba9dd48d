"""`gavel auth`: what it does and prints (its flags: `verbflags`); the keys and permissions
themselves are `gavel.transport.identity`'s."""

from __future__ import annotations

import argparse

from gavel.cli.api.operators import TOKEN_SUFFIX, token_of
from gavel.transport import nodebook
from gavel.transport.identity import add_operator, init

__all__ = ["run_cli"]


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
