"""The broker: a thin shell that runs auctions over NATS and commits awards to git.

Rules:
1. The broker keeps nothing it cannot re-derive: pending work is "desired instances with no
   placement" read from git each tick; liveness comes from heartbeats; in-flight auctions are
   simply re-run after a restart; every promise clock restarts with the broker.
2. An award is durable in git before its winner hears of it; each node's node.json is
   mirrored to a JetStream KV entry after every commit that touches it, so workers converge
   onto the ref even when they missed the award message.
3. Every message from the wire is decoded by one typed decoder per endpoint; anything
   malformed, impersonating another node, stale or no message of gavel's at all (a
   JetStream delivery, flow control, a heartbeat) is counted, logged once per kind and peer
   a minute (`transport.rejects`), dropped; a request is answered only under its
   requester's own inbox (`transport.inbound`).
4. Workers converge onto the broker's view, not the raw tree: when the ref moved under the
   broker (a commit by hand, a merge of a push), the nodes whose node.json the state it
   read holds differently from before are mirrored again from that state - which already
   holds one placement per instance (`broker.ledger.integrity`).
5. A damaged state repository (`Damaged`) stops the broker: `run` raises it once the broker
   is closed, and the daemon prints its one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors

from gavel.broker.api import Api
from gavel.broker.assign import Assignments
from gavel.broker.auctioneer import Auctioneer
from gavel.broker.context import Context
from gavel.broker.deploys import Deploys
from gavel.broker.events import Events
from gavel.broker.integrity import Integrity
from gavel.broker.ledger.committer import Committer
from gavel.broker.ledger.repository import Damaged, Ledger
from gavel.broker.ledger.state import Change, State, compact
from gavel.broker.metrics import Metrics
from gavel.broker.mirror import Mirror
from gavel.broker.outbox import Outbox
from gavel.broker.promises import Promises
from gavel.broker.retention import Retention
from gavel.broker.services import Services
from gavel.broker.watchdog import Timers
from gavel.shared import subjects
from gavel.shared.health import Health, Liveness
from gavel.shared.messages import Heartbeat
from gavel.shared.records import NodeFile
from gavel.shared.timing import Timing
from gavel.transport import wire
from gavel.transport.inbound import Door, Guard
from gavel.transport.rejects import Rejects

__all__ = ["Broker", "NatsUnreachable", "tune_gc"]

#: How long `close` waits for each of its steps.
_CLOSE_S = 10.0


def tune_gc() -> None:
    """For a process whose main job is the broker (the daemon, the bench's broker): what is
    loaded at start is never scanned again, and young collections run every 50,000
    allocations instead of 700. A placement allocates a few hundred objects, so the default
    would collect several times per auction; collecting less often takes less broker CPU a
    placement and shortens the slowest bid rounds (docs/performance.md). Not called by the
    library: GC settings are the process owner's to choose."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


class NatsUnreachable(Exception):
    """`Broker.start` gave up on its first connection; the message says to where and why."""


class Broker:
    """The broker process's composition: builds the shared `Context` and the parts on it,
    connects, subscribes each part to its subjects, and runs the reconcile loop."""

    def __init__(
        self,
        *,
        nats_url: str,
        state_dir: Path,
        ref: str = "refs/heads/main",
        timing: Timing | None = None,
        secrets: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        batch_max: int = 256,
        sample_d: int | None = None,
        seed: int | None = None,
        max_auctions: int = 16,
        batch_wait_s: float = 0.0,
        commit_gap_s: float = 0.0,
        ended_max: int = 100_000,
        writer: str = "process",
        nats_options: Mapping[str, Any] | None = None,
        connect_wait_s: float | None = 30.0,
    ) -> None:
        self.log = logging.getLogger("gavel.broker")
        self.nats_url = nats_url
        self.timing = timing = timing or Timing()
        self.now = clock
        self.ledger = Ledger(state_dir / "state.git", ref, settle=True)
        self.committer = Committer(self.ledger, retry_s=timing.tick_s,
                                   on_commit=self._mirror, writer=writer, wall=wall,
                                   gap_s=commit_gap_s)
        self.liveness = Liveness(timing)
        self.timers = Timers(started=clock())
        self.metrics = Metrics()
        self.committer.metrics = self.metrics
        self.rejects = Rejects(self.log, self.metrics.rejected, clock)
        self.outbox = Outbox(self._publish_failed)
        self.events = Events(self.outbox)
        self.ctx = ctx = Context(timing=timing, ledger=self.ledger, committer=self.committer,
                                 liveness=self.liveness, timers=self.timers,
                                 outbox=self.outbox, events=self.events, rejects=self.rejects,
                                 metrics=self.metrics, now=clock, wake=self.wake, log=self.log)
        self.secrets = dict(secrets or {})
        self.assignments = Assignments(ctx, self.secrets)
        self.auctioneer = Auctioneer(ctx, award_for=self.assignments.award_for,
                                     batch_max=batch_max, sample_d=sample_d,
                                     max_auctions=max_auctions, batch_wait_s=batch_wait_s,
                                     rng=random.Random(seed))
        self.promises = Promises(ctx, capacity_freed=self.auctioneer.capacity_freed)
        self.retention = Retention(ctx, wall, ended_max)
        self.services = Services(ctx, self.promises, wall)
        self.deploys = Deploys(ctx, self.services, wall)
        self.integrity = Integrity(ctx)
        #: Why the broker stopped on its own, raised by `run` (rule 5).
        self.fatal: Damaged | None = None
        self.committer.on_damaged = self._damaged
        #: The state the KV mirror was last brought in line with (rule 4).
        self._mirrored: State | None = None
        #: node.json in KV for the workers, coalesced (`broker.mirror`). Its windows are
        #: timed by the event loop, so on the machine's clock, not an injected one.
        self.mirror = Mirror(self.outbox.publish_raw, timing.mirror_s, time.monotonic)
        self.api = Api(ctx, auctioneer=self.auctioneer, promises=self.promises,
                       services=self.services, deploys=self.deploys, mirror=self.mirror,
                       secrets=self.secrets, ended_max=ended_max)
        self.metrics.attach(now=clock, liveness=self.liveness, ledger=self.ledger,
                            in_flight=lambda: len(self.auctioneer.auctions),
                            mirror=self.mirror, live_state=self.api.state_of)
        self.metrics.attach_services(self.services.counts)
        self._heartbeat = Guard("heartbeat", Heartbeat, self.rejects, node=subjects.node_of,
                                door=Door(self.rejects, subjects.HEARTBEAT_ALL))
        self.nats_options = dict(nats_options or {})
        #: How long `start` keeps trying to reach NATS before it raises `NatsUnreachable`
        #: (None: for ever, as the daemon does - see `gavel.cli.daemons`).
        self.connect_wait_s = connect_wait_s
        self.deaf_since: float | None = None  # our own NATS connection is down since
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.nc: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.ledger.clear_stale_lock)  # (ledger rule 8)
            self.ledger.state()  # a damaged repository stops the broker before it connects
            self.nc = await self._connect()
        except BaseException:
            self.committer.close()
            raise
        self.outbox.nc = self.nc
        state = self._mirrored = self.ledger.state()
        now = self.now()
        for node_id in state.nodes:
            self.liveness.presume(node_id, now)
        self.timers.resume(state, self.timing)
        await self._open_kv(state.nodes)
        await self.nc.subscribe_direct(subjects.HEARTBEAT_ALL, self._on_heartbeat)
        await self.nc.subscribe_direct(subjects.BIDS_ALL, self.auctioneer.on_bids)
        await self.nc.subscribe_direct(subjects.REPORT_ALL, self.promises.on_report)
        await self.nc.subscribe(subjects.ASSIGN_ALL, cb=self.assignments.on_request)
        await self.api.start(self.nc)
        try:  # "up" means heard: an API call or a report sent from now on reaches us
            await wire.subscribed(self.nc)
        except nats.errors.Error as exc:
            self.log.warning("nats did not confirm the subscriptions (%s); carrying on", exc)
        self._tasks = [asyncio.create_task(self.outbox.run(), name="outbox"),
                       asyncio.create_task(self.committer.run(), name="committer"),
                       asyncio.create_task(self._loop(), name="reconcile")]
        self.log.info("broker up: state %s ref %s", self.ledger.path, self.ledger.ref)

    async def run(self) -> None:
        await self.start()
        await self._stopped.wait()
        await self.close()
        if self.fatal is not None:
            raise self.fatal

    def _damaged(self, exc: Damaged) -> None:
        """Rule 5: stop; `run` raises it."""
        if self.fatal is None:
            self.fatal = exc
            self.log.error("%s; the broker stops", exc)
        self.stop()

    def stop(self) -> None:
        self._stopped.set()

    async def _connect(self) -> Any:
        """The first connection, with a deadline: nats-py's own initial connect retries a
        refused credential for ever in silence when reconnects are unbounded. So each first
        attempt is a single try, and only an established connection reconnects for ever."""
        options: dict[str, Any] = {
            "name": "gavel-broker", "reconnect_time_wait": 0.5,
            # Its own requests' answers (JetStream's, its subscription barrier) under a prefix
            # of its own, which operators' `_INBOX.>` does not cover.
            "inbox_prefix": subjects.BROKER_INBOX,
            "disconnected_cb": self._on_disconnect, "reconnected_cb": self._on_reconnect,
            **self.nats_options, "allow_reconnect": False}
        deadline = None if self.connect_wait_s is None else \
            time.monotonic() + self.connect_wait_s
        while True:
            nc = wire.Client()
            try:
                await nc.connect(self.nats_url, **options)
            except Exception as exc:
                with contextlib.suppress(Exception):
                    await nc.close()
                if deadline is not None and time.monotonic() >= deadline:
                    raise NatsUnreachable(
                        f"the broker could not connect to NATS at {self.nats_url} within "
                        f"{self.connect_wait_s:g}s: {str(exc) or type(exc).__name__}") from exc
                await asyncio.sleep(0.5)
                continue
            # nats-py reads these when a connection drops: from now on, reconnect for ever.
            nc.options["allow_reconnect"] = True
            nc.options["max_reconnect_attempts"] = -1
            return nc

    async def close(self) -> None:
        """Stop every loop, send what is queued, drain; bounded, so a stuck part is logged
        rather than holding its caller for ever."""
        for t in self._tasks:
            t.cancel()
        self.api.close()  # requests waiting for a commit that will not come now
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=_CLOSE_S)
            for t in stuck:
                self.log.error("broker task %s did not stop within %gs", t.get_name(), _CLOSE_S)
        if self.nc is not None and not self.nc.is_closed:
            self.mirror.flush()  # puts still waiting for their window
            await self.outbox.drain()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_S):
                    await self.nc.drain()
            if not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.nc.close()
        self.committer.close()

    def wake(self) -> None:
        self._wake.set()

    async def _on_disconnect(self) -> None:
        if self.deaf_since is None:
            self.deaf_since = self.now()
            self.log.warning("lost NATS; node clocks pause until it is back")

    async def _on_reconnect(self) -> None:
        """A broker that could not hear must not declare nodes offline for its own outage:
        every node's silence is shifted by how long the broker was deaf."""
        if self.deaf_since is not None:
            outage = self.now() - self.deaf_since
            self.deaf_since = None
            self.liveness.shift(outage)
            self.log.warning("NATS is back after %.1fs; node clocks shifted by it", outage)

    async def _loop(self) -> None:
        watched = float("-inf")
        while True:
            now = self.now()
            try:
                self.integrity.watch()
                self._remirror()
                self.auctioneer.reconcile(now)
                if self.deaf_since is None and now - watched >= self.timing.tick_s / 2:
                    watched = now
                    self.promises.watch(now)
                    self.services.watch(now)
                    self.retention.watch()
            except Damaged as exc:
                self._damaged(exc)
                return
            except Exception:
                self.log.exception("reconcile failed; retrying next tick")
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands
            # as the event fires, and `close` would wait for this loop for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.tick_s):
                    await self._wake.wait()
            self._wake.clear()

    def _publish_failed(self, subject: str, exc: Exception) -> None:
        self.rejects.count("publish failed", f"{subject}: {exc}")  # count it, carry on

    # -- node state in KV ----------------------------------------------------------------
    async def _open_kv(self, nodes: Mapping[str, NodeFile]) -> None:
        try:
            js = self.nc.jetstream()
            await js.create_key_value(bucket=subjects.NODES_BUCKET, history=1)
        except Exception as exc:  # JetStream off: awards still flow, convergence is off
            self.log.warning("no JetStream KV (%s); workers converge from awards only", exc)
            return
        self.mirror.start(nodes)

    def _remirror(self) -> None:
        """Rule 4: after a re-read, mirror the nodes the state now holds differently."""
        state = self.ledger.state()
        before, self._mirrored = self._mirrored, state
        if before is None or before is state or not self.mirror.enabled:
            return
        nodes = before.nodes.keys() | state.nodes.keys()
        changed = {nid: compact(state.nodes.get(nid) or NodeFile(node_id=nid))
                   for nid in sorted(nodes) if before.nodes.get(nid) != state.nodes.get(nid)}
        if changed:
            self.mirror.changed(changed)

    def _mirror(self, change: Change, sha: str) -> None:
        if self.mirror.enabled and change.nodes:
            self.mirror.changed({
                nid: change.node_compact(nid, nf) if nf is not None
                else compact(NodeFile(node_id=nid)) for nid, nf in change.nodes.items()})

    # -- inbound -------------------------------------------------------------------------
    def _on_heartbeat(self, msg: wire.Received) -> None:
        hb = self._heartbeat(msg)
        if hb is None:
            return
        impossible = _impossible(hb)
        if impossible:
            self.rejects.count(impossible, msg.subject)
            return
        before = self.liveness.record(hb, self.now())
        self.promises.heartbeat_lists(hb.node_id, hb.instances)
        if hb.freed_ports:
            self.promises.ports_freed(hb.node_id, hb.freed_ports)
        if before is not Health.HEALTHY:
            self.log.info("node %s is %s", hb.node_id, "up" if before is None else "back")
            self.auctioneer.capacity_freed()


def _impossible(hb: Heartbeat) -> str:
    """Why a well-formed heartbeat cannot be true (the reject kind), or "" when it can: the
    node id must be usable as a subject token and a git path, the capacity finite and not
    negative, the port range empty or [first, last] within 1-65535."""
    if not subjects.is_node_id(hb.node_id):
        return "heartbeat from an unusable node id"
    cap = hb.capacity
    if not (math.isfinite(cap.cpu) and cap.cpu >= 0 and cap.memory_mb >= 0 and cap.ports >= 0):
        return "heartbeat with an impossible capacity"
    pr = hb.port_range
    if pr and not (len(pr) == 2 and 1 <= pr[0] <= pr[1] <= 65535):
        return "heartbeat with an impossible port range"
    return ""
