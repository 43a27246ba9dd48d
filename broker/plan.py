"""Plans: what a decision or a report changes in the state repository.

Rules:
1. Pure functions over a `View` — the ledger state with the batch's pending `Change`
   layered on top — so many plans can share one commit (group commit) and see each other.
2. Every plan re-checks the state it expects (compare-and-swap through
   `shared.lifecycle.transition`); a plan whose precondition no longer holds returns None
   and changes nothing.
3. Records are never mutated in place: the ledger's cached state stays what git holds until
   the commit lands.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from broker.ledger import Change, State
from shared.auction import Awarded, Unschedulable
from shared.lifecycle import LIVE, PENDING, transition
from shared.messages import InstanceState as S
from shared.ports import allocate
from shared.reasons import Reason
from shared.records import InstanceRecord, NodeFile, Placement

__all__ = [
    "View",
    "finish",
    "place",
    "record_ports",
    "requeue",
    "set_cancelling",
    "set_draining",
    "submit",
    "unschedulable",
]


class View:
    def __init__(self, state: State, change: Change | None = None) -> None:
        self.state = state
        self.change = change if change is not None else Change()

    def instance(self, iid: str) -> InstanceRecord | None:
        if iid in self.change.instances:
            return self.change.instances[iid]
        return self.state.instances.get(iid)

    def node(self, nid: str) -> NodeFile | None:
        if nid in self.change.nodes:
            return self.change.nodes[nid]
        return self.state.nodes.get(nid)

    def put_instance(self, rec: InstanceRecord) -> None:
        self.change.instances[rec.instance_id] = rec

    def put_node(self, nf: NodeFile) -> None:
        self.change.nodes[nf.node_id] = None if nf.empty else nf

    def placed_on(self, iid: str) -> str | None:
        rec = self.instance(iid)
        if rec is not None and rec.node_id:
            nf = self.node(rec.node_id)
            if nf is not None and iid in nf.instances:
                return rec.node_id
        return None


def submit(view: View, rec: InstanceRecord) -> bool:
    if view.instance(rec.instance_id) is not None:
        return False
    view.put_instance(rec)
    return True


def place(view: View, decision: Awarded, auction_id: str,
          port_range: Sequence[int]) -> Placement | None:
    """Put the instance into the winner's node.json; None if it is no longer pending."""
    iid, winner = decision.request.instance_id, decision.winner.node_id
    rec = view.instance(iid)
    if rec is None or view.placed_on(iid) is not None:
        return None
    nf = view.node(winner) or NodeFile(node_id=winner)
    in_use = {p for pl in nf.instances.values() for p in pl.ports.values()}
    in_use.update(nf.blocked_ports)
    ports = allocate(rec.spec.ports, port_range, in_use)
    if ports is None:
        return None
    new = transition(rec, PENDING, S.PLACED, node_id=winner, attempt=rec.attempt + 1,
                     reason="", detail="")
    if new is None:
        return None
    spec = msgspec.structs.replace(rec.spec, secrets=list(rec.spec.secrets))
    placement = Placement(instance_id=iid, spec=spec, auction_id=auction_id,
                          attempt=new.attempt, ports=ports)
    view.put_node(msgspec.structs.replace(nf, instances={**nf.instances, iid: placement}))
    view.put_instance(new)
    return placement


def unschedulable(view: View, decision: Unschedulable) -> bool:
    """Record why the instance waits; False when nothing changed (no commit needed)."""
    rec = view.instance(decision.request.instance_id)
    if rec is None or rec.state not in PENDING:
        return False
    if rec.state is S.UNSCHEDULABLE and rec.reason == decision.reason \
            and rec.detail == decision.summary:
        return False
    new = transition(rec, PENDING, S.UNSCHEDULABLE, reason=str(decision.reason),
                     detail=decision.summary)
    if new is None:
        return False
    view.put_instance(new)
    return True


def _unplace(view: View, rec: InstanceRecord, node_id: str) -> None:
    nf = view.node(node_id)
    if nf is not None and rec.instance_id in nf.instances:
        rest = {k: v for k, v in nf.instances.items() if k != rec.instance_id}
        view.put_node(msgspec.structs.replace(nf, instances=rest))


def finish(view: View, iid: str, node_id: str, to: S, reason: str = "",
           detail: str = "") -> InstanceRecord | None:
    """End the instance (terminal `to`), removing its placement from `node_id`.

    Only an instance that is live on `node_id` (or still pending, for cancel) may end."""
    rec = view.instance(iid)
    if rec is None:
        return None
    if rec.state in LIVE and rec.node_id != node_id:
        return None
    new = transition(rec, LIVE | PENDING, to, reason=reason, detail=detail)
    if new is None:
        return None
    if node_id:
        _unplace(view, rec, node_id)
    view.put_instance(new)
    return new


def requeue(view: View, iid: str, node_id: str, reason: Reason, detail: str = "",
            exhausted: S = S.FAILED, free: bool = False) -> InstanceRecord | None:
    """Take the instance off `node_id` and queue it again without that node, if its attempt
    budget allows; otherwise end it in `exhausted` with the reason. A `free` requeue (the
    operator moved it) gives the attempt back."""
    rec = view.instance(iid)
    if rec is None or rec.state not in LIVE or rec.node_id != node_id:
        return None
    _unplace(view, rec, node_id)
    if free:
        rec = msgspec.structs.replace(rec, attempt=max(0, rec.attempt - 1))
    if rec.attempt >= rec.spec.attempts:
        new = transition(rec, LIVE, exhausted, reason=str(reason),
                         detail=f"{Reason.ATTEMPTS_EXHAUSTED} ({rec.attempt}/{rec.spec.attempts})"
                         + (f": {detail}" if detail else ""))
    else:
        excluded = sorted({*rec.excluded, node_id})
        new = transition(rec, LIVE, S.QUEUED, reason=str(reason), detail=detail,
                         node_id="", excluded=excluded)
    if new is not None:
        view.put_instance(new)
    return new


def set_cancelling(view: View, iid: str) -> InstanceRecord | None:
    rec = view.instance(iid)
    if rec is None or rec.state not in LIVE or rec.cancelling:
        return None
    new = msgspec.structs.replace(rec, cancelling=True)
    view.put_instance(new)
    return new


def set_draining(view: View, node_id: str, draining: bool) -> NodeFile | None:
    nf = view.node(node_id) or NodeFile(node_id=node_id)
    if nf.draining == draining:
        return None
    new = msgspec.structs.replace(nf, draining=draining)
    view.put_node(new)
    return new


def record_ports(view: View, iid: str, node_id: str, ports: dict[str, int],
                 taken: list[int]) -> Placement | None:
    """The worker found some awarded ports taken outside gavel and gave the instance others
    from its free set: record the real ports and block the taken ones on that node."""
    rec, nf = view.instance(iid), view.node(node_id)
    if rec is None or nf is None or iid not in nf.instances or rec.state not in LIVE:
        return None
    old = nf.instances[iid]
    blocked = sorted({*nf.blocked_ports, *taken})
    if old.ports == ports and blocked == nf.blocked_ports:
        return None
    new = msgspec.structs.replace(old, ports=dict(ports))
    view.put_node(msgspec.structs.replace(nf, instances={**nf.instances, iid: new},
                                          blocked_ports=blocked))
    return new
