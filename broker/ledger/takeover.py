"""A new leadership's first commit, and how a branch names the leadership that wrote it.

Rules:
1. A leadership's first act is a commit on the remote's branch that writes ``leader.json``
   at the top of the tree: its epoch, its broker's id and since when it leads. Every later
   commit of that leadership descends from it and keeps the file as it is; a branch's
   epoch is the one its head's ``leader.json`` names (0: none, a branch no HA broker led).
2. The remote is the truth. Taking over, a broker sets its local branch to the remote's,
   whatever the local one held (a stale copy, a deposed leadership's unpushed commits,
   nothing at all), and builds the epoch commit on that. Only a remote without the branch
   leaves the local one as it is: the first leader of a new remote pushes what it has.
3. Once the epoch commit landed (a compare-and-swap push, `broker.ledger.caspush`), no push
   of an older leadership can land: its commits do not descend from ours. If an older
   leader's last push got in first, ours is refused and the takeover starts over from rule
   2, with those commits in what it derives from.
4. The epoch is the lease's revision, raised past the epoch the remote's branch holds when
   it is not above it already (a lease bucket made anew starts counting again): epochs
   only grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pygit2

__all__ = ["LEADER_FILE", "LeaderFile", "Taken", "TakeoverError", "epoch_commit", "epoch_of",
           "next_epoch", "set_branch"]

LEADER_FILE = "leader.json"
_SIGNATURE = ("gavel-broker", "broker@gavel.local")


class LeaderFile(msgspec.Struct, kw_only=True):
    epoch: int
    broker_id: str = ""
    since: str = ""


_dec = msgspec.json.Decoder(LeaderFile)
_enc = msgspec.json.Encoder()


class TakeoverError(Exception):
    """The takeover could not land its epoch commit; the sentence says why."""


@dataclass(frozen=True)
class Taken:
    """A landed takeover: our epoch, the epoch commit, the epoch the branch held before."""

    epoch: int
    head: str
    previous: int


def epoch_of(repo: pygit2.Repository, sha: str | None) -> int:
    """Rule 1: the epoch the branch at `sha` names (0 for none or an unreadable file)."""
    if sha is None:
        return 0
    tree = repo[sha].peel(pygit2.Tree)
    if LEADER_FILE not in tree:
        return 0
    blob = repo[tree[LEADER_FILE].id]
    if not isinstance(blob, pygit2.Blob):
        return 0
    try:
        return max(0, _dec.decode(blob.data).epoch)
    except (msgspec.DecodeError, RecursionError):
        return 0


def next_epoch(lease_revision: int, held: int) -> int:
    """Rule 4."""
    return max(lease_revision, held + 1)


def set_branch(repo: pygit2.Repository, ref: str, sha: str, why: str) -> None:
    """Point our local `ref` at `sha`, under git's ref lock (rule 2: local only)."""
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        txn.set_target(ref, pygit2.Oid(hex=sha), message=why[:200])


def epoch_commit(repo: pygit2.Repository, ref: str, base: str | None, leader: LeaderFile
                 ) -> str:
    """Rule 1: ``leader.json`` on top of `base`, and our branch moved there from `base`."""
    data = msgspec.json.format(_enc.encode(leader), indent=2) + b"\n"
    blob = repo.create_blob(data)
    tb = repo.TreeBuilder() if base is None else repo.TreeBuilder(repo[base].peel(pygit2.Tree))
    tb.insert(LEADER_FILE, blob, pygit2.enums.FileMode.BLOB)
    tree = tb.write()
    sig = pygit2.Signature(*_SIGNATURE)
    message = (f"gavel: broker {leader.broker_id} leads from epoch {leader.epoch}\n\n"
               f"Gavel-Epoch: {leader.epoch}\nGavel-Broker: {leader.broker_id}\n")
    parents = [pygit2.Oid(hex=base)] if base else []
    commit = repo.create_commit(None, sig, sig, message, tree, parents)
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        current = repo.references.get(ref)
        now = None if current is None else str(current.target)
        if now != base:
            raise TakeoverError(f"our branch {ref} moved during the takeover (to {now})")
        txn.set_target(ref, commit, message=message.splitlines()[0][:200])
    return str(commit)
