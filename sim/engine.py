"""The discrete-event engine: one policy, one scenario, virtual time.

Rules:
1. Events live in one heap keyed ``(time, priority, seq)``: at equal times cluster events
   come first, then instances finishing, heartbeats, queue retries, arrivals, samples; the
   sequence number breaks the rest, so a run is a pure function of scenario and seed.
2. Auctions do not overlap: a round is decided on the state when it opens and the award
   takes effect at once (the broker charges awards as it makes them); the round's length
   is reported as placement latency.
3. An unschedulable instance waits in its shape's queue; every ``timing.tick_s`` the queue
   is retried oldest first, one failure per shape per tick. A failed node is silent at
   once, unreachable after ``timing.unreachable_s`` (no longer asked) and offline after
   ``timing.offline_s``: then its instances are re-placed while their attempts last,
   else lost. A drained node declines everything; with ``migrate`` its instances move.
4. A policy with ``rebalance`` re-auctions running work every ``every_s`` and when nodes
   join (`sim.rebalance`): a move takes the instance to its new node at once and frees
   its old room ``settle_s`` later. These events come last at equal times.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator

from gavel.sim.cluster import Cluster, ScriptEvent
from gavel.sim.metrics import PolicyResult, Recorder
from gavel.sim.placer import Placer, Why
from gavel.sim.rebalance import Rebalancer, Running
from gavel.sim.scenario import Scenario
from gavel.sim.workload import Arrival, Catalogue

__all__ = ["Engine", "Progress"]

Progress = Callable[[float], None]

# event kinds, in priority order at equal times (rule 1)
_SCRIPT, _UNREACHABLE, _OFFLINE, _FINISH, _TICK, _RETRY, _ARRIVAL, _SAMPLE = range(8)
_REBALANCE, _SETTLE = 8, 9  # rule 4


class _Instance:
    __slots__ = ("arrived", "awards", "cls", "duration", "epoch", "kind", "node", "placed_at",
                 "queued_at", "seq", "shape", "waited")

    def __init__(self, arrival: Arrival) -> None:
        self.seq = arrival.seq
        self.arrived = arrival.at
        self.shape = arrival.shape
        self.cls = arrival.cls
        self.duration = arrival.duration
        self.queued_at = arrival.at
        self.node = -1
        self.placed_at = 0.0  # its last award or move (re-auction's cool-down)
        self.epoch = 0
        self.awards = 0
        self.waited = False  # has been unschedulable at least once
        self.kind = "first"  # what its next award counts as: first, replace or migrate


class Engine:
    def __init__(self, scenario: Scenario, cluster: Cluster, catalogue: Catalogue,
                 arrivals: Iterator[Arrival], script: list[ScriptEvent], placer: Placer,
                 recorder: Recorder, progress: Progress | None = None,
                 rebalancer: Rebalancer | None = None) -> None:
        self.s = scenario
        self.cluster = cluster
        self.catalogue = catalogue
        self.arrivals = arrivals
        self.script = script
        self.placer = placer
        self.rec = recorder
        self.progress = progress
        self.timing = scenario.timing
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.active: dict[int, _Instance] = {}
        self.queues: dict[int, deque[_Instance]] = {}
        self.pending = 0
        self.queued = [0] * len(scenario.workload.classes)  # waiting instances per class
        self.retry_armed = False
        self.rebalancer = rebalancer

    def _push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, a, b))

    def run(self) -> PolicyResult:
        end = self.s.duration_s
        self.placer.start()
        for i, ev in enumerate(self.script):
            self._push(ev.at, _SCRIPT, i)
        self._next_arrival()
        self._push(0.0, _SAMPLE)
        if self.placer.period:
            self._push(self.placer.period, _TICK)
        if self.rebalancer is not None:
            self._push(self.rebalancer.s.every_s, _REBALANCE, 1)
        step = end / 100.0
        next_report = step
        heap = self.heap
        while heap and heap[0][0] <= end:
            at, kind, _, a, b = heapq.heappop(heap)
            if kind == _ARRIVAL:
                self._arrive(at, a)
            elif kind == _FINISH:
                self._finish(at, a, b)
            elif kind == _SAMPLE:
                self.rec.sample(at, self.pending, self._waiting(), self.queued)
                if at + self.s.interval_s <= end:
                    self._push(at + self.s.interval_s, _SAMPLE)
            elif kind == _RETRY:
                self._retry(at)
            elif kind >= _REBALANCE:
                self._rebalance_event(at, kind, a, b)
            elif kind == _TICK:
                self.placer.tick(at)
                assert self.placer.period
                self._push(at + self.placer.period, _TICK)
            else:
                self._cluster_event(at, kind, a)
            if self.progress and at >= next_report:
                self.progress(min(at / end, 0.999))
                next_report = at + step
        if not self.rec.samples or self.rec.samples[-1][0] < end:
            self.rec.sample(end, self.pending, self._waiting(), self.queued)
        if self.progress:
            self.progress(1.0)
        waiting = [(inst.cls, inst.arrived) for q in self.queues.values() for inst in q]
        if self.rebalancer is not None:
            self.rec.result.rebalance = dict(sorted(self.rebalancer.outcomes.items()))
        return self.rec.finish(self.pending, waiting)

    def _waiting(self) -> list[int]:
        return sorted(shape for shape, queue in self.queues.items() if queue)

    # -- arrivals and placement ----------------------------------------------------------------
    def _next_arrival(self) -> None:
        arrival = next(self.arrivals, None)
        if arrival is not None:
            self._upcoming = arrival
            self._push(arrival.at, _ARRIVAL, arrival.seq)

    def _arrive(self, now: float, seq: int) -> None:
        arrival = self._upcoming
        assert arrival.seq == seq
        self.rec.result.arrivals += 1
        self.rec.arrived(arrival.cls, arrival.at)
        inst = _Instance(arrival)
        self.active[inst.seq] = inst
        self._next_arrival()
        if not self._attempt(inst, now, "first"):
            self._enqueue(inst, now)

    def _attempt(self, inst: _Instance, now: float, kind: str) -> bool:
        out = self.placer.place(inst.shape, now)
        self.rec.result.rejections += out.rejections
        if out.node < 0:
            self.rec.unschedulable(out.reason, inst.cls, not inst.waited, inst.arrived)
            inst.waited = True
            return False
        node = self.cluster.nodes[out.node]
        node.charge(self.catalogue.shapes[inst.shape], +1)
        node.instances.add(inst.seq)
        inst.node = out.node
        inst.placed_at = now
        inst.epoch += 1
        inst.awards += 1
        self.placer.changed(out.node, Why.COMMIT)
        self.rec.placed(out.node, now - inst.queued_at + out.latency, out.tie_broken, kind,
                        inst.cls, inst.arrived, not inst.waited)
        if math.isfinite(inst.duration):
            self._push(now + inst.duration, _FINISH, inst.seq, inst.epoch)
        return True

    def _enqueue(self, inst: _Instance, now: float) -> None:
        self.queues.setdefault(inst.shape, deque()).append(inst)
        self.pending += 1
        self.queued[inst.cls] += 1
        if not self.retry_armed:
            self.retry_armed = True
            self._push(now + self.timing.tick_s, _RETRY)

    def _retry(self, now: float) -> None:
        self.retry_armed = False
        patience = self.s.workload.patience_s
        order = sorted((q[0].seq, shape) for shape, q in self.queues.items() if q)
        for _, shape in order:
            queue = self.queues[shape]
            while queue:
                inst = queue[0]
                if patience is not None and now - inst.queued_at > patience:
                    queue.popleft()
                    self.pending -= 1
                    self.queued[inst.cls] -= 1
                    self.rec.abandoned(inst.cls, inst.arrived)
                    del self.active[inst.seq]
                    continue
                if not self.placer.may_fit(shape):
                    break
                if not self._attempt(inst, now, inst.kind):
                    break
                queue.popleft()
                self.pending -= 1
                self.queued[inst.cls] -= 1
        if self.pending and not self.retry_armed:
            self.retry_armed = True
            self._push(now + self.timing.tick_s, _RETRY)

    def _release(self, inst: _Instance) -> int:
        idx = inst.node
        node = self.cluster.nodes[idx]
        node.charge(self.catalogue.shapes[inst.shape], -1)
        node.instances.discard(inst.seq)
        inst.node = -1
        return idx

    def _finish(self, now: float, seq: int, epoch: int) -> None:
        inst = self.active.get(seq)
        if inst is None or inst.epoch != epoch or inst.node < 0:
            return
        if not self.cluster.nodes[inst.node].alive:
            return  # it died with its node; the lease expiry re-places or loses it
        idx = self._release(inst)
        del self.active[seq]
        self.placer.changed(idx, Why.RELEASE)

    # -- the cluster script --------------------------------------------------------------------
    def _cluster_event(self, now: float, kind: int, a: int) -> None:
        if kind == _UNREACHABLE:
            self.cluster.unreachable(a)
            self.placer.changed(a, Why.UNREACHABLE)
            return
        if kind == _OFFLINE:
            self._offline(now, a)
            return
        ev = self.script[a]
        for idx in ev.nodes:
            node = self.cluster.nodes[idx]
            if ev.kind == "join":
                self.cluster.join(idx)
                self.placer.changed(idx, Why.JOIN)
                if self.rebalancer is not None and idx == ev.nodes[-1]:
                    self._push(now, _REBALANCE)  # an extra round: capacity came
            elif ev.kind == "fail":
                self.cluster.fail(idx)
                self.placer.changed(idx, Why.FAIL)
                self._push(now + self.timing.unreachable_s, _UNREACHABLE, idx)
                self._push(now + self.timing.offline_s, _OFFLINE, idx)
            else:
                node.draining = True
                node.touch()
                self.placer.changed(idx, Why.DRAIN)
                if ev.kind == "drain-migrate":
                    self._move_off(now, idx, "migrate")

    def _offline(self, now: float, idx: int) -> None:
        self._move_off(now, idx, "replace")

    def _move_off(self, now: float, idx: int, kind: str) -> None:
        node = self.cluster.nodes[idx]
        for seq in sorted(node.instances):
            inst = self.active[seq]
            self._release(inst)
            if kind == "replace" and inst.awards >= self.s.workload.attempts:
                self.rec.result.lost += 1
                del self.active[seq]
                continue
            inst.queued_at = now
            inst.kind = kind
            if not self._attempt(inst, now, kind):
                self._enqueue(inst, now)
        self.placer.changed(idx, Why.RELEASE)

    # -- re-auction (rule 4) -------------------------------------------------------------------
    def _rebalance_event(self, now: float, kind: int, a: int, b: int) -> None:
        if kind == _SETTLE:  # the old copy stops: its room is free
            self.cluster.nodes[a].charge(self.catalogue.shapes[b], -1)
            self.placer.changed(a, Why.RELEASE)
            return
        assert self.rebalancer is not None
        running: list[Running] = [inst for inst in self.active.values() if inst.node >= 0
                                  and self.cluster.nodes[inst.node].alive]
        self.rebalancer.round(now, running, self._waiting(), self._move)
        if a:  # the periodic chain (a join's extra round schedules nothing)
            self._push(now + self.rebalancer.s.every_s, _REBALANCE, 1)

    def _move(self, running: Running, to: int, now: float) -> None:
        """Start the instance on node `to`; its old copy keeps its room until it settles."""
        inst = self.active[running.seq]
        old = self.cluster.nodes[inst.node]
        new = self.cluster.nodes[to]
        old.instances.discard(inst.seq)
        new.charge(self.catalogue.shapes[inst.shape], +1)
        new.instances.add(inst.seq)
        inst.node = to
        inst.placed_at = now
        self.placer.changed(to, Why.COMMIT)
        self.rec.moved(now)
        assert self.rebalancer is not None
        self._push(now + self.rebalancer.s.settle_s, _SETTLE, old.idx, inst.shape)
