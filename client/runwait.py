"""The typed client's wait for an instance running healthy - what `gavel submit
--wait=running` (and ``--wait`` on a service) waits for - or, `started`, for an instance to
have run on a node at all (what `gavel logs --follow` waits for: `Client.started`).

Rules:
1. It is over once the instance runs and is healthy (which an instance without checks is
   once it runs), or has succeeded: its status. A `started` wait is over once the instance
   runs in any health, or has ended on a node (it has output there).
2. It ends without success (`Ended`, with the sentence `gavel submit` prints and the status)
   when the instance ends otherwise (failed, lost, cancelled; for a `started` wait, ended
   before any node ran it), no node will take it (unschedulable, its state or the event,
   for the nodes' reasons: not for silence, `gavel.client.jobwait` rule 5; not for a
   `started` wait: the broker asks again when a node comes or room is freed,
   `shared.auctioneer` rule 7, and a follow waits with it), or meets an error (the event: a
   pinned deployment, a broken repository).
3. It looks at the status first (what happened before it listened), then again at each of
   the instance's events, and every `poll_s` (`POLL_S` unless its caller's `Timing` says).
   A `Watch` made before the submit hears the events between the submit's answer and the
   first look: an error event leaves no trace in the status.
4. It keeps the last failing check it heard of (the status's while it is unhealthy, or an
   unhealthy event): the instance may recover, or not. Past the timeout, `TimedOut` (a
   `NoAnswer`) names it, or else the state, health and reason the status last gave.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgspec

from gavel.client.jobwait import Client, Ended, TimedOut, declined
from gavel.shared import subjects
from gavel.shared.api import InstanceStatus
from gavel.shared.messages import Event, EventType
from gavel.shared.timing import Timing
from gavel.transport.inbound import Decode, Malformed

__all__ = ["POLL_S", "Watch", "has_run", "running"]

#: How often the wait looks at the status when no event comes (rule 3).
POLL_S = Timing().follow_s
#: States an instance never leaves, but for success (rule 2).
_ENDED = ("failed", "lost", "cancelled")
_event: Decode[Event] = Decode(Event)


class Watch:
    """Subscriptions to instances' events, made before what is waited for (rule 3): hand it
    to `Client.wait`, and ``close`` it (or ``async with``) when the waits are over."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self._subs: dict[str, Any] = {}

    async def add(self, *instance_ids: str) -> Watch:
        for iid in instance_ids:
            if iid not in self._subs:
                self._subs[iid] = await self._nc.subscribe(
                    subjects.EVENTS.format(instance=iid))
        return self

    async def next(self, instance_id: str, timeout: float) -> Event | None:
        """The instance's next event within `timeout` (None: none, or garbage)."""
        await self.add(instance_id)
        try:
            msg = await self._subs[instance_id].next_msg(timeout=timeout)
        except Exception:  # nothing within timeout (or the connection went: look again)
            return None
        ev = _event(msg.data)
        return None if isinstance(ev, Malformed) else ev

    async def close(self) -> None:
        for sub in self._subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def has_run(inst: InstanceStatus) -> bool:
    """Rule 1's `started`: a node runs the instance, or it has ended on one (its output is
    there)."""
    return bool(inst.node_id) and inst.state in ("running", *_ENDED, "succeeded")


def _heard(iid: str, ev: Event, inst: InstanceStatus, started: bool) -> Ended | None:
    """Rule 2 for an event: the end it means, if it means one."""
    if (ev.type == EventType.UNSCHEDULABLE and not started
            and declined("unschedulable", ev.reason)):
        return Ended(f"{iid} is unschedulable: {ev.detail or ev.reason}",
                     msgspec.structs.replace(inst, state="unschedulable", reason=ev.reason,
                                             detail=ev.detail))
    if ev.type == EventType.ERROR:
        return Ended(f"{iid}: {ev.reason} {ev.detail}".rstrip(),
                     msgspec.structs.replace(inst, state=str(ev.type), reason=ev.reason,
                                             detail=ev.detail))
    return None


def _seen(iid: str, inst: InstanceStatus, started: bool) -> InstanceStatus | Ended | None:
    """Rules 1 and 2 for a status: the instance when the wait is over, its end, or None."""
    if (inst.state == "running" and inst.health == "healthy") or inst.state == "succeeded":
        return inst
    if started and has_run(inst):
        return inst
    if inst.state in _ENDED:
        return Ended(f"{iid} {inst.state}: " + ": ".join(
            p for p in (inst.reason, inst.detail) if p), inst)
    if declined(inst.state, inst.reason) and not started:
        return Ended(f"{iid} is unschedulable: {inst.detail or inst.reason}", inst)
    return None


async def running(client: Client, iid: str, timeout: float | None,
                  watch: Watch | None = None, *, poll_s: float = POLL_S,
                  started: bool = False) -> InstanceStatus:
    """Rules 1 to 4: the instance's status once it runs healthy (`started`: once it has
    run on a node) (`timeout` None: no limit), looked at every `poll_s` when no event comes
    (the caller's `Timing.follow_s`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    mine = watch is None
    watch = watch or await Watch(client.nc).add(iid)
    unhealthy = ""
    try:
        while True:
            inst = (await client.status(iid)).instances[0]
            match _seen(iid, inst, started):
                case InstanceStatus() as done:
                    return done
                case Ended() as ended:
                    raise ended
            if inst.health == "unhealthy" and inst.check:
                unhealthy = inst.check
            left = poll_s if deadline is None else deadline - time.monotonic()
            if left <= 0:
                now = f"unhealthy: {unhealthy}" if unhealthy else " ".join(
                    p for p in (inst.state, inst.health, inst.detail or inst.reason) if p)
                goal = "running" if started else "healthy"
                raise TimedOut(f"{iid} not {goal} within {timeout:g}s: {now}", inst)
            ev = await watch.next(iid, min(left, poll_s))
            if ev is None:
                continue
            if (end := _heard(iid, ev, inst, started)) is not None:
                raise end
            if ev.type == EventType.UNHEALTHY:
                unhealthy = f"{ev.check}: {ev.detail}" if ev.detail else ev.check
    finally:
        if mine:
            await watch.close()
