"""The node agent: answers requests for bids, takes awards and cancels, heartbeats.

Rules: a bid is `shared.strategies.answer` against a cached view of this node, rebuilt when
something changes (an instance comes or goes, host stats are sampled, draining flips), so
the RFB path makes no system calls and creates no tasks. Everything this node sends carries
its own node id on its own subjects; a message addressed to another node is counted and
dropped, a malformed one or one that is no message of gavel's (a JetStream delivery, flow
control, a heartbeat: `transport.inbound`) is counted and logged once per kind a minute.
What the node runs is the `Supervisor`'s business, making it match node.json the
`Converger`'s (see worker.converge for the award/KV ordering and for self-fencing); this
module is the NATS shell around them. An award or cancel of an older leadership than the
newest heard from is counted and ignored (`Supervisor.admit`); an RFB that asks for nothing
is a new leader's hello, answered with a heartbeat at once. A dry-run RFB (`gavel plan`) is
answered as any other: a bid reserves nothing here and keeps no offer, so answering one
changes nothing on this node. A server that stops answering
PINGs for two heartbeats is given up for the next server listed (a cluster's others), so a
node cut off with its server is heard again through the rest of the cluster long before
it would fence itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gavel.shared import subjects
from gavel.shared.feasibility import NodeView
from gavel.shared.logstream import WINDOW_S
from gavel.shared.messages import (
    NODE_ENDS,
    RFB,
    Award,
    BidReply,
    Cancel,
    Capacity,
    EventType,
    Heartbeat,
    InstanceReport,
    Message,
)
from gavel.shared.reauction import keep_view
from gavel.shared.spec import Spec
from gavel.shared.strategies import Strategy, answer
from gavel.shared.timing import Timing
from gavel.transport import wire
from gavel.transport.inbound import Door, Guard
from gavel.transport.tasks import Crashed, Tasks, opened_until
from gavel.transport.urls import servers
from gavel.worker.cgroups import Enforcement
from gavel.worker.converge import Converger
from gavel.worker.drivers import Driver
from gavel.worker.engine import Engine
from gavel.worker.execserver import ExecServer
from gavel.worker.hoststats import Sampler, detect_capacity, primary_address
from gavel.worker.isolation import Isolation, off
from gavel.worker.logfiles import LogLimits, Outputs
from gavel.worker.logserver import LogServer
from gavel.worker.logserver import tick as logs_tick
from gavel.worker.nodeengine import NodeEngine
from gavel.worker.ports import bindable
from gavel.worker.refused import Refused
from gavel.worker.reports import Reports
from gavel.worker.supervisor import OLDER_AWARD, OLDER_CANCEL, Supervisor

__all__ = ["Agent"]

log = logging.getLogger("gavel.worker")


class Agent:
    """One node's agent. ``await run()`` until ``await stop()``."""

    def __init__(self, *, nats_url: str, node_id: str, strategy: Strategy,
                 labels: dict[str, str], state_dir: Path, timing: Timing,
                 cpu: float | None = None, memory_mb: int | None = None,
                 port_range: tuple[int, int] = (20000, 20999),
                 nats_options: dict[str, Any] | None = None, advertise: str = "",
                 log_limits: LogLimits | None = None, logs_window_s: float = WINDOW_S,
                 cgroups: Enforcement | None = None,
                 isolation: Isolation | None = None, engine: Engine | None = None,
                 volumes: Mapping[str, str] | None = None,
                 find_engine: Callable[[], Engine | None] | None = None) -> None:
        self.node_id = node_id
        self.strategy = strategy
        self.labels = dict(labels)
        self.state_dir = Path(state_dir)
        self.timing = timing
        self.port_range = port_range
        self.capacity = detect_capacity(cpu, memory_mb, port_range)
        #: What this node enforces of each award (`worker.cgroups`); said once at start.
        self.enforcement = cgroups or Enforcement.off()
        #: Who instances run as and what they can reach (`worker.isolation`); said at start.
        self.isolation = isolation or off()
        #: Instances killed because a process of theirs was found outside their cgroup.
        self.escapes = 0
        #: Where a gateway reaches this node's instances (the heartbeat carries it), and the
        #: directory each instance's own directory is in.
        self.advertise = advertise or primary_address()
        self.workdir = str((self.state_dir / "instances").resolve())
        self._refused = Refused(log)
        #: Undecodable messages per endpoint ("rfb", "award", "cancel").
        self.malformed = self._refused.malformed_kinds
        #: Well-formed messages dropped on purpose, per reason.
        self.ignored = self._refused.ignored
        #: Set while connected and subscribed.
        self.ready = asyncio.Event()
        self._nats_url = nats_url
        self._nats_options = dict(nats_options or {})
        self._sampler = Sampler()
        self._stats = self._sampler.sample()
        self._draining = False
        #: The node's host volumes (name -> path).
        self.volumes = dict(volumes or {})
        self._make_parts(timing, log_limits, logs_window_s, engine, find_engine)
        self._view: NodeView
        self._refresh_view()
        self._seq = 0
        #: Each event numbered, the newest ends kept for the heartbeats (`worker.reports`).
        self._reports = Reports(node_id, timing.unreachable_s)
        self._nc: NATS | None = None
        self._subs: list[Subscription] = []
        self._outbox: list[tuple[str, bytes]] = []
        #: Its loops (`transport.tasks`): one that crashes stops the agent at once, its
        #: instances left running for the next agent, as a refused credential does.
        self._loops = Tasks("worker", log, crashed=self._crashed)
        #: The crash that stopped the agent, if one did.
        self.crashed: Crashed | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._make_guards()
        self._wake = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._done = asyncio.Event()
        self._kill_children = True
        self._started = False

    def _make_parts(self, timing: Timing, log_limits: LogLimits | None,
                    logs_window_s: float, engine: Engine | None,
                    find_engine: Callable[[], Engine | None] | None) -> None:
        """The parts that run instances, each wired to the others (`__init__`)."""
        node_id, port_range = self.node_id, self.port_range

        def driver(spec: Spec) -> Driver:
            return self._supervisor.process if spec.image is None else self._engine.driver()

        self._supervisor = Supervisor(
            node_id=node_id, state_dir=self.state_dir, timing=timing, port_range=port_range,
            report=self._report, on_change=self._refresh_view,
            reserved=lambda iid: self.converger.reserved(iid),
            secrets=lambda iid, attempt: self.converger.secrets(iid, attempt),
            cgroups=self.enforcement.hierarchy, isolation=self.isolation, drivers=driver,
            volumes=self.volumes)
        #: The node's container engine (`worker.nodeengine`) and its host volumes.
        self._engine = NodeEngine(engine, find=find_engine,
                                  addresses=["127.0.0.1", self.advertise], volumes=self.volumes,
                                  state_dir=self.state_dir,
                                  instance_dir=self._supervisor.instance_dir)
        #: Makes this node match its node.json (KV); its counters say what it did.
        self.converger = Converger(node_id=node_id, timing=timing,
                                    supervisor=self._supervisor,
                                    set_draining=self.set_draining,
                                    on_node=self._refresh_view, sink=self._refused,
                                    crashed=self._crashed)
        #: Each instance's output: rotated while the worker lives, served to operators.
        self.outputs = Outputs(self.state_dir / "instances", log_limits or LogLimits(),
                               held=lambda: [r.instance_id for r in self.instances()])
        self.logserver = LogServer(node_id=node_id, outputs=self.outputs,
                                   holds=self._supervisor.holds, sink=self._refused,
                                   nc=lambda: self._nc,
                                   poll_s=min(timing.logs_look_s, timing.tick_s),
                                   window_s=logs_window_s, close_s=timing.close_s)
        self.execs = ExecServer(node_id=node_id, target=self._supervisor.exec_target,
                                report=self._report, sink=self._refused, nc=lambda: self._nc,
                                poll_s=min(timing.exec_look_s, timing.tick_s),
                                close_s=timing.close_s)

    @property
    def engine(self) -> Engine | None:
        """The node's container engine (None: none answered; image specs are declined)."""
        return self._engine.engine

    async def _engine_later(self) -> None:
        """Take up the engine once it answers (`worker.engine` rule 5)."""
        await self._engine.wait_for_one(self.timing.heartbeat_s)
        self._refresh_view()
        await self._engine.sweep(self._supervisor.held())

    def _make_guards(self) -> None:
        """The guards of what the broker sends here, the subjects this node sends on."""
        node_id = self.node_id
        mine: Callable[[str], str] = lambda _subject: node_id  # noqa: E731 - for the guards
        refused = self._refused
        self._rfb = Guard("rfb", RFB, refused, door=Door(
            refused, (subjects.RFB, subjects.RFB_NODE.format(node=node_id))))
        self._award = Guard("award", Award, refused, node=mine,
                            door=Door(refused, subjects.AWARD.format(node=node_id)))
        self._cancel = Guard("cancel", Cancel, refused, node=mine,
                             door=Door(refused, subjects.CANCEL.format(node=node_id)))
        self._bids_subject = subjects.BIDS.format(node=node_id)
        self._hb_subject = subjects.HEARTBEAT.format(node=node_id)
        self._report_subject = subjects.REPORT.format(node=node_id)

    # -- public surface ---------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    def set_draining(self, draining: bool) -> None:
        """Decline every request from now on (or accept them again); heartbeat at once."""
        self._draining = draining
        self._refresh_view()
        self._wake.set()

    @property
    def committed(self) -> Capacity:
        return self._view.committed

    def instances(self) -> list[InstanceReport]:
        """What this node holds right now, as its heartbeat reports it."""
        return self._supervisor.reports()

    def heartbeat(self) -> Heartbeat:
        """The next heartbeat (each call takes a new sequence number)."""
        self._seq += 1
        view = self._view
        return Heartbeat(
            node_id=self.node_id, seq=self._seq, strategy=self.strategy.name,
            labels=self.labels, capacity=view.capacity, committed=view.committed,
            stats=view.stats, draining=view.draining, instances=self.instances(),
            port_range=list(self.port_range), freed_ports=self._freed_ports(),
            advertise=self.advertise, workdir=self.workdir, reported=self._reports.sent,
            ended=self._reports.recent_ends(),
        )

    def _freed_ports(self) -> list[int]:
        """Blocked ports (node.json: taken outside gavel) that bind again now, for the broker
        to unblock; never one of our own instances holds (that would not be outside)."""
        blocked = self.converger.blocked()
        if not blocked:
            return []
        held = self._supervisor.held_ports()
        return [p for p in blocked if p not in held and bindable(p)]

    async def run(self) -> None:
        """Adopt survivors, connect, serve until `stop`; then stop or leave the instances."""
        if self._started:
            raise RuntimeError("an Agent runs once; make a new one")
        self._started = True
        try:
            if self._stop_requested.is_set():
                return
            enforcement = self.enforcement
            (log.warning if enforcement.missing else log.info)(
                "node %s: %s", self.node_id, enforcement.summary)
            log.info("node %s: %s", self.node_id, self.isolation.summary)
            await self._supervisor.restore()  # events wait in the outbox until connected
            await self._engine.sweep(self._supervisor.held())  # what no instance here owns
            self._loops.spawn(logs_tick(self.outputs, self.timing.tick_s), name="logs")
            if self._engine.find is not None:
                self._loops.spawn(self._engine_later(), name="engine-later")
            self.converger.start_link_watch(lambda: self._nc)
            if await self._connect():
                await self._subscribe()
                self._loops.spawn(self._heartbeats(), name="heartbeats")
                self._loops.spawn(self._sample_stats(), name="stats")
                assert self._nc is not None
                self.converger.start(self._nc)
                self.ready.set()
                await self._stop_requested.wait()
        finally:
            await self._shutdown()
            self._done.set()

    async def stop(self, *, kill_children: bool = True) -> None:
        """End `run`. With ``kill_children=False`` the instances keep running, unwatched, and
        the next agent on this state dir adopts them."""
        self._kill_children = kill_children
        self._stop_requested.set()
        if self._started:
            await self._done.wait()

    def _crashed(self, crash: Crashed) -> None:
        """A loop crashed (`transport.tasks` has logged it): the agent stops, leaving its
        instances running for the next agent on this state dir to adopt."""
        if self.crashed is None and not self._stop_requested.is_set():
            self.crashed = crash
            self._kill_children = False
            log.error("%s; the worker stops, leaving its instances running", crash)
            self._stop_requested.set()

    # -- connection -------------------------------------------------------------------------

    async def _connect(self) -> bool:
        """Connect, retrying for as long as it takes; False if `stop` came first."""
        options: dict[str, Any] = {
            "name": f"gavel-worker-{self.node_id}", "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5, "error_cb": self._on_nats_error,
            "disconnected_cb": self._on_disconnected, "reconnected_cb": self._on_reconnected,
            # Replies to this node (assignments carry secrets) under a prefix only its
            # credential may subscribe to; see broker.auth.
            "inbox_prefix": subjects.NODE_INBOX.format(node=self.node_id),
            # A server that goes silent (cut off, hung) is left for the next one in the list
            # after two unanswered PINGs a heartbeat apart: about `unreachable_s`, well
            # before `offline_s` would self-fence (nats-py's default waits minutes).
            "ping_interval": self.timing.heartbeat_s, "max_outstanding_pings": 2,
        }
        options.update(self._nats_options)
        # nats-py's first connect retries for ever: a stop ends it where it stands
        nc = await opened_until(self._stop_requested,
                                nats.connect(servers(self._nats_url), **options))
        if nc is None:
            return False
        self._nc = nc
        outbox, self._outbox = self._outbox, []
        for subject, data in outbox:
            await nc.publish(subject, data)
        return True

    async def _subscribe(self) -> None:
        assert self._nc is not None
        node = self.node_id
        for subject, cb in (
            (subjects.RFB, self._on_rfb),
            (subjects.RFB_NODE.format(node=node), self._on_rfb),
            (subjects.AWARD.format(node=node), self._on_award),
            (subjects.CANCEL.format(node=node), self._on_cancel),
            (subjects.LOGS.format(node=node), self.logserver.on_request),
            (subjects.LOGS_AS.format(node=node, operator="*"), self.logserver.on_request),
            (subjects.EXEC_NODE.format(node=node), self.execs.on_message),
        ):
            self._subs.append(await self._nc.subscribe(subject, cb=cb))
        try:  # no RFB or award sent after the first heartbeat can pass this node by
            await wire.subscribed(self._nc, timeout=self.timing.heartbeat_answer_s)
        except nats.errors.Error as exc:
            log.warning("nats did not confirm the subscriptions (%s); carrying on", exc)

    async def _shutdown(self) -> None:
        self.ready.clear()
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()
        await self.logserver.close()
        await self.execs.close()
        await self.converger.close()
        # bounded: a stuck loop is logged, never a worker that cannot stop
        await self._loops.aclose(max(self.timing.loops_close_s, self.timing.tick_s))
        await self._supervisor.shutdown(kill=self._kill_children)
        if self.enforcement.hierarchy is not None:
            self.enforcement.hierarchy.close()
        nc, self._nc = self._nc, None
        if nc is not None:
            try:  # flushes what is still buffered: the last events matter
                await asyncio.wait_for(nc.drain(), self.timing.kill_grace_s)
            except (nats.errors.Error, TimeoutError):
                await nc.close()

    async def _on_nats_error(self, exc: Exception) -> None:
        log.warning("nats: %s", exc)

    async def _on_disconnected(self) -> None:
        log.warning("disconnected from nats; reconnecting")

    async def _on_reconnected(self) -> None:
        log.info("reconnected to nats")
        self._wake.set()  # tell the broker at once that this node is back
        self.converger.wake()

    # -- the node's view and its heartbeats -------------------------------------------------

    def _refresh_view(self) -> None:
        """Rebuild the NodeView every bid reads: after any change, never per request. Ports
        node.json blocks (taken outside gavel) are not offered: the broker could not assign
        them, so bidding on them would only win auctions it cannot place."""
        first, last = self.port_range
        blocked = sum(1 for p in self.converger.blocked() if first <= p <= last)
        capacity = self.capacity
        if blocked:
            capacity = capacity - Capacity(ports=min(blocked, capacity.ports))
        self._view = NodeView(
            node_id=self.node_id, capacity=capacity,
            committed=self._supervisor.committed(), stats=self._stats,
            labels=self.labels, draining=self._draining, engine=self.engine is not None,
            images=self._engine.images(),
            volumes=frozenset(self.volumes), residents=self._supervisor.residents(),
            allow_root=self.isolation.allow_root or not self.isolation.enabled,
        )

    async def _heartbeats(self) -> None:
        while True:
            self._wake.clear()
            if await self._engine.learn_images():
                self._refresh_view()
            self.escapes += self._supervisor.escapes()
            await self._send(self._hb_subject, self.heartbeat())
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel
                async with asyncio.timeout(self.timing.heartbeat_s):
                    await self._wake.wait()

    async def _sample_stats(self) -> None:
        while True:
            await asyncio.sleep(self.timing.tick_s)
            self._stats = self._sampler.sample()
            self._refresh_view()

    # -- inbound ----------------------------------------------------------------------------

    async def _on_rfb(self, msg: Msg) -> None:
        rfb = self._rfb(msg)
        if rfb is None:
            return
        if not rfb.shapes:  # a hello from a new leadership: a heartbeat now, no bids
            self._wake.set()
            return
        view, strategy = self._view, self.strategy
        keeps = rfb.keep == self.node_id  # a re-auction of what this node runs: keep-bid
        reply = BidReply(auction_id=rfb.auction_id, node_id=self.node_id,
                         answers=[answer(strategy, shape, keep_view(view, shape) if keeps
                                         else view, i)
                                  for i, shape in enumerate(rfb.shapes)])
        await self._send(self._bids_subject, reply)

    async def _on_award(self, msg: Msg) -> None:
        award = self._award(msg)
        if award is None:
            return
        if not self._supervisor.admit(award.epoch):
            self._refused.count(OLDER_AWARD, f"{award.instance_id} (epoch {award.epoch})")
            return
        ignored = await self._supervisor.award(award)
        if ignored is not None:
            self._refused.count(ignored, award.instance_id)

    async def _on_cancel(self, msg: Msg) -> None:
        cancel = self._cancel(msg)
        if cancel is None:
            return
        if not self._supervisor.admit(cancel.epoch):
            self._refused.count(OLDER_CANCEL, f"{cancel.instance_id} (epoch {cancel.epoch})")
            return
        await self._supervisor.cancel(cancel.instance_id, cancel.attempt)

    # -- outbound ---------------------------------------------------------------------------

    async def _report(self, instance_id: str, attempt: int, type_: str, reason: str,
                      detail: str, exit_code: int | None, *,
                      ports: dict[str, int] | None = None,
                      taken: list[int] | None = None, check: str = "",
                      restarts: int = 0) -> None:
        log.info("instance %s attempt %d: %s %s %s%s", instance_id, attempt, type_, reason,
                 f"{check}: " if check else "", detail)
        if type_ == EventType.RUNNING:
            self.outputs.started(instance_id)
        elif type_ in NODE_ENDS:  # what `gavel logs` says of it, and when its retention starts
            self.outputs.ended(instance_id, f"{type_}" + (f": {reason}" if reason else "")
                               + (f" (exit {exit_code})" if exit_code is not None else ""))
        event = self._reports.event(instance_id, attempt, type_, reason, detail, exit_code,
                                    ports=ports, taken=taken, check=check, restarts=restarts)
        await self._send(self._report_subject, event)

    async def _send(self, subject: str, message: Message) -> None:
        """Publish now, or keep it for when the connection exists; log what NATS refuses."""
        data = self._encoder.encode(message)
        if self._nc is None:
            self._outbox.append((subject, data))
            return
        try:
            await self._nc.publish(subject, data)
        except nats.errors.Error as exc:
            log.warning("dropped %s on %s: %s", type(message).__name__, subject, exc)

