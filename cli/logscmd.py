"""`gavel logs ID`: an instance's output, read from its node (`transport.logclient`).

Rules:
1. Where to ask comes from the status API: the instance's node; for a name that is no
   instance, the service's current replicas - those that have not ended - or with
   ``--history`` every replica it still has a record of (each line then prefixed with its
   instance id); ``--node`` asks one node directly (an ended instance whose record left the
   state tree keeps its logs on the node until the node's retention removes them).
2. One stream is written to stdout as the instance wrote it; with ``--all`` the instance's
   stdout goes to stdout and its stderr to stderr. ``--json`` writes one object per line
   instead: instance, stream, line. Several instances' lines are merged in the order they
   were written (to the node's tick: `LogChunk.at`); a follow prints them as they come.
3. ``--follow`` ends when every instance asked has ended (exit 0), or at Ctrl-C (exit 0).
   A node that does not answer is one sentence naming it (exit 1). A follow of instances
   no node has run yet (queued, unschedulable, placed, ...) waits until they run
   (`Client.started`: an unschedulable instance is asked for again when a node comes or
   room is freed), saying once on stderr what it waits for; one that ends before it runs is
   its sentence (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import BinaryIO

from gavel.cli.commands import Unknown
from gavel.client import BrokerRefused, Client, ClientError
from gavel.client.runwait import has_run
from gavel.shared.api import InstanceStatus
from gavel.shared.logstream import LogChunk, LogsDone
from gavel.shared.reasons import Reason

__all__ = ["run"]

#: The states of a replica that is no longer current (rule 1).
_ENDED = frozenset({"succeeded", "failed", "lost", "cancelled"})


async def _targets(client: Client, args: argparse.Namespace) -> list[tuple[str, str]]:
    """Rule 1: (instance, node) to ask."""
    if args.node:
        return [(args.instance, args.node)]
    try:
        reply = await client.status(args.instance)
        found: list[InstanceStatus] = reply.instances
    except BrokerRefused as exc:
        if Reason.UNKNOWN_INSTANCE not in str(exc):
            raise
        everything = await client.status()
        found = [i for i in everything.instances if i.service == args.instance]
        if not found:
            raise Unknown(f"no instance or service named {args.instance} (give --node "
                          "NODE for an instance whose record is gone)") from None
        current = [i for i in found if i.state not in _ENDED]
        if not args.history:
            if not current:
                raise ClientError(f"service {args.instance} has no current replica "
                                  "(--history: the replicas it had)") from None
            found = current
    if args.follow and not any(has_run(i) for i in found):
        waiting = [i for i in found if i.state not in _ENDED]
        if waiting:
            first = waiting[0]
            why = ": ".join(p for p in (first.state, first.detail or first.reason) if p)
            print(f"gavel logs: waiting for {', '.join(i.instance_id for i in waiting)} to run "
                  f"({why})", file=sys.stderr)
            found = [await client.started(i.instance_id) for i in waiting]
    placed = [(i.instance_id, i.node_id) for i in found if i.node_id]
    if not placed:
        i = found[0]
        raise ClientError(f"{i.instance_id} has not run on a node yet ({i.state}): it has "
                          "no output")
    return placed


class _Printer:
    """Rule 2: where each chunk goes, whole lines only when lines are prefixed."""

    def __init__(self, args: argparse.Namespace, prefixed: bool, merge: bool = False) -> None:
        self.json = bool(args.json)
        self.prefixed = prefixed
        self.both = len(args.streams) > 1
        self._rest: dict[tuple[str, str], tuple[bytes, float]] = {}
        #: Rule 2's merge: (written by, arrival, instance, stream, lines) until `finish`.
        self._held: list[tuple[float, int, str, str, list[bytes]]] | None = \
            [] if merge else None

    def _out(self, stream: str) -> BinaryIO:
        return sys.stderr.buffer if self.both and stream == "stderr" else sys.stdout.buffer

    def chunk(self, c: LogChunk) -> None:
        if not (self.json or self.prefixed):
            out = self._out(c.stream)
            out.write(c.data)
            out.flush()
            return
        key = (c.instance_id, c.stream)
        *lines, rest = (self._rest.pop(key, (b"", 0.0))[0] + c.data).split(b"\n")
        if rest:
            self._rest[key] = (rest, c.at)
        self._emit(c.instance_id, c.stream, lines, c.at)

    def flush(self, instance_id: str) -> None:
        for key in [k for k in self._rest if k[0] == instance_id]:
            rest, at = self._rest.pop(key)
            self._emit(key[0], key[1], [rest], at)

    def _emit(self, iid: str, stream: str, lines: list[bytes], at: float) -> None:
        if self._held is None:
            self._write(iid, stream, lines)
        elif lines:  # 0: after the node's last mark, so newer than every mark
            self._held.append((at or float("inf"), len(self._held), iid, stream, lines))

    def finish(self) -> None:
        """Rule 2: the merged lines, oldest first (each instance's in its own order)."""
        held, self._held = self._held or [], None
        for _, _, iid, stream, lines in sorted(held, key=lambda h: (h[0], h[1])):
            self._write(iid, stream, lines)

    def _write(self, iid: str, stream: str, lines: list[bytes]) -> None:
        if not lines:
            return
        out = self._out(stream)
        if self.json:
            text = "".join(json.dumps({"instance_id": iid, "stream": stream,
                                       "line": ln.decode(errors="replace")}) + "\n"
                           for ln in lines)
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        out.write(b"".join(b"[" + iid.encode() + b"] " + ln + b"\n" for ln in lines))
        out.flush()


async def run(args: argparse.Namespace) -> int:
    client = await Client.connect(args.nats, args.creds)
    try:
        targets = await _targets(client, args)
        printer = _Printer(args, prefixed=len(targets) > 1,
                           merge=len(targets) > 1 and not args.follow)
        since = time.time() - args.since if args.since else 0.0

        async def one(iid: str, node: str) -> LogsDone:
            try:
                async for got in client.logs(iid, node_id=node, streams=args.streams,
                                             tail=-1 if args.tail is None else args.tail,
                                             since=since, follow=args.follow):
                    if isinstance(got, LogsDone):
                        return got
                    printer.chunk(got)
                raise ClientError(f"node {node} ended the logs of {iid} without saying so")
            except BrokerRefused as exc:  # the node has no output of it: no answer (exit 1)
                raise ClientError(str(exc)) from None
            finally:
                printer.flush(iid)

        work = asyncio.gather(*(one(iid, node) for iid, node in targets))
        if args.follow:  # rule 3: Ctrl-C ends a follow quietly
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, work.cancel)
        try:
            dones = await work
        except asyncio.CancelledError:
            return 0
        except ClientError:  # one node did not answer: what the others said still shows
            printer.finish()
            raise
        printer.finish()
        lost = sum(d.skipped for d in dones)
        if lost:
            print(f"gavel logs: {lost} bytes were rotated away before they could be read",
                  file=sys.stderr)
        return 0
    finally:
        await client.close()
