"""A placement the tree disputes, as a value: which node the broker keeps an instance on, by
which rule (`Keep`), and which node files its correction rewrites (`broker.ledger.integrity`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gavel.shared.records import node_path

__all__ = ["Dispute", "Keep"]


class Keep(StrEnum):
    """Which rule chose the placement a dispute keeps (`broker.ledger.integrity`)."""

    HISTORY = "the broker's own placement"
    NOWHERE = "the broker placed it on no node"
    NO_RECORD = "its record is gone from instances/"
    AUCTION = "the winner of its newest recorded auction"
    ATTEMPT = "the highest attempt"
    NODE_ID = "the lowest node id"


@dataclass(frozen=True)
class Dispute:
    """An instance the tree listed where the broker had not placed it, and its correction:
    `kept` ("" for no node) by `rule`; `held`: the nodes whose node.json in the tree listed
    it; `dropped`: those it is taken out of; `restored`: the node whose entry is put back as
    the broker had it ("" for none)."""

    instance_id: str
    kept: str
    rule: Keep
    held: tuple[str, ...]
    dropped: tuple[str, ...]
    restored: str = ""

    @property
    def rewrite(self) -> tuple[str, ...]:
        """The nodes whose node.json the correction writes (as the State holds them)."""
        return tuple(sorted({*self.dropped, *([self.restored] if self.restored else [])}))

    def sentence(self) -> str:
        """One line for the log and the correction's commit message, naming every node file
        involved and the instance."""
        listed = " and ".join(node_path(n) for n in self.held) or "no node file"
        where = f"on {self.kept}" if self.kept else "on no node"
        out = f"{self.instance_id} was listed in {listed}: kept {where} ({self.rule})"
        if self.dropped:
            out += f", taken out of {' and '.join(node_path(n) for n in self.dropped)}"
        if self.restored:
            out += f", put back in {node_path(self.restored)} as the broker had it"
        return out
