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
   far fewer rounds (1,000 nodes, 1,000 submissions/s: see the README's Performance).
5. The next round opens as the last one closes, when work waits and there is room (not when
   the loop next gets round to it), and its RFBs are written to the socket as it opens
   (`Broker.flush`): a round's clock runs from its opening, and with one round in flight
   the gap between rounds is throughput lost. Side by side (`gavel bench`, 1,000 agents,
   `--max-auctions 1 --batch-max 32`, five runs each): 4,637 -> 5,024 placements/s, the
   round p99 unchanged. An auction that closes as it opens (no candidate) does not open
   others from inside the pass that opened it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Iterable
from itertools import filterfalse
from typing import TYPE_CHECKING

import msgspec

from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, place, unschedulable
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import BidReply, Capacity, Decline, EventType, InstanceState, Request
from gavel.shared.reasons import Reason, render
from gavel.shared.records import AuctionRecord, BatchRecord, Outcome, ShapeRecord, auction_trailer
from gavel.transport.wire import Received

if TYPE_CHECKING:
    from gavel.broker.service import Broker

__all__ = ["RECENT_KEPT", "Auctioneer"]

RECENT_KEPT = 2048

_bids_dec = msgspec.msgpack.Decoder(BidReply)


class Auctioneer:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.auctions: dict[str, Auction] = {}
        self.inflight: set[str] = set()
        self.reserved: dict[str, Capacity] = {}
        self.retry_at: dict[str, float] = {}
        #: The last decisions, for `why` before git is walked (bounded; shares bid lists).
        self._recent: dict[str, tuple[str, Decision]] = {}
        self.placed_total = 0
        self.auctions_total = 0
        self.replies_total = 0
        #: When the waiting (not yet auctioned) work began to wait; None: nothing waits.
        self.waiting_since: float | None = None
        self._wait_timer: asyncio.TimerHandle | None = None
        self._opening = False

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
        b = self.b
        state = b.ledger.state()
        room = b.max_auctions - len(self.auctions)
        want = max(room, 1) * b.batch_max
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
        if len(pending) < b.batch_max and now - self.waiting_since < b.batch_wait_s:
            self._wake_at(self.waiting_since + b.batch_wait_s - now)  # rule 4
            return
        if b.ledger.pinned:
            for r in pending:
                if r.instance_id not in b.pinned_reported:
                    b.pinned_reported.add(r.instance_id)
                    b.emit(r.instance_id, EventType.ERROR, reason=Reason.PINNED,
                           detail=b.ledger.ref)
            return
        if room <= 0:
            return
        eligible = b.liveness.eligible(now)
        if state.unusable_nodes:  # a node.json we cannot read: that node wins nothing
            eligible = [n for n in eligible if n not in state.unusable_nodes]
        groups: dict[tuple[str, ...], list[Request]] = {}
        for r in pending:
            groups.setdefault(tuple(r.excluded), []).append(Request.of(r.instance_id, r.spec))
        for excluded, requests in groups.items():
            candidates = ([n for n in eligible if n not in excluded] or eligible) \
                if excluded else eligible
            for i in range(0, len(requests), b.batch_max):
                if room <= 0:
                    return  # what is left has waited already: it goes when room frees
                self.open(requests[i:i + b.batch_max], candidates, now)
                room -= 1
        self.waiting_since = None

    def _wake_at(self, delay: float) -> None:
        if self._wait_timer is None or self._wait_timer.cancelled() \
                or self._wait_timer.when() <= asyncio.get_running_loop().time():
            self._wait_timer = asyncio.get_running_loop().call_later(delay, self.b.wake)

    def open(self, requests: list[Request], candidates: list[str], now: float) -> None:
        """One auction: broadcast to every candidate, or — with sampling on and a cluster
        larger than d per request — to d·len(requests) sampled nodes (Sparrow's batch
        sampling), each addressed on its own subject."""
        b = self.b
        aid = uuid.uuid4().hex[:12]
        deadline = b.timing.bid_deadline_s
        d = b.sample_d
        sampled = d is not None and len(candidates) > d * len(requests)
        if sampled:
            candidates = sorted(b.rng.sample(candidates, (d or 1) * len(requests)))
        auction = Auction(aid, requests, candidates, now, deadline)
        self.auctions[aid] = auction
        self.auctions_total += 1
        self.inflight.update(r.instance_id for r in requests)
        if not candidates:
            self.close(auction)
            return
        payload = b.encode(auction.rfb())
        if sampled:
            for node in candidates:
                b.publish_raw(subjects.RFB_NODE.format(node=node), payload)
        else:
            b.publish_raw(subjects.RFB, payload)
        b.flush()  # the round is being timed: its RFBs do not wait for the sender's turn
        asyncio.get_running_loop().call_later(deadline, self._deadline, aid)

    def _deadline(self, aid: str) -> None:
        auction = self.auctions.get(aid)
        if auction is not None:
            self.close(auction)

    # -- bids ----------------------------------------------------------------------------
    def on_bids(self, msg: Received) -> None:
        b = self.b
        try:
            reply = _bids_dec.decode(msg.data)
        except (msgspec.DecodeError, RecursionError) as exc:  # depth guard: no DecodeError
            b.rejects.malformed("bid reply", msg.subject, exc)
            return
        if subjects.node_of(msg.subject) != reply.node_id:
            b.rejects.count("bid for another node", msg.subject)
            return
        self.replies_total += 1
        auction = self.auctions.get(reply.auction_id)
        if auction is None:
            b.rejects.count(Verdict.WRONG_AUCTION, msg.subject)
            return
        draining = b.ledger.state().draining
        if draining and reply.node_id in draining:
            # git says draining; the node may not know yet (or ignores it): a bid from it is
            # taken as the decline it should have sent, so `gavel why` still shows it asked.
            reply = msgspec.structs.replace(reply, answers=[
                Decline(shape=a.shape, reason=Reason.DRAINING) for a in reply.answers])
        now = b.now()
        verdict = auction.receive(reply, now)
        if verdict is not Verdict.ACCEPTED:
            b.rejects.count(verdict, msg.subject)
        if auction.done(now):
            self.close(auction)

    def free(self, nodes: Iterable[str]) -> dict[str, Capacity]:
        """Per node: heartbeat capacity minus what git and undelivered awards commit there."""
        state = self.b.ledger.state()
        beats = self.b.liveness.heartbeats
        out: dict[str, Capacity] = {}
        for node_id in nodes:
            hb = beats.get(node_id)
            if hb is None:
                continue
            cap = hb.capacity
            free = Capacity(cpu=cap.cpu, memory_mb=cap.memory_mb, ports=cap.ports)
            used = state.committed.get(node_id)
            if used is not None:
                free.cpu -= used.cpu
                free.memory_mb -= used.memory_mb
                free.ports -= used.ports
            res = self.reserved.get(node_id)
            if res is not None:
                free.cpu -= res.cpu
                free.memory_mb -= res.memory_mb
                free.ports -= res.ports
            out[node_id] = free
        return out

    # -- closing -------------------------------------------------------------------------
    def close(self, auction: Auction) -> None:
        del self.auctions[auction.auction_id]
        now = self.b.now()
        decisions = auction.decide(now, self.free(auction.eligible))
        round_s = now - auction.opened_at
        self.b.round_times.append(round_s)
        m = self.b.metrics
        m.round_seconds.observe(round_s)
        awarded = sum(1 for d in decisions if isinstance(d, Awarded))
        if awarded:
            m.auctions.labels(outcome="awarded").inc(awarded)
        if awarded < len(decisions):
            m.auctions.labels(outcome="unschedulable").inc(len(decisions) - awarded)
        for strategy, n in auction.bid_counts().items():
            m.bids.labels(strategy=strategy).inc(n)
        for reason, n in auction.decline_counts().items():
            m.declines.labels(reason=reason).inc(n)
        for d in decisions:
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, +1)
                self.b.emit(d.request.instance_id, EventType.SCHEDULED,
                            node_id=d.winner.node_id,
                            detail=f"load {d.winner.load:.3f} ({d.winner.strategy})")
        self.b.committer.submit(Item(
            plan=lambda view: self._plan(view, auction, decisions, round_s),
            failed=lambda reason, detail: self._failed(decisions, reason, detail),
            retry=False))
        if self._opening:  # closed as it opened: the pass under way counted it; the next
            self.b.wake()  # pass has its room
        else:  # the next round goes out now, not after the loop's other work (rule 5)
            self.reconcile(now)

    def _reserve(self, node_id: str, req: Request, sign: int) -> None:
        res = self.reserved.setdefault(node_id, Capacity())
        res.cpu += sign * req.cpu
        res.memory_mb += sign * req.memory_mb
        res.ports += sign * req.ports

    def _plan(self, view: View, auction: Auction, decisions: list[Decision],
              round_s: float) -> Planned:
        out = Planned(lines=[])
        outcomes: list[Outcome] = []
        aid = auction.auction_id
        for d, shape in zip(decisions, auction.shape_of, strict=True):
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                hb = self.b.liveness.heartbeats.get(d.winner.node_id)
                placement = place(view, d, aid, hb.port_range if hb else [])
                if placement is None:
                    out.after.append(functools.partial(self._not_placed, d))
                    continue
                out.lines.append(_place_line(d))
                outcomes.append(Outcome(instance_id=iid, shape=shape, winner=d.winner.node_id,
                                        load=d.winner.load, tie_broken=d.tie_broken))
                out.after.append(functools.partial(self._placed, d, aid, placement.attempt,
                                                   round_s=round_s))
            else:
                if unschedulable(view, d):
                    out.lines.append(f"unschedulable {iid}: {d.summary}")
                    outcomes.append(Outcome(instance_id=iid, shape=shape, reason=d.reason,
                                            summary=d.summary))
                out.after.append(functools.partial(self._unschedulable, d, aid))
        if outcomes:
            out.trailers.append(auction_trailer(_batch_record(auction, decisions, outcomes)))
        return out

    def _not_placed(self, d: Awarded, _sha: str) -> None:
        self._released(d, placed=False)

    def _placed(self, d: Awarded, aid: str, attempt: int, sha: str, round_s: float) -> None:
        b = self.b
        iid, node = d.request.instance_id, d.winner.node_id
        self._released(d, placed=True)
        self.placed_total += 1
        b.metrics.placements.inc()
        self._remember(iid, aid, d)
        rec = b.ledger.state().instances.get(iid)
        b.timers.placed(iid, node, b.now(), b.timing, rec.spec.timeout_s if rec else None)
        award = b.award_for(iid, node, sha)
        if award is not None:
            b.publish(subjects.AWARD.format(node=node), award)
        b.emit(iid, EventType.PLACED, node_id=node, attempt=attempt,
               detail=f"commit {sha[:12]}; {len(d.bids)} bids, load {d.winner.load:.3f}"
               f"{' (tie broken on node id)' if d.tie_broken else ''}")
        if b.log.isEnabledFor(logging.INFO):
            b.log.info("placed %s on %s: %d bids, load %.3f, round %.3fs, commit %s", iid,
                       node, len(d.bids), d.winner.load, round_s, sha[:12],
                       extra={"instance": iid, "winner": node, "bids": len(d.bids),
                              "load": d.winner.load, "round_s": round_s, "commit": sha[:12],
                              "auction": aid})

    def _released(self, d: Awarded, placed: bool) -> None:
        self._reserve(d.winner.node_id, d.request, -1)
        self.inflight.discard(d.request.instance_id)
        if not placed:
            self.b.wake()

    def _unschedulable(self, d: Unschedulable, aid: str, _sha: str = "") -> None:
        iid = d.request.instance_id
        self.inflight.discard(iid)
        self._remember(iid, aid, d)
        self.retry_at[iid] = self.b.now() + self.b.timing.heartbeat_s
        self.b.emit(iid, EventType.UNSCHEDULABLE, reason=d.reason, detail=d.summary)

    def _failed(self, decisions: list[Decision], reason: Reason, detail: str) -> None:
        for d in decisions:
            iid = d.request.instance_id
            if isinstance(d, Awarded):
                self._reserve(d.winner.node_id, d.request, -1)
            self.inflight.discard(iid)
            self.retry_at[iid] = self.b.now() + self.b.timing.tick_s
            self.b.emit(iid, EventType.ERROR, reason=reason, detail=detail)

    def _remember(self, iid: str, aid: str, d: Decision) -> None:
        recent = self._recent  # a dict keeps insertion order: the oldest is first
        recent.pop(iid, None)
        recent[iid] = (aid, d)
        if len(recent) > RECENT_KEPT:
            del recent[next(iter(recent))]

    def recent(self, iid: str) -> AuctionRecord | None:
        got = self._recent.get(iid)
        return None if got is None else _record(*got)

    def capacity_freed(self) -> None:
        """Waiting instances may fit now: retry them on the next pass."""
        self.retry_at.clear()
        self.b.wake()

    def status_of(self, iid: str, state: InstanceState) -> str:
        if state in PENDING and iid in self.inflight:
            return InstanceState.SCHEDULED if state is InstanceState.QUEUED else state
        return state


def _record(aid: str, d: Decision) -> AuctionRecord:
    if isinstance(d, Awarded):
        return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id,
                             winner=d.winner.node_id, load=d.winner.load,
                             tie_broken=d.tie_broken, bids=list(d.bids),
                             declines=list(d.declines), silent=list(d.silent))
    return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id, bids=list(d.bids),
                         declines=list(d.declines), silent=list(d.silent), reason=d.reason,
                         summary=d.summary)


def _batch_record(auction: Auction, decisions: list[Decision],
                  outcomes: list[Outcome]) -> BatchRecord:
    """One trailer for the auction: each shape's bids once (from the last decision made
    for it, whose declines include any node that ran out of room during the batch)."""
    last: dict[int, Decision] = {}
    for d, s in zip(decisions, auction.shape_of, strict=True):
        last[s] = d
    shapes = [ShapeRecord(shape=shape, bids=list(last[i].bids),
                          declines=list(last[i].declines), silent=list(last[i].silent))
              for i, shape in enumerate(auction.shapes)]
    return BatchRecord(auction_id=auction.auction_id, shapes=shapes, outcomes=outcomes)


def _place_line(d: Awarded) -> str:
    w = d.winner
    others = len(d.bids) - 1
    tie = ", tie broken on node id" if d.tie_broken else ""
    declines = "; ".join(f"{x.node_id} {render(x.reason, x.detail)}" for x in d.declines)
    return (f"place {d.request.instance_id} on {w.node_id}: load {w.load:.3f} "
            f"({w.strategy}) beat {others} other bid{'s' if others != 1 else ''}{tie}"
            + (f"; declined: {declines}" if declines else ""))


