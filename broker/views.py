"""How the API shows an instance: its live state and health beside what git holds.

Rules:
1. A pending instance that a node file holds is placed, or what its node last reported
   (`Promises.live`), or cancelling while its cancel is on its way; a waiting one is
   scheduled while an auction holds it; anything else is the record's own state.
2. A placed instance's health is its node's last word (`Promises.health`); without one, an
   instance running with no checks is healthy and any other unknown.
"""

from __future__ import annotations

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.context import Context
from gavel.broker.promises import Promises
from gavel.shared.api import InstanceStatus
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import Health as InstanceHealth
from gavel.shared.messages import InstanceState
from gavel.shared.records import InstanceRecord

__all__ = ["Views"]


class Views:
    def __init__(self, ctx: Context, auctioneer: Auctioneer, promises: Promises) -> None:
        self.ctx = ctx
        self.auctioneer = auctioneer
        self.promises = promises

    def state_of(self, rec: InstanceRecord) -> str:
        """The state an operator reads in `gavel status` (and the metrics count): a placed
        instance is what its node last reported (provisioning, running), or cancelling, or
        placed; a waiting one is scheduled while in an auction; else the record's state."""
        iid = rec.instance_id
        if rec.state in PENDING and self.ctx.ledger.state().placement_of(iid) is not None:
            return "cancelling" if rec.cancelling else \
                self.promises.live.get(iid, InstanceState.PLACED)
        return self.auctioneer.status_of(iid, rec.state)

    def instance_status(self, rec: InstanceRecord) -> InstanceStatus:
        iid = rec.instance_id
        state = self.ctx.ledger.state()
        pl = state.placement(iid)
        node = state.placement_of(iid)
        st = self.state_of(rec)
        if pl is not None and node is not None and rec.state in PENDING:
            note = self.promises.health.get(iid)
            health, check, restarts = (note.health, note.check, note.restarts) if note else \
                (InstanceHealth.HEALTHY if st == InstanceState.RUNNING and not rec.spec.checks
                 else InstanceHealth.UNKNOWN, "", 0)
            return InstanceStatus(instance_id=iid, name=rec.spec.name, state=st,
                                  node_id=node, attempt=pl.attempt, ports=dict(pl.ports),
                                  health=health, check=check, restarts=restarts,
                                  reason=rec.reason if rec.cancelling else
                                  note.reason if note else "",
                                  detail="" if rec.cancelling or not note else note.detail,
                                  service=rec.service, version=rec.version)
        return InstanceStatus(instance_id=iid, name=rec.spec.name, state=st,
                              node_id=rec.node_id, attempt=rec.attempt, reason=rec.reason,
                              detail=rec.detail, service=rec.service, version=rec.version)
