"""The typed client's waits for the kinds of work beyond one instance: a job's end (a lone
instance, or a batch array) and a system job running on every node that could run it - what
`gavel submit --wait` waits for, for a program.

Rules:
1. A job has ended when its lone instance is in a terminal state, or its batch array has no
   task held, running or due to run again; it succeeded when every task did. An end without
   success, and a lone instance no node will take (unschedulable, `declined`: rule 5), raise
   `Ended` with the sentence `gavel submit --wait` prints. While it waits it asks for an
   array's summary alone (its tally, not its tasks: the cost of a look does not grow with
   the array); the status it returns is whole.
2. A system job is running once an instance of its version runs healthy on every node that
   could run it now (`ServiceStatus.waiting` empty); it being stopped, a node declining
   its instance (rule 5), or every node it waits for waiting at the cluster cap
   (`ServiceStatus.capped`: until an instance ends or the cap is raised, which no wait
   of a command's can tell) raises `Ended` with the cap's refusal.
3. Each event of the job is a reason to look again; it also looks every `POLL_S`; past the
   timeout, `TimedOut` (a `NoAnswer`) with the status as it stood at the last look.
4. A cluster is up once its broker counts the nodes asked for healthy: it is asked every
   `POLL_S`, a broker not answering yet (one starting) asked again.
5. An unschedulable instance is `declined` when the nodes said no. Unschedulable for
   `Reason.NO_BIDS` is not: no node answered before the bid deadline (a loaded machine, a
   busy node), and the broker asks again a heartbeat later (`shared.auctioneer` rule 7).
   Every wait of the client's goes on through it, until bids come, or the silent nodes
   stop counting as healthy (then it is unschedulable for want of nodes), or its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gavel.shared import subjects
from gavel.shared.api import (
    ArrayStatus,
    InstanceStatus,
    NodesReply,
    NodesRequest,
    ServiceReply,
    ServiceRequest,
    ServiceStatus,
    StatusReply,
    StatusRequest,
)
from gavel.shared.messages import Message
from gavel.shared.reasons import Reason
from gavel.shared.timing import Timing
from gavel.transport.client import ClientError, NoAnswer

__all__ = ["POLL_S", "Ended", "TimedOut", "declined", "healthy_nodes", "job_end",
           "system_running"]

#: How often a wait asks again, besides each event it hears (rule 3).
POLL_S = Timing().watch_s
R = TypeVar("R")
T = TypeVar("T", bound=Message)


class Client(Protocol):
    """What a wait asks of `gavel.client.Client`."""

    nc: Any

    async def status(self, instance_id: str = "") -> StatusReply: ...

    async def request(self, verb: str, request: Message, reply_type: type[T],
                      timeout: float | None = None) -> T: ...


def declined(state: str, reason: str) -> bool:
    """Rule 5: an instance in `state` for `reason` is one no node will take."""
    return state == "unschedulable" and reason != Reason.NO_BIDS


class Ended(ClientError):
    """A wait is over without what it waited for (`Client.wait`, `wait_job`,
    `wait_system`): the status says how it stands."""

    def __init__(self, message: str,
                 status: InstanceStatus | ArrayStatus | ServiceStatus) -> None:
        super().__init__(message)
        self.status = status


class TimedOut(NoAnswer):
    """A wait's time passed first (rule 3): `status` is how it stood at the last look."""

    def __init__(self, message: str, status: Any) -> None:
        super().__init__(message)
        self.status = status


async def _until(client: Client, subject_of: str, timeout: float | None, what: str,
                 look: Callable[[], Awaitable[tuple[R | None, Any]]]) -> R:
    """`look` until it answers (rule 3); it hands back its answer (None: not yet) and what
    it saw."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sub = await client.nc.subscribe(subjects.EVENTS.format(instance=subject_of))
    try:
        while True:
            got, seen = await look()
            if got is not None:
                return got
            if deadline is not None and time.monotonic() >= deadline:
                raise TimedOut(f"{subject_of} {what} within {timeout:g}s", seen)
            with contextlib.suppress(Exception):
                await sub.next_msg(timeout=POLL_S)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def job_end(client: Client, job_id: str, timeout: float | None) -> StatusReply:
    """Rule 1: the job's status once it ended, every task succeeded."""
    async def look() -> tuple[StatusReply | None, StatusReply]:
        st = await client.request("status", StatusRequest(instance_id=job_id, summary=True),
                                  StatusReply)
        if st.array is not None:
            a = st.array
            if a.ended and not a.ok:
                raise Ended(f"{job_id}: {a.outcome}", a)
            return (st if a.ended else None), st
        inst = st.instances[0]
        if declined(inst.state, inst.reason):
            raise Ended(f"{job_id} is unschedulable: {inst.detail or inst.reason}", inst)
        if inst.state in ("failed", "lost", "cancelled"):
            raise Ended(f"{job_id} {inst.state}: " + ": ".join(
                p for p in (inst.reason, inst.detail) if p), inst)
        return (st if inst.state == "succeeded" else None), st
    done = await _until(client, job_id, timeout, "did not end", look)
    return done if done.array is None else await client.status(job_id)


async def system_running(client: Client, name: str, timeout: float | None) -> ServiceStatus:
    """Rule 2: the system job's status once it runs on every node that could run it."""
    async def look() -> tuple[ServiceStatus | None, ServiceStatus]:
        st = (await client.request("service", ServiceRequest(name=name),
                                   ServiceReply)).service
        if st.stopped:
            raise Ended(f"{name} was stopped", st)
        for r in st.replicas:
            if r.version == st.version and declined(r.state, r.reason):
                raise Ended(f"{name}: {r.instance_id} is unschedulable: "
                            f"{r.detail or r.reason}", st)
        capped = [n for n in st.waiting if n in st.capped]
        if capped and len(capped) == len(st.waiting):
            raise Ended(f"{name}: {len(capped)} node(s) wait for room at the cluster cap "
                        f"({', '.join(capped)}): {st.capped[capped[0]]}", st)
        return (None if st.waiting else st), st
    return await _until(client, name, timeout, "not running on every node", look)


async def healthy_nodes(client: Client, count: int, timeout: float) -> NodesReply:
    """Rule 4: the broker's nodes once at least `count` of them are healthy."""
    deadline = time.monotonic() + timeout
    seen = NodesReply(nodes=[])
    while True:
        with contextlib.suppress(ClientError):
            seen = await client.request("nodes", NodesRequest(), NodesReply)
            if sum(1 for n in seen.nodes if n.health == "healthy") >= count:
                return seen
        if time.monotonic() >= deadline:
            raise TimedOut(f"only some of the {count} nodes came up within {timeout:g}s",
                           seen)
        await asyncio.sleep(POLL_S)
