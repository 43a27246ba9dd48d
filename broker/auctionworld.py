"""The auctioneer core's world in the broker: git's state and the nodes' heartbeats.

Rules: every read is of the state as it is now (`ledger.state()` is git's head, cached),
except `record`, which reads the state the pass's `pending` was read from;
a node whose node.json cannot be read is never eligible (it wins nothing); `free` is a
heartbeat's capacity minus what git commits on that node, a fresh copy the core may charge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from gavel.broker.context import Context
from gavel.shared.messages import Capacity
from gavel.shared.records import InstanceRecord

__all__ = ["Git"]


class Git:
    """The core's `World`: git's state and the heartbeats, read as the core asks."""

    __slots__ = ("_instances", "ctx")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._instances: Mapping[str, InstanceRecord] = {}

    def pending(self) -> Iterable[str]:
        state = self.ctx.ledger.state()
        self._instances = state.instances  # what `record` reads in the same pass: one read
        return state.pending

    def record(self, iid: str) -> InstanceRecord:
        return self._instances[iid]

    def eligible(self, now: float) -> list[str]:
        eligible = self.ctx.liveness.eligible(now)
        unusable = self.ctx.ledger.state().unusable_nodes
        if unusable:  # a node.json we cannot read: that node wins nothing
            eligible = [n for n in eligible if n not in unusable]
        return eligible

    def draining(self) -> AbstractSet[str]:
        return self.ctx.ledger.state().draining

    def free(self, nodes: Iterable[str], reserved: Mapping[str, Capacity]
             ) -> dict[str, Capacity]:
        committed = self.ctx.ledger.state().committed
        beats = self.ctx.liveness.heartbeats
        out: dict[str, Capacity] = {}
        for node_id in nodes:
            hb = beats.get(node_id)
            if hb is None:
                continue
            free = hb.capacity.copy()
            used = committed.get(node_id)
            if used is not None:
                free.charge(used, -1)
            res = reserved.get(node_id)
            if res is not None:
                free.charge(res, -1)
            out[node_id] = free
        return out

    def held_by(self, group: str) -> dict[str, int]:
        return self.ctx.ledger.state().held_by(group)

    def placed(self, iid: str) -> bool:
        return iid in self.ctx.ledger.state().where

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        return {n: hb.labels for n, hb in self.ctx.liveness.heartbeats.items()}

    @property
    def pinned(self) -> bool:
        return bool(self.ctx.ledger.pinned)
