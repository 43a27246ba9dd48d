"""Re-auction in the broker: running replicas move when the market says a move pays
(`shared.reauction`), health-gated the way a rolling deploy replaces a replica.

Rules:
1. Off unless the broker is given settings (``--rebalance-every-s``): the cluster-wide
   switch; which instances may move is `shared.reauction` rule 1. A round runs every
   ``every_s``, and a tick after capacity changes:
   a node the broker did not know becomes eligible, or a request newly waits unschedulable
   (looked for when the state changed); one round at a time, its candidates one after
   another, each decided on the state its predecessors' moves left (`shared.reauction`
   rule 6).
2. Candidates come from git: placed replicas, running and healthy (one that is not is the
   keeper's), of a service that is not deploying. The cool-down runs from when this broker
   first saw the replica or last moved it — memory only, like the keeper's clocks: a
   restarted broker waits a cool-down before it moves anything.
3. A candidate's re-auction is an ordinary broadcast auction of its request among the
   eligible, non-draining nodes, its RFB naming the holder (``keep``) for its keep-bid;
   it is decided and judged by `shared.reauction` rules 3-5, with the group's replicas
   per node from git and the shapes of the work that waits unschedulable.
4. A move is a commit (`plan_move`): a new replica of the same version placed on the
   winner, the re-auction's record as its trailer and the judgement as its line, so
   ``gavel why NEW`` says why it is there. The keeper does not count the new copy
   (`Services.moving`) until it has been healthy for the spec's ``update.min_healthy_s``;
   then one commit stops the old replica (REBALANCED) and the new one counts; the old
   one's node is told `ROUTE_DRAIN_TICKS` ticks after it (its event steps the gateways,
   whose routes lead to no cancelling replica), so traffic leaves it before it stops. A new copy
   that ends, or is not healthy within ``update.healthy_deadline_s``, is stopped
   (MOVE_ABANDONED) and the old one stays. A service's moves in flight count against its
   ``update.max_parallel``, and every move spends the cluster-wide budget.
5. The keeper's view of a move is the view it plans on: `moving` maps each new copy to the
   replica it replaces, and the new copy counts from the view on in which that replica is
   stopping or gone (`broker.serviceplans.replicas`), so the stop commit's own view, and
   every later one, counts it with no note changed while planning. A move's commits are
   pure plans (`plan_move`, `plan_finish`); one that finds nothing to do has only its
   effect (`Unmoved`, `Over`), carried out in commit order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned, or_only
from gavel.broker.ledger.plan import View, place, stop, submit
from gavel.broker.ledger.state import State
from gavel.broker.promises import Promises
from gavel.broker.replyroutes import ReplyRoutes
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded
from gavel.shared.messages import Award, BidReply, Capacity, EventType, Health, InstanceState
from gavel.shared.messages import Request as Req
from gavel.shared.reasons import Reason
from gavel.shared.reauction import Budget, Holding, Judgement, Room, Settings, choose, judge
from gavel.shared.records import AuctionRecord, InstanceRecord, auction_trailer
from gavel.shared.spread import Tally
from gavel.transport.tasks import Tasks

__all__ = ["PREFIX", "Finished", "Moved", "Over", "Rebalancer", "Unfinished", "Unmoved",
           "plan_finish", "plan_move"]

#: Re-auctions' ids start so: their replies are this part's, not the auctioneer's.
PREFIX = "re-"
#: Ticks between a moved replica's stop commit and its node's cancel (rule 4): a gateway
#: steps a tick after an event (more on a loaded host), so its routes leave the old copy first.
ROUTE_DRAIN_TICKS = 10


@dataclass(frozen=True)
class Moved:
    """A move's commit landed: tell the winner, start the new copy's clocks."""

    old: str
    new: str
    holder: str
    winner: str


@dataclass(frozen=True)
class Finished:
    """A move's stop commit landed: `stop_id` (the old copy, or an abandoned new one) on
    `node` is stopped for `reason`, and the move of `new` is over."""

    new: str
    stop_id: str
    node: str
    reason: Reason


@dataclass(frozen=True)
class Unmoved:
    """The move to `new` was given up before its commit landed: nothing moved."""

    new: str


@dataclass(frozen=True)
class Unfinished:
    """The stop commit of the move to `new` was given up: the move is still in flight, and
    the keeper does not count the new copy yet."""

    new: str


@dataclass(frozen=True)
class Over:
    """The move to `new` ended without a stop commit: what it would have stopped was no
    longer live when planned."""

    new: str
    reason: Reason


@dataclass
class _Move:
    service: str
    old: str
    new: str
    holder: str
    winner: str
    started: float
    deadline_s: float
    settle_s: float
    committing: bool = False


def plan_move(view: View, *, old: str, holder: str, new: str, decision: Awarded,
              auction_id: str, port_range: list[int], judgement: Judgement) -> Planned | None:
    """Rule 4's first commit: the new copy of `old` placed on the winner; None when `old`
    no longer runs on `holder` or the winner can no longer take it."""
    rec = view.instance(old)
    if rec is None or rec.state.terminal or rec.cancelling or view.placed_on(old) != holder \
            or view.instance(new) is not None:
        return None
    copy = InstanceRecord(instance_id=new, spec=rec.spec, service=rec.service,
                          version=rec.version)
    submit(view, copy)
    awarded = msgspec.structs.replace(decision, request=msgspec.structs.replace(
        decision.request, instance_id=new))
    if place(view, awarded, auction_id, port_range) is None:
        view.drop_instance(new)
        return None
    winner = decision.winner.node_id
    line = (f"service {rec.service}: re-auction moves {old} from {holder} to {winner} as "
            f"{new}: {judgement.sentence(holder)}")
    record = AuctionRecord(auction_id=auction_id, instance_id=new, winner=winner,
                           load=decision.winner.load, tie_broken=decision.tie_broken,
                           bids=list(decision.bids), declines=list(decision.declines),
                           silent=list(decision.silent),
                           summary=f"moved {old} from {holder}: {judgement.sentence(holder)}")
    return Planned(lines=[line], trailers=[auction_trailer(record)],
                   effects=[Moved(old=old, new=new, holder=holder, winner=winner)])


def plan_finish(view: View, *, service: str, new: str, stop_id: str,
                reason: Reason) -> Planned | None:
    """Rule 4's last commit: `stop_id` stopped for `reason` (a move settled: the old copy;
    abandoned: the new one); None when it is no longer live."""
    got = stop(view, stop_id, reason)
    if got is None:
        return None
    _rec, node = got
    line = (f"service {service}: re-auction stops {stop_id}"
            + (f" on {node}" if node else "") + f": {reason}")
    return Planned(lines=[line],
                   effects=[Finished(new=new, stop_id=stop_id, node=node, reason=reason)])


class Rebalancer:
    def __init__(self, ctx: Context, settings: Settings | None, *, promises: Promises,
                 award_for: Callable[[str, str, str], Award | None],
                 free: Callable[[Iterable[str]], dict[str, Capacity]],
                 moving: dict[str, str], routes: ReplyRoutes,
                 rng: random.Random | None = None) -> None:
        self.ctx = ctx
        self.settings = settings
        self.promises = promises
        self.award_for = award_for
        self.free = free
        #: The new copies in flight and the replica each replaces, shared with `Services`
        #: (rule 4).
        self.moving = moving
        self.rng = rng or random.Random()
        self.budget = Budget(settings.budget if settings else 0)
        self.moves: dict[str, _Move] = {}  # new copy -> its move
        self._seen: dict[str, float] = {}  # replica -> first seen or last moved (rule 2)
        self._known: set[str] | None = None
        self._state: State | None = None  # the state the waiting work was read from
        self._waiting: set[str] = set()
        self._next = ctx.now() + (settings.every_s if settings else 0.0)
        self._task: asyncio.Task[None] | None = None
        self._rounds = Tasks("rebalancer", ctx.log)  # one round at a time: `_task`
        #: Cancels waiting for the gateways to route around the old copy (rule 4).
        #: Cancels told later (`_stopped`), with when each is due on the loop's clock: uvloop
        #: hands back a `Handle` without `when()` for a delay under a millisecond.
        self._drains: list[tuple[float, asyncio.Handle]] = []
        self._auction: Auction | None = None
        self._answered: asyncio.Event = asyncio.Event()
        #: Re-auctions by how they ended, and moves finished or abandoned.
        self.outcomes: Counter[str] = Counter()
        self.moved_total = 0
        self.abandoned_total = 0
        #: Moves waiting for their first commit to land (`Moved`) or be given up.
        self._landing: dict[str, asyncio.Future[bool]] = {}
        ctx.committer.effects.on(Moved, self._moved)
        ctx.committer.effects.on(Finished, self._finished)
        ctx.committer.effects.on(Unmoved, self._unmoved)
        ctx.committer.effects.on(Unfinished, self._unfinished)
        ctx.committer.effects.on(Over, lambda e, _sha: self._done(e.new, e.reason))
        routes.add(self.divert)

    # -- the loop's pass -----------------------------------------------------------------
    def watch(self, now: float) -> None:
        """Rule 1: settle the moves in flight; start a round when one is due."""
        s = self.settings
        if s is None or self.ctx.ledger.pinned:
            return
        state = self.ctx.ledger.state()
        self._settle(state, now)
        nodes = set(self.ctx.liveness.eligible(now))
        soon = now + self.ctx.timing.tick_s
        if self._known is not None and nodes - self._known:
            self._next = min(self._next, soon)
        self._known = nodes
        if state is not self._state:
            self._state = state
            waiting = set(_waiting(state))
            if waiting - self._waiting:
                self._next = min(self._next, soon)
            self._waiting = waiting
        if now < self._next or (self._task is not None and not self._task.done()):
            return
        self._next = now + s.every_s
        self._task = self._rounds.spawn(self._round(s), name="re-auction round")

    async def close(self) -> None:
        for _, handle in self._drains:  # a broker started again tells the node (its watchdog)
            handle.cancel()
        await self._rounds.aclose(None)

    def divert(self, reply: BidReply) -> bool:
        """The auctioneer's replies to re-auctions come here (rule 3)."""
        if not reply.auction_id.startswith(PREFIX):
            return False
        auction = self._auction
        if auction is not None and auction.auction_id == reply.auction_id:
            auction.receive(reply, self.ctx.now())
            if auction.done(self.ctx.now()):
                self._answered.set()
        return True

    # -- a round -------------------------------------------------------------------------
    async def _round(self, s: Settings) -> None:
        try:
            now = self.ctx.now()
            state = self.ctx.ledger.state()
            holdings = self._holdings(state, now)
            flying = Counter(m.service for m in self.moves.values())
            draining = {nid for nid, nf in state.nodes.items() if nf.draining}
            chosen = choose(holdings, now, s, self.budget, self.rng, in_flight=flying,
                            draining=draining)
            # what waits for room, once a round (not a scan of every record per candidate)
            waiting = [Req.of(iid, state.instances[iid].spec) for iid in _waiting(state)] \
                if chosen else []
            for h in chosen:
                if self.budget.left(self.ctx.now()) == 0:
                    break
                await self._reauction(s, h, waiting)
        except Exception:
            self.ctx.log.exception("re-auction round failed; the next one tries again")

    def _holdings(self, state: State, now: float) -> list[Holding]:
        """Rule 2: the placed, healthy replicas of services that are not deploying."""
        out: list[Holding] = []
        seen = self._seen
        for name, svc in state.services.items():
            dep = svc.deployment
            if dep is not None and dep.state == "running":
                continue
            for rec in state.replicas_of(name):
                iid = rec.instance_id
                node = state.placement_of(iid)
                if node is None or rec.state.terminal or rec.cancelling or iid in self.moving:
                    continue
                placed = seen.setdefault(iid, now)
                note = self.promises.health.get(iid)
                healthy = note.health == Health.HEALTHY if note is not None else (
                    not rec.spec.checks and rec.state is InstanceState.RUNNING)
                if not healthy:
                    continue
                out.append(Holding(
                    instance_id=iid, node_id=node, kind=rec.spec.type, group=name,
                    move=rec.spec.move, volumes=bool(rec.spec.volumes), placed_at=placed,
                    max_parallel=rec.spec.update.max_parallel))
        return out

    async def _reauction(self, s: Settings, h: Holding, waiting: list[Req]) -> None:
        """Rule 3, and rule 4's first commit when the move pays."""
        ctx = self.ctx
        now = ctx.now()
        state = ctx.ledger.state()
        rec = state.instances.get(h.instance_id)
        if rec is None or state.placement_of(h.instance_id) != h.node_id:
            return
        draining = {nid for nid, nf in state.nodes.items() if nf.draining}
        beats = ctx.liveness.heartbeats
        eligible = [n for n in ctx.liveness.eligible(now)
                    if n not in draining and not (n in beats and beats[n].draining)]
        if h.node_id not in eligible or len(eligible) < 2:
            return
        request = Req.of(rec.instance_id, rec.spec, group=rec.service)
        aid = f"{PREFIX}{uuid.uuid4().hex[:12]}"
        auction = Auction(aid, [request], eligible, now, ctx.timing.bid_deadline_s)
        self._auction = auction
        self._answered.clear()
        ctx.outbox.publish(subjects.RFB, msgspec.structs.replace(auction.rfb(),
                                                                 keep=h.node_id))
        ctx.outbox.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), auction.deadline_s)
        self._auction = None
        state = ctx.ledger.state()
        free = self.free(eligible)
        if h.node_id in free:
            free[h.node_id] = free[h.node_id] + request
        held = self._held(state, rec.service, h)
        labels = {n: dict(beats[n].labels) for n in eligible if n in beats}
        decision = auction.decide(ctx.now(), free, held=held, labels=labels)[0]
        winner = decision.winner.node_id if isinstance(decision, Awarded) else ""
        verdict = judge(request, h.node_id, decision, margin=s.margin,
                        holder_room=self._room(state, h.node_id),
                        winner_room=self._room(state, winner) if winner else None,
                        waiting=waiting, tally=Tally(held, labels))
        self.outcomes[verdict.outcome] += 1
        if not verdict.moves or not isinstance(decision, Awarded):
            return
        await self._commit_move(s, h, rec, decision, aid, verdict)

    @staticmethod
    def _held(state: State, service: str, h: Holding) -> dict[str, dict[str, int]]:
        """The service's live replicas per node, the candidate left out (rule 3)."""
        per = state.held_by(service)
        per[h.node_id] = per.get(h.node_id, 1) - 1
        return {service: per}

    def _room(self, state: State, node: str) -> Room:
        hb = self.ctx.liveness.heartbeats.get(node)
        capacity = hb.capacity if hb is not None else Capacity()
        return Room(capacity, state.committed.get(node) or Capacity(),
                    dict(hb.labels) if hb else {})

    async def _commit_move(self, s: Settings, h: Holding, rec: InstanceRecord,
                           decision: Awarded, aid: str, verdict: Judgement) -> None:
        ctx = self.ctx
        new = self._new_id(ctx.ledger.state(), rec.service)
        winner = decision.winner.node_id
        hb = ctx.liveness.heartbeats.get(winner)
        update = rec.spec.update
        self.moves[new] = _Move(service=rec.service, old=h.instance_id, new=new,
                                holder=h.node_id, winner=winner, started=ctx.now(),
                                deadline_s=update.healthy_deadline_s,
                                settle_s=update.min_healthy_s)
        self.moving[new] = h.instance_id
        landed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._landing[new] = landed
        plan = functools.partial(plan_move, old=h.instance_id, holder=h.node_id, new=new,
                                 decision=decision, auction_id=aid,
                                 port_range=list(hb.port_range) if hb else [],
                                 judgement=verdict)
        ctx.committer.submit(Item(plan=functools.partial(or_only, plan=plan,
                                                         effects=(Unmoved(new),)),
                                  retry=False, gave_up=[Unmoved(new)]))
        try:
            ok = await landed
        finally:
            self._landing.pop(new, None)
        if ok:
            self.budget.spend(ctx.now())
            self._seen[h.instance_id] = ctx.now()
            self._seen[new] = ctx.now()
        else:
            self.moves.pop(new, None)
            self.moving.pop(new, None)

    def _new_id(self, state: State, name: str) -> str:
        while True:
            iid = f"{name}-{self.rng.getrandbits(24):06x}"
            if iid not in state.instances and iid not in self.moves:
                return iid

    def _moved(self, e: Moved, sha: str) -> None:
        """The move's commit is durable: the winner is told, the new copy's clocks start."""
        ctx = self.ctx
        rec = ctx.ledger.state().instances.get(e.new)
        ctx.timers.placed(e.new, e.winner, ctx.now(), ctx.timing,
                          rec.spec.timeout_s if rec else None)
        award = self.award_for(e.new, e.winner, sha)
        if award is not None:
            ctx.outbox.publish(subjects.AWARD.format(node=e.winner), award)
        ctx.events.emit(e.new, EventType.PLACED, node_id=e.winner,
                        detail=f"commit {sha[:12]}; moved here from {e.holder} "
                               f"(replaces {e.old})")
        if (landed := self._landing.get(e.new)) is not None:
            _settle_future(landed, True)

    def _unmoved(self, e: Unmoved, _sha: str) -> None:
        if (landed := self._landing.get(e.new)) is not None:
            _settle_future(landed, False)

    def _unfinished(self, e: Unfinished, _sha: str) -> None:
        m = self.moves.get(e.new)
        if m is not None:
            m.committing = False

    # -- rule 4: a move in flight settles, or is abandoned ----------------------------
    def _settle(self, state: State, now: float) -> None:
        for m in list(self.moves.values()):
            if m.committing:
                continue
            old = state.instances.get(m.old)
            new = state.instances.get(m.new)
            if new is None:
                continue  # its commit has not landed yet
            note = self.promises.health.get(m.new)
            healthy_for = now - note.since if note is not None and \
                note.health == Health.HEALTHY else None
            if new.state.terminal or new.cancelling or (
                    healthy_for is None and now - m.started >= m.deadline_s):
                self._finish(m, stop_id=m.new, reason=Reason.MOVE_ABANDONED)
            elif old is None or old.state.terminal or old.cancelling:
                self._finish(m, stop_id="", reason=Reason.REBALANCED)  # gone anyway
            elif healthy_for is not None and healthy_for >= m.settle_s:
                self._finish(m, stop_id=m.old, reason=Reason.REBALANCED)

    def _finish(self, m: _Move, *, stop_id: str, reason: Reason) -> None:
        """One commit: stop `stop_id` (none: nothing to stop) and let the keeper count the
        new copy if it stays."""
        if not stop_id:
            self._done(m.new, reason)
            return
        m.committing = True
        plan = functools.partial(plan_finish, service=m.service, new=m.new, stop_id=stop_id,
                                 reason=reason)
        self.ctx.committer.submit(Item(
            plan=functools.partial(or_only, plan=plan, effects=(Over(m.new, reason),)),
            retry=False, gave_up=[Unfinished(m.new)]))

    def _done(self, new: str, reason: Reason) -> None:
        """The move of `new` is over: the keeper counts the new copy if it stays."""
        self.moves.pop(new, None)
        self.moving.pop(new, None)
        if reason is Reason.REBALANCED:
            self.moved_total += 1
        else:
            self.abandoned_total += 1

    def _finished(self, e: Finished, _sha: str) -> None:
        """The stop commit is durable: the stopped copy's node is told, the move ends."""
        self._stopped(e.stop_id, e.node, e.reason)
        self._done(e.new, e.reason)

    def _stopped(self, iid: str, node: str, reason: Reason) -> None:
        if node and reason is Reason.REBALANCED:
            # The old copy leaves the routes first: its event steps the gateways (a
            # cancelling replica leads nowhere), and its node is told a few ticks later, so
            # no request is sent to a process that is stopping.
            self.ctx.events.emit(iid, EventType.STOPPING, node_id=node, reason=reason)
            loop = asyncio.get_running_loop()
            now, delay = loop.time(), ROUTE_DRAIN_TICKS * self.ctx.timing.tick_s
            self._drains = [(due, h) for due, h in self._drains
                            if not h.cancelled() and due > now]
            self._drains.append((now + delay, loop.call_later(
                delay, self.promises.send_cancel, iid, node)))
        elif node:
            self.promises.send_cancel(iid, node)
        else:
            self.ctx.events.emit(iid, EventType.CANCELLED, reason=reason)
            self.promises.ended(iid)


def _settle_future(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _waiting(state: State) -> list[str]:
    """The instances that wait unschedulable: pending, and found no room."""
    instances = state.instances
    return [iid for iid in state.pending if (rec := instances.get(iid)) is not None
            and rec.state is InstanceState.UNSCHEDULABLE]
