"""Running auctions: the shell around `shared.auctioneer.Core`, which decides them.

The core holds every rule below that decides what is auctioned, whom it asks and what is
awarded; this shell gives it the real clock, git's state and the heartbeats
(`broker.auctionworld`), and does what it asks: RFBs on NATS through the outbox, the
deadline timers, the commits (and `_plan`, what they write), events and metrics. The
simulator drives the same core in virtual time (`sim.market`).

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
10. A sampled auction asks d or more nodes per request of each shape among the healthy nodes
    that could ever take it - its hard labels, not draining, its total capacity - drawn away
    from scarce-label and largest nodes (`shared.candidates` rules 5-8), or all of them when
    there are no more: d random nodes of a fleet
    where few carry a label would mostly decline, and the request fail a round it could have
    won. A request no node could ever take is decided at once with the declines the nodes
    would have sent.
11. A request the d sampled nodes could not place is asked again at once of 8·d of the nodes
    that could take it, and what those cannot place of every such node, before it is
    declared unschedulable: two busy nodes say little about a fleet, and waiting a heartbeat
    interval for another two is how a big request starves.
    The last winner of each shape is asked beside the sampled nodes (`shared.candidates`
    rule 3).
12. Unless given, the batch size, the rounds in flight and the committer's gap are the
    `shared.tuning.Tuner`'s: told of every round that closes (its time, whether work was
    left waiting), every commit's time and every pass, it moves them between the latency
    end and the throughput end as the load asks. A pass hears of the commits landed before
    it asks whether things are quiet. A value given is pinned, also one set on `batch_max`
    or `max_auctions` later.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from gavel.broker.auctionlog import Recent, batch_record, count, place_line, shapes_of
from gavel.broker.auctionworld import Git
from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, place, unschedulable
from gavel.broker.preemptions import plan_evictions
from gavel.broker.replyroutes import ReplyRoutes
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.auctioneer import CLOSED_KEPT, Core, Decided, Open, Pinned, Wake
from gavel.shared.auctionworld import Action
from gavel.shared.award import NodeDecline
from gavel.shared.candidates import Candidates
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import Award, BidReply, Capacity, EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import AuctionRecord, Outcome, auction_trailer
from gavel.shared.tuning import Tuner
from gavel.transport.inbound import Door, Guard
from gavel.transport.wire import Received

__all__ = ["CLOSED_KEPT", "RECENT_KEPT", "ROUNDS_KEPT", "Auctioneer"]

RECENT_KEPT = 2048
#: Bid-round durations kept for the API's percentiles.
ROUNDS_KEPT = 10_000


def _aid() -> str:
    return uuid.uuid4().hex[:12]


class Auctioneer:
    def __init__(self, ctx: Context, *, award_for: Callable[[str, str, str], Award | None],
                 batch_max: int | None = None, sample_d: int | None = None,
                 max_auctions: int | None = None, batch_wait_s: float = 0.0,
                 commit_gap_s: float | None = None, rng: random.Random | None = None,
                 routes: ReplyRoutes | None = None) -> None:
        self.ctx = ctx
        #: The award a placed instance's winner is told (`broker.assign`).
        self.award_for = award_for
        t = ctx.timing
        #: Rule 12: what is not given is tuned.
        self.tuner = Tuner(batch_max=batch_max, max_auctions=max_auctions,
                           commit_gap_s=commit_gap_s)
        self.core = Core(Git(ctx), deadline_s=t.bid_deadline_s, heartbeat_s=t.heartbeat_s,
                         tick_s=t.tick_s, batch_max=self.tuner.batch_max, sample_d=sample_d,
                         max_auctions=self.tuner.max_auctions, batch_wait_s=batch_wait_s,
                         rng=rng, ids=_aid)
        ctx.committer.gap_s = self.tuner.commit_gap_s
        self._commits_seen = ctx.committer.commits
        self._guard = Guard("bid reply", BidReply, ctx.rejects, node=subjects.node_of,
                            foreign="bid", door=Door(ctx.rejects, subjects.BIDS_ALL))
        #: Instances whose pinned-deployment error was reported (once each).
        self.pinned_reported: set[str] = set()
        self.round_times: deque[float] = deque(maxlen=ROUNDS_KEPT)
        #: The last decisions, for `why` before git is walked (bounded; shares bid lists).
        self._recent = Recent(RECENT_KEPT)
        self.placed_total = 0
        self.replies_total = 0
        #: Replies to auctions not this auctioneer's: dry runs' (`broker.planner`) and the
        #: takers registered at construction (re-auctions, `broker.reauction`).
        self.routes = routes if routes is not None else ReplyRoutes()
        #: Dry runs' auctions (`broker.planner`): a reply for one of these ids is the plan's.
        self.dry = self.routes.dry
        self._wait_timer: asyncio.TimerHandle | None = None

    # -- the core's state, as the broker's other parts and the tests read it ---------------
    @property
    def auctions(self) -> dict[str, Auction]:
        return self.core.auctions

    @auctions.setter
    def auctions(self, value: dict[str, Auction]) -> None:
        self.core.auctions = value

    @property
    def inflight(self) -> set[str]:
        return self.core.inflight

    @property
    def reserved(self) -> dict[str, Capacity]:
        return self.core.reserved

    @property
    def retry_at(self) -> dict[str, float]:
        return self.core.retry_at

    @property
    def candidates(self) -> Candidates:
        return self.core.candidates

    @property
    def last_winner(self) -> dict[object, str]:
        return self.core.last_winner

    @property
    def late_total(self) -> int:
        return self.core.late_total

    @property
    def auctions_total(self) -> int:
        return self.core.auctions_total

    @property
    def hold_until(self) -> float:
        return self.core.hold_until

    @hold_until.setter
    def hold_until(self, value: float) -> None:
        self.core.hold_until = value

    @property
    def batch_max(self) -> int:
        return self.core.batch_max

    @batch_max.setter
    def batch_max(self, value: int) -> None:
        self.core.batch_max = self.tuner.pinned_batch_max = value  # rule 12

    @property
    def max_auctions(self) -> int:
        return self.core.max_auctions

    @max_auctions.setter
    def max_auctions(self, value: int) -> None:
        self.core.max_auctions = self.tuner.pinned_max_auctions = value  # rule 12

    @property
    def sample_d(self) -> int | None:
        return self.core.sample_d

    @property
    def batch_wait_s(self) -> float:
        return self.core.batch_wait_s

    @property
    def rng(self) -> random.Random:
        return self.core.rng

    @rng.setter
    def rng(self, value: random.Random) -> None:
        self.core.rng = value

    # -- driving the core ------------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        self._heard_commits(now)  # rule 12: a commit that just landed is not quiet
        if self.tuner.passed(now, len(self.core.auctions)):
            self._tuned()
        self.core.reconcile(now)
        self._act(now)

    def on_bids(self, msg: Received) -> None:
        reply = self._guard(msg)
        if reply is None:
            return
        if self.routes.take(reply, self.ctx.now):
            return
        self.replies_total += 1
        now = self.ctx.now()
        verdict = self.core.receive(reply, now)
        if verdict is not None:
            self.ctx.rejects.count(verdict, msg.subject)
        self._act(now)

    def _deadline(self, aid: str) -> None:
        now = self.ctx.now()
        self.core.expire(aid, now)
        self._act(now)

    def _act(self, now: float) -> None:
        """Do what the core asked, in its order."""
        ctx = self.ctx
        actions = self.core.take()
        for action in actions:
            if isinstance(action, Open):
                auction = action.auction
                payload = ctx.outbox.encode(auction.rfb())
                if action.to is not None:
                    for node in action.to:
                        ctx.outbox.publish_raw(subjects.RFB_NODE.format(node=node), payload)
                else:
                    ctx.outbox.publish_raw(subjects.RFB, payload)
                ctx.outbox.flush()  # the round is being timed: its RFBs do not wait
                asyncio.get_running_loop().call_later(auction.deadline_s, self._deadline,
                                                      auction.auction_id)
            elif isinstance(action, Decided):
                self._decided(action.auction, action.decisions, action.round_s)
            elif isinstance(action, Wake):
                ctx.wake()
            elif isinstance(action, Pinned):
                for iid in action.instances:
                    if iid not in self.pinned_reported:
                        self.pinned_reported.add(iid)
                        ctx.events.emit(iid, EventType.ERROR, reason=Reason.PINNED,
                                        detail=ctx.ledger.ref)
        self._observe(actions, now)
        at = self.core.wake_at
        if at is not None:  # rule 4, 9: the pass that found too little runs again then
            self.core.wake_at = None
            self._wake_at(at - now)

    def _observe(self, actions: Sequence[Action], now: float) -> None:
        """Rule 12: the tuner hears of the commits written and the rounds closed since it
        last heard, and what it chose applies from the next pass."""
        self._heard_commits(now)
        if self.tuner.took(actions, len(self.core.auctions), now):
            self._tuned()

    def _heard_commits(self, now: float) -> None:
        tuner, committer = self.tuner, self.ctx.committer
        if committer.commits != self._commits_seen and committer.latencies:
            self._commits_seen = committer.commits
            tuner.committed(committer.latencies[-1], now)
            committer.gap_s = tuner.commit_gap_s

    def _tuned(self) -> None:
        core, tuner = self.core, self.tuner
        core.batch_max, core.max_auctions = tuner.batch_max, tuner.max_auctions
        self.ctx.committer.gap_s = tuner.commit_gap_s
        self.ctx.log.debug("tuned: %d rounds of %d in flight, commits %.1f ms apart",
                           core.max_auctions, core.batch_max, 1000 * tuner.commit_gap_s)

    def _wake_at(self, delay: float) -> None:
        if self._wait_timer is None or self._wait_timer.cancelled() \
                or self._wait_timer.when() <= asyncio.get_running_loop().time():
            self._wait_timer = asyncio.get_running_loop().call_later(delay, self.ctx.wake)

    def _decided(self, auction: Auction, decisions: list[Decision], round_s: float) -> None:
        self.round_times.append(round_s)
        count(self.ctx.metrics, auction, decisions, round_s)
        for d in decisions:
            if isinstance(d, Awarded):
                self.ctx.events.emit(d.request.instance_id, EventType.SCHEDULED,
                                     node_id=d.winner.node_id,
                                     detail=f"load {d.winner.load:.3f} ({d.winner.strategy})")
        if decisions:
            self.ctx.committer.submit(Item(
                plan=lambda view: self._plan(view, auction, decisions, round_s),
                failed=lambda reason, detail: self._failed(decisions, reason, detail),
                retry=False))

    def free(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        """Per node: heartbeat capacity minus what git and undelivered awards commit there."""
        return self.core.free(nodes)

    # -- the commit --------------------------------------------------------------------------
    def _plan(self, view: View, auction: Auction, decisions: list[Decision],
              round_s: float) -> Planned:
        out = Planned(lines=[])
        outcomes: list[Outcome] = []
        aid = auction.auction_id
        for d, shape in zip(decisions, shapes_of(auction, decisions), strict=True):
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                hb = self.ctx.liveness.heartbeats.get(d.winner.node_id)
                if d.displaced:  # its victims leave in this commit, or nothing happens
                    evicted = plan_evictions(view, d, hb.port_range if hb else [],
                                             self.ctx.leader.epoch)
                    if evicted is None:
                        out.after.append(functools.partial(self._not_placed, d))
                        continue
                    out.lines += evicted.lines
                    out.effects += evicted.effects
                placement = place(view, d, aid, hb.port_range if hb else [])
                if placement is None:
                    out.after.append(functools.partial(self._not_placed, d))
                    continue
                out.lines.append(place_line(d))
                outcomes.append(Outcome(instance_id=iid, shape=shape, winner=d.winner.node_id,
                                        load=d.winner.load, tie_broken=d.tie_broken,
                                        displaced=list(d.displaced)))
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
        displacing = ""
        if d.displaced:
            ctx.metrics.preemptions.inc(len(d.displaced))
            displacing = f"; displacing {', '.join(v.instance_id for v in d.displaced)}"
        ctx.events.emit(iid, EventType.PLACED, node_id=node, attempt=attempt,
               detail=f"commit {sha[:12]}; {len(d.bids)} bids, load {d.winner.load:.3f}"
               f"{' (tie broken on node id)' if d.tie_broken else ''}{displacing}")
        if ctx.log.isEnabledFor(logging.INFO):
            ctx.log.info("placed %s on %s: %d bids, load %.3f, round %.3fs, commit %s", iid,
                       node, len(d.bids), d.winner.load, round_s, sha[:12],
                       extra={"instance": iid, "winner": node, "bids": len(d.bids),
                              "load": d.winner.load, "round_s": round_s, "commit": sha[:12],
                              "auction": aid})

    def _released(self, d: Awarded, placed: bool) -> None:
        self.core.released(d)
        if not placed:
            self.ctx.wake()

    def _unschedulable(self, d: Unschedulable, aid: str, changed: bool, _sha: str = "") -> None:
        """Rule 7: the event only when the reason or summary changed (the record did)."""
        iid = d.request.instance_id
        self.core.unschedulable(iid, self.ctx.now())
        self._recent.remember(iid, aid, d)
        if changed:
            self.ctx.events.emit(iid, EventType.UNSCHEDULABLE, reason=d.reason,
                                 detail=d.summary)

    def _failed(self, decisions: Sequence[Decision], reason: Reason, detail: str) -> None:
        self.core.failed(decisions, self.ctx.now())
        for d in decisions:
            self.ctx.events.emit(d.request.instance_id, EventType.ERROR, reason=reason,
                                 detail=detail)

    def declines_by(self, node_id: str, limit: int) -> list[tuple[str, str, NodeDecline]]:
        return self._recent.declines_by(node_id, limit)

    def recent(self, iid: str) -> AuctionRecord | None:
        return self._recent.record(iid)

    def capacity_freed(self) -> None:
        """Waiting instances may fit now: retry them on the next pass."""
        self.core.capacity_freed()
        self.ctx.wake()

    def status_of(self, iid: str, state: InstanceState) -> str:
        if state in PENDING and iid in self.inflight:
            return InstanceState.SCHEDULED if state is InstanceState.QUEUED else state
        return state

