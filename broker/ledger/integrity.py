"""One instance, one node: what the broker keeps when a tree someone else wrote disagrees.

The broker is the single writer of placements, but the state repository is a git branch:
anyone may commit to it by hand, or push to the remote it merges from. A node.json that
lists an instance on a node the broker did not place it on would make a second worker run
it. `settle` corrects the `State` read from such a tree, in memory and before anyone reads
it; the broker then commits the correction (`broker.integrity`).

Rules:
1. When the ref moved under the broker, its previous `State` - what its own commits made -
   is the history, and the placement it had stands: an instance's entry that someone else
   added to a node file, moved between node files, removed or changed is put back as the
   broker had it. A removed entry is put back only while the instance's record is still in
   the tree: a placement without its record cannot be awarded (the award carries the spec),
   so it would only hold capacity for nothing.
2. At a broker start there is no history: an instance listed in two or more node files keeps
   the node its newest recorded auction (``Gavel-Auction:``) names as winner, if that is one
   of them; else the one that lists the highest attempt; else, among those, the lowest node
   id. A single listing is taken as it is: without history nothing says it is wrong.
3. `draining` and `blocked_ports` of a node file stay the operator's to edit by hand: they
   are never compared, never put back.
4. The corrected `State` holds only the kept placement - in `nodes` itself and so in `where`,
   `pending` and `committed` - so no award, no mirror put and no capacity count ever sees
   the dropped copy, even before the correction lands. Each correction is a `Dispute` in
   `State.disputes` until the broker has committed it.
5. A node file that is not usable (`State.unusable_nodes`) is never rewritten: an instance
   the broker had placed there is left to that file's own rule (fix it in git).
6. A dispute that is still open when the ref moves again is found again; the same dispute
   keeps its identity (the object of the previous `State`), so it is committed once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import msgspec

from gavel.broker.ledger.disputes import Dispute, Keep
from gavel.broker.ledger.state import State
from gavel.shared.lifecycle import PENDING
from gavel.shared.records import Assignment, NodeFile

__all__ = ["Winners", "settle"]

#: The winner each instance's newest recorded auction names, for the instances asked about
#: (those without a recorded winner are left out): `Ledger` reads it from the history.
Winners = Callable[[Collection[str]], Mapping[str, str]]


def settle(st: State, history: State | None, winners: Winners) -> list[Dispute]:
    """Correct `st`, a tree just read, in place (rules 1-6); the disputes it now holds."""
    found = _against(st, history) if history is not None else _at_start(st, winners)
    if not found:
        return []
    _apply(st, found)
    known = history.disputes if history is not None else {}
    for d, _entry in found:
        st.disputes[d.instance_id] = known[d.instance_id] \
            if known.get(d.instance_id) == d else d  # rule 6
    return [st.disputes[d.instance_id] for d, _ in found]


def _holders(st: State, iids: Collection[str]) -> dict[str, list[str]]:
    """The nodes whose node.json lists each of `iids`, in node id order."""
    out: dict[str, list[str]] = {iid: [] for iid in iids}
    for nid in sorted(st.nodes):
        listed = st.nodes[nid].instances
        for iid in iids:
            if iid in listed:
                out[iid].append(nid)
    return out


def _against(st: State, history: State) -> list[tuple[Dispute, Assignment | None]]:
    """Rule 1: every entry that differs from the history's, put back as it was."""
    changed: set[str] = set()
    for nid in st.nodes.keys() | history.nodes.keys():
        if nid in st.unusable_nodes:
            continue  # rule 5
        now, was = st.nodes.get(nid), history.nodes.get(nid)
        a = now.instances if now is not None else {}
        b = was.instances if was is not None else {}
        if a != b:
            changed.update(iid for iid in a.keys() | b.keys() if a.get(iid) != b.get(iid))
    if not changed:
        return []
    holders = _holders(st, changed)
    out: list[tuple[Dispute, Assignment | None]] = []
    for iid in sorted(changed):
        held = holders[iid]
        kept = history.where.get(iid, "")
        entry = history.placement(iid) if kept else None
        rule = Keep.HISTORY if kept else Keep.NOWHERE
        if kept and iid not in st.instances:
            kept, entry, rule = "", None, Keep.NO_RECORD
        if kept in st.unusable_nodes:
            continue  # rule 5
        dropped = tuple(n for n in held if n != kept)
        restored = ""
        if kept and entry is not None:
            nf = st.nodes.get(kept)
            if nf is None or nf.instances.get(iid) != entry:
                restored = kept
        if dropped or restored:
            out.append((Dispute(instance_id=iid, kept=kept, rule=rule, held=tuple(held),
                                dropped=dropped, restored=restored), entry))
    return out


def _at_start(st: State, winners: Winners) -> list[tuple[Dispute, Assignment | None]]:
    """Rule 2: an instance in several node files keeps one of them."""
    twice = {iid for nid, nf in st.nodes.items() for iid in nf.instances
             if st.where.get(iid) != nid}  # `where` holds the last file read that lists it
    if not twice:
        return []
    holders = _holders(st, twice)
    named = winners(sorted(twice))
    out: list[tuple[Dispute, Assignment | None]] = []
    for iid in sorted(twice):
        held = holders[iid]
        winner = named.get(iid, "")
        if winner in held:
            kept, rule = winner, Keep.AUCTION
        else:
            attempts = {n: st.nodes[n].instances[iid].attempt for n in held}
            top = max(attempts.values())
            best = [n for n in held if attempts[n] == top]
            kept, rule = best[0], (Keep.ATTEMPT if len(best) == 1 else Keep.NODE_ID)
        out.append((Dispute(instance_id=iid, kept=kept, rule=rule, held=tuple(held),
                            dropped=tuple(n for n in held if n != kept)), None))
    return out


def _apply(st: State, found: list[tuple[Dispute, Assignment | None]]) -> None:
    """Rule 4: the node files as the broker keeps them, and the indexes to match."""
    files: dict[str, dict[str, Assignment]] = {}

    def entries(nid: str) -> dict[str, Assignment]:
        if nid not in files:
            nf = st.nodes.get(nid)
            files[nid] = dict(nf.instances) if nf is not None else {}
        return files[nid]

    for d, entry in found:
        for nid in d.dropped:
            entries(nid).pop(d.instance_id, None)
        if d.restored and entry is not None:
            entries(d.restored)[d.instance_id] = entry  # in its place, or last
    for nid, instances in files.items():
        old = st.nodes.get(nid)
        nf = msgspec.structs.replace(old, instances=instances) if old is not None \
            else NodeFile(node_id=nid, instances=instances)
        st.put_node(nid, None if nf.empty else nf)
    st.held.clear()  # placements move below, beside `put_node`
    for d, _entry in found:  # whatever order the files were read and rewritten in
        iid = d.instance_id
        if d.kept:
            st.where[iid] = d.kept
            st.pending.pop(iid, None)
        else:
            st.where.pop(iid, None)
            rec = st.instances.get(iid)
            if rec is not None and rec.state in PENDING and not rec.held:
                st.pending.setdefault(iid, None)
