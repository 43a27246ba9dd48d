"""The auctioneer's rules, sans-IO: which auctions to open, whom to ask, what was decided.

The broker (`broker.auctioneer`, with the real clock, NATS and git) and the simulator
(`sim.market`, in virtual time) drive this one object. It is fed ``now``, a `World` (the
pending work and the node views) and bid replies; it never reads a clock, sends or writes.
What it wants done comes back as actions from `take` (`shared.auctionworld`); `timer` says
when it wants `handle_timer` at the latest (an auction's deadline or the end of a wait).

Rules (the numbers are `broker.auctioneer`'s, where operators read them):
1. Pending work is read from the world on every pass, oldest first: instances in flight
   (auctioned, or awarded and not yet committed) and those parked until a retry time are
   skipped (by membership, unread: `shared.waiting`); of what is due, no more than the
   room for auctions can take is kept - the highest priority first (`Spec.priority`), the
   oldest first within a priority. A pass that found nothing due remembers the pending
   work's tail and the earliest retry time ahead: until then, and while nothing is
   released, failed or freed, nothing of that work can come due (an instance found
   unschedulable is parked: it only brings the time nearer), so a pass over the same work
   is skipped and one over more reads only what was added.
2. Work is grouped by its excluded nodes; a group is auctioned without them unless no
   other eligible node is left, then with them. What no other node would take (unschedulable
   in an auction that left them out) is asked again at once, of every eligible node with
   them: a node it failed on is a worse choice than another, not no choice (a replica bound
   to a host volume only that node holds would otherwise never be placed again).
3. An award reserves its winner's capacity until `released` (its commit landed, placed or
   not) or `failed` (the commit failed): `free` is heartbeat capacity minus what the world
   commits there minus these reservations, so rounds in flight together never over-commit.
4. An auction opens once `batch_max` requests wait or the oldest has waited `batch_wait_s`;
   no more than `max_auctions` are open at once.
5. Closing an auction opens the next at once when work waits and there is room; an auction
   that closes as it opens (no candidate) asks for another pass (`Wake`) instead of opening
   others from inside the pass that opened it.
6. A reply for an auction that closed (one of the last `CLOSED_KEPT`), or after its
   deadline, from a node it asked that had not answered, is late: counted, not rejected.
   A reply from a node the world says is draining is taken as the declines it should be.
7. An unschedulable instance is retried a heartbeat interval later (`unschedulable`), twice
   that after a second miss in a row, and so on up to 2**`BACKOFF_DOUBLINGS` heartbeats; the
   time is rounded up to a whole tick, so retries come due together and one pass takes
   many of them. One whose commit failed is retried a tick later; `capacity_freed` (a node
   came or capacity was freed) retries every one at once and starts the back-off again:
   what waits for room is asked again when room may have come, not every heartbeat while
   nothing changed (at a hundred thousand waiting instances, a retry every heartbeat is
   ten thousand auctions a second).
8. A round placing replicas is told each group's replicas per node - the world's plus the
   awards not yet committed - and every node's labels.
9. Until `hold_until` no auction opens while no node is eligible.
10. With `sample_d`, an auction asks d nodes per request of each shape among the nodes that
    could ever take it (`shared.candidates`); a request none could ever take is decided at
    once with the declines the nodes would send, and nothing is sent.
11. What d sampled nodes could not place is asked at once of `RETRY_TIMES`·d, then of every
    candidate, before it is declared unschedulable (`shared.candidates` rule 9); the last
    winner of each shape is asked beside the sampled ones. What they could place only by
    displacing other work (`shared.preemption`) is asked again the same way: a node with
    room that was not asked comes before any eviction.
12. An instance bound to one node (`InstanceRecord.only_node`: a system job's) is auctioned
    among that node alone, never sampled; while the node is not eligible its auction has no
    candidate and the instance waits, unschedulable - it is never placed elsewhere.
13. `backlog` is the pending work waiting for a round, neither in flight nor parked
    (`shared.waiting` rule 5): the shell's tuner reads it before each pass (`shared.tuning`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import count, filterfalse
from typing import NamedTuple

import msgspec

from gavel.shared import waiting
from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict, group_shapes
from gavel.shared.auctionworld import Action, Decided, Open, Pinned, Wake, World
from gavel.shared.candidates import RETRY_TIMES, Candidates
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Request
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.urgency import DEFAULT_PRIORITY, Urgent, ranked

__all__ = ["CLOSED_KEPT", "Core", "Decided", "Open", "Pinned", "Wake", "World"]

class _Partial(NamedTuple):
    """A sampled auction that did not ask every candidate of some shape (rule 11)."""

    keys: frozenset[object]  # those shapes' keys
    candidates: list[str]  # the auction's candidates and exclusions, for the retry
    excluded: AbstractSet[str]
    stage: int  # 0 the first draw, 1 the retry of RETRY_TIMES·d


#: Closed auctions whose late answers are recognised (rule 6).
CLOSED_KEPT = 256
#: Rule 7: an instance unschedulable again and again waits up to 2**this heartbeats.
BACKOFF_DOUBLINGS = 3
#: Last winners kept before the table starts again (shapes are few).
WINNERS_KEPT = 2048


class Core:
    def __init__(self, world: World, *, deadline_s: float, heartbeat_s: float, tick_s: float,
                 batch_max: int = 256, sample_d: int | None = None, max_auctions: int = 16,
                 batch_wait_s: float = 0.0, rng: random.Random | None = None,
                 ids: Callable[[], str] | None = None) -> None:
        self.world = world
        self.deadline_s = deadline_s
        self.heartbeat_s = heartbeat_s
        self.tick_s = tick_s
        self.batch_max = batch_max
        self.sample_d = sample_d
        self.max_auctions = max_auctions
        self.batch_wait_s = batch_wait_s
        self.rng = rng or random.Random()
        #: Auction ids: the broker's are random, the simulator's a count.
        self._ids = ids or map("a{}".format, count(1)).__next__
        self.candidates = Candidates()
        self.last_winner: dict[object, str] = {}
        self.auctions: dict[str, Auction] = {}
        self._broadcast: set[str] = set()
        self._closed: dict[str, tuple[AbstractSet[str], AbstractSet[str] | None]] = {}
        self._partial: dict[str, _Partial] = {}
        #: Open auctions that left some excluded nodes out, and which (rule 2).
        self._without: dict[str, AbstractSet[str]] = {}
        self.inflight: set[str] = set()
        self.reserved: dict[str, Capacity] = {}
        #: Rule 1: retry times, and which are still ahead (`shared.waiting`).
        self._retries = waiting.Retries()
        self.retry_at = self._retries.at
        #: Rule 7: instance -> how many auctions in a row found it unschedulable.
        self._misses: dict[str, int] = {}
        #: Rule 1: the pending work a pass found nothing due in, and until when.
        self._idle: waiting.Tail | None = None
        self._idle_until = float("-inf")
        #: Pending work above the default priority (rule 1, `shared.urgency`).
        self._urgent = Urgent()
        #: Replicas awarded and not yet released: instance -> (service, winner) (rule 8).
        self.awarding: dict[str, tuple[str, str]] = {}
        self.waiting_since: float | None = None
        #: When the pass that found too little work wants to run again (rule 4, 9).
        self.wake_at: float | None = None
        self.hold_until = float("-inf")
        self.late_total = 0
        self.auctions_total = 0
        self._opening = False
        self._out: list[Action] = []

    def take(self) -> list[Action]:
        """What to do, in order, since the last `take`."""
        out, self._out = self._out, []
        return out

    def _aid(self) -> str:
        return self._ids()

    # -- timers ----------------------------------------------------------------------------
    def timer(self) -> float | None:
        """When `handle_timer` must run at the latest (None: nothing is timed)."""
        first = next(iter(self.auctions.values()), None)  # opened in order: the earliest
        at = first.deadline if first is not None else None
        if self.wake_at is not None and (at is None or self.wake_at < at):
            at = self.wake_at
        return at

    def handle_timer(self, now: float) -> None:
        for auction in [a for a in self.auctions.values() if a.deadline <= now]:
            if auction.auction_id in self.auctions:
                self.close(auction, now)
        if self.wake_at is not None and self.wake_at <= now:
            self.wake_at = None
            self.reconcile(now)

    def expire(self, aid: str, now: float) -> None:
        """An auction's deadline came (the broker's per-auction timer)."""
        auction = self.auctions.get(aid)
        if auction is not None:
            self.close(auction, now)

    # -- opening (rules 1, 2, 4, 9, 10) ------------------------------------------------------
    def reconcile(self, now: float) -> None:
        if self._opening:  # an auction closed while opening (no candidates): once is enough
            return
        self._opening = True
        try:
            self._reconcile(now)
        finally:
            self._opening = False

    def backlog(self) -> int:
        """Rule 13."""
        return waiting.backlog(self.world.pending(), self.inflight, self._retries.parked)

    def _reconcile(self, now: float) -> None:
        world = self.world
        room = self.max_auctions - len(self.auctions)
        want = max(room, 1) * self.batch_max
        ids = world.pending()
        tail = waiting.tail(ids)
        scan: Iterable[str] = ids
        if self._idle is not None and now < self._idle_until:  # rule 1
            if tail == self._idle:
                self.waiting_since = None
                return
            scan = waiting.added(ids, self._idle, want - 1) or ids  # only those can be due
        pending, due = self._due(scan, now, want)
        if not pending:
            self.waiting_since = None
            self._idle, self._idle_until = tail, due
            return
        if self.waiting_since is None:
            self.waiting_since = now
        if len(pending) < self.batch_max and now - self.waiting_since < self.batch_wait_s:
            self.wake_at = self.waiting_since + self.batch_wait_s  # rule 4
            return
        if world.pinned:
            self._out.append(Pinned([r.instance_id for r in pending]))
            return
        if room <= 0:
            return
        eligible = world.eligible(now)
        if not eligible and now < self.hold_until:  # rule 9
            self.wake_at = self.hold_until
            return
        if self.sample_d is not None:  # rule 10: the index asks only nodes that could fit
            self.candidates.live(eligible)
            self.candidates.drained(world.draining())
        groups: dict[tuple[tuple[str, ...], str], list[Request]] = {}
        for r in pending:
            groups.setdefault((tuple(r.excluded), r.only_node), []).append(
                Request.of(r.instance_id, r.spec, r.service))
        for (excluded, only), requests in groups.items():
            if only:  # rule 12: that node alone, or nobody
                candidates = [only] if only in eligible else []
            else:
                candidates = ([n for n in eligible if n not in excluded] or eligible) \
                    if excluded else eligible
            for i in range(0, len(requests), self.batch_max):
                if room <= 0:
                    return  # what is left has waited already: it goes when room frees
                self.open(requests[i:i + self.batch_max], candidates, now, set(excluded),
                          whole=bool(only))
                room -= 1
        self.waiting_since = None

    def _due(self, ids: Iterable[str], now: float, want: int
             ) -> tuple[list[InstanceRecord], float]:
        """Rule 1: the first `want` due instances by priority, highest first, oldest first
        within a priority (`shared.urgency`); and the earliest retry time skipped. The
        oldest `want` are read as they come; past them, when the lowest priority taken is
        the default or above, only the urgent work is read (`shared.urgency` rule 2)."""
        retries = self._retries
        retries.due(now)
        left = filterfalse(self.inflight.__contains__, ids) if self.inflight else iter(ids)
        if retries.parked:  # skipped by membership, never read (`shared.waiting` rule 1)
            left = filterfalse(retries.parked.__contains__, left)
        record = self.world.record
        pending: list[InstanceRecord] = []
        low = high = 0
        for iid in left:
            rec = record(iid)
            p = rec.spec.priority
            if not pending:
                low = high = p
            elif p < low:
                low = p
            elif p > high:
                high = p
            pending.append(rec)
            if len(pending) >= want:
                break
        else:
            return ranked(pending, want, high != low), retries.earliest()
        if low < DEFAULT_PRIORITY or not isinstance(ids, Mapping | Sequence):
            rest: Iterable[str] = left  # the remainder, read whole
        else:
            urgent = self._urgent.note(ids, record)
            taken = {r.instance_id for r in pending} if urgent else set()
            rest = [i for i in urgent if i not in taken and i not in self.inflight
                    and i not in retries.parked]
        for iid in rest:
            rec = record(iid)
            if rec.spec.priority > low:  # it displaces some of what was taken
                high = max(high, rec.spec.priority)
                pending.append(rec)
        return ranked(pending, want, high != low), retries.earliest()

    def open(self, requests: list[Request], candidates: list[str], now: float,
             excluded: AbstractSet[str] = frozenset(), stage: int = 0,
             whole: bool = False) -> None:
        """One auction, broadcast or sampled (rule 10); `stage` 1 asks `RETRY_TIMES`·d per
        request, 2 every candidate (rule 11); `whole`: ask every candidate (rule 12)."""
        aid = self._aid()
        if excluded and not whole:
            left_out = excluded - set(candidates)
            if left_out:
                self._without[aid] = left_out
        d = self.sample_d
        sampled = False
        if d is not None and not whole:
            shapes, counts = group_shapes(requests)
            if stage == 1:
                d *= RETRY_TIMES
            elif stage > 1:
                d = len(self.candidates) + 1
            draw = self.candidates.draw(shapes, counts, d, self.rng, excluded,
                                        self.last_winner)
            if draw.hopeless:
                keys = {shapes[i].key() for i in draw.hopeless}
                self._refuse([r for r in requests if r.key() in keys], now)
                requests = [r for r in requests if r.key() not in keys]
                if not requests:
                    return
            sampled = not (all(draw.whole) and len(draw.asked) == len(candidates)
                           and set(draw.asked) == set(candidates))
            if not all(draw.whole):
                self._partial[aid] = _Partial(frozenset(shapes[i].key() for i, w in
                                                enumerate(draw.whole) if not w),
                                      candidates, excluded, stage)
            if sampled:
                candidates = draw.asked
        auction = Auction(aid, requests, candidates, now, self.deadline_s)
        self.auctions[aid] = auction
        if not sampled:
            self._broadcast.add(aid)
        self.auctions_total += 1
        self.inflight.update(r.instance_id for r in requests)
        if not candidates:
            self.close(auction, now)
            return
        self._out.append(Open(auction, candidates if sampled else None))

    def _refuse(self, requests: list[Request], now: float) -> None:
        """Rule 10: requests no live node could ever take, decided at once, each node
        declining as it would (from what its heartbeats say it is); nothing is sent."""
        aid = self._aid()
        index = self.candidates
        nodes = index.asked()
        auction = Auction(aid, requests, nodes, now, self.deadline_s)
        shapes = auction.shapes
        for node in nodes:
            answers: list[Bid | Decline] = []
            for shape in shapes:
                why = index.refusal(node, shape)
                assert why is not None, "a hopeless shape has no candidate"
                answers.append(Decline(shape=len(answers), reason=why.reason,
                                       detail=why.detail))
            auction.receive(BidReply(auction_id=aid, node_id=node, answers=answers), now)
        self.auctions[aid] = auction
        self.auctions_total += 1
        self.inflight.update(r.instance_id for r in requests)
        self.close(auction, now)

    # -- bids (rule 6) -----------------------------------------------------------------------
    def receive(self, reply: BidReply, now: float) -> Verdict | None:
        """A decoded reply; the verdict to count as a reject, None when it was taken or was
        only late (`late_total`)."""
        auction = self.auctions.get(reply.auction_id)
        if auction is None:
            closed = self._closed.get(reply.auction_id)
            if closed is not None and _late(reply.node_id, *closed):
                self.late_total += 1
                return None
            return Verdict.WRONG_AUCTION
        draining = self.world.draining()
        if draining and reply.node_id in draining:
            reply = msgspec.structs.replace(reply, answers=[
                Decline(shape=a.shape, reason=Reason.DRAINING) for a in reply.answers])
        verdict = auction.receive(reply, now)
        out: Verdict | None = None
        if verdict in (Verdict.LATE, Verdict.NOT_ELIGIBLE) and _late(
                reply.node_id, auction.answered,
                None if reply.auction_id in self._broadcast else auction.eligible):
            self.late_total += 1
        elif verdict is not Verdict.ACCEPTED:
            out = verdict
        if auction.done(now):
            self.close(auction, now)
        return out

    def free(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        """Rule 3: per node, heartbeat capacity minus git's and the reserved."""
        return self.world.free(nodes, self.reserved)

    # -- closing (rules 3, 5, 8, 11) ---------------------------------------------------------
    def close(self, auction: Auction, now: float) -> None:
        aid = auction.auction_id
        del self.auctions[aid]
        self._closed[aid] = (auction.answered,
                             None if aid in self._broadcast else auction.eligible)
        self._broadcast.discard(aid)
        if len(self._closed) > CLOSED_KEPT:
            del self._closed[next(iter(self._closed))]
        if auction.groups or auction.affine:  # rule 8; affinities need the labels too
            held, labels = self._spread_of(auction.groups)
            decisions = auction.decide(now, self.free(auction.eligible), held=held,
                                       labels=labels)
        else:
            decisions = auction.decide(now, self.free(auction.eligible))
        wider: list[Request] = []
        partial = self._partial.pop(aid, None)
        if partial is not None:  # rule 11
            keys = partial.keys
            wider = [d.request for d in decisions  # a displacement waits for the wider ask
                     if (isinstance(d, Unschedulable) or d.displaced)
                     and d.request.key() in keys]
            if wider:
                again = {r.instance_id for r in wider}
                decisions = [d for d in decisions if d.request.instance_id not in again]
        left_out = self._without.pop(aid, None)
        refused: list[Request] = []
        if left_out is not None:  # rule 2: asked again, of them too
            refused = [d.request for d in decisions if isinstance(d, Unschedulable)]
            if refused:
                again = {r.instance_id for r in refused}
                decisions = [d for d in decisions if d.request.instance_id not in again]
        if self.sample_d is not None:
            self._remember_winners(auction, decisions)
        for d in decisions:
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, +1)
                if d.request.group:
                    self.awarding[d.request.instance_id] = (d.request.group, d.winner.node_id)
        self._out.append(Decided(auction, decisions, now - auction.opened_at))
        if wider and partial is not None:  # still in flight: asked again, of more nodes
            self.open(wider, partial.candidates, now, partial.excluded,
                      stage=partial.stage + 1)
        if refused:
            self.open(refused, self.world.eligible(now), now)
        if self._opening:  # closed as it opened: the pass under way counted it
            self._out.append(Wake())
        else:  # the next round goes out now (rule 5)
            self.reconcile(now)

    def _remember_winners(self, auction: Auction, decisions: list[Decision]) -> None:
        won = [d for d in decisions if isinstance(d, Awarded)]
        if won and len(self.last_winner) > WINNERS_KEPT:
            self.last_winner.clear()
        for d in won:
            self.last_winner[d.request.key()] = d.winner.node_id

    def _spread_of(self, groups: Iterable[str]
                   ) -> tuple[dict[str, dict[str, int]], Mapping[str, Mapping[str, str]]]:
        world = self.world
        held = {g: world.held_by(g) for g in groups}
        for iid, (group, node) in self.awarding.items():
            counts = held.get(group)
            if counts is not None and not world.placed(iid):
                counts[node] = counts.get(node, 0) + 1
        return held, world.labels()

    def _reserve(self, node_id: str, req: Request, sign: int) -> None:
        self.reserved.setdefault(node_id, Capacity()).charge(req, sign)

    # -- what became of the decisions (rules 3, 7) ---------------------------------------------
    def _stir(self) -> None:
        """Rule 1: something may be due that the last idle pass did not see."""
        self._idle = None

    def released(self, d: Awarded) -> None:
        """The award's commit landed (placed, or the ledger refused the placement)."""
        self._stir()
        self._reserve(d.winner.node_id, d.request, -1)
        self.inflight.discard(d.request.instance_id)
        self.awarding.pop(d.request.instance_id, None)
        self._misses.pop(d.request.instance_id, None)

    def unschedulable(self, iid: str, now: float) -> None:
        """Parked (rule 7): nothing came due, so an idle pass stays so until then (rule 1)."""
        misses = self._misses.get(iid, 0)
        self._misses[iid] = misses + 1
        wait = self.heartbeat_s * (1 << min(misses, BACKOFF_DOUBLINGS))
        at = math.ceil((now + wait) / self.tick_s) * self.tick_s if self.tick_s > 0 else \
            now + wait
        self._idle_until = min(self._idle_until, at)
        self.inflight.discard(iid)
        self._retries.park(iid, at)

    def failed(self, decisions: Sequence[Decision], now: float) -> None:
        """The commit of these decisions failed: released, retried a tick later."""
        self._stir()
        for d in decisions:
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, -1)
                self.awarding.pop(iid, None)
            self.inflight.discard(iid)
            self._retries.park(iid, now + self.tick_s)

    def capacity_freed(self) -> None:
        self._stir()
        self._retries.clear()
        self._misses.clear()


def _late(node: str, answered: AbstractSet[str], asked: AbstractSet[str] | None) -> bool:
    """Rule 6: an answer that came too late for its auction, from a node that had not
    answered it and that it asked (`asked` None: a broadcast asks every node)."""
    return node not in answered and (asked is None or node in asked)
