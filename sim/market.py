"""The production auctioneer in virtual time: `shared.auctioneer.Core`, as the broker runs it.

Rules:
1. The simulator is the core's world (`_Ledger`): git's pending work and placements are the
   driver's, the heartbeats are the cluster's nodes (their total capacity, labels, drain),
   and every decision comes from the core - batching, the pipelining bound, exclusion,
   reservations, sampling, the wider ask, retry timers. Nothing here picks a winner.
2. Messages take a latency drawn from ``network.latency_s`` each way; RFBs, bids, awards and
   acknowledgements are each lost with ``market.loss``. A round's replies reach the core at
   its close (the last answer, or the deadline); a reply after the deadline is late.
3. A node bids on its own view, which learns of an award ``market.staleness_s`` after its
   commit (of an end at once), so it can bid for room it no longer has; the core's
   reservations and git's commitments stop the over-commit. `over_commits` counts nodes
   git ever committed beyond their capacity: 0 unless a reservation is missing.
4. Decisions commit in group commits, each ``market.commit_lag_s`` long, one at a time;
   what is decided meanwhile goes in the next. An award is reserved until its commit lands.
5. A placed instance whose award or acknowledgement never arrived is revoked at the
   provisioning deadline (``timing.provisioning_s``) and re-auctioned without that node, as
   is one its node failed to start (``market.provisioning_failure``); an acknowledgement
   lost is heard with the node's next heartbeat. Out of attempts, it is lost.
6. A restarting node is silent for ``market.restart_s`` and rejoins under its own id with
   its instances; awards sent meanwhile are lost. Failures, joins and drains follow the
   scenario's script as on the fast path (`sim.engine` rule 3).
7. Events at equal times run in a fixed kind order, then by sequence; every random draw
   comes from a stream named after the policy: a run is a pure function of scenario and seed.
8. With ``market.tune`` the broker's `shared.tuning.Tuner` chooses the batch size and the
   rounds in flight from the rounds it sees close (and the requests still in flight after
   each, and the work waiting for a round as each pass begins), and paces the commits: the
   next one starts its gap after the last landed.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.auctioneer import Core, Decided, Open, Wake
from gavel.shared.messages import Bid, BidReply
from gavel.shared.records import InstanceRecord
from gavel.shared.strategies import Strategy
from gavel.shared.tuning import Tuner
from gavel.sim.cluster import Cluster, ScriptEvent
from gavel.sim.marketworld import Inst, Ledger, Views, specs
from gavel.sim.metrics import PolicyResult, Recorder
from gavel.sim.scenario import GavelPolicy, Scenario
from gavel.sim.workload import Arrival, Catalogue

__all__ = ["Market"]

Progress = Callable[[float], None]
(_SCRIPT, _UNREACHABLE, _OFFLINE, _FINISH, _COMMIT, _CLOSE, _AWARD, _ACK, _REVOKE, _RESTART,
 _TIMER, _PASS, _ARRIVAL, _VIEW, _SAMPLE, _PATIENCE) = range(16)


class Market:
    def __init__(self, s: Scenario, policy: GavelPolicy, cluster: Cluster,
                 catalogue: Catalogue, arrivals: Iterator[Arrival], script: list[ScriptEvent],
                 strategies: list[Strategy], recorder: Recorder, seed: int,
                 progress: Progress | None = None) -> None:
        self.s, self.cluster, self.catalogue = s, cluster, catalogue
        self.arrivals, self.script, self.strategies = arrivals, script, strategies
        self.rec, self.progress = recorder, progress
        m = s.market
        self.lag, self.loss = m.commit_lag_s, (s.network.loss if m.loss is None else m.loss)
        self.stale = s.timing.mirror_s if m.staleness_s is None else m.staleness_s
        name = recorder.result.policy
        self.rng = random.Random(f"{seed}/market/{name}")
        self.net = random.Random(f"{seed}/network/{name}")
        self.world = Ledger(cluster)
        t = s.timing
        #: Rule 8.
        self.tuner = Tuner() if m.tune else None
        self.core = Core(self.world, deadline_s=s.deadline_s, heartbeat_s=t.heartbeat_s,
                         tick_s=t.tick_s,
                         batch_max=self.tuner.batch_max if self.tuner else m.batch_max,
                         max_auctions=self.tuner.max_auctions if self.tuner else m.max_auctions,
                         batch_wait_s=m.batch_wait_s, rng=random.Random(f"{seed}/placer/{name}"),
                         sample_d=policy.d if policy.mode == "sample" else None)
        self.specs = specs(catalogue)
        self.nodes = Views(cluster, catalogue, strategies)  # their own views (rule 3)
        self.down = [False] * len(cluster)  # restarting (rule 6)
        self.insts: dict[str, Inst] = {}
        self.queued = [0] * len(s.workload.classes)
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.timer_at = math.inf
        self.committing: list[Decided] | None = None  # the commit in flight (rule 4)
        self.next_commit: list[Decided] = []
        self.commit_free = -math.inf  # when the gap after the last commit ends (rule 8)
        self.counts = dict.fromkeys(("rounds", "replies", "stale_bids", "over_commits",
                                     "lost_messages", "revoked", "provisioning_failed",
                                     "restarts", "late"), 0)

    # -- the loop ------------------------------------------------------------------------------
    def _push(self, at: float, kind: int, data: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, data))

    def run(self) -> PolicyResult:
        s, end = self.s, self.s.duration_s
        for idx in self.cluster.alive.items:
            self._heard(idx)
        for i, ev in enumerate(self.script):
            self._push(ev.at, _SCRIPT, i)
        for _ in range(s.market.restarts):
            self._push(self.rng.uniform(0.0, end), _RESTART,
                       (self.rng.randrange(self.cluster.initial), False))
        self._next_arrival()
        self._push(0.0, _SAMPLE, True)
        self._push(s.timing.tick_s, _PATIENCE)
        step, next_report = end / 100.0, end / 100.0
        heap = self.heap
        handlers: dict[int, Callable[[float, Any], None]] = {
            _SCRIPT: self._script, _UNREACHABLE: self._unreachable, _OFFLINE: self._off,
            _FINISH: self._finish, _COMMIT: self._landed, _CLOSE: self._close,
            _AWARD: self._award, _ACK: self._ack, _REVOKE: self._revoke,
            _RESTART: self._restart, _TIMER: self._timer, _PASS: self._pass,
            _ARRIVAL: self._arrive, _VIEW: self._view, _SAMPLE: self._sample,
            _PATIENCE: self._patience}
        while heap and heap[0][0] <= end:
            at, kind, _, data = heapq.heappop(heap)
            handlers[kind](at, data)
            if self.progress and at >= next_report:
                self.progress(min(at / end, 0.999))
                next_report = at + step
        if not self.rec.samples or self.rec.samples[-1][0] < end:
            self._sample(end, False)
        if self.progress:
            self.progress(1.0)
        self.counts["late"] = self.core.late_total
        waiting = [(self.insts[i].cls, self.insts[i].arrived) for i in self.world.queue]
        result = self.rec.finish(len(self.world.queue), waiting)
        result.market = dict(self.counts)
        return result

    def _pass(self, now: float, _: Any = None) -> None:
        tuner = self.tuner
        landing = self.committing is not None or bool(self.next_commit)
        if tuner is not None and (tuner.passed(now, len(self.core.auctions), landing)
                                  | tuner.waiting(self.core.backlog(), self._in_flight())):
            self._tuned()
        self.core.reconcile(now)
        self._act(now)

    def _in_flight(self) -> int:
        return sum(len(a.requests) for a in self.core.auctions.values())

    def _tuned(self) -> None:
        assert self.tuner is not None
        self.core.batch_max, self.core.max_auctions = self.tuner.batch_max, \
            self.tuner.max_auctions

    def _timer(self, now: float, _: Any) -> None:
        if now >= self.timer_at:
            self.timer_at = math.inf
        self.core.handle_timer(now)
        self._act(now)

    def _act(self, now: float) -> None:
        """Do what the core asked, in its order (rule 1)."""
        actions = self.core.take()
        for action in actions:
            if isinstance(action, Open):
                self._send(action.auction, now)
            elif isinstance(action, Decided):
                self._submit(action, now)
            elif isinstance(action, Wake):
                self._push(now, _PASS)
        in_flight = self._in_flight()
        if self.tuner is not None and self.tuner.took(
                actions, len(self.core.auctions), now, in_flight):
            self._tuned()
        if self.tuner is not None and any(isinstance(a, Decided) for a in actions) \
                and self.tuner.waiting(self.core.backlog(), in_flight):
            self._tuned()  # as the broker: a backlog heard as rounds close, a pass at once
            self._push(now, _PASS)
        at = self.core.timer()
        if at is not None and at < self.timer_at:
            self.timer_at = at
            self._push(max(at, now), _TIMER)

    # -- rounds (rule 2, 3) ----------------------------------------------------------------------
    def _lost(self) -> bool:
        if self.loss and self.net.random() < self.loss:
            self.counts["lost_messages"] += 1
            return True
        return False

    def _latency(self) -> float:
        return self.s.network.latency_s.sample(self.net)

    def _send(self, auction: Auction, now: float) -> None:
        self.counts["rounds"] += 1
        by_id, nodes = self.cluster.by_id, self.cluster.nodes
        shapes = auction.shapes
        keys = [sh.key() for sh in shapes]
        replies: list[tuple[float, BidReply]] = []
        last = now
        for node_id in sorted(auction.eligible):
            idx = by_id[node_id]
            if not nodes[idx].alive or self.down[idx] or self._lost():
                continue
            at = now + self._latency()
            answers = [self.nodes.answer(idx, sh, k, i)
                       for i, (sh, k) in enumerate(zip(shapes, keys, strict=True))]
            for sh, ans in zip(shapes, answers, strict=True):
                if isinstance(ans, Bid) and not self.nodes.fits(idx, sh, self.core.reserved):
                    self.counts["stale_bids"] += 1
            reply = BidReply(auction_id=auction.auction_id, node_id=node_id, answers=answers)
            if self._lost():
                continue
            at += self._latency()
            replies.append((at, reply))
            last = max(last, at)
        self.counts["replies"] += len(replies)
        close = last if len(replies) == len(auction.eligible) else auction.deadline
        replies.sort(key=lambda r: (r[0], r[1].node_id))
        self._push(min(close, auction.deadline), _CLOSE, (auction.auction_id, replies))

    def _later(self, now: float, idx: int, shape: int, sign: int) -> None:
        """The node learns of a change git made `staleness_s` from now (rule 3)."""
        if self.stale:
            self._push(now + self.stale, _VIEW, (idx, shape, sign))
        else:
            self.nodes.see(idx, shape, sign)

    def _view(self, now: float, data: Any) -> None:
        idx, shape, sign = data
        self.nodes.see(idx, shape, sign)

    def _close(self, now: float, data: Any) -> None:
        aid, replies = data
        late = []
        for at, reply in replies:
            if at > now:
                late.append(reply)
            elif self.core.receive(reply, at) is not None:
                raise AssertionError("the simulator sent a reply the core rejects")
        self.core.expire(aid, now)
        for reply in late:  # after the close: counted late (`shared.auctioneer` rule 6)
            self.core.receive(reply, now)
        self._act(now)

    # -- commits (rule 4) ------------------------------------------------------------------------
    def _submit(self, decided: Decided, now: float) -> None:
        if not decided.decisions:
            return
        if self.committing is None:
            self.committing = [decided]
            self._push(max(now, self.commit_free) + self.lag, _COMMIT)
        else:
            self.next_commit.append(decided)

    def _landed(self, now: float, _: Any) -> None:
        batch, self.committing = self.committing or [], None
        for decided in batch:
            for d in decided.decisions:
                self._commit(d, now)
        gap = 0.0
        if self.tuner is not None:  # rule 8
            self.tuner.committed(self.lag, now)
            gap = self.tuner.commit_gap_s
        self.commit_free = now + gap
        if self.next_commit:
            self.committing, self.next_commit = self.next_commit, []
            self._push(self.commit_free + self.lag, _COMMIT)
        self._pass(now)

    def _commit(self, d: Decision, now: float) -> None:
        inst = self.insts[d.request.instance_id]
        if not isinstance(d, Awarded):
            self.core.unschedulable(inst.iid, now)
            self.rec.unschedulable(d.reason, inst.cls, not inst.waited, inst.arrived)
            inst.waited = True
            return
        idx = self.cluster.by_id[d.winner.node_id]
        node = self.cluster.nodes[idx]
        if not node.eligible:  # the node left meanwhile: git refuses the placement
            self.core.released(d)
            return
        shape = self.catalogue.shapes[inst.shape]
        node.charge(shape, +1)
        if node.used_milli > node.cap_milli or node.used_memory > node.group.memory_mb \
                or node.used_ports > node.group.ports:
            self.counts["over_commits"] += 1
        node.instances.add(int(inst.iid[1:]))
        del self.world.queue[inst.iid]
        self.queued[inst.cls] -= 1
        self.core.released(d)
        inst.node, inst.acked = idx, False
        inst.epoch += 1
        inst.awards += 1
        self.rec.placed(idx, now - inst.queued_at, d.tie_broken, inst.kind, inst.cls,
                        inst.arrived, not inst.waited)
        self._later(now, idx, inst.shape, +1)
        if not self._lost() and node.alive and not self.down[idx]:
            self._push(now + self._latency(), _AWARD, (inst.iid, inst.epoch))
        self._push(now + self.s.timing.provisioning_s, _REVOKE, (inst.iid, inst.epoch))

    # -- the node's side (rule 5) ------------------------------------------------------------------
    def _current(self, data: Any) -> Inst | None:
        iid, epoch = data
        inst = self.insts.get(iid)
        return inst if inst is not None and inst.epoch == epoch and inst.node >= 0 else None

    def _award(self, now: float, data: Any) -> None:
        inst = self._current(data)
        if inst is None or self.down[inst.node] or not self.cluster.nodes[inst.node].alive:
            return
        if self.s.market.provisioning_failure and \
                self.rng.random() < self.s.market.provisioning_failure:
            self.counts["provisioning_failed"] += 1
            self._move(inst, now, "replace", exclude=True)
            return
        at = now + self._latency()
        if self._lost():  # heard with the next heartbeat
            at = now + self.s.timing.heartbeat_s
        self._push(at, _ACK, data)
        if math.isfinite(inst.duration):
            self._push(now + inst.duration, _FINISH, data)

    def _ack(self, now: float, data: Any) -> None:
        inst = self._current(data)
        if inst is not None:
            inst.acked = True

    def _revoke(self, now: float, data: Any) -> None:
        inst = self._current(data)
        if inst is not None and not inst.acked:
            self.counts["revoked"] += 1
            self._move(inst, now, "replace", exclude=True)

    def _finish(self, now: float, data: Any) -> None:
        inst = self._current(data)
        if inst is None or not self.cluster.nodes[inst.node].alive:
            return
        idx = self._release(inst)
        self.nodes.see(idx, inst.shape, -1)
        del self.insts[inst.iid]
        self._freed(now)

    def _release(self, inst: Inst) -> int:
        idx = inst.node
        node = self.cluster.nodes[idx]
        node.charge(self.catalogue.shapes[inst.shape], -1)
        node.instances.discard(int(inst.iid[1:]))
        inst.node = -1
        return idx

    def _freed(self, now: float) -> None:
        self.core.capacity_freed()
        self._push(now, _PASS)

    def _move(self, inst: Inst, now: float, kind: str, exclude: bool) -> None:
        """Off its node: queued again (without that node), or lost out of attempts."""
        idx = self._release(inst)
        self._later(now, idx, inst.shape, -1)
        if kind == "replace" and inst.awards >= self.s.workload.attempts:
            self.rec.result.lost += 1
            del self.insts[inst.iid]
        else:
            if exclude:
                inst.excluded = tuple(sorted({*inst.excluded, self.cluster.ids[idx]}))
            inst.kind, inst.queued_at = kind, now
            self._queue(inst)
        self._freed(now)

    def _queue(self, inst: Inst) -> None:
        self.world.records[inst.iid] = InstanceRecord(
            instance_id=inst.iid, spec=self.specs[inst.shape], excluded=inst.excluded)
        self.world.queue[inst.iid] = None
        self.queued[inst.cls] += 1

    # -- arrivals, samples, patience -------------------------------------------------------------
    def _next_arrival(self) -> None:
        a = next(self.arrivals, None)
        if a is not None:
            self._push(a.at, _ARRIVAL, a)

    def _arrive(self, now: float, data: Any) -> None:
        a: Arrival = data
        self.rec.result.arrivals += 1
        self.rec.arrived(a.cls, a.at)
        inst = Inst(a)
        self.insts[inst.iid] = inst
        self._queue(inst)
        self._next_arrival()
        self._pass(now)

    def _sample(self, now: float, again: Any) -> None:
        waiting = sorted({self.insts[iid].shape for iid in self.world.queue})
        self.rec.sample(now, len(self.world.queue), waiting, self.queued)
        if again and now + self.s.interval_s <= self.s.duration_s:
            self._push(now + self.s.interval_s, _SAMPLE, True)

    def _patience(self, now: float, _: Any) -> None:
        patience = self.s.workload.patience_s
        if patience is not None:
            inflight = self.core.inflight
            gone = [iid for iid in self.world.queue if iid not in inflight
                    and now - self.insts[iid].queued_at > patience]
            for iid in gone:
                inst = self.insts.pop(iid)
                del self.world.queue[iid]
                self.queued[inst.cls] -= 1
                self.rec.abandoned(inst.cls, inst.arrived)
        self._push(now + self.s.timing.tick_s, _PATIENCE)

    # -- the cluster (rule 6) ----------------------------------------------------------------------
    def _heard(self, idx: int) -> None:
        n = self.cluster.nodes[idx]
        self.core.candidates.update(n.node_id, n.labels, n.capacity, n.draining)
        self.world.changed()

    def _restart(self, now: float, data: Any) -> None:
        idx, up = data
        if up:
            self.down[idx] = False
            self._heard(idx)  # the same id, the same instances: nothing new to the index
            self._push(now, _PASS)
        elif self.cluster.nodes[idx].alive and not self.down[idx]:
            self.counts["restarts"] += 1
            self.down[idx] = True
            self._push(now + self.s.market.restart_s, _RESTART, (idx, True))

    def _script(self, now: float, data: Any) -> None:
        ev = self.script[data]
        t = self.s.timing
        for idx in ev.nodes:
            node = self.cluster.nodes[idx]
            if ev.kind == "join":
                self.cluster.join(idx)
                self._heard(idx)
            elif ev.kind == "fail":
                self.cluster.fail(idx)
                self._push(now + t.unreachable_s, _UNREACHABLE, idx)
                self._push(now + t.offline_s, _OFFLINE, idx)
            else:
                node.draining = True
                node.touch()
                self.world.drains.add(node.node_id)
                self._heard(idx)
                self.nodes.forget(idx)
                if ev.kind == "drain-migrate":
                    self._off(now, idx, "migrate")
        self._push(now, _PASS)

    def _unreachable(self, now: float, data: Any) -> None:
        idx: int = data
        self.cluster.unreachable(idx)
        self.core.candidates.remove(self.cluster.ids[idx])
        self.world.changed()

    def _off(self, now: float, idx: int, kind: str = "replace") -> None:
        for seq in sorted(self.cluster.nodes[idx].instances):
            self._move(self.insts[f"i{seq}"], now, kind, exclude=False)

