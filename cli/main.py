"""The `gavel` command line: the embedded default (`up`), the daemons, and the client verbs.

Rules:
1. Every verb exits with a status of `outcomes.EXIT_CODES` (the README's table) and one
   sentence naming the problem: bad flags, bad spec files, a NATS URL that is not one or
   where nothing answers exit 2; a broker (or node) that cannot be reached exits 1; a
   broker's no exits 3, and its "no such instance, service or node" 4. No traceback reaches
   a user.
2. With ``--json`` every exit that is not a success also prints one JSON object on stdout,
   ``{"error": SENTENCE, "exit_code": N}``, so a script reads JSON whatever happened.
3. A reader that goes away (``gavel logs ID | head``) ends the command quietly, as it ends a
   Unix tool: no traceback, exit 141 (128 + SIGPIPE, what a shell reports for a tool the
   signal ended). The signal itself stays ignored: a NATS socket closing under a command
   must be a sentence, not a silent death.
4. A verb's module is imported where the verb runs, never for the command line itself
   (`cmdline`): a daemon, `gavel worker` idle on every node above all, loads none of the
   client verbs, the HTTP API or the dashboard.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gavel.cli import completion, daemons, logs
from gavel.cli.cmdline import DAEMONS, Parser, build_parser, print_error_json, wait_modes
from gavel.cli.outcomes import Unknown, refusal_code
from gavel.cli.verbflags import split_exec
from gavel.shared.errors import BadInput
from gavel.transport import eventloop
from gavel.transport.client import BrokerRefused, ClientError

__all__ = ["build_parser", "main"]


def _env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    value = os.environ.get(name, "")
    return value if value in choices else default


async def _dispatch(args: argparse.Namespace) -> int:
    """Rule 4: each verb's module, imported here."""
    match args.command:
        case "broker":
            return await daemons.run_broker(args)
        case "worker":
            from gavel.cli.workerdaemon import run_worker

            return await run_worker(args)
        case "gateway":
            from gavel.cli.gatewaydaemon import run_gateway

            return await run_gateway(args)
        case "up":
            from gavel.cli.up import up

            return await up(args)
        case "ui":
            from gavel.cli.ui import app as ui_app

            return await ui_app.run(args)
        case "api":
            from gavel.cli.api import app as api_app

            return await api_app.run(args)
        case "logs":
            from gavel.cli import logscmd

            return await logscmd.run(args)
        case "exec":
            from gavel.cli import execcmd

            return await execcmd.run_cli(args)
    from gavel.cli import commands

    return await commands.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = wait_modes(list(sys.argv[1:] if argv is None else argv))
    Parser.json_errors = "--json" in argv
    parser = build_parser()
    argv, command = split_exec(argv)
    args = parser.parse_args(argv)
    if args.command == "exec":
        args.argv = command
    try:
        code = _main(parser, args)
        sentence = getattr(args, "error_sentence", "")
        if code and sentence and getattr(args, "json", False):  # rule 2
            print_error_json(sentence, code)
        # Rule 3: what is still buffered (a pipe's stdout is) goes now, where a reader
        # gone is heard, not in the interpreter's last flush, which complains and exits 120.
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    return code


#: Rule 3's exit status.
READER_GONE = 128 + 13


def _reader_gone() -> int:
    """Rule 3: stdout points at nothing from now on (the interpreter's last flush would
    fail again and print its own complaint), and the status a shell knows."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout that is no file: nothing to flush into a pipe
        pass
    return READER_GONE


def _fail(args: argparse.Namespace, sentence: str, code: int) -> int:
    """Print `sentence` for the operator (and keep it for rule 2's object); `code`."""
    print(f"gavel {args.command}: {sentence}", file=sys.stderr)
    args.error_sentence = f"gavel {args.command}: {sentence}"
    return code


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command not in DAEMONS:  # the daemons configure logs from settings
        logs.configure(getattr(args, "log_format", None)
                       or _env_choice("GAVEL_LOG_FORMAT", ("text", "json"), "text"),
                       _env_choice("GAVEL_LOG_LEVEL", ("DEBUG", "INFO", "WARNING", "ERROR"),
                                   "INFO"))
    try:
        if args.command == "completion":
            print(completion.script(parser, args.shell), end="")
            return 0
        if args.command == "sim":
            from gavel.cli import sim as sim_cli

            return sim_cli.run(args)
        if args.command == "bench":
            from gavel.cli import bench as bench_cli

            return bench_cli.run_cli(args)
        if args.command == "config":
            return daemons.config_check(args)
        if args.command == "auth":
            from gavel.cli import auth

            return auth.run_cli(args)
        if args.command in DAEMONS:
            args.settings = daemons.settings(args)
            if args.check:
                return daemons.check(args)
        try:
            eventloop.choose(os.environ)
        except ValueError as exc:
            return _fail(args, str(exc), 2)
        return eventloop.run(_dispatch(args))
    except BadInput as exc:
        return _fail(args, str(exc), 2)
    except BrokerRefused as exc:
        return _fail(args, str(exc), refusal_code(str(exc)))
    except Unknown as exc:
        return _fail(args, str(exc), 4)
    except (ClientError, daemons.Stopped) as exc:
        return _fail(args, str(exc), 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
