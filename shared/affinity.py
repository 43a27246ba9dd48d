"""Soft affinities: a spec's preferences for nodes by label, never constraints.

Rules:
1. An affinity names a node label, a value and a weight in -100 .. 100 (not 0): a node whose
   label has that value is preferred (weight > 0) or avoided (weight < 0); a node without it
   is neither. Nothing is refused for an affinity: the work still goes where it fits.
2. They enter at the broker's award, never at the nodes: the nodes price the shape as they
   would without them (their strategies stay opaque and the RFB does not carry them), and
   the award ranks each bid at its load plus `adjustment` - the sum over the affinities its
   node matches of ``-weight / 100 * SCALE``. The ranking stays total and deterministic:
   the same bids, labels and affinities give the same winner.
3. `SCALE` is 1.0, a whole node: every built-in strategy's load lies in [0, 1], so weight
   100 makes a matching node win over every bid without it that is not itself preferred,
   weight 50 outweighs a difference of half a node's load, and so on. Negative effective
   loads are fine: only their order counts.
4. An affinity on a label no node carries is a warning at submit (`unmatched`), not an
   error: nodes come and go, and the preference does nothing until one carries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated

import msgspec

from gavel.shared.reasons import Reason

__all__ = ["SCALE", "Affinity", "adjustment", "unmatched", "warnings"]

#: What weight 100 is worth in load (rule 3).
SCALE = 1.0


class Affinity(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """``[[affinities]]`` in a spec: prefer (weight > 0) or avoid (weight < 0) nodes whose
    label `label` has the value `value`."""

    label: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    value: Annotated[str, msgspec.Meta(max_length=253)]
    weight: Annotated[int, msgspec.Meta(ge=-100, le=100)]

    def __post_init__(self) -> None:
        if self.weight == 0:
            raise ValueError(f"affinity on {self.label!r}: weight 0 prefers nothing; give "
                             "-100 .. 100 (negative avoids), not 0")
        if any(ord(c) < 32 or ord(c) == 127 for c in self.label + self.value):
            raise ValueError(f"affinity on {self.label!r} holds a control character: no "
                             "node's label can match it")


def adjustment(affinities: Sequence[Affinity], labels: Mapping[str, str]) -> float:
    """What the affinities add to the load of a bid from a node with `labels` (rule 2)."""
    total = 0
    for a in affinities:
        if labels.get(a.label) == a.value:
            total += a.weight
    return -total / 100 * SCALE


def unmatched(affinities: Sequence[Affinity],
              node_labels: Iterable[Mapping[str, str]]) -> list[Affinity]:
    """The affinities whose label no node in `node_labels` carries (rule 4)."""
    carried: set[str] = set()
    for labels in node_labels:
        carried.update(labels)
    return [a for a in affinities if a.label not in carried]


def warnings(affinities: Sequence[Affinity],
             node_labels: Iterable[Mapping[str, str]]) -> list[str]:
    """One sentence for each affinity no node carries the label of (rule 4)."""
    return [f"{Reason.AFFINITY_UNMATCHED}: {a.label} (affinity {a.label} = {a.value!r}, "
            f"weight {a.weight}, prefers nothing until a node carries it)"
            for a in unmatched(affinities, node_labels)]
