"""Where a service's replica goes among the nodes that bid for it: the spread rule.

Rules:
1. A replica (a `Request` with a `group`) is awarded to the fitting bidder with the lowest
   `rank`: ``(replicas of its group in the node's value of the spread label, replicas of
   its group on the node, effective load, node id)``, the first term only when the request
   spreads over a label. So replicas land on distinct nodes whenever a bidder without one
   can take the next: a node that holds one is the fallback, preferred against, never
   refused.
2. The counts are the group's replicas the ledger has on each node now plus this batch's
   awards (`Tally`), so a batch of replicas spreads as one placement after another would.
3. A hard spread places a replica only in a value of the label that holds no more of the
   group than the emptiest value among the nodes that could take one: those that bid, and
   those that declined for want of room (a full zone still counts: filling the others
   would unbalance it). Nodes that lack the label, do not match the request's labels, drain
   or stay silent are not part of the spread. When no fitting bidder qualifies the replica
   waits, unschedulable with `Reason.SPREAD`. A soft spread takes the best by rank, a node
   without the label after every node with it.
4. Every tie breaks on the node id: the award never depends on the order bids arrived in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from gavel.shared.messages import Request

__all__ = ["Rank", "Tally", "rank"]

#: ``(replicas in the node's label value, replicas on the node, effective load, node id)``.
Rank = tuple[float, int, float, str]


class Tally:
    """Replicas of each group per node, and per value of a label: what the ledger holds now
    (`held`: group -> node -> replicas) plus every award `add`ed since."""

    __slots__ = ("_held", "_labels", "_nodes", "_values")

    def __init__(self, held: Mapping[str, Mapping[str, int]],
                 labels: Mapping[str, Mapping[str, str]]) -> None:
        self._held = held
        self._labels = labels
        self._nodes: dict[str, Counter[str]] = {}
        self._values: dict[tuple[str, str], Counter[str]] = {}

    def label(self, node: str, label: str) -> str | None:
        """The node's value of `label` (None: the node lacks it, or is unknown)."""
        return self._labels.get(node, {}).get(label)

    def on_node(self, group: str, node: str) -> int:
        return self._group(group)[node]

    def in_value(self, group: str, label: str, value: str) -> int:
        return self._by_value(group, label)[value]

    def add(self, group: str, node: str) -> None:
        """One more replica of `group` on `node` (an award of this batch)."""
        self._group(group)[node] += 1
        for (g, label), values in self._values.items():
            if g == group:
                value = self.label(node, label)
                if value is not None:
                    values[value] += 1

    def floor(self, group: str, label: str, values: Iterable[str]) -> int | None:
        """The fewest replicas of `group` in any of `values` (None: no values)."""
        counts = self._by_value(group, label)
        return min((counts[v] for v in values), default=None)

    def _group(self, group: str) -> Counter[str]:
        got = self._nodes.get(group)
        if got is None:
            got = self._nodes[group] = Counter(self._held.get(group, {}))
        return got

    def _by_value(self, group: str, label: str) -> Counter[str]:
        got = self._values.get((group, label))
        if got is None:
            got = Counter()
            for node, n in self._group(group).items():
                value = self.label(node, label)
                if value is not None and n:
                    got[value] += n
            self._values[(group, label)] = got
        return got


def rank(request: Request, node: str, load: float, tally: Tally) -> Rank:
    """The award order of a replica (rule 1): the lowest wins. A node without the spread
    label ranks after every node with it (rule 3)."""
    group = request.group
    zone = 0.0
    if request.spread:
        value = tally.label(node, request.spread)
        zone = math.inf if value is None else float(tally.in_value(group, request.spread,
                                                                   value))
    return zone, tally.on_node(group, node), load, node
