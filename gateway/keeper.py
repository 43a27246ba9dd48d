"""The gateway: keeps a Caddy's routes following every placement, move, health change and end.

Rules:
1. It is an operator client of the broker's API (``endpoints``), never a part of the broker:
   the broker stays small and on its hot path, and a Caddy that is down or slow can only
   hold up the gateway, never a placement.
2. It keeps nothing it cannot re-derive: each step asks the broker (the placements git holds,
   the health the nodes report) and derives the whole table again (`gavel.shared.routes`),
   then `caddyconfig.plan` closes the gap to what Caddy holds. A restarted gateway, or a
   restarted Caddy, comes back to the same routes: nothing stale, nothing doubled.
3. A step runs every tick, and soon after an instance event (placed, running, ended,
   healthy, ...): a burst of events makes one step, at most one per `GAP` of a tick.
4. A broker that does not answer leaves Caddy as it is (the last table stays served, and goes
   back into a Caddy that lost it); a gateway that has never heard the broker changes
   nothing, so a gateway started before its broker takes no route away.
5. A Caddy that is down or refuses a request is retried with back-off, doubling from one tick
   to `BACKOFF_MAX` ticks (events do not cut it short). Each kind of failure is logged when it
   starts, then at most once per `LOG_EVERY` ticks with a count, and once when it ends.
6. A files route with a static root is served only under one of the gateway's static roots
   (a spec may not make the gateway's host serve a directory its operator did not offer);
   one outside them is left out, and said once.
7. Stopping the gateway leaves Caddy's routes in place: traffic never waits for a gateway.
8. Upstreams come from the node book when it has one, and never lead to the cluster's own
   ports (`gavel.shared.routes` rule 8, `gateway.trust`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gavel.gateway.admin import Admin, AdminError
from gavel.gateway.caddyconfig import desired, plan
from gavel.shared import subjects
from gavel.shared.api import EndpointsReply, EndpointsRequest
from gavel.shared.nodebook import KnownNode
from gavel.shared.routes import RouteEntry, derive
from gavel.shared.timing import Timing
from gavel.transport.client import ClientError, call

__all__ = ["BACKOFF_MAX", "GAP", "LOG_EVERY", "Complaint", "Keeper", "backoff"]

log = logging.getLogger("gavel.gateway")

#: Back-off cap and logging interval, in ticks (rule 5); the least time between two steps
#: an event asks for, in ticks (rule 3); how long a step waits for the broker's endpoints,
#: in ticks (`Timing.endpoints_least_s` at least).
BACKOFF_MAX = 5.0
LOG_EVERY = 60.0
GAP = 0.25
ASK_TICKS = 5.0


def backoff(delay: float, ok: bool, tick: float) -> float:
    """The wait before the next step (rule 5): a tick after a step that worked, else twice
    the last wait, from one tick up to `BACKOFF_MAX` ticks."""
    if ok:
        return tick
    return min(max(delay, tick / 2) * 2, BACKOFF_MAX * tick)


class Complaint:
    """Rule 5 for one kind of failure: said when it starts, then once per `every_s` with a
    count, and when it ends."""

    def __init__(self, what: str, every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.every_s = every_s
        self.clock = clock
        self.errors = 0
        self._since: float | None = None
        self._said = 0.0

    def failed(self, why: str) -> None:
        now = self.clock()
        self.errors += 1
        if self._since is None:
            self._since = self._said = now
            log.warning("%s; retrying with back-off", why)
        elif now - self._said >= self.every_s:
            self._said = now
            log.warning("%s: still failing, %s in %.0f s; retrying", why,
                        _errors(self.errors), now - self._since)

    def recovered(self) -> None:
        if self._since is not None:
            log.info("%s answers again, after %s", self.what, _errors(self.errors))
        self._since = None
        self.errors = 0


class Keeper:
    """``await run()`` until `stop()`; `step()` is one derivation and reconcile."""

    def __init__(self, *, nc: Any, admin: Admin, timing: Timing, server: str = "gavel",
                 listen: Sequence[str] = (":8080",), static_roots: Sequence[str] = (),
                 book: Mapping[str, KnownNode] | None = None,
                 reserved: Collection[int] = (), files_dial: str = "") -> None:
        self.nc = nc
        self.admin = admin
        self.tick = timing.tick_s
        self.endpoints_least_s = timing.endpoints_least_s
        self.server = server
        self.listen = tuple(listen)
        self.static_roots = tuple(posixpath.normpath(r) for r in static_roots)
        self.book = book
        self.reserved = frozenset(reserved)
        #: The confined file server's upstream (`gateway.files`; "": none, so a files
        #: route of an instance's directory is left out).
        self.files_dial = files_dial
        #: The last table derived from a broker's answer (None: none yet, rule 4).
        self.table: list[RouteEntry] | None = None
        #: The routes Caddy holds since the last step that reached it.
        self.applied: list[RouteEntry] = []
        self.steps = 0
        self.writes = 0
        self.admin_errors = 0
        self.broker_errors = 0
        self._broker = Complaint("the broker", LOG_EVERY * self.tick)
        self._caddy = Complaint(f"Caddy's admin API at {admin.url}", LOG_EVERY * self.tick)
        self._refused: set[str] = set()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        sub = await self.nc.subscribe(subjects.EVENTS_ALL, cb=self._on_event)
        delay = self.tick
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                ok = await self.step()
                delay = backoff(delay, ok, self.tick)
                if not ok:  # rule 5: events do not cut a back-off short
                    await self._sleep(delay, self._stop)
                    continue
                await self._sleep(delay, self._wake, self._stop)
                rest = started + GAP * self.tick - time.monotonic()
                if rest > 0 and not self._stop.is_set():
                    await self._sleep(rest, self._stop)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @staticmethod
    async def _sleep(seconds: float, *events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _on_event(self, _msg: Any) -> None:
        self._wake.set()

    async def step(self) -> bool:
        """Derive the table from the broker's answer (or keep the last, rule 4) and make
        Caddy hold it; True when both answered."""
        self._wake.clear()
        self.steps += 1
        broker_ok = await self._derive()
        if self.table is None:
            return broker_ok
        entries = self._allowed(self.table)
        want = desired(entries, self.server, self.listen, self.files_dial)
        try:
            ops = plan(await self.admin.config(), want)
            for op in ops:
                await self.admin.send(op)
                self.writes += 1
        except AdminError as exc:
            self.admin_errors += 1
            self._caddy.failed(str(exc))
            return False
        self._caddy.recovered()
        now = [e for e in entries if e.leads_somewhere]
        for line in _changes(self.applied, now):
            log.info("%s", line)
        self.applied = now
        return broker_ok

    async def _derive(self) -> bool:
        try:
            reply = await call(self.nc, "endpoints", EndpointsRequest(), EndpointsReply,
                               timeout=max(self.endpoints_least_s, ASK_TICKS * self.tick))
        except ClientError as exc:
            self.broker_errors += 1
            self._broker.failed(f"the broker did not give the endpoints: {exc}")
            return False
        self._broker.recovered()
        self.table = derive(reply.endpoints, reply.nodes, book=self.book,
                            reserved=self.reserved)
        return True

    def root_of(self, rid: str) -> tuple[str, str] | None:
        """The directory a files route serves, split where the instance's own part starts
        (`gateway.files` rules 1 and 3): from the routes Caddy holds, read in the file
        server's thread (the list is replaced, never changed in place)."""
        for e in self.applied:
            if e.id == rid and e.root and not e.static and not e.port:
                below = posixpath.normpath(e.files)
                if below == ".":
                    return e.root, ""
                if e.root.endswith("/" + below):
                    return e.root[:-len(below) - 1], below
        return None

    def _allowed(self, table: list[RouteEntry]) -> list[RouteEntry]:
        """Rule 6."""
        out = []
        for e in table:
            if e.static and e.root and not any(
                    e.root == r or e.root.startswith(r.rstrip("/") + "/")
                    for r in self.static_roots):
                if e.id not in self._refused:
                    self._refused.add(e.id)
                    log.warning("route %s of %s serves %s, outside every static root of this "
                                "gateway (--static-root): left out", e.id, e.name, e.root)
                continue
            out.append(e)
        return out


def _errors(n: int) -> str:
    return f"{n} error" + ("" if n == 1 else "s")


def _changes(before: list[RouteEntry], after: list[RouteEntry]) -> list[str]:
    """One line for each route that came, changed where it leads, or went."""
    old = {e.id: e for e in before}
    new = {e.id: e for e in after}
    lines = []
    for rid, e in new.items():
        where = ", ".join(u.dial for u in e.upstreams) if e.port else e.root
        was = old.get(rid)
        if was is None or (was.upstreams, was.root) != (e.upstreams, e.root):
            lines.append(f"route {e.host}{e.path} of {e.name} -> {where}")
    lines += [f"route {e.host}{e.path} of {e.name} removed: nothing to lead to"
              for rid, e in old.items() if rid not in new]
    return lines
