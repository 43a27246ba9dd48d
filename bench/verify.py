"""The bench's own check, read back from git after the run: it fails loudly, never warns.

Rules:
1. Without churn: every placement the bench asked for is in exactly one node.json.
2. With churn (instances end, retention forgets them): no instance is in two node.json
   files; every submitted instance won exactly one award in the branch's history (the
   `Gavel-Auction` trailers) for each time it was placed - once, and once more for every
   commit that requeued it (a node that did not accept its assignment in time, on a loaded
   machine: `requeue <id> off <node>: <reason>`); and it is still in exactly one node.json,
   or its record says it succeeded, or a commit forgot it (and it is gone from the tree).
3. Either way the tree holds the bench's instances and no other: an instance in a node.json
   or a record the bench never asked for is as wrong as one missing (the bench compares
   what it finds with what it asked for, never with what it found), and the ids asked for
   are distinct.
4. Each submission's reply names exactly the ids asked for, in order (`answered`): a
   broker that named fewer, more or others fails the run before anything is read back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pygit2

from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import State
from gavel.shared.messages import InstanceState
from gavel.shared.records import parse_trailers

__all__ = ["Churn", "VerifyError", "answered", "verify", "verify_churn"]


class VerifyError(Exception):
    """The run's own check failed: a placement missing, or in two node.json files."""


@dataclass(frozen=True)
class Churn:
    """What the tree held after a churn run."""

    running: int
    ended_kept: int
    forgotten: int


def answered(asked: list[str], named: list[str]) -> None:
    """Rule 4: `named`, the ids a submission's reply gave, are `asked`."""
    if named != asked:
        odd = next((n for n in named if n not in asked), None)
        raise VerifyError(f"the broker named {len(named)} instances for a submission of "
                          f"{len(asked)} ({asked[0]} ..)" + (f", among them {odd}, never asked "
                                                             "for" if odd else ""))


def _holders(st: State) -> dict[str, str]:
    seen: dict[str, str] = {}
    for node_id, nf in st.nodes.items():
        for iid in nf.instances:
            if iid in seen:
                raise VerifyError(f"{iid} is in two node.json files: {seen[iid]} and {node_id}")
            seen[iid] = node_id
    return seen


def _only(st: State, seen: dict[str, str], ids: list[str]) -> set[str]:
    """Rule 3: the ids asked for, as a set; a VerifyError for an id asked twice or an
    instance in the tree nobody asked for."""
    ours = set(ids)
    if len(ours) != len(ids):
        twice = next(i for i, n in Counter(ids).items() if n > 1)
        raise VerifyError(f"the bench asked for {twice} twice")
    for what, found in (("node.json files", seen), ("instance records", st.instances)):
        extra = sorted(i for i in found if i not in ours)
        if extra:
            raise VerifyError(f"{len(extra)} instances in {what} were never submitted, e.g. "
                              f"{extra[0]}")
    return ours


def verify(state: Path, ids: list[str], git_dir: Path | None = None) -> None:
    """Rules 1 and 3 (`git_dir`: another repository than the broker's, its remote's)."""
    st = Ledger(git_dir or state / "state.git").state()
    seen = _holders(st)
    _only(st, seen, ids)
    missing = [i for i in ids if i not in seen]
    if missing:
        raise VerifyError(f"{len(missing)} placements are in no node.json, e.g. {missing[0]}")


def verify_churn(state: Path, ids: list[str]) -> Churn:
    """Rules 2 and 3."""
    # One snapshot: the tree at a head and the history up to that head (the broker may
    # still be committing ends and forgets while this reads).
    ledger = Ledger(state / "state.git")
    st = ledger.state()
    seen = _holders(st)
    ours = _only(st, seen, ids)
    awards: Counter[str] = Counter()
    requeued: Counter[str] = Counter()
    forgotten: set[str] = set()
    walk: Iterable[pygit2.Commit] = ledger.repo.walk(pygit2.Oid(hex=st.head)) \
        if st.head else []
    for commit in walk:
        for line in commit.message.split("\n"):
            if line.startswith("forget "):
                forgotten.add(line.split(" ", 2)[1])
            elif line.startswith("requeue "):
                requeued[line.split(" ", 2)[1]] += 1
        awards.update(r.instance_id for r in parse_trailers(commit.message) if r.winner)
    for iid in ids:
        if awards[iid] != 1 + requeued[iid]:
            raise VerifyError(f"{iid} won {awards[iid]} awards in git history, not one"
                              + (f" and one for each of its {requeued[iid]} requeues"
                                 if requeued[iid] else ""))
        rec = st.instances.get(iid)
        if iid in forgotten:
            if rec is not None:
                raise VerifyError(f"{iid} was forgotten but its record is still in the tree")
        elif iid not in seen and (rec is None or rec.state is not InstanceState.SUCCEEDED):
            raise VerifyError(f"{iid} is in no node.json, did not succeed and was not "
                              "forgotten")
    ours = set(ids)
    return Churn(running=sum(1 for i in seen if i in ours),
                 ended_kept=sum(1 for i in st.ended if i in ours),
                 forgotten=len(forgotten & ours))
