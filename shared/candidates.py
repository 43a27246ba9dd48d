"""Which nodes a sampled auction may ask: only those that could ever take the request.

Rules:
1. A node can possibly take a shape when it carries the shape's hard labels, is not
   draining, and its total capacity (cpu, memory, ports - what its heartbeats say it has, not
   what is free now) holds the shape: `shared.feasibility.check` against an empty node, the
   one fit check in its fixed order. A node that is merely full now stays a candidate: its
   room may be back by the time it answers, and its decline says so.
2. The index is told of every change (`update` as a node is heard or changes, `remove` as it
   leaves, `live` for the nodes that may be asked now, `drained` for the drains git records);
   a change that changes nothing costs a comparison. The nodes that can take a shape are
   derived once per shape and kept until the next real change, so an auction costs a
   dictionary look-up and the draw, never a pass over every node.
3. `draw` asks, per shape, d nodes for each of its requests among that shape's candidates
   (Sparrow's batch sampling, d·m for m requests of one shape), or all of them when there
   are no more than that; the nodes are drawn from the sorted candidates with the injected
   `random.Random`, so the same index and seed ask the same nodes. The last winner of a
   shape, when it is still a candidate, is asked beside them: it was the best of the last
   round, and one node more is cheap next to a round lost to two busy ones.
4. A shape no node can take is hopeless: `refusals` gives the decline each live node would
   send for it, so the request is unschedulable at once, for the reason the nodes would give.
5. Scarce nodes are spared: a label (key and value) fewer than `SCARCE_SHARE` of the live
   nodes carry is scarce, and a shape that does not ask for it draws among the candidates
   carrying no scarce label, when they are at least half of its candidates and at least as
   many as it asks. The few nodes with a rare label are the only home of the requests that
   need it; work that could run anywhere, spread over them by a random draw, leaves them
   full when those requests come. They stay candidates: drawn from when too few others are
   left, and asked by the retry to every candidate (`shared.auctioneer` rule 11) when the
   drawn nodes are full.
6. The largest nodes are spared the same way: a shape that fits half of the largest of the
   smaller candidates (cpu and memory) draws among the candidates smaller in cpu than the
   largest, when they are at least half of what rule 5 left and as many as it asks. Only the
   largest nodes take the largest requests, and only while whole; small work spread over
   them leaves none whole. With fewer than it asks left, a shape draws among all candidates.
7. The last winner (rule 3) is asked only when it is among the nodes drawn from: a scarce
   or large node that won a retry does not keep drawing the shape's work to it.
8. A request that needs half or more of the smallest node it is drawn among asks d more for
   each such half (d·(1 + ⌊2·cpu / smallest cpu⌋) per request): the more of a node a request
   needs, the fewer random nodes have that much free, and a round the drawn nodes cannot
   place is asked again of more (rule 9), a round that waits for the slowest of them.
   The count decides whether every candidate is asked (rule 3).
9. A retry widens in two steps (`shared.auctioneer` rule 11): first `RETRY_TIMES`·d per
   request, drawn as rule 3 draws, then every candidate. A round that asks every candidate
   of a large fleet waits for its slowest answer - the deadline, when one of a thousand
   replies is lost - so most of what two busy nodes could not place is placed by the
   sixteen asked next, and only what they cannot place waits for the whole fleet.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from gavel.shared.feasibility import NodeView, Refusal, check
from gavel.shared.messages import Capacity, Shape

__all__ = ["RETRY_TIMES", "Candidates", "Draw"]

#: Shapes whose candidates are kept at once; past it the cache starts again (shapes are few).
SHAPES_KEPT = 4096
#: A label carried by fewer than this share of the live nodes is scarce (rule 5).
SCARCE_SHARE = 1 / 8
#: The first retry asks this many times d per request (rule 9).
RETRY_TIMES = 8


class Draw(NamedTuple):
    #: The nodes to ask, sorted and distinct.
    asked: list[str]
    #: Per shape drawn for: True when its candidates were all asked (no more than d·m).
    whole: list[bool]
    #: Indexes of the shapes no live node can ever take (rule 4).
    hopeless: list[int]


class Candidates:
    def __init__(self) -> None:
        #: Each node as an empty node of its total capacity: what `check` is asked (rule 1).
        self._views: dict[str, NodeView] = {}
        self._draining: dict[str, bool] = {}
        self._drained: frozenset[str] = frozenset()
        #: The nodes that may be asked now (None: every node the index knows).
        self._live: frozenset[str] | None = None
        self._live_seen: Sequence[str] | None = None
        self._members: list[str] | None = None
        self._pools: dict[object, list[str]] = {}
        #: Per shape, the candidates its draws come from, the same as a set (rules 5-6), and
        #: how many times d a request of it asks (rule 8).
        self._fields: dict[object, tuple[list[str], frozenset[str], int]] = {}
        self._scarce: tuple[frozenset[tuple[str, str]],
                            dict[str, frozenset[tuple[str, str]]]] | None = None
        #: Real changes so far (a test and the simulator can tell a rebuild from a hit).
        self.version = 0

    def __len__(self) -> int:
        return len(self._views)

    # -- changes (rule 2) ----------------------------------------------------------------
    def update(self, node_id: str, labels: Mapping[str, str], capacity: Capacity,
               draining: bool = False) -> None:
        """The node as its last heartbeat describes it (its total capacity, not its free)."""
        view = self._views.get(node_id)
        if view is not None and self._draining[node_id] == draining \
                and view.labels == labels and _same(view.capacity, capacity):
            return
        self._views[node_id] = NodeView(node_id=node_id, capacity=capacity.copy(),
                                        labels=dict(labels))
        self._draining[node_id] = draining
        self._changed(membership=view is None)

    def remove(self, node_id: str) -> None:
        if self._views.pop(node_id, None) is not None:
            del self._draining[node_id]
            self._changed(membership=True)

    def drained(self, nodes: AbstractSet[str]) -> None:
        """The nodes git records as draining (a node may not know yet)."""
        if nodes != self._drained:
            self._drained = frozenset(nodes)
            self._changed()

    def live(self, nodes: Sequence[str]) -> None:
        """The nodes that may be asked now (the same list again costs nothing)."""
        if nodes is self._live_seen:
            return
        self._live_seen = nodes
        live = frozenset(nodes)
        if live != self._live:
            self._live = live
            self._changed()

    def _changed(self, membership: bool = False) -> None:
        self.version += 1
        self._pools.clear()
        self._fields.clear()
        self._scarce = None
        if membership:
            self._members = None

    # -- reading ---------------------------------------------------------------------------
    def _sorted(self) -> list[str]:
        if self._members is None:
            self._members = sorted(self._views)
        return self._members

    def asked(self) -> list[str]:
        """The live nodes the index knows, sorted."""
        live = self._live
        members = self._sorted()
        return members if live is None else [n for n in members if n in live]

    def refusal(self, node_id: str, shape: Shape) -> Refusal | None:
        """Why the node can never take `shape` (None: it could; rule 1)."""
        view = self._views[node_id]
        if self._draining[node_id] or node_id in self._drained:
            view = NodeView(node_id=node_id, capacity=view.capacity, labels=view.labels,
                            draining=True)
        return check(shape, view)

    def pool(self, shape: Shape) -> list[str]:
        """The live nodes that can possibly take `shape`, sorted (shared: do not change)."""
        key = shape.key()
        got = self._pools.get(key)
        if got is None:
            if len(self._pools) >= SHAPES_KEPT:
                self._pools.clear()
            got = [n for n in self.asked() if self.refusal(n, shape) is None]
            self._pools[key] = got
        return got

    def refusals(self, shape: Shape) -> list[tuple[str, Refusal]]:
        """Rule 4: each live node's decline for a shape, in node order (its candidates,
        if it has any, are left out)."""
        out = []
        for n in self.asked():
            why = self.refusal(n, shape)
            if why is not None:
                out.append((n, why))
        return out

    def candidate(self, node_id: str, shape: Shape) -> bool:
        """Whether a live node the index knows could take `shape`, in O(1)."""
        live = self._live
        return node_id in self._views and (live is None or node_id in live) \
            and self.refusal(node_id, shape) is None

    def scarce(self) -> frozenset[tuple[str, str]]:
        """Rule 5: the labels fewer than `SCARCE_SHARE` of the live nodes carry."""
        return self._rare()[0]

    def _rare(self) -> tuple[frozenset[tuple[str, str]], dict[str, frozenset[tuple[str, str]]]]:
        """The scarce labels, and the scarce labels of each live node carrying any."""
        if self._scarce is None:
            live = self.asked()
            seen: dict[tuple[str, str], int] = {}
            for n in live:
                for label in self._views[n].labels.items():
                    seen[label] = seen.get(label, 0) + 1
            scarce = frozenset(k for k, c in seen.items() if c < SCARCE_SHARE * len(live))
            carriers: dict[str, frozenset[tuple[str, str]]] = {}
            if scarce:
                for n in live:
                    mine = scarce.intersection(self._views[n].labels.items())
                    if mine:
                        carriers[n] = mine
            self._scarce = (scarce, carriers)
        return self._scarce

    def field(self, shape: Shape) -> list[str]:
        """Rules 5-6: the candidates `shape`'s requests are drawn from, sorted (shared)."""
        return self._field(shape, self.pool(shape))[0]

    def times(self, shape: Shape) -> int:
        """Rule 8: how many times d nodes a request of `shape` asks."""
        return self._field(shape, self.pool(shape))[2]

    def _field(self, shape: Shape, pool: list[str]) -> tuple[list[str], frozenset[str], int]:
        key = shape.key()
        got = self._fields.get(key)
        if got is None:
            if len(self._fields) >= SHAPES_KEPT:
                self._fields.clear()
            views = self._views
            field = pool
            carriers = self._rare()[1]
            if carriers:
                wanted = shape.labels.items()
                plain = [n for n in field if n not in carriers or carriers[n].issubset(wanted)]
                field = plain if 2 * len(plain) >= len(field) else field
            cpus = [views[n].capacity for n in field]
            top = max((c.cpu for c in cpus), default=0.0)
            smaller = [n for n, c in zip(field, cpus, strict=True) if c.cpu < top]
            if smaller and 2 * len(smaller) >= len(field):
                room = [views[n].capacity for n in smaller]
                if 2 * shape.cpu <= max(c.cpu for c in room) \
                        and 2 * shape.memory_mb <= max(c.memory_mb for c in room):
                    field = smaller
            least = min((views[n].capacity.cpu for n in field), default=0.0)
            times = 1 + int(2 * shape.cpu / least) if least > 0 else 1
            got = (field, frozenset(field), times)
            self._fields[key] = got
        return got

    def draw(self, shapes: Sequence[Shape], counts: Sequence[int], d: int,
             rng: random.Random, excluded: AbstractSet[str] = frozenset(),
             last: Mapping[object, str] | None = None) -> Draw:
        """Rule 3: the nodes to ask for `counts[i]` requests of each `shapes[i]`, d each (or
        more, rule 8), drawn among the nodes rules 5-6 leave; a shape's `excluded`
        candidates are left out unless no other is left (`shared.auctioneer` rule 2);
        `last`: the last winner per shape key, asked too while a candidate among those
        drawn from (rule 7)."""
        if len(shapes) == 1 and not excluded:  # the common batch: one shape, a list will do
            return self._draw_one(shapes[0], counts[0], d, rng, last)
        asked: set[str] = set()
        whole: list[bool] = []
        hopeless: list[int] = []
        for i, (shape, m) in enumerate(zip(shapes, counts, strict=True)):
            pool = self.pool(shape)
            if not pool:
                hopeless.append(i)
                whole.append(True)
                continue
            field, inside, times = self._field(shape, pool)
            if excluded:
                pool = [n for n in pool if n not in excluded] or pool
                if not inside.isdisjoint(excluded):
                    field = [n for n in field if n not in excluded]
            k = d * times * m
            if len(pool) <= k:
                asked.update(pool)
                whole.append(True)
                continue
            if len(field) < k:
                field, inside = pool, frozenset()
            asked.update(rng.sample(field, k))
            whole.append(False)
            best = last.get(shape.key()) if last else None
            if best is not None and best not in excluded and (not inside or best in inside) \
                    and self.candidate(best, shape):
                asked.add(best)
        return Draw(sorted(asked), whole, hopeless)

    def _draw_one(self, shape: Shape, m: int, d: int, rng: random.Random,
                  last: Mapping[object, str] | None) -> Draw:
        """`draw` for one shape and nothing excluded, without a set."""
        pool = self.pool(shape)
        if not pool:
            return Draw([], [True], [0])
        field, inside, times = self._field(shape, pool)
        k = d * times * m
        if len(pool) <= k:
            return Draw(list(pool), [True], [])
        if len(field) < k:
            field, inside = pool, frozenset()
        asked = rng.sample(field, k)
        best = last.get(shape.key()) if last else None
        if best is not None and best not in asked and (not inside or best in inside) \
                and self.candidate(best, shape):
            asked.append(best)
        asked.sort()
        return Draw(asked, [False], [])


def _same(a: Capacity, b: Capacity) -> bool:
    return a.cpu == b.cpu and a.memory_mb == b.memory_mb and a.ports == b.ports
