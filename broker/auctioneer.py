"""Running auctions: the shell around `shared.auctioneer.Core`, which decides them.

The core holds every rule that decides what is auctioned, whom it asks and what is awarded
(`shared.auctioneer` rules 1-12, numbered as operators and the docs cite them here); this
shell gives it the real clock, git's state and the heartbeats (`broker.auctionworld`), and
does what it asks: RFBs on NATS through the outbox, the deadline timers, the commits
(`broker.awardplan`: what they write and the effects that follow them), events and
metrics. The simulator drives the same core in virtual time (`sim.market`).

What the shell adds to the core's rules, by their numbers:
1. Pending work is re-derived from git on every pass; nothing else is remembered.
3. A winner's reservation ends when its commit's effect runs (`Placed`, `NotPlaced`) or the
   commit is given up (`AwardLost`).
4. A batch wait is a timer that runs the pass again when the oldest request's wait ends: a
   broadcast round costs a reply from every node however few requests it carries
   (docs/performance.md).
5. A round's RFBs are written to the socket as it opens (`Broker.flush`): its clock runs
   from its opening, and the gap between rounds is throughput lost (docs/performance.md).
   The rounds a pass opened go out before the rest of what it asked: a closed round's
   events and its hand-over to the committer are done while the next round's bids are on
   their way.
6. A late answer (`shared.auctioneer` rule 6) is no rejected message: nothing on the wire
   was wrong. A replay, an answer to a sampled auction from a node it did not ask, or one
   for an auction this broker never opened is a reject. Answers to other auctions (dry
   runs, re-auctions) go to their takers first (`broker.replyroutes`).
7. An instance's ``unschedulable`` event is emitted when its record changes (a new reason
   or summary), not every round: the same sentence every few seconds would bury the events
   an operator follows.
9. A new leadership (`broker.ha`) sets `hold_until`: it has asked every node for a heartbeat
   and gives them that long, rather than find its queued work "unschedulable: no nodes
   connected" in its first pass.
12. Unless given, the batch size, the rounds in flight and the committer's gap are the
    `shared.tuning.Tuner`'s: told of every round that closes (its time, whether work was
    left waiting, the requests in the rounds still open), every commit's time, and the work
    waiting for a round as every pass begins and as rounds close (the core's backlog and the
    submissions still landing, `incoming`: `broker.submissions` rule 6) beside the requests
    in flight, it moves them between the
    latency end and the throughput end as the load asks, from that pass on (a jump for a
    backlog heard as a round closes runs a pass at once: a closed loop that began while
    rounds were in flight waited for a tick before). A pass hears of the commits
    landed before it asks whether things are quiet, and tells whether work is landing (the
    committer not idle, or submissions landing). A value given is pinned, also one set
    on `batch_max` or `max_auctions` later.
13. `retune` (`gavel tune`) replaces the tuner with a fresh one pinning what it is given, as
    a broker started with those values would have it, applies its values at once and runs
    a pass; rounds in flight finish as they were opened. The rounds opened and closed under
    its settings are kept beside `round_times` (`since_tuned`, `since_tuned_total`) and
    handed back by the `retune` that ends them, so a caller reads what each setting did; a
    round opened before a change and closed after it is in neither record (the long rounds
    of a throughput end just left were counted against the latency end that followed).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from gavel.broker.auctionlog import Recent, count
from gavel.broker.auctionworld import Git
from gavel.broker.awardplan import (
    AwardLost,
    NotPlaced,
    Placed,
    Waits,
    plan_award,
    winner_ports,
)
from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item
from gavel.broker.replyroutes import ReplyRoutes
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.auctioneer import CLOSED_KEPT, Core, Decided, Open, Pinned, Wake
from gavel.shared.auctionworld import Action
from gavel.shared.award import NodeDecline
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import Award, BidReply, Capacity, EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import AuctionRecord
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
        #: Rule 12: instances submitted whose commit has not landed (`Submissions.incoming`,
        #: set by the API that makes them).
        self.incoming: Callable[[], int] = lambda: 0
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
        #: Rule 13: the rounds opened and closed since the tuner was last replaced (the
        #: last `ROUNDS_KEPT` of them), and how many in all.
        self.since_tuned: deque[float] = deque(maxlen=ROUNDS_KEPT)
        self.since_tuned_total = 0
        #: When the last change was made (rule 13; -inf: none since the broker started).
        self._tuned_at = -math.inf
        #: The last decisions, for `why` before git is walked (bounded; shares bid lists).
        self._recent = Recent(RECENT_KEPT)
        self.placed_total = 0
        self.replies_total = 0
        #: Replies to auctions not this auctioneer's: dry runs' (`broker.planner`) and the
        #: takers registered at construction (re-auctions, `broker.reauction`).
        self.routes = routes if routes is not None else ReplyRoutes()
        #: Dry runs' auctions (`broker.planner`): a reply for one of these ids is the plan's.
        self.dry = self.routes.dry
        #: The pending wake-up of a pass that found too little (rules 4, 9) and when it
        #: fires, on the loop's clock: uvloop hands back a plain `Handle`, with no `when()`,
        #: for a delay under a millisecond.
        self._wait_timer: asyncio.Handle | None = None
        self._wait_due = -math.inf
        effects = ctx.committer.effects
        effects.on(Placed, self._placed)
        effects.on(NotPlaced, self._not_placed)
        effects.on(Waits, self._waits)
        effects.on(AwardLost, self._lost)

    # -- the core's state, as the broker's other parts read it (the rest: `core`) ----------
    @property
    def auctions(self) -> dict[str, Auction]:
        return self.core.auctions

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

    def backlog(self) -> int:
        """Rule 12: the work waiting for a round, landed or still landing."""
        return self.core.backlog() + self.incoming()

    def _in_flight(self) -> int:
        """Rule 12: the requests in the rounds open."""
        return sum(len(a.requests) for a in self.core.auctions.values())

    # -- driving the core ------------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        self._heard_commits(now)  # rule 12: a commit that just landed is not quiet
        landing = not self.ctx.committer.idle.is_set() or self.incoming() > 0
        quiet = self.tuner.passed(now, len(self.core.auctions), landing)
        if self.tuner.waiting(self.backlog(), self._in_flight()) or quiet:  # rule 12
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
        """Do what the core asked: the rounds it opened first (rule 5), the rest in its order."""
        ctx = self.ctx
        actions = self.core.take()
        for action in actions:  # rule 5: a round opening goes out before the rest is done
            if isinstance(action, Open):
                self._open(action)
        for action in actions:
            if isinstance(action, Decided):
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

    def _open(self, action: Open) -> None:
        ctx, auction = self.ctx, action.auction
        payload = ctx.outbox.encode(auction.rfb())
        if action.to is not None:
            for node in action.to:
                ctx.outbox.publish_raw(subjects.RFB_NODE.format(node=node), payload)
        else:
            ctx.outbox.publish_raw(subjects.RFB, payload)
        ctx.outbox.flush()  # the round is being timed: its RFBs do not wait
        asyncio.get_running_loop().call_later(auction.deadline_s, self._deadline,
                                              auction.auction_id)

    def _observe(self, actions: Sequence[Action], now: float) -> None:
        """Rule 12: the tuner hears of the commits written and the rounds closed since it
        last heard, and what it chose applies from the next pass."""
        self._heard_commits(now)
        if not actions or not any(isinstance(a, Decided) for a in actions):
            return  # no round closed (most bid replies): nothing else to hear
        in_flight = self._in_flight()
        if self.tuner.took(actions, len(self.core.auctions), now, in_flight):
            self._tuned()
        if self.tuner.waiting(self.backlog(), in_flight):
            self._tuned()
            self.ctx.wake()  # rule 12: the throughput end's rounds open now, not at a tick

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

    def retune(self, *, batch_max: int | None, max_auctions: int | None,
               commit_gap_s: float | None) -> tuple[list[float], int]:
        """Rule 13: a fresh tuner pinning what is given (None: tuned), its values applied now;
        the rounds closed under the one it replaces, oldest first, and how many closed."""
        ended = list(self.since_tuned), self.since_tuned_total
        self.tuner = Tuner(batch_max=batch_max, max_auctions=max_auctions,
                           commit_gap_s=commit_gap_s)
        self.since_tuned.clear()
        self.since_tuned_total = 0
        self._tuned_at = self.ctx.now()
        self._tuned()
        self.ctx.wake()  # waiting work is opened under the new settings now, not at a tick
        gap_ms = None if commit_gap_s is None else 1000 * commit_gap_s
        self.ctx.log.info("retuned: batch %s, rounds in flight %s, commit gap %s ms", *(
            "tuned" if v is None else f"{v:g}" for v in (batch_max, max_auctions, gap_ms)))
        return ended

    def _wake_at(self, delay: float) -> None:
        """A pass in `delay` seconds, unless one is already due by then; a later one pending
        gives way to it."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now + max(0.0, delay)
        timer = self._wait_timer
        if timer is not None and not timer.cancelled() and now < self._wait_due <= due:
            return
        if timer is not None:
            timer.cancel()
        self._wait_timer = loop.call_later(max(0.0, delay), self.ctx.wake)
        self._wait_due = due

    def _decided(self, auction: Auction, decisions: list[Decision], round_s: float) -> None:
        self.round_times.append(round_s)
        if auction.opened_at >= self._tuned_at:  # rule 13: opened under these settings
            self.since_tuned.append(round_s)
            self.since_tuned_total += 1
        count(self.ctx.metrics, auction, decisions, round_s)
        for d in decisions:
            if isinstance(d, Awarded):
                self.ctx.events.emit(d.request.instance_id, EventType.SCHEDULED,
                                     node_id=d.winner.node_id,
                                     detail=f"load {d.winner.load:.3f} ({d.winner.strategy})")
        if decisions:
            self.ctx.committer.submit(Item(  # what it reads, gathered now (`awardplan` rule 6)
                plan=functools.partial(
                    plan_award, auction=auction, decisions=decisions, round_s=round_s,
                    ports=winner_ports(decisions, self.ctx.liveness.heartbeats),
                    epoch=self.ctx.leader.epoch),
                retry=False, gave_up=[AwardLost(tuple(decisions))]))

    def free(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        """Per node: heartbeat capacity minus what git and undelivered awards commit there."""
        return self.core.free(nodes)

    # -- what follows a commit, once it is durable (`broker.awardplan`) -------------------
    def _not_placed(self, e: NotPlaced, _sha: str) -> None:
        self._released(e.decision, placed=False)

    def _placed(self, e: Placed, sha: str) -> None:
        ctx = self.ctx
        d, aid, attempt, round_s = e.decision, e.auction_id, e.attempt, e.round_s
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

    def _waits(self, e: Waits, _sha: str) -> None:
        """Rule 7: the event only when the reason or summary changed (the record did)."""
        d, aid, changed = e.decision, e.auction_id, e.changed
        iid = d.request.instance_id
        self.core.unschedulable(iid, self.ctx.now())
        self._recent.remember(iid, aid, d)
        if changed:
            self.ctx.events.emit(iid, EventType.UNSCHEDULABLE, reason=d.reason,
                                 detail=d.summary)

    def _lost(self, e: AwardLost, _sha: str) -> None:
        self.core.failed(e.decisions, self.ctx.now())
        for d in e.decisions:
            self.ctx.events.emit(d.request.instance_id, EventType.ERROR, reason=e.reason,
                                 detail=e.detail)

    def declines_by(self, node_id: str, limit: int) -> list[tuple[str, str, NodeDecline]]:
        return self._recent.declines_by(node_id, limit)

    def recent(self, iid: str) -> AuctionRecord | None:
        return self._recent.record(iid)

    def capacity_freed(self) -> None:
        """Waiting instances may fit now: retry them on the next pass."""
        self.core.capacity_freed()
        self.ctx.wake()

    def status_of(self, iid: str, state: InstanceState) -> str:
        if state in PENDING and iid in self.core.inflight:
            return InstanceState.SCHEDULED if state is InstanceState.QUEUED else state
        return state

