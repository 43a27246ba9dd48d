"""`gavel plan`: the auction a spec would get, run without committing or reserving anything.

Rules:
1. A plan asks every eligible node with a dry-run RFB (`RFB.dry_run`) and decides with the
   award rule every auction uses (`shared.auction.Auction.decide`), on the capacity free
   now (heartbeats, git and undelivered awards): the answer is what a real request would
   get if nothing changed in between. It never goes through the auctioneer's core, so no
   capacity is reserved and no instance is put in flight; it never submits to the
   committer, so git's commit count is unchanged.
2. A plan is always a broadcast (never sampled): it answers "where could this go" for the
   whole fleet, and its cost is one operator's request, not the hot path.
3. Its replies come in on the bid subject with the real auctions' (the auctioneer hands a
   reply for a plan's auction id to the plan: `Auctioneer.dry`) and are judged as theirs: a
   duplicate, a bad load or reason is a reject; one from a node not asked, or one after the
   plan closed (for one of the last `CLOSED_KEPT` plans), is late, not a reject.
4. What is placed: a job's first wave (`count`, or `parallelism` of an array); a new
   service's `count` replicas; a service's new version, `count` replicas (and every live
   replica is stopped as they become healthy); a service's new count, the replicas it adds
   or, scaled down, the ones the keeper would stop first (`broker.keeper.stop_order`, as far
   as health is known here); a system job, one on every node that bids. At most
   `PLANNED_MAX` instances are auctioned.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import Callable

import msgspec

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.auctionlog import record
from gavel.broker.context import Context
from gavel.broker.keeper import Replica, stop_order
from gavel.shared import subjects
from gavel.shared.affinity import warnings
from gavel.shared.api import InstanceStatus
from gavel.shared.auction import Auction, Decision, Verdict
from gavel.shared.messages import BidReply, Decline, Message, Request
from gavel.shared.planning import (
    PLACEMENTS_SHOWN,
    PlanReply,
    PlanRequest,
    spec_diff,
    version_index,
)
from gavel.shared.reasons import Reason
from gavel.shared.records import AuctionRecord, InstanceRecord, ServiceRecord
from gavel.shared.spec import Spec

__all__ = ["CLOSED_KEPT", "PLANNED_MAX", "Planner"]

#: Instances one plan auctions at most (rule 4).
PLANNED_MAX = 1000
#: Closed plans whose late answers are recognised (rule 3).
CLOSED_KEPT = 256


class Planner:
    def __init__(self, ctx: Context, auctioneer: Auctioneer, *,
                 refused: Callable[[Spec], Message | None],
                 instance_status: Callable[[InstanceRecord], InstanceStatus]) -> None:
        self.ctx = ctx
        self.auctioneer = auctioneer
        self._refused = refused
        self._instance_status = instance_status
        self._closed: deque[str] = deque()

    async def plan(self, req: PlanRequest) -> Message:
        spec = req.spec
        refused = self._refused(spec)
        if refused is not None:
            return refused
        out = PlanReply(name=spec.name, type=spec.type)
        world = self.auctioneer.core.world
        out.warnings = warnings(spec.affinities, world.labels().values())
        requests = self._requests(spec, out)
        if not requests:
            return out
        auction = await self._ask(requests)
        held = {spec.name: world.held_by(spec.name)} if auction.groups else {}
        decisions = auction.decide(self.ctx.now(), self.auctioneer.free(auction.eligible),
                                   held=held, labels=world.labels())
        out.placements_total = len(decisions)
        out.placements = _shown(auction.auction_id, decisions, system=spec.system)
        return out

    # -- what a deploy or submission would do (rule 4) ---------------------------------------
    def _requests(self, spec: Spec, out: PlanReply) -> list[Request]:
        name = spec.name
        if not spec.service:
            out.count = spec.count
            n = min(spec.count, spec.parallelism or spec.count, PLANNED_MAX)
            return [Request.of(f"{name}[{k}]", spec) for k in range(1, n + 1)]
        svc = self.ctx.ledger.state().services.get(name)
        out.index = version_index(svc)
        if spec.system:
            if not self._versions(spec, svc, out) and svc is not None:
                out.stops = sorted(r.instance_id for r in self._live(svc))
            return [Request.of(name, spec)] if out.changed else []
        if svc is None:
            out.next_version = 1
            return self._replicas(spec, spec.count)
        live = self._live(svc)
        if not self._versions(spec, svc, out):  # a new version replaces every live replica
            out.stops = sorted(r.instance_id for r in live)
            return self._replicas(spec, spec.count)
        if not out.changed:
            return []
        if svc.stopped:  # started again
            return self._replicas(spec, spec.count)
        mine = [r for r in live if r.version == svc.version]
        if spec.count < len(mine):
            order = stop_order([self._replica(r) for r in mine])
            out.stops = [r.instance_id for r in order[:len(mine) - spec.count]]
            return []
        return self._replicas(spec, spec.count - len(mine))

    def _versions(self, spec: Spec, svc: ServiceRecord | None, out: PlanReply) -> bool:
        """The running version, the next one and the diff; whether `spec` is the running
        version (a count alone is a scale, not a new version: `broker.deploys` rule 1)."""
        if svc is None:
            out.next_version = 1
            return False
        out.version = svc.version
        top = max(v.version for v in svc.versions)
        running = svc.spec_of(svc.version)
        if running is None:
            out.next_version = top + 1
            return False
        out.changes = spec_diff(msgspec.structs.replace(running, count=svc.count), spec)
        same = all(c.field == "count" for c in out.changes)
        out.next_version = svc.version if same else top + 1
        out.changed = bool(out.changes) or svc.stopped
        return same

    def _live(self, svc: ServiceRecord) -> list[InstanceRecord]:
        return [r for r in self.ctx.ledger.state().replicas_of(svc.name)
                if not r.state.terminal and not r.cancelling]

    def _replica(self, rec: InstanceRecord) -> Replica:
        st = self._instance_status(rec)
        return Replica(instance_id=rec.instance_id, version=rec.version,
                       waiting=not st.node_id,
                       healthy_for=0.0 if st.health == "healthy" else None)

    @staticmethod
    def _replicas(spec: Spec, n: int) -> list[Request]:
        return [Request.of(f"{spec.name}[{k}]", spec, group=spec.name)
                for k in range(1, min(n, PLANNED_MAX) + 1)]

    # -- the dry run (rules 1-3) ---------------------------------------------------------------
    async def _ask(self, requests: list[Request]) -> Auction:
        ctx = self.ctx
        world = self.auctioneer.core.world
        now = ctx.now()
        aid = f"plan-{uuid.uuid4().hex[:12]}"
        auction = Auction(aid, requests, world.eligible(now), now, ctx.timing.bid_deadline_s)
        if not auction.eligible:
            return auction
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def receive(reply: BidReply, at: float) -> None:
            draining = world.draining()
            if draining and reply.node_id in draining:  # as the core takes it (its rule 6)
                reply = msgspec.structs.replace(reply, answers=[
                    Decline(shape=a.shape, reason=Reason.DRAINING) for a in reply.answers])
            verdict = auction.receive(reply, at)
            if verdict in (Verdict.LATE, Verdict.NOT_ELIGIBLE):
                self.auctioneer.core.late_total += 1
            elif verdict is not Verdict.ACCEPTED:
                ctx.rejects.count(verdict, subjects.BIDS.format(node=reply.node_id))
            if auction.done(at) and not answered.done():
                answered.set_result(None)

        self.auctioneer.dry[aid] = receive
        try:
            rfb = msgspec.structs.replace(auction.rfb(), dry_run=True)
            ctx.outbox.publish_raw(subjects.RFB, ctx.outbox.encode(rfb))
            ctx.outbox.flush()
            with contextlib.suppress(TimeoutError):  # the silent are shown silent, as in a
                await asyncio.wait_for(answered, auction.deadline_s)  # real round
        finally:
            self._retire(aid)
        return auction

    def _retire(self, aid: str) -> None:
        """Rule 3: answers after the close are late, for the last `CLOSED_KEPT` plans."""
        dry = self.auctioneer.dry
        dry[aid] = self._late
        self._closed.append(aid)
        while len(self._closed) > CLOSED_KEPT:
            dry.pop(self._closed.popleft(), None)

    def _late(self, _reply: BidReply, _at: float) -> None:
        self.auctioneer.core.late_total += 1


def _shown(aid: str, decisions: list[Decision], *, system: bool) -> list[AuctionRecord]:
    """The placements as `why` shows auctions; a system job's one decision becomes one
    placement per node that bid (each would run one)."""
    if system:
        d = decisions[0]
        return [AuctionRecord(auction_id=aid, instance_id=f"{d.request.instance_id}@"
                              f"{b.node_id}", winner=b.node_id, load=b.load, bids=[b])
                for b in sorted(d.bids, key=lambda b: b.node_id)] + (
            [AuctionRecord(auction_id=aid, instance_id=d.request.instance_id,
                           declines=list(d.declines), silent=list(d.silent),
                           summary="the nodes that would not run one")]
            if d.declines or d.silent else [])
    return [record(aid, d) for d in decisions[:PLACEMENTS_SHOWN]]
