"""The broker: a thin shell that runs auctions over NATS and commits awards to git.

Rules:
1. The broker keeps nothing it cannot re-derive: pending work is "desired instances with no
   placement" read from git each tick; liveness comes from heartbeats, and at start from
   the heartbeat stream NATS keeps (`shared.health` rule 2, `broker.heartbeat_stream`);
   in-flight auctions are simply re-run after a restart; every other promise clock restarts
   with the broker.
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
5. A damaged state repository (`Damaged`), or a loop of the broker's that crashed
   (`transport.tasks.Crashed`, reported as it happens), stops the broker: `run` raises it
   once the broker is closed, and the daemon prints its one sentence.
6. The API has a NATS connection of its own: whatever nodes send (or fail to read) on the
   node connection, operators' requests and their answers never queue behind it, and a
   node connection the server cuts off leaves the API answering.
7. While the broker cannot hear (its node connection down, or its heartbeat feed losing
   its own probes) no promise is judged, and the outage counts against no node
   (`shared.health` rule 3).
8. As one leadership of several brokers (`leader.ha`, run by `broker.ha`) the broker is
   the same, but: it tells a node nothing (awards, cancels, KV entries, assignment
   answers) before the commit behind it is on the remote (`MakePusher`); every award,
   cancel and KV entry carries its epoch; KV puts are checked against the key's revision
   (`broker.fencedkv`); nothing goes out once its lease's own-clock verdict says no; and
   `abort` ends it at once, sending nothing it still holds.
9. A tick's passes (auctions, promises, services, arrays, ...) each take a turn of the loop
   of their own: a request waits for one pass over a large cluster, never for all of them.
   So does an auctioneer's pass woken while the last ran (a wave of retries come due).
10. A broker told to stop while it starts (a signal; a credential NATS takes but that is
   not the broker's, `cli.daemons` rule 5) stops there: what is left of its start (the
   JetStream streams and bucket, the subscriptions' confirmation, each waiting out its
   timeout when the broker's inbox is refused) is given up, and it closes as a broker
   that was up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import random
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import nats.errors

from gavel.broker.admission import Admission
from gavel.broker.api import Api
from gavel.broker.arrays import Arrays
from gavel.broker.assign import Assignments
from gavel.broker.auctioneer import Auctioneer
from gavel.broker.config import Config
from gavel.broker.connect import NatsUnreachable, connect_within
from gavel.broker.context import Context, Leadership
from gavel.broker.deploys import Deploys
from gavel.broker.events import Events
from gavel.broker.fencedkv import FencedPuts
from gavel.broker.hearing import Hearing
from gavel.broker.heartbeat_stream import HeartbeatStream
from gavel.broker.heartbeats import Heartbeats
from gavel.broker.integrity import Integrity
from gavel.broker.kvbucket import Made, make_bucket, until_made
from gavel.broker.ledger.committer import AFTER_SLICE_S, Committer
from gavel.broker.ledger.remote import Pusher
from gavel.broker.ledger.repository import Damaged, Ledger
from gavel.broker.ledger.state import Change, State, compact
from gavel.broker.metrics import Metrics
from gavel.broker.mirror import Mirror
from gavel.broker.outbox import Outbox
from gavel.broker.periodic import Periodic
from gavel.broker.promises import Promises
from gavel.broker.reauction import Rebalancer
from gavel.broker.replyroutes import ReplyRoutes
from gavel.broker.retention import Retention
from gavel.broker.services import Services
from gavel.broker.systems import Systems
from gavel.broker.watchdog import Timers
from gavel.broker.watches import Watches
from gavel.shared import subjects
from gavel.shared.health import Liveness, silences
from gavel.shared.messages import RFB
from gavel.shared.records import NodeFile
from gavel.transport import wire
from gavel.transport.rejects import Rejects
from gavel.transport.tasks import Crashed, Tasks, until

__all__ = ["Broker", "Config", "MakePusher", "NatsUnreachable", "tune_gc"]

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


#: How a broker gets the pusher of its commits to a remote, from its ledger and what wakes
#: it (a merge of what others pushed may bring work): with HA, what it tells a node waits
#: for the push (rule 8); without, the push follows the commit and nothing waits for it.
MakePusher = Callable[[Ledger, Callable[[], None]], Pusher]


class Broker:
    """The broker process's composition root: `__init__` builds every part once, in
    dependency order, each handed only what it uses; `start` connects and subscribes each
    part to its subjects; `_loop` is the reconcile pass."""

    def __init__(self, config: Config, *, leader: Leadership | None = None,
                 metrics: Metrics | None = None, pusher: MakePusher | None = None) -> None:
        self.config = config
        self.log = logging.getLogger("gavel.broker")
        self.timing = timing = config.timing
        self.now = clock = config.clock
        #: Rule 8: who leads, and with HA this leadership's epoch and its lease's verdict.
        self.leader = leader or Leadership(broker_id=config.broker_id,
                                           since=_stamp(config.wall()))
        self.ha = self.leader.ha
        # The broker's own controls, which the parts are handed: the reconcile kick, and
        # why the broker stopped on its own (rule 5), raised by `run`.
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self.fatal: Damaged | Crashed | None = None
        #: Its loops' owner: a loop that crashes stops the broker at once (rule 5).
        self.tasks = Tasks("broker", self.log, crashed=self._crashed)
        # Out: what is counted, what is published, node.json in KV for the workers. The
        # mirror's windows are timed by the event loop, so on the machine's clock; with HA
        # its puts are checked ones carrying the epoch, and the outbox's gate is the lease.
        self.metrics = metrics or Metrics()
        if not self.ha:  # a leadership's view is attached as it starts (`start`)
            self.metrics.leadership(lambda: (True, self.leader.broker_id, 0,
                                             self.leader.since))
        self.rejects = Rejects(self.log, self.metrics.rejected, clock)
        self.outbox = Outbox(self._publish_failed,
                             gate=self.leader.leading if self.ha else None)
        self.fenced = FencedPuts(self.leader, timing=timing) if self.ha else None
        self.mirror = Mirror(self.fenced.put if self.fenced is not None
                             else self.outbox.publish_raw, timing.mirror_s, time.monotonic)
        # Git: the state repository, its pusher, and the one committer that writes it.
        self.ledger = Ledger(config.state_dir / "state.git", config.ref, settle=True,
                             objects=config.objects)
        self.pusher = pusher(self.ledger, self.wake) if pusher is not None else None
        self.committer = self._committer()
        # The parts, on the context they share.
        self.liveness = Liveness(timing)
        self.timers = Timers(started=clock())
        self.events = Events(self.outbox, timing=timing)
        self.ctx = ctx = Context(timing=timing, ledger=self.ledger, committer=self.committer,
                                 liveness=self.liveness, timers=self.timers,
                                 outbox=self.outbox, events=self.events, rejects=self.rejects,
                                 metrics=self.metrics, now=clock, wake=self.wake, log=self.log,
                                 leader=self.leader, durable=self.committer.durable)
        self.secrets = dict(config.secrets)
        self.assignments = Assignments(ctx, self.secrets)
        self.watches = Watches(ctx, min_gap_s=timing.heartbeat_s / 2,
                               inactive_s=10 * timing.heartbeat_s)
        #: Replies to auctions not the auctioneer's; the re-auctioner registers with it.
        self.routes = ReplyRoutes()
        self.auctioneer = Auctioneer(ctx, award_for=self.assignments.award_for,
                                     batch_max=config.batch_max, sample_d=config.sample_d,
                                     max_auctions=config.max_auctions,
                                     batch_wait_s=config.batch_wait_s,
                                     commit_gap_s=config.commit_gap_s,
                                     rng=random.Random(config.seed), routes=self.routes)
        self.promises = Promises(ctx, capacity_freed=self.auctioneer.capacity_freed)
        self._keepers(ctx, config)
        self.api = Api(ctx, auctioneer=self.auctioneer, promises=self.promises,
                       services=self.services, deploys=self.deploys, mirror=self.mirror,
                       secrets=self.secrets, ended_max=config.ended_max,
                       admission=Admission(ctx, config.caps), periodic=self.periodic,
                       capped=self.systems.capped, landing=self.landing)
        if not self.ha:
            self._show_metrics()
        self.heartbeats = Heartbeats(ctx, self.promises, self.auctioneer.capacity_freed,
                                     self.auctioneer.core.candidates)
        # In: rule 7's hearing, and the heartbeat feed it watches.
        self.hearing = Hearing(self.liveness, clock, self.log)
        self.deafness, self.disconnects = self.hearing.deafness, self.hearing.disconnects
        self.feed = HeartbeatStream(timing=timing, deliver=self._on_heartbeat,
                                    deaf=self.hearing.feed_deaf,
                                    hearing=self.hearing.feed_hearing, now=clock, log=self.log,
                                    replicas=config.kv_replicas, ha=self.ha)
        #: The state the KV mirror was last brought in line with (rule 4).
        self._mirrored: State | None = None
        #: The node connection (rule 6: `api_nc` is the API's); set once both are up.
        self.nc: Any = None
        self.api_nc: Any = None

    def _keepers(self, ctx: Context, config: Config) -> None:
        """The parts that keep each kind of work, on the promises and the auctioneer, in the
        order they depend on each other."""
        self.retention = Retention(ctx, config.wall, config.ended_max)
        #: Re-auction's new copies, not counted by the keeper until they settle.
        moving: dict[str, str] = {}
        self.services = Services(ctx, self.promises, config.wall, moving=moving)
        self.rebalancer = Rebalancer(ctx, config.rebalance, promises=self.promises,
                                     award_for=self.assignments.award_for,
                                     free=self.auctioneer.free, moving=moving,
                                     routes=self.routes, rng=random.Random(config.seed))
        #: Arrays whose submission is still landing (`broker.submissions` rule 2).
        self.landing: set[str] = set()
        self.arrays = Arrays(ctx, landing=self.landing)
        self.systems = Systems(ctx, self.promises, config.wall, caps=config.caps)
        self.periodic = Periodic(ctx, self.promises, config.wall, config.caps)
        self.deploys = Deploys(ctx, self.services)
        self.integrity = Integrity(ctx)

    def _committer(self) -> Committer:
        """The group committer, and who hears of each commit: the pusher, if any, at once;
        the KV mirror at once, or with HA once the push landed (rule 8)."""
        mirror = self.mirror.committed  # rule 2
        pusher = self.pusher
        heard: list[Callable[[Change, str], None]] = [] if self.ha else [mirror]
        if pusher is not None:
            heard.append(lambda change, sha: pusher.notify())
        return Committer(self.ledger, retry_s=self.timing.tick_s, orphan_s=self.timing.orphan_s,
                         on_commit=functools.partial(_tell, heard) if heard else None,
                         writer=self.config.writer, wall=self.config.wall,
                         gap_s=self.config.commit_gap_s or 0.0, metrics=self.metrics,
                         on_damaged=self._damaged, durable=pusher if self.ha else None,
                         on_durable=mirror if self.ha else None,
                         slice_s=AFTER_SLICE_S if self.config.after_slices else None,
                         stale_lock_s=self.timing.stale_lock_s)

    def _show_metrics(self) -> None:
        """The scrape-time view of this broker's parts (with HA, of the leadership now)."""
        self.metrics.attach(now=self.now, liveness=self.liveness, ledger=self.ledger,
                            in_flight=lambda: len(self.auctioneer.auctions),
                            mirror=self.mirror, live_state=self.api.views.state_of,
                            events_dropped=lambda: self.events.dropped)
        self.metrics.attach_services(self.services.counts)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.ha:  # rule 8: derived from the remote's branch alone, then shown
            self.ledger.forget()
            self._show_metrics()
        nc = api_nc = None
        try:
            await asyncio.to_thread(self.ledger.clear_stale_lock, self.timing.stale_lock_s)
            self.ledger.state()  # a damaged repository stops the broker before it connects
            nc = await self._connect("gavel-broker", "nodes")
            api_nc = await self._connect("gavel-broker-api", "api")
        except BaseException:
            if nc is not None:
                with contextlib.suppress(Exception):
                    await nc.close()
            await self.committer.join(self.timing.close_s)
            raise
        self.nc, self.api_nc = nc, api_nc
        self.outbox.nc = nc
        if self.fenced is not None:
            self.fenced.nc = nc
        state = self._mirrored = self.ledger.state()
        stamps = await self.feed.start(nc)
        loaded = await self.events.load(nc, self.config.kv_replicas, self.log, ha=self.ha)
        if loaded:
            self.log.info("%d events loaded from the event history", loaded)
        now = self.now()
        silent = silences(stamps, state.nodes)
        for node_id in state.nodes:
            self.liveness.presume(node_id, now, silent.get(node_id, 0.0))
        for stored in self.feed.past.values():
            self.heartbeats.recall(stored)
        if silent:
            self.log.info("%d of %d nodes with placements found in the heartbeat stream; "
                          "the quietest had been silent %.1fs", len(silent), len(state.nodes),
                          max(silent.values()))
        self.timers.resume(state, self.timing)
        # A node heard but holding nothing in git gets its empty node.json mirrored too: a
        # broker (or a leadership) killed between a commit that moved everything off a node
        # and that node's KV put leaves the old list there, and the node would keep running
        # what was moved away.
        heard = {n: NodeFile(node_id=n) for n in stamps if subjects.is_node_id(n)}
        await self._open_kv({**heard, **state.nodes})
        await nc.subscribe_direct(subjects.BIDS_ALL, self.auctioneer.on_bids)
        await nc.subscribe_direct(subjects.REPORT_ALL, self.promises.on_report)
        await nc.subscribe(subjects.ASSIGN_ALL, cb=self.assignments.on_request)
        await nc.subscribe(subjects.WATCH_ALL, cb=self.watches.on_request)
        await self.api.start(api_nc)
        for conn in (nc, api_nc):
            try:  # "up" means heard: an API call or a report sent from now on reaches us
                await wire.subscribed(conn, self.timing.call_s)
            except nats.errors.Error as exc:
                self.log.warning("nats did not confirm the subscriptions (%s); carrying on",
                                 exc)
        if self.ha:  # a new leadership's hello: every node heartbeats now (`messages.RFB`),
            # and no auction finds "no nodes connected" before they could have: every live
            # node heartbeats within a heartbeat interval anyway (`broker.auctioneer` rule 9)
            self.auctioneer.hold_until = self.now() + self.timing.heartbeat_s
            self.outbox.publish(subjects.RFB, RFB(auction_id=f"hello-{self.leader.epoch}",
                                                  shapes=[], deadline_s=0.0))
        for name, loop in (("outbox", self.outbox.run()), ("committer", self.committer.run()),
                           ("heartbeats", self.feed.run()), ("events", self.events.run()),
                           ("reconcile", self._loop())):
            self.tasks.spawn(loop, name=name)
        self.log.info("broker up: state %s ref %s%s", self.ledger.path, self.ledger.ref,
                      f", leading in epoch {self.leader.epoch}" if self.ha else "")

    async def run(self) -> None:
        starting = await until(self._stopped, self.start())  # rule 10
        if not starting.cancelled():
            starting.result()  # what `start` raised
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

    def _crashed(self, crash: Crashed) -> None:
        """Rule 5: a loop that crashed (`transport.tasks` has logged it) stops the broker, as
        a damaged repository does; `run` raises it."""
        if self.fatal is None:
            self.fatal = crash
        self.stop()

    def stop(self) -> None:
        self._stopped.set()

    @property
    def stopped(self) -> asyncio.Event:
        """Set once the broker is told to stop, or stops on its own (rule 5)."""
        return self._stopped

    async def _connect(self, name: str, role: str) -> Any:
        """A first connection, with a deadline: nats-py's own initial connect retries a
        refused credential for ever in silence when reconnects are unbounded. So each first
        attempt is a single try, and only an established connection reconnects for ever.
        `role` is "nodes" (its outage makes the broker deaf, rule 7) or "api"."""
        async def disconnected() -> None:
            await self.hearing.disconnected(role)

        async def reconnected() -> None:
            await self.hearing.reconnected(role)

        options: dict[str, Any] = {
            "name": name, "reconnect_time_wait": 0.5,
            # Its own requests' answers (JetStream's, its subscription barrier, the heartbeat
            # stream's pulls) under a prefix of its own, which operators' `_INBOX.>` does
            # not cover.
            "inbox_prefix": subjects.BROKER_INBOX,
            "disconnected_cb": disconnected, "reconnected_cb": reconnected,
            **self.config.nats_options, "allow_reconnect": False}
        nc = await connect_within(wire.Client, self.config.nats_url, options,
                                  self.config.first_connect_s, self.timing.retry_s)
        nc.options["max_reconnect_attempts"] = -1
        return nc

    async def close(self) -> None:
        """Stop every loop, send what is queued, drain; bounded, so a stuck part is logged
        rather than holding its caller for ever."""
        self.hearing.closing = True  # from now on a connection that goes is one we close
        close_s = self.timing.close_s
        await self.events.settle(close_s)  # stored before we go (`broker.events` rule 3)
        self.tasks.cancel()
        await self.rebalancer.close()
        self.api.close()  # requests waiting for a commit that will not come now
        await self.tasks.wait(close_s)
        if self.nc is not None and not self.nc.is_closed:
            self.mirror.flush()  # puts still waiting for their window
            await self.outbox.drain()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(close_s):
                    await self.feed.close()
        for conn in (self.api_nc, self.nc):
            if conn is None or conn.is_closed:
                continue
            with contextlib.suppress(Exception):
                async with asyncio.timeout(close_s):
                    await conn.drain()
            if not conn.is_closed:
                with contextlib.suppress(Exception):
                    await conn.close()
        await self.committer.join(self.timing.close_s)

    async def abort(self) -> None:
        """Rule 8: stop at once and say nothing more - nothing queued or pending is sent,
        no request is answered; both connections, and with them every subscription, end."""
        self.tasks.cancel()
        self.api.close()
        if self.fenced is not None:
            self.fenced.close()
        self.mirror.stop()
        self.outbox.gate = lambda: False
        await wire.abort(self.api_nc)
        await wire.abort(self.nc)
        await self.tasks.wait(self.timing.close_s)
        await self.committer.join(self.timing.close_s)

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        watched = float("-inf")
        while True:
            now = self.now()
            try:
                self.integrity.watch()
                self._remirror()
                self.auctioneer.reconcile(now)
                if not self.deafness.deaf and now - watched >= self.timing.tick_s / 2:
                    watched = now
                    await asyncio.sleep(0)  # rule 9
                    self.promises.watch(now)
                    await self.services.watch(now)  # in steps of its own
                    await asyncio.sleep(0)
                    self.rebalancer.watch(now)
                    for part in (self.arrays, self.systems, self.periodic, self.retention):
                        await asyncio.sleep(0)
                        part.watch()
            except Damaged as exc:
                self._damaged(exc)
                return
            except Exception:
                self.log.exception("reconcile failed; retrying next tick")
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands
            # as the event fires, and `close` would wait for this loop for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timing.tick_s):  # woken meanwhile: rule 9
                    await (asyncio.sleep(0) if self._wake.is_set() else self._wake.wait())
            self._wake.clear()

    def _publish_failed(self, subject: str, exc: Exception) -> None:
        self.rejects.count("publish failed", f"{subject}: {exc}")  # count it, carry on

    # -- node state in KV ----------------------------------------------------------------
    async def _open_kv(self, nodes: Mapping[str, NodeFile]) -> None:
        """The mirror starts once its bucket is made (`broker.kvbucket`); a JetStream that
        cannot answer yet is asked again by a task of the broker's. A leadership's puts are
        answered ones, sent again until the bucket takes them, so it mirrors `nodes` (what
        the remote holds) at once; a lone broker's are not, so it starts the mirror from
        the state it holds when the bucket answers."""
        made, why = await make_bucket(self.nc, self.config.kv_replicas, self.ha, self.log)
        if made is Made.NEVER:
            self.log.warning("no JetStream KV (%s); workers converge from awards only", why)
            return
        if made is Made.MADE or self.ha:
            self.mirror.start(nodes)
        if made is Made.MADE:
            return
        self.log.warning("JetStream cannot make the KV bucket yet (%s); asked again every "
                         "%gs", why, self.timing.tick_s)

        async def later() -> None:
            made = await until_made(self.nc, self.config.kv_replicas, self.ha, self.log,
                                    self.timing.tick_s)
            if made and not self.ha:
                self.mirror.start({**{n: NodeFile(node_id=n) for n in nodes},
                                   **self.ledger.state().nodes})
        self.tasks.spawn(later(), name="kv-bucket")

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

    # -- inbound -------------------------------------------------------------------------
    def _on_heartbeat(self, msg: wire.Received) -> None:
        self.heartbeats.on_heartbeat(msg)


def _tell(heard: list[Callable[[Change, str], None]], change: Change, sha: str) -> None:
    for one in heard:
        one(change, sha)


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
