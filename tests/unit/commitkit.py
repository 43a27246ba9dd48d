"""A test's own effect, as a part defines one (`broker.effects` rule 3): `Then(fn)` calls
`fn(sha)` once its commit is durable, so a committer test observes when and in what order
the committer carries effects out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gavel.broker.ledger.committer import Committer

__all__ = ["Then", "heard"]


@dataclass(frozen=True)
class Then:
    fn: Callable[[str], None]


def heard(committer: Committer) -> Committer:
    """`committer`, carrying out `Then` effects."""
    committer.effects.on(Then, lambda e, sha: e.fn(sha))
    return committer
