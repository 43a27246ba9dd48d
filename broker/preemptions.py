"""Committing a displacing award: its victims leave and the award lands in one commit.

Rules:
1. The node's word is never taken for what it may stop: every victim must be placed on the
   winner in the view, and be one `shared.preemption` rules 1 and 2 let it offer (by its
   own record, not the node's report). One that is not spoils the whole award (nothing is
   evicted, the instance is auctioned again).
2. The preemptor's own placement is checked before anything is evicted (still pending, the
   winner usable and not draining, ports to be had once the victims' are free): a plan never
   evicts for an award it then cannot place.
3. A victim is queued again without that node, its attempt given back (`requeue`'s
   ``free``; a service's replica is replaced the same way, as its own next attempt, so the
   service keeps its count), its node told to stop it, with the reason
   `Reason.PREEMPTED` and the preemptor named in the detail; a ``preempted`` event says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from gavel.broker.effects import Effect, Emit
from gavel.broker.ledger.committer import Planned
from gavel.broker.ledger.plan import View
from gavel.broker.promiseplans import plan_requeue
from gavel.shared.auction import Awarded
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import EventType
from gavel.shared.ports import allocate
from gavel.shared.preemption import displaceable
from gavel.shared.reasons import Reason, preempted_by

__all__ = ["plan_evictions"]


def plan_evictions(view: View, d: Awarded, port_range: Sequence[int],
                   epoch: int = 0) -> Planned | None:
    """Evict `d`'s victims from its winner (rules 1-3); None, changing nothing, when the
    award can no longer displace them or could not be placed after."""
    node = d.winner.node_id
    if not _placeable(view, d, port_range):
        return None
    for v in d.displaced:
        got = view.live(v.instance_id, node)
        if got is None or got[0].cancelling or got[0].only_node \
                or not displaceable(d.request.priority, got[0].spec.priority):
            return None
    detail = preempted_by(d.request.instance_id, d.request.priority)
    out = Planned(lines=[])
    for v in d.displaced:
        planned = plan_requeue(view, v.instance_id, node, Reason.PREEMPTED, detail, free=True,
                               stop=True, epoch=epoch)
        assert planned is not None, "checked live above"
        out.lines += [f"preempt {v.instance_id} on {node} for {d.request.instance_id}"]
        effects: list[Effect] = [*planned.effects,
                                 Emit(v.instance_id, EventType.PREEMPTED, node_id=node,
                                      reason=Reason.PREEMPTED, detail=detail)]
        out.effects += effects
    return out


def _placeable(view: View, d: Awarded, port_range: Sequence[int]) -> bool:
    """Rule 2: `ledger.plan.place`'s preconditions, with the victims' ports counted free."""
    rec = view.instance(d.request.instance_id)
    node = d.winner.node_id
    if rec is None or rec.state not in PENDING or rec.held \
            or view.placed_on(rec.instance_id) is not None \
            or node in view.state.unusable_nodes:
        return False
    nf = view.node(node)
    if nf is not None and nf.draining:
        return False
    if not rec.spec.ports:
        return True
    gone = {v.instance_id for v in d.displaced}
    in_use = {p for iid, pl in (nf.instances.items() if nf else ()) if iid not in gone
              for p in pl.ports.values()}
    in_use.update(nf.blocked_ports if nf else ())
    return allocate(rec.spec.ports, port_range, in_use) is not None
