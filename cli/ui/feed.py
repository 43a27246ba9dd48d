"""The dashboard's view of the cluster: one operator connection, asked and listened to.

Rules:
1. The dashboard is an operator client like the CLI: it asks the broker's API (`nodes`,
   `status`, `services`, `events`) through the Python client (`gavel.client`, as any
   program asks it) and follows the events the broker stores (``Client.follow_events``:
   none missed or shown twice across a reconnect). It never reads git, and speaks to a
   node only to ask for an instance's lines, through `gavel logs`' API (`ui.logs`).
2. The overview is asked again every `REFRESH_S` (heartbeats change loads without an
   event), and `SETTLE_S` after an event (it changed a state): a burst of events is one
   refresh. Each page is pushed the overview after every refresh, and every event as it is
   heard.
3. A page that cannot keep up (its queue of `QUEUE_MAX` frames is full) is dropped, never
   waited for: its browser reconnects and starts again from the overview.
4. A broker that does not serve the service verbs (no responder on the verb's subject, or
   an answer that the verb is unknown) has no services: the overview says None (views
   rule 3). Any other refusal is shown as it was said.
5. A broker that does not answer leaves the last overview standing, with the sentence why.
6. Batch arrays are tallied by the broker (`status` of the array's id, its summary alone),
   each array the instances name, up to `views.ARRAYS_SHOWN` of them (views rule 6).
7. Instances come as the broker's summary (`StatusRequest.summary`): counts of every
   instance and a bounded list, one answer however many there are; only a broker without
   the summary is read page by page.
8. Its refreshing and its following are tasks of the feed's own owner (`transport.tasks`): a
   crash is logged as it happens, and `close` ends and awaits both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgspec
from nats.errors import NoRespondersError

from gavel.cli.ui import usage, views
from gavel.client import BrokerRefused, Client, ClientError
from gavel.client.aio import EventFeed
from gavel.shared.api import (
    ArrayStatus,
    InstanceStatus,
    NodeStatus,
    PeriodicStatus,
    ServiceStatus,
    StatusReply,
    StatusRequest,
)
from gavel.shared.timing import Timing
from gavel.transport.tasks import Tasks

__all__ = ["EVENTS_KEPT", "QUEUE_MAX", "REFRESH_S", "SETTLE_S", "Feed", "Page"]

log = logging.getLogger("gavel.ui")
#: The dashboard's clocks: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()

#: Rule 2.
REFRESH_S = _TIMING.refresh_s
#: How long a closing feed waits for a cancelled task before cancelling it again.
CLOSE_RETRY_S = 0.1
SETTLE_S = _TIMING.settle_s
#: Events a page is shown when it opens.
EVENTS_KEPT = 200
#: Rule 3.
QUEUE_MAX = 512
#: How long one API call may take before the overview says the broker did not answer (the
#: dashboard's client's timeout).
CALL_S = _TIMING.glance_s

_json = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _json.encode(obj)


class Page:
    """One open event stream: the frames waiting for it (rule 3)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(QUEUE_MAX)
        self.dropped = False

    def put(self, event: str, data: bytes) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait((event, data))
        except asyncio.QueueFull:
            self.dropped = True
            # Wake the stream so it notices it was dropped and ends.
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.queue.put_nowait(("dropped", b"{}"))


def unknown_verb(exc: ClientError) -> bool:
    """Rule 4: the broker does not serve the verb it was asked."""
    if isinstance(exc.__context__, NoRespondersError):  # `call` says so in a sentence
        return True
    text = str(exc).lower()
    return isinstance(exc, BrokerRefused) and "unknown" in text and (
        "verb" in text or "request" in text)


class Feed:
    def __init__(self, client: Client, *, refresh_s: float = REFRESH_S) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self.events: deque[bytes] = deque(maxlen=EVENTS_KEPT)
        self.overview = encode(views.overview(nodes=[], instances=[], services=None,
                                              error="asking the broker ..."))
        self.pages: set[Page] = set()
        self._nodes: list[NodeStatus] = []
        self._instances: list[InstanceStatus] = []
        #: The summary's counts of every instance (None: `_instances` is every instance).
        self._counts: dict[str, int] | None = None
        self._total: int | None = None
        self._services: list[ServiceStatus] | None = None
        self._periodic: list[PeriodicStatus] = []
        self._arrays: list[ArrayStatus] = []
        self._changed = asyncio.Event()
        self._tasks = Tasks("the dashboard's feed", log)  # rule 8
        self._sub: EventFeed | None = None
        #: Each running instance's measured usage over the last minutes (`ui.usage`).
        self.usage = usage.History()

    async def start(self) -> None:
        self._sub = await self.client.follow_events()
        listed: set[bytes] = set()
        try:
            recent = await self.client.events(limit=EVENTS_KEPT)
            self.events.clear()
            self.events.extend(encode(views.event(e)) for e in recent.events)
            listed = set(self.events)
        except ClientError:
            pass  # the broker is not up yet: events come as they happen
        await self.refresh()
        self._tasks.spawn(self._run(), name="refresh")
        self._tasks.spawn(self._follow(self._sub, listed), name="follow")

    async def _follow(self, feed: EventFeed, listed: set[bytes]) -> None:
        """Rule 1: every event stored after the follower was placed, once, in order, across
        reconnects (`Client.follow_events`); those the listing already showed are not
        shown again."""
        async for event in feed:
            data = encode(views.event(event))
            if data in listed:
                listed.discard(data)
                continue
            self._heard(data)

    async def close(self) -> None:
        """Rule 8. Each task is cancelled again until it ends: on 3.11 a cancel that lands as
        a request's answer arrives is swallowed by the NATS client's wait_for, and the
        follower asks for the next event as if nothing happened."""
        while running := self._tasks.running:
            self._tasks.cancel()
            await asyncio.wait(running, timeout=CLOSE_RETRY_S)
        if self._sub is not None:
            await self._sub.aclose()

    def open_page(self) -> Page:
        page = Page()
        self.pages.add(page)
        return page

    def close_page(self, page: Page) -> None:
        self.pages.discard(page)

    def _push(self, event: str, data: bytes) -> None:
        for page in list(self.pages):
            page.put(event, data)
            if page.dropped:
                self.pages.discard(page)

    def _heard(self, data: bytes) -> None:
        self.events.append(data)
        self._push("event", data)
        self._changed.set()

    async def _run(self) -> None:
        """Rule 2."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.refresh_s):
                    await self._changed.wait()
            await asyncio.sleep(SETTLE_S)
            self._changed.clear()
            try:
                await self.refresh()
            except Exception:  # one failed refresh must not end the dashboard's updates
                log.exception("the dashboard could not refresh its overview")

    async def _tallies(self) -> list[ArrayStatus]:
        """Rule 6: each shown array's tally, as `gavel status ARRAY` has it."""
        out = []
        for array in views.arrays_shown(self._instances):
            try:
                got = await self.client.request(
                    "status", StatusRequest(instance_id=array, summary=True), StatusReply)
            except BrokerRefused:  # its records were forgotten since the listing
                continue
            if got.array is not None:
                out.append(got.array)
        return out

    async def refresh(self) -> None:
        """Ask the broker again; push the overview to every page."""
        error = services_error = ""
        try:
            nodes = await self.client.nodes()
            status = await self.client.request("status", StatusRequest(summary=True),
                                               StatusReply)  # rule 7
            if status.total and not status.counts:  # a broker without the summary
                status = await self.client.status()
            self._nodes, self._instances = nodes.nodes, status.instances
            self._counts = status.counts or None
            self._total = status.total if status.counts else None
            self.usage.record(time.time(), status.instances)
            try:
                services = await self.client.services()
                self._services = services.services
            except ClientError as exc:  # rule 4
                if unknown_verb(exc):
                    self._services = None
                else:
                    services_error = str(exc)
            try:  # periodic jobs: a broker without the verb has none to show (rule 4)
                self._periodic = (await self.client.periodic_jobs()).jobs
            except ClientError:
                self._periodic = []
            self._arrays = await self._tallies()
        except ClientError as exc:  # rule 5
            error = str(exc)
        data = encode(views.overview(nodes=self._nodes, instances=self._instances,
                                     counts=self._counts, total=self._total,
                                     services=self._services, periodic=self._periodic,
                                     arrays=self._arrays,
                                     error=error,
                                     services_error=services_error, at=time.time()))
        self.overview = data
        self._push("overview", data)
