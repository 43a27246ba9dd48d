"""`gavel exec ID -- CMD...`: a command inside a running instance, its input and output
streamed through NATS from the node that runs it (`transport.execclient`).

Rules:
1. It is `gavel.client.Client.exec`: the node comes from the status API (the instance's
   node; ``--node`` asks one directly).
   An instance that does not run is one sentence (exit 1); an unknown one exits 4.
2. This process's stdin is the command's (to its end); its stdout and stderr are printed as
   they come. With ``--tty`` the local terminal is put in raw mode for the session and put
   back after, whatever ends it.
3. The exit status is the command's own; a session the node ended early (its time limit, its
   output limit, the instance ending) prints why and exits 1; Ctrl-C hangs up (130).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import termios
import threading
import tty
from collections.abc import AsyncIterator

from gavel.cli.outcomes import Unknown
from gavel.client import BrokerRefused, Client, ClientError
from gavel.shared.execstream import TIMEOUT_MAX_S, ExecOutput
from gavel.shared.reasons import Reason

__all__ = ["run_cli"]


async def _stdin() -> AsyncIterator[bytes]:
    """This process's stdin, read on a daemon thread of its own (a terminal, a pipe or a file
    alike; a read blocked on a terminal never holds up the command's exit)."""
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)

    def reader() -> None:
        while True:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(got.put(data), loop).result()
            except Exception:  # the loop has ended
                return
            if not data:
                return
    threading.Thread(target=reader, name="gavel-exec-stdin", daemon=True).start()
    while data := await got.get():
        yield data


def _write(out: ExecOutput) -> None:
    stream = sys.stderr.buffer if out.stream == "stderr" else sys.stdout.buffer
    stream.write(out.data)
    stream.flush()


async def run_cli(args: argparse.Namespace) -> int:
    command = list(getattr(args, "argv", []))
    if not command:
        raise ClientError("give the command to run after --: gavel exec ID -- CMD ...")
    if args.timeout > TIMEOUT_MAX_S:
        raise ClientError(f"an exec session lasts at most {TIMEOUT_MAX_S:g} seconds")
    client = await Client.connect(args.nats, args.creds)
    saved = None
    try:
        await _known(client, args)
        rows = cols = 0
        if args.tty and sys.stdin.isatty():
            cols, rows = shutil.get_terminal_size()
            saved = termios.tcgetattr(0)
            tty.setraw(0)
        session = asyncio.ensure_future(client.exec(
            args.instance, command, on_output=_write, stdin=_stdin(), node_id=args.node,
            tty=args.tty, timeout_s=args.timeout, rows=rows, cols=cols))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # rule 3: hang up
            loop.add_signal_handler(sig, session.cancel)
        try:
            ended = await session
        except asyncio.CancelledError:
            return 130
    finally:
        if saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(0, termios.TCSADRAIN, saved)
        await client.close()
    if ended.reason:
        detail = f": {ended.detail}" if ended.detail else ""
        print(f"gavel exec: {ended.reason}{detail}", file=sys.stderr)
        return 1 if ended.exit_code is None else ended.exit_code
    return ended.exit_code if ended.exit_code is not None else 1


async def _known(client: Client, args: argparse.Namespace) -> None:
    """Rule 1: an unknown instance exits 4 (the client says when it is not running)."""
    if args.node:
        return
    try:
        await client.status(args.instance)
    except BrokerRefused as exc:
        if Reason.UNKNOWN_INSTANCE in str(exc):
            raise Unknown(str(exc)) from None
        raise
