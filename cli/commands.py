"""What each client verb of `gavel` does; the parser and the dispatch live in `gavel.cli.main`.

Rules:
1. Daemons stop cleanly on SIGTERM/SIGINT; client verbs print a table, or JSON with
   ``--json``, and map outcomes to the exit codes of `EXIT_CODES`, the same for every verb
   (the README's table).
2. `submit` sends an idempotency key (``--key``, or a new uuid4 per invocation) and asks
   again with the same key, up to `SUBMIT_TRIES` times, when the broker does not answer
   within `SUBMIT_TRY_S`: a request whose answer was lost is answered again, never
   submitted twice (`broker.api` rule 4). When no try is answered, the sentence names the
   key to submit with again. While no broker answers at all (none leads: a failover), it
   asks again every `SUBMIT_PAUSE_S`, for as long as its tries would have waited.
4. A job spec's `count` is how many instances `submit` makes (ids ``ID-1`` .. ``ID-N``, a
   batch array named ``ID``: `gavel.shared.arrays`), one id a line.
5. ``--wait`` on a job waits for its end (a batch array's: every task ended or cancelled) and
   exits 0 only when all succeeded, else 3 naming how many failed and the first failure's
   reason; ``--wait=running``, and ``--wait`` on a service, waits until each instance runs
   and is healthy (`Client.wait`, its instances watched from before the submit when
   ``--id`` names them).
6. A system job (``type = "system"``) is answered with its name: its instances come and go
   with the fleet (`gavel status NAME` shows them); ``--wait`` waits until one runs healthy
   on every node that could run it (`gavel.cli.systemwait`). A periodic job (a `schedule`)
   is answered with its name at once: its runs are made at their times.
3. The reading verbs and their tables live in `gavel.cli.readouts`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from gavel.cli import plancmd, services, tunecmd
from gavel.cli.outcomes import (
    EXIT_CODES,
    Refused,
    Unknown,
    UsageError,
    refusal_code,
)
from gavel.cli.readouts import nodes, ports_cell, print_json, print_table, status, why
from gavel.cli.specfile import SpecError, load_spec
from gavel.cli.systemwait import wait_system
from gavel.client import (
    BrokerRefused,
    Client,
    ClientError,
    Ended,
    NoAnswer,
    NoBroker,
    Retries,
    TimedOut,
    Watch,
)
from gavel.client.aio import EventFeed
from gavel.shared.api import (
    INSTANCE_ID,
    InstanceStatus,
    ServiceReply,
    ServiceRequest,
    ServiceStatus,
    StatusReply,
    StatusRequest,
    SubmitReply,
    counted_id_problem,
    counted_ids,
    key_problem,
    kind_naming_problem,
)
from gavel.shared.messages import Event, Spec
from gavel.shared.routes import derive
from gavel.shared.timing import Timing
from gavel.transport import nodebook

__all__ = ["EXIT_CODES", "SUBMIT_TRIES", "SUBMIT_TRY_S", "ClientError", "Refused", "Unknown",
           "UsageError", "refusal_code", "run"]


#: How long `submit` waits for each answer, and how many times it asks (rule 2).
SUBMIT_TRY_S = Timing().answer_s
SUBMIT_TRIES = 3
#: How long `submit` waits before asking again when no broker answers at all (rule 2).
SUBMIT_PAUSE_S = Timing().failover_s


async def _until_signal(stop: Any) -> None:
    """Call `stop` on SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


async def run(args: argparse.Namespace) -> int:
    """The client verb `args.command`; its exit status."""
    match args.command:
        case "submit":
            try:
                return await submit(args)
            except Refused as exc:
                print(f"gavel submit: {exc}", file=sys.stderr)
                if args.json:  # JSON on every outcome: the instance as last seen, and why
                    seen = msgspec.to_builtins(exc.status) if exc.status is not None else {}
                    print_json({**seen, "error": f"gavel submit: {exc}", "exit_code": 3})
                return 3
        case "status":
            return await status(args)
        case "nodes":
            return await nodes(args)
        case "why":
            return await why(args)
        case "events":
            return await events(args)
        case "cancel":
            return await cancel(args)
        case "drain":
            return await drain(args)
        case "routes":
            return await routes(args)
        case "plan":
            return await plancmd.plan(args)
        case "tune":
            return await tunecmd.tune(args)
        case "deploy" | "services" | "scale" | "stop" | "rollback":
            verb = getattr(services, args.command)
            try:
                code: int = await verb(args)
            except services.Refused as exc:
                print(f"gavel {args.command}: {exc}", file=sys.stderr)
                args.error_sentence = f"gavel {args.command}: {exc}"
                return refusal_code(str(exc))
            return code
    raise UsageError(f"unknown command {args.command!r}")


async def submit(args: argparse.Namespace) -> int:
    if args.id and (len(args.id) > 128 or not re.match(INSTANCE_ID, args.id)):
        raise UsageError(f"--id {args.id!r}: expected letters, digits, '_', '-' and single "
                         "dots, starting with a letter or digit, at most 128")
    key = getattr(args, "key", "") or uuid.uuid4().hex
    if problem := key_problem(key):
        raise UsageError(f"--key: {problem}")
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    if named := kind_naming_problem(spec, args.id or ""):
        raise UsageError(named)
    count = 1 if spec.service else spec.count  # rule 4
    if problem := counted_id_problem(args.id, count):
        raise UsageError(f"--id: {problem}")
    client = await Client.connect(args.nats, args.creds)
    # Ids known before the submit are watched from before it (`gavel.client.runwait` rule 3).
    watch = await client.watch(*(counted_ids(args.id, count) if args.wait and args.id
                                 else ()))
    try:
        try:
            reply = await _submit_once(client, spec, args.id, key, count)
        except BrokerRefused as exc:  # reached, and it said no (never fits, pinned, ...)
            raise Refused(str(exc)) from None
        for w in reply.warnings:  # taken, but not quite as meant (an affinity on no label)
            print(f"gavel submit: warning: {w}", file=sys.stderr)
        ids = reply.ids()
        if spec.system and args.wait:  # rule 6
            return await wait_system(client, reply.instance_id, args)
        if spec.system or spec.schedule is not None:  # rule 6: the job's name
            print_json({"name": reply.instance_id}) if args.json else print(reply.instance_id)
            return 0
        if not args.wait:
            if args.json:
                print_json({"instance_id": ids[0]} if len(ids) == 1 else
                            {"instance_id": ids[0], "instance_ids": ids})
            else:
                print("\n".join(ids))
            return 0
        if args.wait == "end" and not spec.service:  # rule 5
            return await _wait_end(client, ids, reply.instance_id if len(ids) == 1 else
                                   ids[0].rpartition("-")[0], args)
        for iid in ids:
            await _wait_healthy(client, watch, iid, args)
        return 0
    finally:
        await watch.close()
        await client.close()


async def _submit_once(client: Client, spec: Spec, instance_id: str, key: str,
                       count: int) -> SubmitReply:
    """Rule 2: the submission through the client, asked again with its key while the broker
    does not answer; each retry said once (a failover's pause once in all), and the last
    failure naming the key to submit with again."""
    said: set[type[ClientError]] = set()

    def retrying(exc: ClientError) -> None:
        if isinstance(exc, NoBroker) and NoBroker in said:
            return
        said.add(type(exc))
        print(f"gavel submit: {exc}; asking again with the same key", file=sys.stderr)

    again = "a submission that landed is answered again, not made twice"
    try:
        return await client.submit(spec, instance_id=instance_id, count=count, key=key,
                                   on_retry=retrying,
                                   retries=Retries(try_s=SUBMIT_TRY_S, tries=SUBMIT_TRIES,
                                                   pause_s=SUBMIT_PAUSE_S))
    except NoAnswer as exc:
        raise NoAnswer(f"{exc} ({SUBMIT_TRIES} tries with key {key}); submit again with "
                       f"--key {key}: {again}") from None
    except NoBroker as exc:
        raise NoBroker(f"{exc}; submit again with --key {key}: {again}") from None


async def _wait_end(client: Client, ids: list[str], job: str,
                    args: argparse.Namespace) -> int:
    """``--wait`` on a job (rule 5): the client's wait for its end (`Client.wait_job`) - a
    lone instance in a terminal state, a batch array with no task held or running. Success
    is 0; otherwise `Refused` names how many failed and the first failure's reason."""
    limit = args.timeout or 0.0
    try:
        st = await client.wait_job(job, limit if limit > 0 else None)
    except Ended as exc:
        if isinstance(exc.status, ServiceStatus):  # a job's wait never ends on a service
            raise
        raise Refused(_failed(exc, job, len(ids)), exc.status) from None
    except TimedOut as exc:
        seen: StatusReply = exc.status
        raise Refused(f"{job} did not end within {limit:g}s: {_line(seen, job)}",
                      seen.array or seen.instances[0]) from None
    print_json(st.array or st.instances[0]) if args.json else print(_line(st, job))
    return 0


def _line(st: StatusReply, job: str) -> str:
    """How the job stands, in a line."""
    if st.array is not None:
        return f"{job}: {st.array.outcome}"
    inst = st.instances[0]
    return f"{job} {inst.state}" + (f" on {inst.node_id}" if inst.node_id else "")


def _failed(exc: Ended, job: str, count: int) -> str:
    """The sentence of a job that ended without success: a lone instance's names how many
    failed and the first failure's reason; an array's and an unschedulable instance's are
    the wait's own."""
    inst = exc.status
    if not isinstance(inst, InstanceStatus) or inst.state not in _ENDED:
        return str(exc)
    why = ": ".join(p for p in (inst.reason, inst.detail) if p)
    return f"{job} {inst.state}: 1 of {count} failed (first: {job}: {why or inst.state})"


#: States an instance never leaves: --wait gives up on them at once (succeeded is success).
_ENDED = ("failed", "lost", "cancelled")


async def _wait_healthy(client: Client, watch: Watch, iid: str,
                        args: argparse.Namespace) -> None:
    """``--wait``: the client's wait for the instance running healthy (`Client.wait`), each
    instance within ``--timeout`` (default 30 s; 0: no limit); how it ended otherwise is
    `Refused` with the wait's sentence (the last failing check, the detail of a failure)."""
    limit = 30.0 if args.timeout is None else args.timeout
    try:
        inst = await client.wait(iid, limit or None, watch=watch)
    except (Ended, TimedOut) as exc:
        seen = exc.status if isinstance(exc.status, InstanceStatus) else None
        raise Refused(str(exc), seen) from None
    if args.json:
        print_json(inst)
    else:
        print(f"{iid} {inst.health if inst.state == 'running' else inst.state} on "
              f"{inst.node_id}" + (f" (ports {ports_cell(inst.ports)})" if inst.ports else ""))


#: A following command's connection: it reconnects for ever (a NATS restart is a pause).
FOLLOWING: dict[str, Any] = {"allow_reconnect": True, "max_reconnect_attempts": -1,
                             "reconnect_time_wait": 0.5}


def _fmt_event(e: Event) -> str:
    parts = [time.strftime("%H:%M:%S", time.localtime(e.at)), e.instance_id, e.type]
    if e.node_id:
        parts.append(f"node={e.node_id}")
    if e.exit_code is not None:
        parts.append(f"exit={e.exit_code}")
    if e.reason:
        parts.append(f"reason={e.reason!r}")
    if e.restarts:
        parts.append(f"restarts={e.restarts}")
    if e.check:
        parts.append(f"check={e.check!r}")
    if e.detail:
        parts.append(e.detail)
    return " ".join(parts)


async def events(args: argparse.Namespace) -> int:
    """The events the broker keeps; with --follow, then every one stored after them, in
    order and each once, across reconnects (`transport.eventstream` rule 3). The follower
    is placed before the listing, so an event stored between the two is shown once; its
    connection reconnects for as long as it follows."""
    client = await Client.connect(args.nats, args.creds,
                                  **(FOLLOWING if args.follow else {}))
    feed: EventFeed | None = None
    try:
        if args.follow:
            feed = await client.follow_events(args.instance)
        since = time.time() - args.since if args.since else 0.0
        reply = await client.events(args.instance, limit=args.limit, since=since)
        if args.instance and not reply.events:
            await _known(client, args.instance)
        for e in reply.events:
            print(msgspec.json.encode(e).decode() if args.json else _fmt_event(e))
        if feed is None:
            return 0
        sys.stdout.flush()  # what is listed is shown before the first new event
        listed = reply.events[-64:]  # what the listing and the follower may both hold
        done = asyncio.Event()
        await _until_signal(done.set)

        async def show() -> None:
            async for e in feed:
                if e in listed:
                    continue
                print(msgspec.json.encode(e).decode() if args.json else _fmt_event(e),
                      flush=True)  # BrokenPipeError: the reader went (main rule 3)

        shown = asyncio.create_task(show())
        ended = asyncio.create_task(done.wait())
        await asyncio.wait({shown, ended}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if shown.done():
            shown.result()
        else:
            shown.cancel()
        return 0
    finally:
        if feed is not None:
            await feed.aclose()
        await client.close()


async def _known(client: Client, name: str) -> None:
    """`Unknown` unless `name` is an instance or a service the broker knows (an `events`
    without any is then an answer, not a typo)."""
    for verb, request, reply in (("status", StatusRequest(instance_id=name), StatusReply),
                                 ("service", ServiceRequest(name=name), ServiceReply)):
        try:
            await client.request(verb, request, reply)
            return
        except BrokerRefused as exc:
            if refusal_code(str(exc)) != 4:
                raise
    raise Unknown(f"no instance or service named {name}")


async def cancel(args: argparse.Namespace) -> int:
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.cancel(args.instance)
    print_json(reply) if args.json else print(f"{reply.instance_id}: {reply.state}")
    return 0


async def drain(args: argparse.Namespace) -> int:
    if args.undo and (args.migrate or args.deadline):
        raise UsageError("--undo cannot be combined with --migrate or --deadline")
    if args.migrate and args.deadline:
        raise UsageError("--migrate moves the instances now, --deadline later: give one")
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.drain(args.node, undo=args.undo, migrate=args.migrate,
                                   deadline_s=args.deadline or 0.0)
    if args.json:
        print_json(reply)
    else:
        what = "draining" if reply.draining else "back in service"
        extra = f"; moving {reply.migrating} instances one by one" if reply.migrating else ""
        if reply.deadline:
            at = time.strftime("%H:%M:%S", time.localtime(reply.deadline))
            extra += f"; what still runs there at {at} is moved"
        print(f"{reply.node_id}: {what}{extra}")
    return 0


async def routes(args: argparse.Namespace) -> int:
    """The route table a gateway derives from the broker's endpoints, derived here the same
    way (`gavel.shared.routes`, with the gateway's node book when given): what is routed
    where, and what leads nowhere now."""
    book = nodebook.load(Path(args.nodes)) if getattr(args, "nodes", "") else None
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.endpoints()
    table = derive(reply.endpoints, reply.nodes, book=book)
    if args.json:
        print_json(table)
        return 0
    if not table:
        print("no live instance declares a route")
        return 0
    rows = [("NAME", "MATCH", "TARGET", "LEADS TO", "REPLICAS")]
    for e in table:
        if e.port:
            target = f"port {e.port}"
            leads = ", ".join(u.dial for u in e.upstreams)
            serving = len(e.upstreams)
        else:
            target = f"files {e.files}"
            leads, serving = e.root, int(bool(e.root))
        if e.strip_prefix:
            target += " (prefix stripped)"
        leads = leads or "nothing (no healthy running replica)"
        if e.shadowed_by:
            leads += f" (shadowed by {e.shadowed_by})"
        rows.append((e.name, f"{e.host}{e.path}", target, leads, f"{serving}/{e.replicas}"))
    print_table(rows)
    return 0


