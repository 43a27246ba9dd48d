"""The broker: a thin shell that runs auctions over NATS and commits awards to git.

Rules:
1. The broker keeps nothing it cannot re-derive: pending work is "desired instances with no
   placement" read from git each tick; liveness comes from heartbeats; in-flight auctions are
   simply re-run after a restart.
2. An award is durable in git before its winner hears of it.
3. Every message from the wire is decoded by one typed decoder per endpoint; anything
   malformed, impersonating another node or stale is counted, logged once per kind, dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.msg import Msg

from broker.committer import Committer, Item, Planned
from broker.ledger import Ledger
from broker.plan import View, finish, place, requeue, unschedulable
from broker.rejects import Rejects
from shared import subjects
from shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict
from shared.health import Health, Liveness
from shared.lifecycle import PENDING
from shared.messages import (
    RFB,
    Award,
    BidReply,
    Capacity,
    Event,
    EventType,
    Heartbeat,
    InstanceState,
    Request,
)
from shared.reasons import Reason, render
from shared.records import AuctionRecord, auction_trailer
from shared.timing import Timing

__all__ = ["Broker"]

log = logging.getLogger("gavel.broker")

_hb_dec = msgspec.msgpack.Decoder(Heartbeat)
_bids_dec = msgspec.msgpack.Decoder(BidReply)
_event_dec = msgspec.msgpack.Decoder(Event)
_enc = msgspec.msgpack.Encoder()

#: Worker-reported failures that could succeed on another node: they consume an attempt.
RETRYABLE = frozenset({Reason.DRIVER_FAILED.value})


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
        batch_max: int = 256,
        nats_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.timing = timing or Timing()
        self.ledger = Ledger(state_dir / "state.git", ref)
        self.committer = Committer(self.ledger, retry_s=self.timing.tick_s)
        self.liveness = Liveness(self.timing)
        self.secrets = dict(secrets or {})
        self.now = clock
        self.batch_max = batch_max
        self.nats_options = dict(nats_options or {})
        self.rejects = Rejects(log)
        self.auctions: dict[str, Auction] = {}
        self.inflight: set[str] = set()
        self.reserved: dict[str, Capacity] = {}
        self.retry_at: dict[str, float] = {}
        self.live: dict[str, tuple[str, str]] = {}  # instance -> (state, node) from reports
        self.pinned_reported: set[str] = set()
        self.recent: dict[str, AuctionRecord] = {}
        self.events: deque[Event] = deque(maxlen=2000)
        self.round_times: deque[float] = deque(maxlen=10_000)
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.nc: Any = None
        self.api: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        from broker.api import Api

        self.nc = await nats.connect(
            self.nats_url, name="gavel-broker", max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, **self.nats_options)
        await self.nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        await self.nc.subscribe(subjects.BIDS_ALL, cb=self._on_bids)
        await self.nc.subscribe(subjects.REPORT_ALL, cb=self._on_report)
        self.api = Api(self)
        await self.api.start(self.nc)
        self._tasks = [asyncio.create_task(self.committer.run(), name="committer"),
                       asyncio.create_task(self._reconcile_loop(), name="reconcile")]
        log.info("broker up: state %s ref %s", self.ledger.path, self.ledger.ref)

    async def run(self) -> None:
        await self.start()
        await self._stopped.wait()
        await self.close()

    def stop(self) -> None:
        self._stopped.set()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: PERF203
                pass
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.drain()

    def wake(self) -> None:
        self._wake.set()

    # -- publishing ----------------------------------------------------------------------
    def _publish(self, subject: str, msg: msgspec.Struct) -> None:
        asyncio.ensure_future(self.nc.publish(subject, _enc.encode(msg)))

    def emit(self, instance_id: str, type_: EventType, node_id: str = "",
             reason: str = "", detail: str = "", exit_code: int | None = None,
             attempt: int = 0) -> None:
        ev = Event(instance_id=instance_id, type=type_, node_id=node_id, reason=reason,
                   detail=detail, exit_code=exit_code, attempt=attempt, at=time.time())
        self.events.append(ev)
        self._publish(subjects.EVENTS.format(instance=instance_id), ev)

    # -- heartbeats ----------------------------------------------------------------------
    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = _hb_dec.decode(msg.data)
        except msgspec.DecodeError:
            self.rejects.count("malformed heartbeat", msg.subject)
            return
        if subjects.node_of(msg.subject) != hb.node_id:
            self.rejects.count("heartbeat for another node", msg.subject)
            return
        before = self.liveness.record(hb, self.now())
        if before is not Health.HEALTHY:
            log.info("node %s is %s", hb.node_id, "up" if before is None else "back")
            self.retry_at.clear()
            self.wake()

    # -- auctions ------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One idempotent pass: auction every pending instance that is not in flight."""
        now = self.now()
        state = self.ledger.state()
        pending = [r for r in state.instances.values()
                   if r.state in PENDING and r.instance_id not in self.inflight
                   and self.retry_at.get(r.instance_id, 0.0) <= now]
        if not pending:
            return
        if self.ledger.pinned:
            for r in pending:
                if r.instance_id not in self.pinned_reported:
                    self.pinned_reported.add(r.instance_id)
                    self.emit(r.instance_id, EventType.ERROR, reason=Reason.PINNED,
                              detail=self.ledger.ref)
            return
        eligible = self.liveness.eligible(now)
        groups: dict[tuple[str, ...], list[Request]] = {}
        for r in sorted(pending, key=lambda r: r.instance_id):
            groups.setdefault(tuple(r.excluded), []).append(Request.of(r.instance_id, r.spec))
        for excluded, requests in groups.items():
            candidates = [n for n in eligible if n not in excluded] or eligible
            for i in range(0, len(requests), self.batch_max):
                self.open_auction(requests[i:i + self.batch_max], candidates, now)

    def open_auction(self, requests: list[Request], candidates: list[str], now: float) -> None:
        aid = uuid.uuid4().hex[:12]
        auction = Auction(aid, requests, candidates, now, self.timing.bid_deadline_s)
        self.auctions[aid] = auction
        self.inflight.update(r.instance_id for r in requests)
        if not candidates:
            self._close(auction)
            return
        rfb = RFB(auction_id=aid, requests=requests, deadline_s=self.timing.bid_deadline_s)
        self._publish(subjects.RFB, rfb)
        asyncio.get_running_loop().call_later(self.timing.bid_deadline_s, self._deadline, aid)

    def _deadline(self, aid: str) -> None:
        auction = self.auctions.get(aid)
        if auction is not None:
            self._close(auction)

    async def _on_bids(self, msg: Msg) -> None:
        try:
            reply = _bids_dec.decode(msg.data)
        except msgspec.DecodeError:
            self.rejects.count("malformed bid reply", msg.subject)
            return
        if subjects.node_of(msg.subject) != reply.node_id:
            self.rejects.count("bid for another node", msg.subject)
            return
        auction = self.auctions.get(reply.auction_id)
        if auction is None:
            self.rejects.count(Verdict.WRONG_AUCTION, msg.subject)
            return
        now = self.now()
        verdict = auction.receive(reply, now)
        if verdict is not Verdict.ACCEPTED:
            self.rejects.count(verdict, msg.subject)
        if auction.done(now):
            self._close(auction)

    def free(self) -> dict[str, Capacity]:
        """Per node: heartbeat capacity minus what git and undelivered awards commit there."""
        state = self.ledger.state()
        out: dict[str, Capacity] = {}
        for node_id, hb in self.liveness.heartbeats.items():
            cap = hb.capacity
            free = Capacity(cpu=cap.cpu, memory_mb=cap.memory_mb, ports=cap.ports)
            nf = state.nodes.get(node_id)
            for pl in (nf.instances.values() if nf else ()):
                free.cpu -= pl.spec.cpu
                free.memory_mb -= pl.spec.memory_mb
                free.ports -= len(pl.spec.ports)
            res = self.reserved.get(node_id)
            if res is not None:
                free.cpu -= res.cpu
                free.memory_mb -= res.memory_mb
                free.ports -= res.ports
            out[node_id] = free
        return out

    def _close(self, auction: Auction) -> None:
        del self.auctions[auction.auction_id]
        now = self.now()
        decisions = auction.decide(now, self.free())
        self.round_times.append(now - auction.opened_at)
        for d in decisions:
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, +1)
                self.emit(d.request.instance_id, EventType.SCHEDULED, node_id=d.winner.node_id,
                          detail=f"load {d.winner.load:.3f} ({d.winner.strategy})")
        self.committer.submit(Item(
            plan=lambda view: self._plan_auction(view, auction.auction_id, decisions),
            failed=lambda reason, detail: self._auction_failed(decisions, reason, detail),
            retry=False))

    def _reserve(self, node_id: str, req: Request, sign: int) -> None:
        res = self.reserved.setdefault(node_id, Capacity())
        res.cpu += sign * req.cpu
        res.memory_mb += sign * req.memory_mb
        res.ports += sign * req.ports

    def _plan_auction(self, view: View, aid: str, decisions: list[Decision]) -> Planned:
        out = Planned(lines=[])
        for d in decisions:
            iid = d.request.instance_id
            record = _record(aid, d)
            if isinstance(d, Awarded):
                port_range = self.liveness.heartbeats[d.winner.node_id].port_range \
                    if d.winner.node_id in self.liveness.heartbeats else []
                placement = place(view, d, aid, port_range)
                if placement is None:
                    out.after.append(lambda _sha, d=d: self._released(d, placed=False))
                    continue
                out.lines.append(_place_line(d))
                out.trailers.append(auction_trailer(record))
                out.after.append(lambda sha, d=d, p=placement, r=record:
                                 self._placed(d, p.ports, p.attempt, sha, r))
            else:
                if unschedulable(view, d):
                    out.lines.append(f"unschedulable {iid}: {d.summary}")
                    out.trailers.append(auction_trailer(record))
                out.after.append(lambda _sha, d=d, r=record: self._unschedulable(d, r))
        return out

    def _placed(self, d: Awarded, ports: dict[str, int], attempt: int, sha: str,
                record: AuctionRecord) -> None:
        iid, node = d.request.instance_id, d.winner.node_id
        self._released(d, placed=True)
        self.recent[iid] = record
        rec = self.ledger.state().instances.get(iid)
        if rec is None:
            return
        secret_env = {name: self.secrets[name] for name in rec.spec.secrets
                      if name in self.secrets}
        award = Award(auction_id=record.auction_id, instance_id=iid, node_id=node,
                      spec=rec.spec, ports=ports, attempt=attempt, commit=sha,
                      secret_env=secret_env)
        self._publish(subjects.AWARD.format(node=node), award)
        self.live[iid] = (InstanceState.PLACED, node)
        self.emit(iid, EventType.PLACED, node_id=node, attempt=attempt,
                  detail=f"commit {sha[:12]}; {len(d.bids)} bids, load {d.winner.load:.3f}"
                  f"{' (tie broken on node id)' if d.tie_broken else ''}")
        log.info("placed %s on %s: %d bids, load %.3f, commit %s", iid, node, len(d.bids),
                 d.winner.load, sha[:12])

    def _released(self, d: Awarded, placed: bool) -> None:
        self._reserve(d.winner.node_id, d.request, -1)
        self.inflight.discard(d.request.instance_id)
        if not placed:
            self.wake()

    def _unschedulable(self, d: Unschedulable, record: AuctionRecord) -> None:
        iid = d.request.instance_id
        self.inflight.discard(iid)
        self.recent[iid] = record
        self.retry_at[iid] = self.now() + self.timing.heartbeat_s
        self.emit(iid, EventType.UNSCHEDULABLE, reason=d.reason, detail=d.summary)

    def _auction_failed(self, decisions: list[Decision], reason: Reason, detail: str) -> None:
        for d in decisions:
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, -1)
            self.inflight.discard(iid)
            self.retry_at[iid] = self.now() + self.timing.tick_s
            self.emit(iid, EventType.ERROR, reason=reason, detail=detail)

    # -- reports from workers ------------------------------------------------------------
    async def _on_report(self, msg: Msg) -> None:
        try:
            ev = _event_dec.decode(msg.data)
        except msgspec.DecodeError:
            self.rejects.count("malformed event", msg.subject)
            return
        node = subjects.node_of(msg.subject)
        if node != ev.node_id:
            self.rejects.count("event for another node", msg.subject)
            return
        if self.ledger.state().placement_of(ev.instance_id) != node:
            self.rejects.count("event for an instance not placed on that node", msg.subject)
            return
        self.events.append(ev)
        self._publish(subjects.EVENTS.format(instance=ev.instance_id), ev)
        match ev.type:
            case EventType.PROVISIONING | EventType.RUNNING:
                self.live[ev.instance_id] = (ev.type, node)
            case EventType.EXITED:
                self._end(ev, InstanceState.SUCCEEDED)
            case EventType.CANCELLED:
                self._end(ev, InstanceState.CANCELLED)
            case EventType.FAILED:
                if ev.reason in RETRYABLE:
                    self.committer.submit(Item(plan=lambda v, ev=ev: self._plan_requeue(v, ev)))
                else:
                    self._end(ev, InstanceState.FAILED)
            case _:
                self.rejects.count("event of an unknown type", msg.subject)

    def _end(self, ev: Event, to: InstanceState) -> None:
        def plan(view: View) -> Planned | None:
            if finish(view, ev.instance_id, ev.node_id, to, ev.reason, ev.detail) is None:
                return None
            code = "" if ev.exit_code is None else f" (exit {ev.exit_code})"
            return Planned(lines=[f"{to} {ev.instance_id} on {ev.node_id}{code}"],
                           after=[lambda _sha: self._ended(ev.instance_id)])
        self.committer.submit(Item(plan=plan))

    def _plan_requeue(self, view: View, ev: Event) -> Planned | None:
        new = requeue(view, ev.instance_id, ev.node_id, Reason(ev.reason), ev.detail)
        if new is None:
            return None
        line = (f"requeue {ev.instance_id} off {ev.node_id}: {ev.reason}"
                if new.state is InstanceState.QUEUED
                else f"{new.state} {ev.instance_id}: {new.detail}")
        return Planned(lines=[line], after=[lambda _sha: self._ended(ev.instance_id)])

    def _ended(self, iid: str) -> None:
        self.live.pop(iid, None)
        self.retry_at.clear()  # capacity was freed: waiting instances may fit now
        self.wake()

    # -- the loop ------------------------------------------------------------------------
    async def _reconcile_loop(self) -> None:
        while True:
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile failed; retrying next tick")
            try:
                await asyncio.wait_for(self._wake.wait(), self.timing.tick_s)
            except TimeoutError:
                pass
            self._wake.clear()


def _record(aid: str, d: Decision) -> AuctionRecord:
    if isinstance(d, Awarded):
        return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id,
                             winner=d.winner.node_id, load=d.winner.load,
                             tie_broken=d.tie_broken, bids=d.bids, declines=d.declines,
                             silent=d.silent)
    return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id, bids=d.bids,
                         declines=d.declines, silent=d.silent, reason=d.reason,
                         summary=d.summary)


def _place_line(d: Awarded) -> str:
    w = d.winner
    others = len(d.bids) - 1
    tie = ", tie broken on node id" if d.tie_broken else ""
    declines = "; ".join(f"{x.node_id} {render(x.reason, x.detail)}" for x in d.declines)
    return (f"place {d.request.instance_id} on {w.node_id}: load {w.load:.3f} "
            f"({w.strategy}) beat {others} other bid{'s' if others != 1 else ''}{tie}"
            + (f"; declined: {declines}" if declines else ""))
