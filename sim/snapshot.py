"""One instant of a cluster, as arrays: utilisation, evenness, stranded capacity, packing.

Rules:
1. A node's utilisation is its committed share: the mean of its cpu and memory reserved.
2. Evenness is measured over the nodes placements can go to (live, not draining): the
   coefficient of variation weighted by capacity (a node weighs its share of the fleet's
   cpu and of its memory, averaged), and Jain's index ``(sum u)^2 / (n * sum u^2)`` —
   1 when every node is equally loaded, 1/n when one node holds everything; an idle fleet
   counts as even (CV 0, Jain 1).
3. Capacity is *stranded* when it is free on a live, non-draining node that some waiting
   shape could use — its labels match and the shape would fit the node were it empty — yet
   no waiting shape fits it now: room lost to fragmentation. A node no waiting request
   could ever use (wrong labels, too small) strands nothing, however much it has free.
4. The packing bound is the fewest live nodes, taken largest first, whose cpu covers the
   committed cpu, and likewise memory; the larger of the two. No placement of the same
   work can use fewer nodes (it is a relaxation: it ignores labels and that an instance
   cannot be split), so nodes in use over the bound is 1 for a perfect packing.
5. "Fits" is `shared.feasibility.check`'s rule — labels first, then room, draining takes
   nothing — over arrays: labels are asked of `check` once per (labels, shape), and room
   is compared in integers (milli-cpu, MB, ports), as the nodes count it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gavel.shared.feasibility import NodeView, check
from gavel.shared.messages import Request
from gavel.sim.cluster import Cluster
from gavel.sim.workload import Catalogue

__all__ = ["Fleet", "Snapshot", "jain", "packing_bound", "take", "weighted_cv"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


class Fleet:
    """What does not change in a run: every node's capacity and which shapes its labels
    allow, and every shape's size."""

    def __init__(self, cluster: Cluster, catalogue: Catalogue) -> None:
        nodes = cluster.nodes
        self.cap_cpu: Ints = np.array([n.cap_milli for n in nodes], dtype=np.int64)
        self.cap_mem: Ints = np.array([n.group.memory_mb for n in nodes], dtype=np.int64)
        self.cap_ports: Ints = np.array([n.group.ports for n in nodes], dtype=np.int64)
        shapes = catalogue.shapes
        self.cpu: Ints = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.mem: Ints = np.array([s.memory_mb for s in shapes], dtype=np.int64)
        self.ports: Ints = np.array([s.ports for s in shapes], dtype=np.int64)
        self.labels_ok: Bools = np.zeros((len(shapes), len(nodes)), dtype=np.bool_)
        asked: dict[tuple[tuple[str, str], ...], list[bool]] = {}
        for n in nodes:
            key = tuple(sorted(n.labels.items()))
            if key not in asked:
                view = NodeView(node_id=n.node_id, capacity=n.capacity, labels=n.labels)
                asked[key] = [check(Request(instance_id="labels", cpu=0.0, memory_mb=0,
                                            labels=dict(s.labels)), view) is None
                              for s in shapes]
            self.labels_ok[:, n.idx] = asked[key]
        #: a shape could use a node (rule 3): its labels match and it fits the node empty
        self.usable: Bools = (self.labels_ok & (self.cpu[:, None] <= self.cap_cpu)
                              & (self.mem[:, None] <= self.cap_mem)
                              & (self.ports[:, None] <= self.cap_ports))


class Snapshot(NamedTuple):
    nodes: Ints  # live node indexes, ascending
    util: Floats  # their utilisation, in the same order
    open: Bools  # which of them take placements (not draining)
    empty: int  # open nodes holding nothing
    largest_fits: int  # open nodes the largest shape fits
    cap_cpu: int  # open capacity
    cap_mem: int
    free_cpu: int  # open free capacity
    free_mem: int
    unfit_cpu: int  # free on open nodes no waiting shape fits (whether or not it could)
    unfit_mem: int
    stranded_cpu: int  # rule 3
    stranded_mem: int
    util_cv: float  # rule 2
    util_jain: float
    in_use: int  # live nodes holding anything
    bound: int  # rule 4


def weighted_cv(util: Floats, weight: Floats) -> float:
    """Rule 2: the capacity-weighted coefficient of variation of `util`."""
    total = float(weight.sum())
    if total <= 0:
        return 0.0
    mean = float((weight * util).sum()) / total
    if mean <= 0:
        return 0.0
    var = float((weight * (util - mean) ** 2).sum()) / total
    return float(np.sqrt(max(var, 0.0))) / mean


def jain(util: Floats) -> float:
    """Rule 2: Jain's fairness index of `util`."""
    squares = float((util * util).sum())
    if len(util) == 0 or squares <= 0:
        return 1.0
    return float(util.sum()) ** 2 / (len(util) * squares)


def packing_bound(used_cpu: int, used_mem: int, cap_cpu: Ints, cap_mem: Ints) -> int:
    """Rule 4: no packing of `used_cpu` and `used_mem` fits on fewer of these nodes."""

    def fewest(used: int, caps: Ints) -> int:
        if used <= 0:
            return 0
        covered = np.cumsum(np.sort(caps)[::-1])
        return min(int(np.searchsorted(covered, used)) + 1, len(caps))

    return max(fewest(used_cpu, cap_cpu), fewest(used_mem, cap_mem))


def take(fleet: Fleet, cluster: Cluster, waiting: list[int], largest: int) -> Snapshot:
    """The cluster now; `waiting` lists the shapes with queued requests."""
    nodes = cluster.nodes
    live = np.array(sorted(cluster.alive.items), dtype=np.int64)
    count = len(live)
    members = [nodes[i] for i in live.tolist()]
    used_cpu = np.fromiter((n.used_milli for n in members), dtype=np.int64, count=count)
    used_mem = np.fromiter((n.used_memory for n in members), dtype=np.int64, count=count)
    used_ports = np.fromiter((n.used_ports for n in members), dtype=np.int64, count=count)
    draining = np.fromiter((n.draining for n in members), dtype=np.bool_, count=count)
    cap_cpu, cap_mem = fleet.cap_cpu[live], fleet.cap_mem[live]
    util = (used_cpu / cap_cpu + used_mem / cap_mem) / 2.0
    is_open = ~draining
    free_cpu, free_mem = cap_cpu - used_cpu, cap_mem - used_mem
    free_ports = fleet.cap_ports[live] - used_ports

    def fits(shape: int) -> Bools:
        ok: Bools = (is_open & fleet.labels_ok[shape, live] & (fleet.cpu[shape] <= free_cpu)
                     & (fleet.mem[shape] <= free_mem) & (fleet.ports[shape] <= free_ports))
        return ok

    fits_any = np.zeros(count, dtype=np.bool_)
    usable_any = np.zeros(count, dtype=np.bool_)
    for shape in waiting:
        fits_any |= fits(shape)
        usable_any |= fleet.usable[shape, live]
    unfit = is_open & ~fits_any if waiting else np.zeros(count, dtype=np.bool_)
    stranded = unfit & usable_any
    o_cpu, o_mem = cap_cpu[is_open], cap_mem[is_open]
    weight = (o_cpu / max(int(o_cpu.sum()), 1) + o_mem / max(int(o_mem.sum()), 1)) / 2.0
    return Snapshot(
        nodes=live, util=util, open=is_open,
        empty=int(np.count_nonzero(is_open & (used_cpu == 0) & (used_mem == 0))),
        largest_fits=int(np.count_nonzero(fits(largest))),
        cap_cpu=int(o_cpu.sum()), cap_mem=int(o_mem.sum()),
        free_cpu=int(free_cpu[is_open].sum()), free_mem=int(free_mem[is_open].sum()),
        unfit_cpu=int(free_cpu[unfit].sum()), unfit_mem=int(free_mem[unfit].sum()),
        stranded_cpu=int(free_cpu[stranded].sum()), stranded_mem=int(free_mem[stranded].sum()),
        util_cv=weighted_cv(util[is_open], weight), util_jain=jain(util[is_open]),
        in_use=int(np.count_nonzero((used_cpu > 0) | (used_mem > 0) | (used_ports > 0))),
        bound=packing_bound(int(used_cpu.sum()), int(used_mem.sum()), cap_cpu, cap_mem))
