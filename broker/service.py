"""The broker: a thin shell that runs auctions over NATS and commits awards to git.

Rules:
1. The broker keeps nothing it cannot re-derive: pending work is "desired instances with no
   placement" read from git each tick; liveness comes from heartbeats; in-flight auctions are
   simply re-run after a restart; every promise clock restarts with the broker.
2. An award is durable in git before its winner hears of it; each node's node.json is
   mirrored to a JetStream KV entry after every commit that touches it, so workers converge
   onto the ref even when they missed the award message.
3. Every message from the wire is decoded by one typed decoder per endpoint; anything
   malformed, impersonating another node or stale is counted, logged once per kind, dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import nats.errors
from nats.aio.msg import Msg

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.ledger.committer import Committer
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, compact
from gavel.broker.metrics import Metrics
from gavel.broker.mirror import Mirror
from gavel.broker.promises import Promises
from gavel.broker.retention import Retention
from gavel.broker.watchdog import Timers
from gavel.shared import subjects
from gavel.shared.health import Health, Liveness
from gavel.shared.messages import ApiError, AssignmentRequest, Award, Event, EventType, Heartbeat
from gavel.shared.records import NodeFile
from gavel.shared.timing import Timing
from gavel.transport import wire
from gavel.transport.rejects import Rejects

if TYPE_CHECKING:
    from gavel.broker.api import Api

__all__ = ["Broker", "NatsUnreachable", "tune_gc"]

_hb_dec = msgspec.msgpack.Decoder(Heartbeat)
_assign_dec = msgspec.msgpack.Decoder(AssignmentRequest)
_enc = msgspec.msgpack.Encoder()
#: How long `close` waits for each of its steps.
_CLOSE_S = 10.0


def tune_gc() -> None:
    """For a process whose main job is the broker (the daemon, the bench's broker): what is
    loaded at start is never scanned again, and young collections run every 50,000
    allocations instead of 700. A placement allocates a few hundred objects, so the default
    collected several times per auction; measured: broker CPU per placement -10%, bid-round
    p99 lower. Not called by the library: GC settings are the process owner's to choose."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


class NatsUnreachable(Exception):
    """`Broker.start` gave up on its first connection; the message says to where and why."""


class Broker:
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
        self.timing = timing or Timing()
        self.ledger = Ledger(state_dir / "state.git", ref)
        self.committer = Committer(self.ledger, retry_s=self.timing.tick_s,
                                   on_commit=self._mirror, writer=writer, wall=wall,
                                   gap_s=commit_gap_s)
        self.liveness = Liveness(self.timing)
        self.secrets = dict(secrets or {})
        self.now = clock
        self.timers = Timers(started=clock())
        self.batch_max = batch_max
        #: Sampling: ask d nodes per request instead of everyone (None: full broadcast).
        self.sample_d = sample_d
        #: Auctions in flight at once (pipelining with a bound, so a backlog of 100,000
        #: submissions does not become 400 simultaneous broadcasts).
        self.max_auctions = max_auctions
        #: How long waiting work may wait for a fuller batch (`broker.auctioneer` rule 4).
        self.batch_wait_s = batch_wait_s
        #: Ended instance records kept in the tree at most, newest first (0: no cap).
        self.ended_max = ended_max
        self.rng = random.Random(seed)
        self.nats_options = dict(nats_options or {})
        #: How long `start` keeps trying to reach NATS before it raises `NatsUnreachable`
        #: (None: for ever, as the daemon does - see `broker.daemons`).
        self.connect_wait_s = connect_wait_s
        self.metrics = Metrics()
        self.rejects = Rejects(self.log, self.metrics.rejected)
        self.auctioneer = Auctioneer(self)
        self.promises = Promises(self)
        self.retention = Retention(self, wall)
        self.metrics.attach(self)
        self.committer.metrics = self.metrics
        self.pinned_reported: set[str] = set()
        self.events: deque[Event] = deque(maxlen=2000)
        self.round_times: deque[float] = deque(maxlen=10_000)
        self.deaf_since: float | None = None  # our own NATS connection is down since
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.api: Api | None = None
        #: node.json in KV for the workers, coalesced (`broker.mirror`). Its windows are
        #: timed by the event loop, so on the machine's clock, not an injected one.
        self.mirror = Mirror(self.publish_raw, self.timing.mirror_s, time.monotonic)
        self._outbox: list[tuple[str, bytes]] = []
        self._outbox_ready = asyncio.Event()
        #: The sender is handing a batch over the slow way (`flush` waits for it).
        self._sending = False
        self.nc: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        from gavel.broker.api import Api

        try:
            self.nc = await self._connect()
        except BaseException:
            self.committer.close()
            raise
        state = self.ledger.state()
        now = self.now()
        for node_id in state.nodes:
            self.liveness.presume(node_id, now)
        self.timers.resume(state, self.timing)
        await self._open_kv(state.nodes)
        await self.nc.subscribe_direct(subjects.HEARTBEAT_ALL, self._on_heartbeat)
        await self.nc.subscribe_direct(subjects.BIDS_ALL, self.auctioneer.on_bids)
        await self.nc.subscribe_direct(subjects.REPORT_ALL, self.promises.on_report)
        await self.nc.subscribe(subjects.ASSIGN_ALL, cb=self._on_assign)
        self.api = Api(self)
        await self.api.start(self.nc)
        try:  # "up" means heard: an API call or a report sent from now on reaches us
            await wire.subscribed(self.nc)
        except nats.errors.Error as exc:
            self.log.warning("nats did not confirm the subscriptions (%s); carrying on", exc)
        self._tasks = [asyncio.create_task(self._send(), name="outbox"),
                       asyncio.create_task(self.committer.run(), name="committer"),
                       asyncio.create_task(self._loop(), name="reconcile")]
        self.log.info("broker up: state %s ref %s", self.ledger.path, self.ledger.ref)

    async def run(self) -> None:
        await self.start()
        await self._stopped.wait()
        await self.close()

    def stop(self) -> None:
        self._stopped.set()

    async def _connect(self) -> Any:
        """The first connection, with a deadline: nats-py's own initial connect retries a
        refused credential for ever in silence when reconnects are unbounded. So each first
        attempt is a single try, and only an established connection reconnects for ever."""
        options: dict[str, Any] = {
            "name": "gavel-broker", "reconnect_time_wait": 0.5,
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
        if self.api is not None:
            self.api.close()  # requests waiting for a commit that will not come now
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=_CLOSE_S)
            for t in stuck:
                self.log.error("broker task %s did not stop within %gs", t.get_name(), _CLOSE_S)
        if self.nc is not None and not self.nc.is_closed:
            self.mirror.flush()  # puts still waiting for their window
            with contextlib.suppress(Exception):
                for subject, payload in self._outbox:  # what the sender had not sent yet
                    await self.nc.publish(subject, payload)
                self._outbox = []
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
                self.auctioneer.reconcile(now)
                if self.deaf_since is None and now - watched >= self.timing.tick_s / 2:
                    watched = now
                    self.promises.watch(now)
                    self.retention.watch()
            except Exception:
                self.log.exception("reconcile failed; retrying next tick")
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands
            # as the event fires, and `close` would wait for this loop for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.tick_s):
                    await self._wake.wait()
            self._wake.clear()

    # -- publishing ----------------------------------------------------------------------
    def publish(self, subject: str, msg: msgspec.Struct) -> None:
        self.publish_raw(subject, _enc.encode(msg))

    def publish_raw(self, subject: str, payload: bytes) -> None:
        """Queue a message; one sender task publishes them in order (no task per message)."""
        self._outbox.append((subject, payload))
        self._outbox_ready.set()

    def flush(self) -> None:
        """Put what is queued on the socket now, if it can go at once (`wire.write_now`):
        an auction's RFBs, whose round is already being timed. Never while the sender is
        mid-batch - what it holds must go first."""
        if self._outbox and not self._sending and wire.write_now(self.nc, self._outbox):
            self._outbox = []

    async def _send(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            batch, self._outbox = self._outbox, []
            if wire.write_now(self.nc, batch):
                continue
            self._sending = True
            try:
                await wire.send(self.nc, batch, self._publish_failed)
            finally:
                self._sending = False

    def _publish_failed(self, subject: str, exc: Exception) -> None:
        self.rejects.count("publish failed", f"{subject}: {exc}")  # count it, carry on

    @staticmethod
    def encode(msg: msgspec.Struct) -> bytes:
        return _enc.encode(msg)

    def record_event(self, ev: Event) -> None:
        self.events.append(ev)
        self.publish(subjects.EVENTS.format(instance=ev.instance_id), ev)

    def emit(self, instance_id: str, type_: EventType, node_id: str = "",
             reason: str = "", detail: str = "", exit_code: int | None = None,
             attempt: int = 0) -> None:
        self.record_event(Event(instance_id=instance_id, type=type_, node_id=node_id,
                                reason=reason, detail=detail, exit_code=exit_code,
                                attempt=attempt, at=time.time()))

    def award_for(self, iid: str, node: str, sha: str) -> Award | None:
        """The award for an instance git places on `node`, secrets resolved now."""
        state = self.ledger.state()
        rec = state.instances.get(iid)
        nf = state.nodes.get(node)
        if rec is None or nf is None or iid not in nf.instances:
            return None
        pl = nf.instances[iid]
        secret_env = {n: self.secrets[n] for n in rec.spec.secrets if n in self.secrets}
        return Award(auction_id=pl.auction_id, instance_id=iid, node_id=node, spec=rec.spec,
                     ports=dict(pl.ports), attempt=pl.attempt, commit=sha,
                     secret_env=secret_env)

    # -- node state in KV ----------------------------------------------------------------
    async def _open_kv(self, nodes: Mapping[str, NodeFile]) -> None:
        try:
            js = self.nc.jetstream()
            await js.create_key_value(bucket=subjects.NODES_BUCKET, history=1)
        except Exception as exc:  # JetStream off: awards still flow, convergence is off
            self.log.warning("no JetStream KV (%s); workers converge from awards only", exc)
            return
        self.mirror.start(nodes)

    def _mirror(self, change: Change, sha: str) -> None:
        if self.mirror.enabled and change.nodes:
            self.mirror.changed({
                nid: change.node_compact(nid, nf) if nf is not None
                else compact(NodeFile(node_id=nid)) for nid, nf in change.nodes.items()})

    # -- inbound -------------------------------------------------------------------------
    def _on_heartbeat(self, msg: wire.Received) -> None:
        try:
            hb = _hb_dec.decode(msg.data)
        except (msgspec.DecodeError, RecursionError) as exc:  # depth guard: no DecodeError
            self.rejects.malformed("heartbeat", msg.subject, exc)
            return
        if subjects.node_of(msg.subject) != hb.node_id:
            self.rejects.count("heartbeat for another node", msg.subject)
            return
        impossible = _impossible(hb)
        if impossible:
            self.rejects.count(impossible, msg.subject)
            return
        before = self.liveness.record(hb, self.now())
        self.promises.heartbeat_lists(hb.node_id,
                                      [(i.instance_id, i.state) for i in hb.instances])
        if hb.freed_ports:
            self.promises.ports_freed(hb.node_id, hb.freed_ports)
        if before is not Health.HEALTHY:
            self.log.info("node %s is %s", hb.node_id, "up" if before is None else "back")
            self.auctioneer.capacity_freed()

    async def _on_assign(self, msg: Msg) -> None:
        try:
            req = _assign_dec.decode(msg.data)
        except (msgspec.DecodeError, RecursionError) as exc:
            self.rejects.malformed("assignment request", msg.subject, exc)
            if msg.reply:  # the asker is not left waiting out its timeout on garbage
                await self.nc.publish(msg.reply, _enc.encode(
                    ApiError(error="malformed assignment request")))
            return
        node = subjects.node_of(msg.subject)
        reply: msgspec.Struct
        if node != req.node_id:
            self.rejects.count("assignment request for another node", msg.subject)
            reply = ApiError(error="assignment request for another node")
        else:
            award = self.award_for(req.instance_id, node, self.ledger.state().head or "")
            reply = award or ApiError(error=f"{req.instance_id} is not placed on {node}")
        if msg.reply:
            await self.nc.publish(msg.reply, _enc.encode(reply))


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
