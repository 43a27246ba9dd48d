"""The production driver's world (`sim.market`): its ledger and the nodes' own views.

Rules:
1. `Ledger` is the auctioneer core's `World` (`shared.auctionworld`): pending work in
   queue order, the records the core reads, the cluster's eligible nodes (sorted, kept until
   the next change), and on each node its capacity minus what the driver's git committed.
2. `Views` is what each node knows of itself when it bids: what it holds as it last
   learned it (`see`), so it may bid for room it no longer has (`fits` tells the driver).
   A node's answer per shape is kept until its view changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import msgspec

from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, Capacity, Decline
from gavel.shared.messages import Shape as MShape
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec
from gavel.shared.strategies import Strategy, answer
from gavel.sim.cluster import Cluster
from gavel.sim.workload import Arrival, Catalogue

__all__ = ["Inst", "Ledger", "Views", "specs"]


class Inst:
    __slots__ = ("acked", "arrived", "awards", "cls", "duration", "epoch", "excluded", "iid",
                 "kind", "node", "queued_at", "shape", "waited")

    def __init__(self, a: Arrival) -> None:
        self.iid = f"i{a.seq}"
        self.arrived = self.queued_at = a.at
        self.shape, self.cls, self.duration = a.shape, a.cls, a.duration
        self.node = -1
        self.epoch = self.awards = 0
        self.acked = self.waited = False
        self.kind = "first"
        self.excluded: tuple[str, ...] = ()


class Ledger:
    """The core's `World` over the simulator (rule 1)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.queue: dict[str, None] = {}  # pending, oldest first
        self.records: dict[str, InstanceRecord] = {}
        self._eligible: list[str] | None = None
        self.drains: set[str] = set()
        self.pinned = False
        self._labels = {n.node_id: n.labels for n in cluster.nodes}

    def changed(self) -> None:
        self._eligible = None

    def pending(self) -> Iterable[str]:
        return self.queue

    def record(self, iid: str) -> InstanceRecord:
        return self.records[iid]

    def eligible(self, now: float) -> list[str]:
        if self._eligible is None:
            ids = self.cluster.ids
            self._eligible = [ids[i] for i in sorted(self.cluster.eligible.items)]
        return self._eligible

    def draining(self) -> AbstractSet[str]:
        return self.drains

    def free(self, nodes: Iterable[str], reserved: Mapping[str, Capacity]
             ) -> dict[str, Capacity]:
        by_id, all_nodes = self.cluster.by_id, self.cluster.nodes
        out = {}
        for node_id in nodes:
            n = all_nodes[by_id[node_id]]
            free = out[node_id] = Capacity(cpu=(n.cap_milli - n.used_milli) / 1000.0,
                                           memory_mb=n.group.memory_mb - n.used_memory,
                                           ports=n.group.ports - n.used_ports)
            res = reserved.get(node_id)
            if res is not None:
                free.charge(res, -1)
        return out

    def held_by(self, group: str) -> dict[str, int]:
        return {}

    def placed(self, iid: str) -> bool:
        return iid not in self.queue

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        return self._labels


class Views:
    def __init__(self, cluster: Cluster, catalogue: Catalogue, strategies: list[Strategy]
                 ) -> None:
        self.cluster, self.catalogue, self.strategies = cluster, catalogue, strategies
        size = len(cluster)
        self.seen = [[0, 0, 0] for _ in range(size)]
        self.views: list[NodeView | None] = [None] * size
        self.answers: list[dict[object, Bid | Decline]] = [{} for _ in range(size)]

    def answer(self, idx: int, shape: MShape, key: object, i: int) -> Bid | Decline:
        """The node's answer for `shape`, at index `i` of its RFB."""
        cache = self.answers[idx]
        got = cache.get(key)
        if got is None:
            got = cache[key] = answer(self.strategies[idx], shape, self._own(idx))
        return got if i == 0 else msgspec.structs.replace(got, shape=i)

    def fits(self, idx: int, shape: MShape, reserved: Mapping[str, Capacity]) -> bool:
        """Whether git and the reservations leave the node room for `shape` now."""
        n = self.cluster.nodes[idx]
        res = reserved.get(n.node_id)
        cpu = n.used_milli / 1000.0 + (res.cpu if res else 0.0)
        mem = n.used_memory + (res.memory_mb if res else 0)
        return cpu + shape.cpu <= n.capacity.cpu + 1e-9 and \
            mem + shape.memory_mb <= n.group.memory_mb

    def _own(self, idx: int) -> NodeView:
        view = self.views[idx]
        if view is None:
            n = self.cluster.nodes[idx]
            cpu, mem, ports = self.seen[idx]
            view = self.views[idx] = NodeView(
                node_id=n.node_id, capacity=n.capacity, stats=n.stats, labels=n.labels,
                committed=Capacity(cpu=cpu / 1000.0, memory_mb=mem, ports=ports),
                draining=n.draining)
        return view

    def see(self, idx: int, shape: int, sign: int) -> None:
        """The node learns it holds one more (or one fewer) of `shape`."""
        sh = self.catalogue.shapes[shape]
        seen = self.seen[idx]
        seen[0] += sign * sh.cpu_milli
        seen[1] += sign * sh.memory_mb
        seen[2] += sign * sh.ports
        self.forget(idx)

    def forget(self, idx: int) -> None:
        self.views[idx] = None
        self.answers[idx].clear()


def specs(catalogue: Catalogue) -> list[Spec]:
    """The spec an instance of each shape is submitted with."""
    return [Spec(name=f"shape-{k}", command=["true"], cpu=sh.cpu_milli / 1000.0,
                 memory_mb=sh.memory_mb, ports=[f"p{i}" for i in range(sh.ports)],
                 labels=dict(sh.labels), affinities=list(sh.affinity_list()))
            for k, sh in enumerate(catalogue.shapes)]
