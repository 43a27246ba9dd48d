"""Running auctions: open an RFB for pending instances, collect bids, award, commit.

Rules:
1. Pending work is re-derived from git on every pass: desired instances that are queued or
   unschedulable and not already in an auction. Nothing else is remembered.
2. An instance re-auctioned after failing on some nodes is auctioned without them (unless
   no other node is left, then with them).
3. A winner's capacity is charged for undelivered awards until the commit lands, so
   pipelined auctions never over-commit a node.
4. An auction opens once `batch_max` requests wait, or once the oldest waiting one has waited
   `batch_wait_s` (0: at once). A broadcast round costs a reply from every node however few
   requests it carries; waiting a few ms for a fuller batch trades that much queueing for
   far fewer rounds (docs/performance.md).
5. The next round opens as the last one closes, when work waits and there is room (not when
   the loop next gets round to it), and its RFBs are written to the socket as it opens
   (`Broker.flush`): a round's clock runs from its opening, and with one round in flight
   the gap between rounds is throughput lost; closing that gap places more a second without
   lengthening the rounds (docs/performance.md). An auction that closes as it opens (no
   candidate) does not open others from inside the pass that opened it.
6. A broadcast RFB reaches every node, also one whose first heartbeat the broker has not
   heard yet (it just started, or the node did), and an auction closes once its candidates
   have answered or at its deadline: an answer from a node that was not a candidate, or one
   after the deadline or the close of one of the last `CLOSED_KEPT` auctions from a node it
   asked and that had not answered, is left out and counted in `late_total`, but it is not a
   rejected message - nothing on the wire was wrong. A second answer from the same node (a
   replay), an answer to a sampled auction from a node it did not ask, or one for an auction
   this broker never opened, is a reject.
7. An instance that waits is auctioned again every heartbeat interval; its ``unschedulable``
   event is emitted when its record changes (a new reason or summary), not every round:
   the same sentence every few seconds would bury the events an operator follows.
8. A service's replica is auctioned with its group (`InstanceRecord.service`), and its round
   is decided knowing how many of the group's replicas each node holds - in git, or awarded
   and not yet committed - and every node's labels, from its heartbeats
   (`shared.auction` rule 5); a round without replicas is told nothing of the kind.
9. Until `hold_until`, no auction opens while no node is eligible: a new leadership
   (`broker.ha`) has asked every node for a heartbeat and gives them that long to answer,
   rather than find its queued work "unschedulable: no nodes connected" in its first pass.
   The first heartbeat ends the wait.
10. A sampled auction asks d nodes per request of each shape among the healthy nodes that
    could ever take it - its hard labels, not draining, its total capacity
    (`shared.candidates`) - or all of them when there are no more: d random nodes of a fleet
    where few carry a label would mostly decline, and the request fail a round it could have
    won. A request no node could ever take is decided at once with the declines the nodes
    would have sent.
11. A request the d sampled nodes could not place is asked again at once of every node that
    could take it, before it is declared unschedulable: two busy nodes say little about a
    fleet, and waiting a heartbeat interval for another two is how a big request starves.
    The last winner of each shape is asked beside the sampled nodes (`shared.candidates`
    rule 3).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from itertools import filterfalse

import msgspec

from gavel.broker.auctionlog import Recent, batch_record, count, place_line, shapes_of
from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, place, unschedulable
from gavel.shared import subjects
from gavel.shared.auction import (
    Auction,
    Awarded,
    Decision,
    Unschedulable,
    Verdict,
    group_shapes,
)
from gavel.shared.award import NodeDecline
from gavel.shared.candidates import Candidates
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import (
    Award,
    Bid,
    BidReply,
    Capacity,
    Decline,
    EventType,
    InstanceState,
    Request,
)
from gavel.shared.reasons import Reason
from gavel.shared.records import AuctionRecord, Outcome, auction_trailer
from gavel.transport.inbound import Door, Guard
from gavel.transport.wire import Received

__all__ = ["CLOSED_KEPT", "RECENT_KEPT", "ROUNDS_KEPT", "Auctioneer"]

RECENT_KEPT = 2048
#: Closed auctions whose late answers are recognised (rule 6).
CLOSED_KEPT = 256
#: Bid-round durations kept for the API's percentiles.
ROUNDS_KEPT = 10_000


class Auctioneer:
    def __init__(self, ctx: Context, *, award_for: Callable[[str, str, str], Award | None],
                 batch_max: int = 256, sample_d: int | None = None, max_auctions: int = 16,
                 batch_wait_s: float = 0.0, rng: random.Random | None = None) -> None:
        self.ctx = ctx
        #: The award a placed instance's winner is told (`broker.assign`).
        self.award_for = award_for
        self.batch_max = batch_max
        #: Sampling: ask d nodes per request instead of everyone (None: full broadcast).
        self.sample_d = sample_d
        #: Auctions in flight at once (pipelining with a bound, so a backlog of 100,000
        #: submissions does not become 400 simultaneous broadcasts).
        self.max_auctions = max_auctions
        #: How long waiting work may wait for a fuller batch (rule 4).
        self.batch_wait_s = batch_wait_s
        self.rng = rng or random.Random()
        #: Which nodes could ever take which shape, fed by every heartbeat (rule 10), and
        #: the last winner per shape key, asked beside the sampled nodes.
        self.candidates = Candidates()
        self.last_winner: dict[object, str] = {}
        self._guard = Guard("bid reply", BidReply, ctx.rejects, node=subjects.node_of,
                            foreign="bid", door=Door(ctx.rejects, subjects.BIDS_ALL))
        #: Instances whose pinned-deployment error was reported (once each).
        self.pinned_reported: set[str] = set()
        self.round_times: deque[float] = deque(maxlen=ROUNDS_KEPT)
        self.auctions: dict[str, Auction] = {}
        #: Open auctions whose RFB went to every node, the last auctions closed, and the
        #: answers that came too late for theirs or from a node not yet heard (rule 6).
        self._broadcast: set[str] = set()
        self._closed: dict[str, tuple[AbstractSet[str], AbstractSet[str] | None]] = {}
        #: Sampled auctions that asked some shape's candidates in part: the keys of those
        #: shapes, the auction's candidates and excluded nodes, for the wider ask (rule 11).
        self._partial: dict[str, tuple[frozenset[object], list[str], AbstractSet[str]]] = {}
        self.late_total = 0
        self.inflight: set[str] = set()
        self.reserved: dict[str, Capacity] = {}
        self.retry_at: dict[str, float] = {}
        #: The last decisions, for `why` before git is walked (bounded; shares bid lists).
        self._recent = Recent(RECENT_KEPT)
        self.placed_total = 0
        self.auctions_total = 0
        self.replies_total = 0
        #: Replicas awarded and not yet released: instance -> (service, winner) (rule 8).
        self.awarding: dict[str, tuple[str, str]] = {}
        #: When the waiting (not yet auctioned) work began to wait; None: nothing waits.
        self.waiting_since: float | None = None
        self._wait_timer: asyncio.TimerHandle | None = None
        self._opening = False
        #: Rule 6 (-inf: never hold).
        self.hold_until = float("-inf")

    # -- opening -------------------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        if self._opening:  # an auction closed while opening (no candidates): once is enough
            return
        self._opening = True
        try:
            self._reconcile(now)
        finally:
            self._opening = False

    def _reconcile(self, now: float) -> None:
        ctx = self.ctx
        state = ctx.ledger.state()
        room = self.max_auctions - len(self.auctions)
        want = max(room, 1) * self.batch_max
        pending = []
        # Oldest first; stop once there is enough for the room. Awarded instances stay
        # pending until their commit lands (a whole group commit of them, at the front):
        # they are skipped in C, not one Python test each.
        waiting = filterfalse(self.inflight.__contains__, state.pending) if self.inflight \
            else iter(state.pending)
        retry_at = self.retry_at
        for iid in waiting:
            if not retry_at or retry_at.get(iid, 0.0) <= now:
                pending.append(state.instances[iid])
                if len(pending) >= want:
                    break
        if not pending:
            self.waiting_since = None
            return
        if self.waiting_since is None:
            self.waiting_since = now
        if len(pending) < self.batch_max and now - self.waiting_since < self.batch_wait_s:
            self._wake_at(self.waiting_since + self.batch_wait_s - now)  # rule 4
            return
        if ctx.ledger.pinned:
            for r in pending:
                if r.instance_id not in self.pinned_reported:
                    self.pinned_reported.add(r.instance_id)
                    ctx.events.emit(r.instance_id, EventType.ERROR, reason=Reason.PINNED,
                                    detail=ctx.ledger.ref)
            return
        if room <= 0:
            return
        eligible = ctx.liveness.eligible(now)
        if not eligible and now < self.hold_until:  # rule 9
            self._wake_at(self.hold_until - now)
            return
        if state.unusable_nodes:  # a node.json we cannot read: that node wins nothing
            eligible = [n for n in eligible if n not in state.unusable_nodes]
        if self.sample_d is not None:  # rule 10: the index asks only nodes that could fit
            self.candidates.live(eligible)
            self.candidates.drained(state.draining)
        groups: dict[tuple[str, ...], list[Request]] = {}
        for r in pending:
            groups.setdefault(tuple(r.excluded), []).append(
                Request.of(r.instance_id, r.spec, r.service))
        for excluded, requests in groups.items():
            candidates = ([n for n in eligible if n not in excluded] or eligible) \
                if excluded else eligible
            for i in range(0, len(requests), self.batch_max):
                if room <= 0:
                    return  # what is left has waited already: it goes when room frees
                self.open(requests[i:i + self.batch_max], candidates, now, set(excluded))
                room -= 1
        self.waiting_since = None

    def _wake_at(self, delay: float) -> None:
        if self._wait_timer is None or self._wait_timer.cancelled() \
                or self._wait_timer.when() <= asyncio.get_running_loop().time():
            self._wait_timer = asyncio.get_running_loop().call_later(delay, self.ctx.wake)

    def open(self, requests: list[Request], candidates: list[str], now: float,
             excluded: AbstractSet[str] = frozenset(), wide: bool = False) -> None:
        """One auction: broadcast to every candidate, or - with sampling on - to d nodes per
        request of each shape among the nodes that could ever take it (rule 10), each
        addressed on its own subject; when those are all the candidates, a broadcast.
        `wide`: every node that could take each request (rule 11)."""
        ctx = self.ctx
        aid = uuid.uuid4().hex[:12]
        deadline = ctx.timing.bid_deadline_s
        d = self.sample_d
        sampled = False
        if d is not None:
            shapes, counts = group_shapes(requests)
            if wide:
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
                self._partial[aid] = (frozenset(shapes[i].key() for i, w in
                                                enumerate(draw.whole) if not w),
                                      candidates, excluded)
            if sampled:
                candidates = draw.asked
        auction = Auction(aid, requests, candidates, now, deadline)
        self.auctions[aid] = auction
        if not sampled:
            self._broadcast.add(aid)
        self.auctions_total += 1
        self.inflight.update(r.instance_id for r in requests)
        if not candidates:
            self.close(auction)
            return
        payload = ctx.outbox.encode(auction.rfb())
        if sampled:
            for node in candidates:
                ctx.outbox.publish_raw(subjects.RFB_NODE.format(node=node), payload)
        else:
            ctx.outbox.publish_raw(subjects.RFB, payload)
        ctx.outbox.flush()  # the round is being timed: its RFBs do not wait for the sender
        asyncio.get_running_loop().call_later(deadline, self._deadline, aid)

    def _refuse(self, requests: list[Request], now: float) -> None:
        """Rule 9: requests no live node could ever take are decided at once, each node
        declining as it would (from what its heartbeats say it is); nothing is sent."""
        aid = uuid.uuid4().hex[:12]
        index = self.candidates
        nodes = index.asked()
        auction = Auction(aid, requests, nodes, now, self.ctx.timing.bid_deadline_s)
        shapes = auction.shapes
        for node in nodes:
            answers: list[Bid | Decline] = []
            for i, shape in enumerate(shapes):
                why = index.refusal(node, shape)
                assert why is not None, "a hopeless shape has no candidate"
                answers.append(Decline(shape=i, reason=why.reason, detail=why.detail))
            auction.receive(BidReply(auction_id=aid, node_id=node, answers=answers), now)
        self.auctions[aid] = auction
        self.auctions_total += 1
        self.inflight.update(r.instance_id for r in requests)
        self.close(auction)

    def _deadline(self, aid: str) -> None:
        auction = self.auctions.get(aid)
        if auction is not None:
            self.close(auction)

    # -- bids ----------------------------------------------------------------------------
    def on_bids(self, msg: Received) -> None:
        ctx = self.ctx
        reply = self._guard(msg)
        if reply is None:
            return
        self.replies_total += 1
        auction = self.auctions.get(reply.auction_id)
        if auction is None:
            closed = self._closed.get(reply.auction_id)
            if closed is not None and _late(reply.node_id, *closed):
                self.late_total += 1  # rule 6: an answer after the close
            else:  # never opened, or a replay of an answer taken
                ctx.rejects.count(Verdict.WRONG_AUCTION, msg.subject)
            return
        draining = ctx.ledger.state().draining
        if draining and reply.node_id in draining:
            # git says draining; the node may not know yet (or ignores it): a bid from it is
            # taken as the decline it should have sent, so `gavel why` still shows it asked.
            reply = msgspec.structs.replace(reply, answers=[
                Decline(shape=a.shape, reason=Reason.DRAINING) for a in reply.answers])
        now = ctx.now()
        verdict = auction.receive(reply, now)
        if verdict in (Verdict.LATE, Verdict.NOT_ELIGIBLE) and _late(
                reply.node_id, auction.answered,
                None if reply.auction_id in self._broadcast else auction.eligible):
            self.late_total += 1  # rule 6
        elif verdict is not Verdict.ACCEPTED:
            ctx.rejects.count(verdict, msg.subject)
        if auction.done(now):
            self.close(auction)

    def free(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        """Per node: heartbeat capacity minus what git and undelivered awards commit there."""
        state = self.ctx.ledger.state()
        beats = self.ctx.liveness.heartbeats
        out: dict[str, Capacity] = {}
        for node_id in nodes:
            hb = beats.get(node_id)
            if hb is None:
                continue
            free = hb.capacity.copy()
            used = state.committed.get(node_id)
            if used is not None:
                free.charge(used, -1)
            res = self.reserved.get(node_id)
            if res is not None:
                free.charge(res, -1)
            out[node_id] = free
        return out

    # -- closing -------------------------------------------------------------------------
    def close(self, auction: Auction) -> None:
        aid = auction.auction_id
        del self.auctions[aid]
        self._closed[aid] = (auction.answered,
                             None if aid in self._broadcast else auction.eligible)
        self._broadcast.discard(aid)
        if len(self._closed) > CLOSED_KEPT:
            del self._closed[next(iter(self._closed))]
        now = self.ctx.now()
        if auction.groups:
            held, labels = self._spread_of(auction.groups)
            decisions = auction.decide(now, self.free(auction.eligible), held=held,
                                       labels=labels)
        else:
            decisions = auction.decide(now, self.free(auction.eligible))
        wider: list[Request] = []
        partial = self._partial.pop(aid, None)
        if partial is not None:  # rule 11: what d nodes could not place, every candidate may
            keys = partial[0]
            wider = [d.request for d in decisions
                     if isinstance(d, Unschedulable) and d.request.key() in keys]
            if wider:
                again = {r.instance_id for r in wider}
                decisions = [d for d in decisions if d.request.instance_id not in again]
        round_s = now - auction.opened_at
        self.round_times.append(round_s)
        count(self.ctx.metrics, auction, decisions, round_s)
        if self.sample_d is not None:
            self._remember_winners(auction, decisions)
        for d in decisions:
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, +1)
                if d.request.group:
                    self.awarding[d.request.instance_id] = (d.request.group, d.winner.node_id)
                self.ctx.events.emit(d.request.instance_id, EventType.SCHEDULED,
                            node_id=d.winner.node_id,
                            detail=f"load {d.winner.load:.3f} ({d.winner.strategy})")
        if decisions:
            self.ctx.committer.submit(Item(
                plan=lambda view: self._plan(view, auction, decisions, round_s),
                failed=lambda reason, detail: self._failed(decisions, reason, detail),
                retry=False))
        if wider:  # still in flight: asked again at once, of every node that could take them
            self.open(wider, partial[1] if partial else [], now, partial[2] if partial
                      else frozenset(), wide=True)
        if self._opening:  # closed as it opened: the pass under way counted it; the next
            self.ctx.wake()  # pass has its room
        else:  # the next round goes out now, not after the loop's other work (rule 5)
            self.reconcile(now)

    def _remember_winners(self, auction: Auction, decisions: list[Decision]) -> None:
        """The last winner of each shape, asked in its next sampled round (rule 11)."""
        won: dict[int, str] = {}
        for d, s in zip(decisions, shapes_of(auction, decisions), strict=True):
            if isinstance(d, Awarded):
                won[s] = d.winner.node_id
        if won and len(self.last_winner) > RECENT_KEPT:
            self.last_winner.clear()  # shapes are few; a flood of distinct ones starts again
        shapes = auction.shapes
        for s, node in won.items():
            self.last_winner[shapes[s].key()] = node

    def _spread_of(self, groups: Iterable[str]
                   ) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, str]]]:
        """What a round placing replicas of `groups` is told (rule 8): per group, the
        replicas each node holds (git's, plus awards whose commit has not landed), and each
        node's labels."""
        state = self.ctx.ledger.state()
        held = {g: state.held_by(g) for g in groups}
        for iid, (group, node) in self.awarding.items():
            counts = held.get(group)
            if counts is not None and iid not in state.where:
                counts[node] = counts.get(node, 0) + 1
        labels = {n: hb.labels for n, hb in self.ctx.liveness.heartbeats.items()}
        return held, labels

    def _reserve(self, node_id: str, req: Request, sign: int) -> None:
        self.reserved.setdefault(node_id, Capacity()).charge(req, sign)

    def _plan(self, view: View, auction: Auction, decisions: list[Decision],
              round_s: float) -> Planned:
        out = Planned(lines=[])
        outcomes: list[Outcome] = []
        aid = auction.auction_id
        for d, shape in zip(decisions, shapes_of(auction, decisions), strict=True):
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                hb = self.ctx.liveness.heartbeats.get(d.winner.node_id)
                placement = place(view, d, aid, hb.port_range if hb else [])
                if placement is None:
                    out.after.append(functools.partial(self._not_placed, d))
                    continue
                out.lines.append(place_line(d))
                outcomes.append(Outcome(instance_id=iid, shape=shape, winner=d.winner.node_id,
                                        load=d.winner.load, tie_broken=d.tie_broken))
                out.after.append(functools.partial(self._placed, d, aid, placement.attempt,
                                                   round_s=round_s))
            else:
                changed = unschedulable(view, d)
                if changed:
                    out.lines.append(f"unschedulable {iid}: {d.summary}")
                    outcomes.append(Outcome(instance_id=iid, shape=shape, reason=d.reason,
                                            summary=d.summary))
                out.after.append(functools.partial(self._unschedulable, d, aid, changed))
        if outcomes:
            out.trailers.append(auction_trailer(batch_record(auction, decisions, outcomes)))
        return out

    def _not_placed(self, d: Awarded, _sha: str) -> None:
        self._released(d, placed=False)

    def _placed(self, d: Awarded, aid: str, attempt: int, sha: str, round_s: float) -> None:
        ctx = self.ctx
        iid, node = d.request.instance_id, d.winner.node_id
        self._released(d, placed=True)
        self.placed_total += 1
        ctx.metrics.placements.inc()
        self._recent.remember(iid, aid, d)
        rec = ctx.ledger.state().instances.get(iid)
        ctx.timers.placed(iid, node, ctx.now(), ctx.timing, rec.spec.timeout_s if rec else None)
        award = self.award_for(iid, node, sha)
        if award is not None:
            ctx.outbox.publish(subjects.AWARD.format(node=node), award)
        ctx.events.emit(iid, EventType.PLACED, node_id=node, attempt=attempt,
               detail=f"commit {sha[:12]}; {len(d.bids)} bids, load {d.winner.load:.3f}"
               f"{' (tie broken on node id)' if d.tie_broken else ''}")
        if ctx.log.isEnabledFor(logging.INFO):
            ctx.log.info("placed %s on %s: %d bids, load %.3f, round %.3fs, commit %s", iid,
                       node, len(d.bids), d.winner.load, round_s, sha[:12],
                       extra={"instance": iid, "winner": node, "bids": len(d.bids),
                              "load": d.winner.load, "round_s": round_s, "commit": sha[:12],
                              "auction": aid})

    def _released(self, d: Awarded, placed: bool) -> None:
        self._reserve(d.winner.node_id, d.request, -1)
        self.inflight.discard(d.request.instance_id)
        self.awarding.pop(d.request.instance_id, None)
        if not placed:
            self.ctx.wake()

    def _unschedulable(self, d: Unschedulable, aid: str, changed: bool, _sha: str = "") -> None:
        """Rule 7: the event only when the reason or summary changed (the record did)."""
        iid = d.request.instance_id
        self.inflight.discard(iid)
        self._recent.remember(iid, aid, d)
        self.retry_at[iid] = self.ctx.now() + self.ctx.timing.heartbeat_s
        if changed:
            self.ctx.events.emit(iid, EventType.UNSCHEDULABLE, reason=d.reason,
                                 detail=d.summary)

    def _failed(self, decisions: list[Decision], reason: Reason, detail: str) -> None:
        for d in decisions:
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, -1)
                self.awarding.pop(iid, None)
            self.inflight.discard(iid)
            self.retry_at[iid] = self.ctx.now() + self.ctx.timing.tick_s
            self.ctx.events.emit(iid, EventType.ERROR, reason=reason, detail=detail)

    def declines_by(self, node_id: str, limit: int) -> list[tuple[str, str, NodeDecline]]:
        return self._recent.declines_by(node_id, limit)

    def recent(self, iid: str) -> AuctionRecord | None:
        return self._recent.record(iid)

    def capacity_freed(self) -> None:
        """Waiting instances may fit now: retry them on the next pass."""
        self.retry_at.clear()
        self.ctx.wake()

    def status_of(self, iid: str, state: InstanceState) -> str:
        if state in PENDING and iid in self.inflight:
            return InstanceState.SCHEDULED if state is InstanceState.QUEUED else state
        return state


def _late(node: str, answered: AbstractSet[str], asked: AbstractSet[str] | None) -> bool:
    """Rule 6: an answer that came too late for its auction, from a node that had not
    answered it and that it asked (`asked` None: a broadcast asks every node)."""
    return node not in answered and (asked is None or node in asked)
