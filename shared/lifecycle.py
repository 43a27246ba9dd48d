"""Instance lifecycle: which state may follow which, applied by compare-and-swap.

Rules:
1. queued → scheduled → placed → provisioning → running → succeeded | failed | lost |
   cancelled; queued ⇄ unschedulable; a placed/provisioning/running instance may go back to
   queued (re-auction) or end in any terminal state.
2. Every transition names the state it expects to leave. If the record is no longer in that
   state the transition is refused (returns None) — a heartbeat expiring at the same instant
   a late event arrives is a rejected transition, not corruption.
3. Terminal states are final.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from gavel.shared.messages import InstanceState as S
from gavel.shared.records import InstanceRecord

__all__ = ["ALLOWED", "LIVE", "PENDING", "transition"]

PENDING = frozenset({S.QUEUED, S.UNSCHEDULABLE})
LIVE = frozenset({S.SCHEDULED, S.PLACED, S.PROVISIONING, S.RUNNING})
_ENDS = frozenset({S.SUCCEEDED, S.FAILED, S.LOST, S.CANCELLED})

ALLOWED: dict[S, frozenset[S]] = {
    S.QUEUED: frozenset({S.UNSCHEDULABLE, S.SCHEDULED, S.PLACED, S.CANCELLED, S.FAILED}),
    S.UNSCHEDULABLE: frozenset({S.QUEUED, S.SCHEDULED, S.PLACED, S.CANCELLED, S.FAILED}),
    S.SCHEDULED: frozenset({S.PLACED, S.QUEUED}) | _ENDS,
    S.PLACED: frozenset({S.PROVISIONING, S.RUNNING, S.QUEUED}) | _ENDS,
    S.PROVISIONING: frozenset({S.RUNNING, S.QUEUED}) | _ENDS,
    S.RUNNING: frozenset({S.QUEUED}) | _ENDS,
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.LOST: frozenset(),
    S.CANCELLED: frozenset(),
}


def transition(
    record: InstanceRecord,
    expected: S | Collection[S],
    to: S,
    **changes: object,
) -> InstanceRecord | None:
    """A new record in state `to`, or None if `record` is not in `expected` or `to` is not
    allowed from its state. The input record is never mutated."""
    allowed_from = {expected} if isinstance(expected, S) else set(expected)
    if record.state not in allowed_from or to not in ALLOWED[record.state]:
        return None
    return msgspec.structs.replace(record, state=to, **changes)
