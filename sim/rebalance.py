"""Re-auction in virtual time: the engine's periodic rounds, decided by `shared.reauction`.

Rules:
1. Every ``every_s`` (and once more when nodes join) a round picks its candidates with
   `shared.reauction.choose` among every running instance: those of the classes named in
   ``rebalance.classes`` are service replicas, the rest jobs, which stay. Instances whose
   removal would let a waiting shape fit their node (its labels allow it, it does not fit
   now) are offered first, the rest drawn from the policy's own stream.
2. A candidate's re-auction asks every eligible node, as a broadcast round: the holder
   answers with its strategy on its view without the instance (`keep_view`), every other
   node with its order-book answer, and the real `Auction` decides among the holder and
   the two best challengers (`sim.rounds` rule 2: nothing else can win or tie).
   Re-auction rounds take no virtual time and lose no replies.
3. A move the core judges worth making (`shared.reauction.judge`) is charged to the winner
   at once and to the holder until ``settle_s`` later, as the broker starts the new copy,
   waits for its health, then stops the old one; the instance counts as in flight (no
   second move) until then. Every move spends the budget; the round stops when it is
   spent. Moves count in ``migrations`` and the steady window's ``moves_per_hour``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, overload

import numpy as np

from gavel.shared.messages import Bid, Decline, Request
from gavel.shared.reauction import (
    Budget,
    Holding,
    Outcome,
    Room,
    choose,
    decide,
    judge,
    keep_view,
)
from gavel.shared.spec import JOB, SERVICE
from gavel.shared.strategies import answer
from gavel.sim.cluster import Cluster, SimNode
from gavel.sim.placer import Placer
from gavel.sim.rounds import leaders
from gavel.sim.scenario import Rebalance
from gavel.sim.snapshot import Fleet
from gavel.sim.workload import Catalogue

__all__ = ["Rebalancer", "Running"]


class Running(Protocol):
    """What the rebalancer reads of one of the engine's instances."""

    seq: int
    shape: int
    cls: int
    node: int
    placed_at: float


#: Move `instance` to node index `to` at `now` (the engine's own bookkeeping).
Mover = Callable[[Running, int, float], None]


class _Holdings(Sequence[Holding]):
    """The running instances as `Holding`s, built only for those a round looks at."""

    def __init__(self, running: list[Running], service: list[bool], ids: list[str]) -> None:
        self.running = running
        self.service = service
        self.ids = ids
        #: instance id -> its index, for the holdings built so far
        self.built: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.running)

    @overload
    def __getitem__(self, i: int) -> Holding: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Holding]: ...
    def __getitem__(self, i: int | slice) -> Holding | Sequence[Holding]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        inst = self.running[i]
        iid = str(inst.seq)
        self.built[iid] = i
        return Holding(instance_id=iid, node_id=self.ids[inst.node],
                       kind=SERVICE if self.service[inst.cls] else JOB,
                       placed_at=inst.placed_at)

    def __iter__(self) -> Iterator[Holding]:
        return (self[k] for k in range(len(self)))


class Rebalancer:
    def __init__(self, settings: Rebalance, class_names: list[str], cluster: Cluster,
                 catalogue: Catalogue, placer: Placer, rng: random.Random) -> None:
        self.s = settings
        self.service = [name in settings.classes for name in class_names]
        self.cluster = cluster
        self.catalogue = catalogue
        self.placer = placer
        self.rng = rng
        self.budget = Budget(settings.budget)
        self.fleet = Fleet(cluster, catalogue)
        #: re-auctions by how they ended
        self.outcomes: Counter[str] = Counter()
        #: instance seq -> when its move settles (rule 3: in flight until then)
        self.in_flight: dict[str, float] = {}
        self.rounds = 0

    def round(self, now: float, running: list[Running], waiting: list[int],
              move: Mover) -> int:
        """One round (rules 1-3); returns the moves made."""
        self.in_flight = {k: t for k, t in self.in_flight.items() if t > now}
        if self.budget.left(now) == 0 or not running:
            return 0
        ids = self.cluster.ids
        holdings = _Holdings(running, self.service, ids)
        draining = {n.node_id for n in self.cluster.nodes if n.draining}
        prefer = self._near(running, waiting)
        chosen = choose(holdings, now, self.s, self.budget, self.rng,
                        in_flight=dict.fromkeys(self.in_flight, 1), draining=draining,
                        prefer=prefer)
        shapes = [self.catalogue.requests[w] for w in waiting]
        moved = 0
        for h in chosen:
            inst = running[holdings.built[h.instance_id]]
            to = self._auction(now, inst, shapes)
            if to < 0:
                continue
            move(inst, to, now)
            self.in_flight[h.instance_id] = now + self.s.settle_s
            self.budget.spend(now)
            moved += 1
            if self.budget.left(now) == 0:
                break
        return moved

    def _auction(self, now: float, inst: Running, waiting: Sequence[Request]) -> int:
        """Rule 2: the re-auction of one instance; the winner's index when it moves."""
        self.rounds += 1
        nodes = self.cluster.nodes
        holder = nodes[inst.node]
        request = self.catalogue.requests[inst.shape]
        book = self.placer.books[inst.shape]
        held = holder.idx
        winner, tie, _, _ = leaders(book.ranked, lambda _no, idx: idx == held)
        if winner < 0:
            self.outcomes[Outcome.NO_BIDS] += 1
            return -1
        view = holder.view()
        answers: list[tuple[str, Bid | Decline]] = [
            (holder.node_id, answer(self.placer.strategies[held], request,
                                    keep_view(view, request)))]
        for idx in (winner, tie):
            if idx >= 0:
                got = book.answers[idx]
                assert got is not None
                answers.append((nodes[idx].node_id, got))
        decision = decide(f"re-{self.rounds}", request, answers, now)
        won = nodes[winner]
        verdict = judge(request, holder.node_id, decision, margin=self.s.margin,
                        holder_room=_room(holder), winner_room=_room(won), waiting=waiting)
        self.outcomes[verdict.outcome] += 1
        if not verdict.moves:
            return -1
        return self.cluster.by_id[verdict.winner]

    def _near(self, running: list[Running], waiting: list[int]) -> list[int]:
        """Rule 1: the running instances whose removal lets a waiting shape fit their
        node, in the policy's own random order."""
        if not waiting:
            return []
        live = self.cluster.nodes
        free_cpu = np.array([n.cap_milli - n.used_milli for n in live], dtype=np.int64)
        free_mem = np.array([n.group.memory_mb - n.used_memory for n in live], dtype=np.int64)
        fleet = self.fleet
        node = np.fromiter((i.node for i in running), dtype=np.int64, count=len(running))
        shape = np.fromiter((i.shape for i in running), dtype=np.int64, count=len(running))
        cpu, mem = fleet.cpu[shape], fleet.mem[shape]
        service = np.array(self.service, dtype=np.bool_)[
            np.fromiter((i.cls for i in running), dtype=np.int64, count=len(running))]
        near = np.zeros(len(running), dtype=np.bool_)
        for w in waiting:
            want_cpu, want_mem = fleet.cpu[w], fleet.mem[w]
            short = (free_cpu < want_cpu) | (free_mem < want_mem)
            ok = fleet.labels_ok[w] & short
            near |= (ok[node] & (free_cpu[node] + cpu >= want_cpu)
                     & (free_mem[node] + mem >= want_mem))
        found: list[int] = np.flatnonzero(near & service).tolist()
        self.rng.shuffle(found)
        return found


def _room(node: SimNode) -> Room:
    view = node.view()
    return Room(view.capacity, view.committed, view.labels)
