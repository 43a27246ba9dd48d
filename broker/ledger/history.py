"""The branch's history: its commits newest first, and the auction records their messages
carry (`shared.records.parse_trailers`).

Rules:
1. The history is the commits reachable from the head in topological order, newest first,
   as far back as a caller's limit: every read here is bounded.
2. The newest recorded auction of an instance names its winner (`winners`): one walk of the
   history for all the instances asked about, stopping once each has one.
3. A commit is ours, landed, when the branch holds it - at the head or under what others
   put on top since, following first parents (a merge of a push puts ours first) at most
   `LANDED_DEPTH` commits down - on top of the commit it was planned on, with its message,
   by the broker (`landed_at`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec
import pygit2

from gavel.broker.ledger.cascommit import AUTHOR_EMAIL
from gavel.shared.records import AuctionRecord, parse_trailers

__all__ = ["LANDED_DEPTH", "auctions", "landed_at", "walk", "winners"]

#: How many commits others may have put on top of ours before `landed_at` looks (a merge of
#: a push, a hand commit): it walks no further back.
LANDED_DEPTH = 64


def walk(repo: pygit2.Repository, head: str | None, limit: int | None = None
         ) -> Iterator[pygit2.Commit]:
    """The commits from `head` back, newest first, at most `limit` of them (rule 1)."""
    if head is None:
        return
    for n, commit in enumerate(repo.walk(pygit2.Oid(hex=head),
                                         pygit2.enums.SortMode.TOPOLOGICAL)):
        if limit is not None and n >= limit:
            return
        yield commit


def winners(commits: Iterable[pygit2.Commit], iids: Iterable[str]) -> dict[str, str]:
    """The winner the newest recorded auction of each instance names (rule 2; those without
    a recorded winner are left out)."""
    wanted = set(iids)
    out: dict[str, str] = {}
    for commit in commits:
        message = commit.message
        if not any(iid in message for iid in wanted):
            continue
        for r in parse_trailers(message):
            if r.instance_id in wanted and r.winner:
                out.setdefault(r.instance_id, r.winner)
                wanted.discard(r.instance_id)
        if not wanted:
            break
    return out


def auctions(commits: Iterable[pygit2.Commit], instance_id: str) -> list[AuctionRecord]:
    """Every auction for the instance the commits record, in their order."""
    out: list[AuctionRecord] = []
    for commit in commits:
        if instance_id not in commit.message:
            continue
        out.extend(msgspec.structs.replace(r, at=float(commit.commit_time))
                   for r in parse_trailers(commit.message) if r.instance_id == instance_id)
    return out


def landed_at(repo: pygit2.Repository, head: str | None, planned_on: str | None,
              message: str) -> str | None:
    """The commit a write planned on `planned_on` with `message` made, if the branch at
    `head` holds it (rule 3), or None."""
    sha = head
    want = message.encode()
    for _ in range(LANDED_DEPTH):  # first parents: a merge puts ours first
        if sha is None or sha == planned_on:
            return None
        commit = repo[sha].peel(pygit2.Commit)
        parents = [str(p) for p in commit.parent_ids]
        if parents[:1] == ([planned_on] if planned_on else []) \
                and commit.raw_message == want and commit.author.email == AUTHOR_EMAIL:
            return sha
        sha = parents[0] if parents else None
    return None
