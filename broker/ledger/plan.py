"""Plans: what a decision or a report changes in the state repository.

Rules:
1. Pure functions over a `View` — the ledger state with the batch's pending `Change`
   layered on top — so many plans can share one commit (group commit) and see each other.
2. An instance is placed exactly when a node.json holds it; a placement writes only that
   node.json. The instance's record changes only for intent and durable outcomes: queued,
   unschedulable, cancelling, re-queued (with its attempt count) and terminal states.
3. Every plan re-checks the state it expects (compare-and-swap through
   `shared.lifecycle.transition` on the effective state); a plan whose precondition no
   longer holds returns None and changes nothing.
4. Records are never mutated in place: the ledger's cached state stays what git holds until
   the commit lands. The one exception is a view's own copy: the first placement a view
   makes on a node copies its file, later ones in the same view are added to that copy
   (`View.add`). A commit places hundreds of instances on nodes holding dozens; copying
   and diffing a node's whole file for each one would make planning O(instances on the
   node) a placement - touching every record's refcount, all over a big heap, in
   synchronous stretches that bid rounds wait behind (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gavel.broker.ledger.state import Change, State, committed_by
from gavel.broker.steps import Steps, at_once, chunks
from gavel.shared.auction import Awarded, Unschedulable
from gavel.shared.lifecycle import PENDING, transition
from gavel.shared.messages import Capacity
from gavel.shared.messages import InstanceState as S
from gavel.shared.ports import allocate
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    Assignment,
    InstanceRecord,
    NodeFile,
    PeriodicRecord,
    ServiceRecord,
)

__all__ = [
    "View",
    "block_ports",
    "finish",
    "forget",
    "place",
    "record_ports",
    "release",
    "requeue",
    "rewrite",
    "set_cancelling",
    "set_draining",
    "stop",
    "submit",
    "unexclude",
    "unschedulable",
]


class View:
    def __init__(self, state: State, change: Change | None = None) -> None:
        self.state = state
        self.change = change if change is not None else Change()
        self.change.bases = state.encoded
        self._where: dict[str, str | None] = {}
        #: Node files this view made, by node: only these may grow in place (rule 4).
        self._own: dict[str, NodeFile] = {}

    def instance(self, iid: str) -> InstanceRecord | None:
        if iid in self.change.instances:
            return self.change.instances[iid]
        return self.state.instances.get(iid)

    def node(self, nid: str) -> NodeFile | None:
        if nid in self.change.nodes:
            return self.change.nodes[nid]
        return self.state.nodes.get(nid)

    def service(self, name: str) -> ServiceRecord | None:
        if name in self.change.services:
            return self.change.services[name]
        return self.state.services.get(name)

    def put_service(self, rec: ServiceRecord) -> None:
        self.change.services[rec.name] = rec

    def periodic(self, name: str) -> PeriodicRecord | None:
        if name in self.change.periodic:
            return self.change.periodic[name]
        return self.state.periodic.get(name)

    def put_periodic(self, rec: PeriodicRecord) -> None:
        self.change.periodic[rec.name] = rec

    def drop_periodic(self, name: str) -> None:
        self.change.periodic[name] = None

    def replicas(self, name: str) -> list[InstanceRecord]:
        """Every replica record of the service `name` as this view has them: the state's,
        as changed here, and those made here (a scan of this change's records: a service's
        plans are few, and it keeps the hot path's plans free of a second index)."""
        return at_once(self.replicas_in_steps(name))

    def replicas_in_steps(self, name: str) -> Steps[list[InstanceRecord]]:
        """`replicas`, in steps (`broker.steps`)."""
        out: list[InstanceRecord] = []
        known = self.state.replicas.get(name, {})
        for part in chunks(list(known)):
            for iid in part:
                rec = self.instance(iid)
                if rec is not None and rec.service == name:
                    out.append(rec)
            yield
        for iid, made in self.change.instances.items():
            if made is not None and made.service == name and iid not in known:
                out.append(made)
        return out

    def put_instance(self, rec: InstanceRecord) -> None:
        self.change.instances[rec.instance_id] = rec

    def drop_instance(self, iid: str) -> None:
        self.change.instances[iid] = None

    def put_node(self, nf: NodeFile, committed: Capacity | None = None) -> None:
        """Change the node's file; `committed`: what its placements add up to, if known."""
        self.change.grown.pop(nf.node_id, None)
        old = self.node(nf.node_id)
        before = old.instances.keys() if old is not None else set()
        for iid in before - nf.instances.keys():
            self._where[iid] = None
        for iid in nf.instances.keys() - before:
            self._where[iid] = nf.node_id
        self.change.nodes[nf.node_id] = None if nf.empty else nf
        if committed is None or nf.empty:
            self.change.committed.pop(nf.node_id, None)
        else:
            self.change.committed[nf.node_id] = committed

    def add(self, nf: NodeFile, iid: str, placement: Assignment, committed: Capacity) -> None:
        """`put_node` of `nf` (as `node` gives it) with `placement` added last, and
        `committed` its new total: O(1) in what the node holds after its first (rule 4)."""
        nid = nf.node_id
        grown = self.change.grown
        if self._own.get(nid) is nf and self.change.nodes.get(nid) is nf:
            nf.instances[iid] = placement
            self.change.forget_encoding(nid)
            if nid in grown:
                grown[nid][1].append(iid)
        else:
            if nid not in self.change.nodes and nf is self.state.nodes.get(nid):
                grown[nid] = (nf, [iid])  # the state's record plus these, last
            else:
                grown.pop(nid, None)
            nf = self._own[nid] = msgspec.structs.replace(
                nf, instances={**nf.instances, iid: placement})
        self._where[iid] = nid
        self.change.nodes[nid] = nf
        self.change.committed[nid] = committed

    def committed(self, nid: str) -> Capacity:
        """What the node's placements add up to, as this view has them."""
        if nid in self.change.nodes:
            got = self.change.committed.get(nid)
            if got is not None:
                return got
            nf = self.change.nodes[nid]
            return committed_by(nf) if nf is not None else Capacity()
        return self.state.committed.get(nid) or Capacity()

    def placed_on(self, iid: str) -> str | None:
        if iid in self._where:
            return self._where[iid]
        return self.state.where.get(iid)

    def placement(self, iid: str) -> Assignment | None:
        node = self.placed_on(iid)
        nf = self.node(node) if node is not None else None
        return nf.instances.get(iid) if nf is not None else None

    def live(self, iid: str, node_id: str) -> tuple[InstanceRecord, Assignment] | None:
        """The record (seen as ``placed``) and placement of an instance placed on `node_id`."""
        rec = self.instance(iid)
        pl = self.placement(iid) if self.placed_on(iid) == node_id else None
        if rec is None or pl is None or rec.state not in PENDING:
            return None
        return msgspec.structs.replace(rec, state=S.PLACED, node_id=node_id,
                                       attempt=pl.attempt), pl


def forget(view: View, iid: str, ended_at: str) -> InstanceRecord | None:
    """Drop the record of an ended instance (retention); None, changing nothing, unless it
    is still ended with the same end stamp and no node.json holds it."""
    rec = view.instance(iid)
    if rec is None or not rec.state.terminal or rec.ended_at != ended_at \
            or view.placed_on(iid) is not None:
        return None
    view.drop_instance(iid)
    return rec


def submit(view: View, rec: InstanceRecord) -> bool:
    if view.instance(rec.instance_id) is not None:
        return False
    view.put_instance(rec)
    return True


def place(view: View, decision: Awarded, auction_id: str,
          port_range: Sequence[int]) -> Assignment | None:
    """Put the instance into the winner's node.json; None if it is no longer pending."""
    iid, winner = decision.request.instance_id, decision.winner.node_id
    rec = view.instance(iid)
    if rec is None or rec.state not in PENDING or rec.held or view.placed_on(iid) is not None \
            or winner in view.state.unusable_nodes:  # never overwrite a file we cannot read
        return None
    nf = view.node(winner) or NodeFile(node_id=winner)
    if nf.draining:  # drained after its round opened: the instance waits for the next
        return None
    ports: dict[str, int] | None = {}
    if rec.spec.ports:  # the node's ports in use only matter to a spec that asks for some
        in_use = {p for pl in nf.instances.values() for p in pl.ports.values()}
        in_use.update(nf.blocked_ports)
        ports = allocate(rec.spec.ports, port_range, in_use)
    if ports is None:
        return None
    placement = Assignment(instance_id=iid, auction_id=auction_id, attempt=rec.attempt + 1,
                           cpu=rec.spec.cpu, memory_mb=rec.spec.memory_mb, ports=ports)
    # The new placement goes last in the file, so the node's total is the old one plus it:
    # the same sum, in the same order, as adding up the whole file again.
    view.add(nf, iid, placement, view.committed(winner) + placement.reserves())
    return placement


def unschedulable(view: View, decision: Unschedulable) -> bool:
    """Record why the instance waits; False when nothing changed (no commit needed)."""
    iid = decision.request.instance_id
    rec = view.instance(iid)
    if rec is None or rec.state not in PENDING or view.placed_on(iid) is not None:
        return False
    if rec.state is S.UNSCHEDULABLE:  # still waiting: only a new reason or summary is news
        if rec.reason == decision.reason and rec.detail == decision.summary:
            return False
        new: InstanceRecord | None = msgspec.structs.replace(
            rec, reason=str(decision.reason), detail=decision.summary)
    else:
        new = transition(rec, PENDING, S.UNSCHEDULABLE, reason=str(decision.reason),
                         detail=decision.summary)
    if new is None:
        return False
    view.put_instance(new)
    return True


def _unplace(view: View, iid: str, node_id: str) -> None:
    nf = view.node(node_id)
    if nf is not None and iid in nf.instances:
        rest = {k: v for k, v in nf.instances.items() if k != iid}
        view.put_node(msgspec.structs.replace(nf, instances=rest))


def finish(view: View, iid: str, node_id: str, to: S, reason: str = "",
           detail: str = "") -> InstanceRecord | None:
    """End the instance (terminal `to`), removing its placement from `node_id`.

    Only an instance placed on `node_id` may end there; with ``node_id=""`` only one that
    is still waiting (cancel before placement)."""
    if node_id:
        got = view.live(iid, node_id)
        if got is None:
            return None
        cur = got[0]
    else:
        rec = view.instance(iid)
        if rec is None or view.placed_on(iid) is not None:
            return None
        cur = rec
    new = transition(cur, cur.state, to, reason=reason, detail=detail, cancelling=False)
    if new is None:
        return None
    if node_id:
        _unplace(view, iid, node_id)
    view.put_instance(new)
    return new


def requeue(view: View, iid: str, node_id: str, reason: Reason, detail: str = "",
            exhausted: S = S.FAILED, free: bool = False) -> InstanceRecord | None:
    """Take the instance off `node_id` and queue it again without that node, if its attempt
    budget allows; otherwise end it in `exhausted` with the reason. A `free` requeue (the
    operator moved it) gives the attempt back."""
    got = view.live(iid, node_id)
    if got is None:
        return None
    cur = got[0]
    if free:
        cur = msgspec.structs.replace(cur, attempt=max(0, cur.attempt - 1))
    _unplace(view, iid, node_id)
    if cur.attempt >= cur.spec.attempts:
        new = transition(cur, S.PLACED, exhausted, reason=str(reason), cancelling=False,
                         detail=f"{Reason.ATTEMPTS_EXHAUSTED} ({cur.attempt}/{cur.spec.attempts})"
                         + (f": {detail}" if detail else ""))
    else:
        excluded = tuple(sorted({*cur.excluded, node_id}))
        new = transition(cur, S.PLACED, S.QUEUED, reason=str(reason), detail=detail,
                         node_id="", excluded=excluded, cancelling=False)
    if new is not None:
        view.put_instance(new)
    return new


def set_cancelling(view: View, iid: str, reason: Reason = Reason.CANCELLED
                   ) -> InstanceRecord | None:
    """Mark a placed instance as being cancelled, and why: the end its node confirms keeps
    that reason (`Promises`), so a replica a service stopped reads as stopped by it."""
    rec = view.instance(iid)
    if rec is None or rec.cancelling or view.placed_on(iid) is None:
        return None
    new = msgspec.structs.replace(rec, cancelling=True, reason=str(reason), detail="")
    view.put_instance(new)
    return new


def stop(view: View, iid: str, reason: Reason) -> tuple[InstanceRecord, str] | None:
    """Stop a live instance for `reason`: one still waiting for a node is cancelled at once,
    a placed one is marked cancelling (its node is told after the commit). The new record
    and the node it is on ("" for none); None when it is not live or already stopping."""
    rec = view.instance(iid)
    if rec is None or rec.state.terminal or rec.cancelling:
        return None
    node = view.placed_on(iid)
    if node is None:
        new = finish(view, iid, "", S.CANCELLED, str(reason))
    else:
        new = set_cancelling(view, iid, reason)
    return None if new is None else (new, node or "")


def release(view: View, iid: str) -> InstanceRecord | None:
    """Release a held task of a batch array (`gavel.shared.arrays`): it becomes an ordinary
    queued instance, auctioned from the next round; None unless it is still held."""
    rec = view.instance(iid)
    if rec is None or not rec.held or rec.state.terminal:
        return None
    new = msgspec.structs.replace(rec, held=False, reason="", detail="")
    view.put_instance(new)
    return new


def set_draining(view: View, node_id: str, draining: bool) -> NodeFile | None:
    if node_id in view.state.unusable_nodes:
        return None  # its node.json is not ours to overwrite (see `State.unreadable`)
    nf = view.node(node_id) or NodeFile(node_id=node_id)
    if nf.draining == draining:
        return None
    new = msgspec.structs.replace(nf, draining=draining)
    view.put_node(new)
    return new


def unexclude(view: View, node_id: str) -> list[str]:
    """Take `node_id` out of every record's exclusion list (the node is back in service: the
    drain, or the failure, that put it there no longer holds); the instances changed."""
    changed = []
    for iid in sorted(view.state.instances.keys() | view.change.instances.keys()):
        rec = view.instance(iid)
        if rec is not None and node_id in rec.excluded:
            view.put_instance(msgspec.structs.replace(
                rec, excluded=tuple(n for n in rec.excluded if n != node_id)))
            changed.append(iid)
    return changed
def rewrite(view: View, node_ids: Sequence[str]) -> list[str]:
    """Write these nodes' node.json as the view holds them: the correction of a tree that
    listed an instance where the broker had not placed it (`broker.ledger.integrity`),
    whose `State` already holds the broker's placement. Writing what the state holds is
    always safe, whether or not another commit wrote it first; the nodes written (never a
    file the broker cannot read: `State.unreadable`)."""
    out = []
    for nid in node_ids:
        if nid in view.state.unusable_nodes:
            continue
        view.put_node(view.node(nid) or NodeFile(node_id=nid))
        out.append(nid)
    return out


def block_ports(view: View, node_id: str, awarded: Assignment, taken: list[int]) -> list[int]:
    """Block on the node the ports of `awarded` (an instance's placement there) it found
    taken outside gavel; the ports newly blocked. Only those: found taken is by definition
    an awarded port that failed its bind check (`worker.ports.assign`), so a report naming
    others - any number of them - cannot fill the node's file with blocks; nor a port an
    instance of the node holds now."""
    if node_id in view.state.unusable_nodes:
        return []  # its node.json is not ours to overwrite (see `State.unreadable`)
    nf = view.node(node_id) or NodeFile(node_id=node_id)
    held = {p for pl in nf.instances.values() for p in pl.ports.values()}
    new = sorted((set(taken) & set(awarded.ports.values())) - set(nf.blocked_ports) - held)
    if new:
        view.put_node(msgspec.structs.replace(
            nf, blocked_ports=sorted({*nf.blocked_ports, *new})))
    return new


def unblock_ports(view: View, node_id: str, ports: list[int]) -> list[int]:
    """Give back blocked ports the node found free again; the ports actually unblocked."""
    nf = view.node(node_id)
    if nf is None:
        return []
    freed = sorted(set(nf.blocked_ports) & set(ports))
    if freed:
        view.put_node(msgspec.structs.replace(
            nf, blocked_ports=[p for p in nf.blocked_ports if p not in freed]))
    return freed


def record_ports(view: View, iid: str, node_id: str, ports: dict[str, int],
                 taken: list[int]) -> Assignment | None:
    """The worker found some awarded ports taken outside gavel and gave the instance others
    from its free set: record the real ports and block the taken ones on that node."""
    nf = view.node(node_id)
    if nf is None or iid not in nf.instances or view.live(iid, node_id) is None:
        return None
    old = nf.instances[iid]
    new = old
    if old.ports != ports:
        new = msgspec.structs.replace(old, ports=dict(ports))
        view.put_node(msgspec.structs.replace(nf, instances={**nf.instances, iid: new}))
    blocked = block_ports(view, node_id, old, taken)
    return new if new is not old or blocked else None
