"""Instance lifecycle: allowed transitions, compare-and-swap on the expected state."""

from __future__ import annotations

import pytest

from gavel.shared.lifecycle import ALLOWED, LIVE, PENDING, transition
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord

SPEC = Spec(name="web", command=["run"])
ENDS = {s for s in S if s.terminal}


def rec(state: S) -> InstanceRecord:
    return InstanceRecord(instance_id="i-1", spec=SPEC, state=state)


def test_happy_path() -> None:
    r = rec(S.QUEUED)
    for to in (S.SCHEDULED, S.PLACED, S.PROVISIONING, S.RUNNING, S.SUCCEEDED):
        nxt = transition(r, r.state, to)
        assert nxt is not None, (r.state, to)
        assert nxt.state is to
        r = nxt


def test_transition_applies_changes_and_never_mutates_the_input() -> None:
    before = rec(S.SCHEDULED)
    after = transition(before, S.SCHEDULED, S.PLACED, node_id="n1", attempt=1)
    assert after is not None
    assert (after.state, after.node_id, after.attempt) == (S.PLACED, "n1", 1)
    assert (before.state, before.node_id, before.attempt) == (S.SCHEDULED, "", 0)


def test_unexpected_current_state_is_refused() -> None:
    # A heartbeat expiry and a late event racing: the loser's expectation is stale.
    assert transition(rec(S.RUNNING), S.PROVISIONING, S.LOST) is None
    assert transition(rec(S.RUNNING), {S.PLACED, S.PROVISIONING}, S.LOST) is None
    assert transition(rec(S.RUNNING), {S.PROVISIONING, S.RUNNING}, S.LOST) is not None


def test_disallowed_target_is_refused_even_when_expected() -> None:
    assert transition(rec(S.QUEUED), S.QUEUED, S.RUNNING) is None
    assert transition(rec(S.UNSCHEDULABLE), S.UNSCHEDULABLE, S.PROVISIONING) is None


@pytest.mark.parametrize("end", sorted(ENDS))
def test_terminal_states_are_final(end: S) -> None:
    assert ALLOWED[end] == frozenset()
    for to in S:
        assert transition(rec(end), end, to) is None


def test_rules_in_the_module_docstring_hold() -> None:
    assert set(ALLOWED) == set(S)
    assert S.UNSCHEDULABLE in ALLOWED[S.QUEUED] and S.QUEUED in ALLOWED[S.UNSCHEDULABLE]
    for live in LIVE:
        assert S.QUEUED in ALLOWED[live], live  # re-auction
        assert ALLOWED[live] >= ENDS, live
    assert set(S) == PENDING | LIVE | ENDS
    assert not PENDING & LIVE
