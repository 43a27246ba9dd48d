"""System jobs in memory (`gavel.shared.systems`): which nodes lack an instance, which
instances stop and why, in a fixed order; the spec's refusals naming the field."""

from __future__ import annotations

import re

import msgspec
import pytest

from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec
from gavel.shared.systems import Node, Placed, decide

EDGE = {"role": "edge"}


def nodes(**kw: Node) -> dict[str, Node]:
    return dict(kw)


def test_every_healthy_matching_node_without_an_instance_gets_one() -> None:
    fleet = nodes(c=Node(EDGE), a=Node(EDGE), b=Node({"role": "db"}),
                  d=Node(EDGE, healthy=False))  # unreachable: keeps what it has, gets none
    d = decide(EDGE, 1, fleet, [Placed("x-1", "a", 1)])
    assert d.start == ["c"] and d.stop == []


def test_a_drained_offline_or_relabelled_nodes_instance_stops_and_is_not_replaced() -> None:
    fleet = nodes(a=Node(EDGE, draining=True), b=Node(EDGE, offline=True, healthy=False),
                  c=Node({"role": "db"}), e=Node(EDGE))
    live = [Placed("x-a", "a", 1), Placed("x-b", "b", 1), Placed("x-c", "c", 1),
            Placed("x-gone", "gone", 1), Placed("x-e", "e", 1)]
    d = decide(EDGE, 1, fleet, live)
    assert d.start == []
    # x-gone's node is not known at all: kept until it is heard or goes offline (rule 3).
    assert d.stop == [(i, Reason.SYSTEM_NODE_LEFT) for i in ("x-a", "x-b", "x-c")]


def test_another_version_is_replaced_on_its_node_and_a_stopped_job_keeps_none() -> None:
    fleet = nodes(a=Node(EDGE))
    d = decide(EDGE, 2, fleet, [Placed("x-1", "a", 1)])
    assert d.stop == [("x-1", Reason.SUPERSEDED)] and d.start == ["a"]
    d = decide(EDGE, 2, fleet, [Placed("x-2", "a", 2)], stopped=True)
    assert d.stop == [("x-2", Reason.SERVICE_STOPPED)] and d.start == []


def test_two_on_one_node_keep_one() -> None:
    d = decide({}, 1, nodes(a=Node({})), [Placed("x-2", "a", 1), Placed("x-1", "a", 1)])
    assert d.stop == [("x-2", Reason.SCALED_DOWN)] and not d.start


@pytest.mark.parametrize(("fields", "words"), [
    ({"count": 3}, "count does not apply to a system job"),
    ({"count": 0}, "count does not apply to a system job"),
    ({"parallelism": 2}, "parallelism applies to a job's batch array (type = \"job\"), not "
                         "to a system"),
    ({"spread": "zone"}, "spread applies to a service's replicas"),
])
def test_bad_system_fields_are_refused_naming_the_field(fields: dict[str, object],
                                                        words: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(words)):
        msgspec.convert({"name": "x", "command": ["true"], "type": "system", **fields}, Spec)


def test_a_node_not_heard_since_the_broker_started_keeps_its_instance_and_gets_none() -> None:
    live = [Placed("x-a", "a", 1), Placed("x-b", "b", 1)]
    d = decide(EDGE, 1, nodes(b=Node(None), c=Node(None)), live)  # a: not even presumed
    assert not d
    d = decide(EDGE, 1, nodes(b=Node(None, offline=True, healthy=False)), live)
    assert d.stop == [("x-b", Reason.SYSTEM_NODE_LEFT)]


def test_a_node_the_back_off_holds_gets_no_instance_yet() -> None:
    d = decide(EDGE, 1, nodes(a=Node(EDGE), b=Node(EDGE)), [], hold={"a"})
    assert d.start == ["b"]


def test_a_new_version_rolls_max_parallel_nodes_at_a_time_gated_on_health() -> None:
    """Rule 6: with max_parallel 1 one node is between versions at a time; the next is
    replaced only once its new instance is settled (healthy); a node with no instance gets
    one at once; max_parallel 0 replaces every node together."""
    fleet = nodes(a=Node(EDGE), b=Node(EDGE), c=Node(EDGE), n=Node(EDGE))
    old = [Placed("x-a1", "a", 1), Placed("x-b1", "b", 1), Placed("x-c1", "c", 1)]
    d = decide(EDGE, 2, fleet, old, max_parallel=1)
    assert d.stop == [("x-a1", Reason.SUPERSEDED)] and d.start == ["a", "n"]
    rolling = [Placed("x-a2", "a", 2), *old[1:], Placed("x-n2", "n", 2)]
    assert not decide(EDGE, 2, fleet, rolling, max_parallel=1, settled={"x-n2"})
    d = decide(EDGE, 2, fleet, rolling, max_parallel=1, settled={"x-a2", "x-n2"})
    assert d.stop == [("x-b1", Reason.SUPERSEDED)] and d.start == ["b"]
    d = decide(EDGE, 2, fleet, rolling, max_parallel=2, settled={"x-n2"})
    assert d.stop == [("x-b1", Reason.SUPERSEDED)] and d.start == ["b"]
    d = decide(EDGE, 2, fleet, old, max_parallel=0)
    assert [i for i, _ in d.stop] == ["x-a1", "x-b1", "x-c1"] and d.start == ["a", "b", "c",
                                                                              "n"]


def test_an_old_instance_is_kept_where_its_replacement_cannot_start_yet() -> None:
    fleet = nodes(a=Node(EDGE, healthy=False), b=Node(EDGE))
    old = [Placed("x-a1", "a", 1), Placed("x-b1", "b", 1)]
    d = decide(EDGE, 2, fleet, old, max_parallel=1, hold={"b"})
    assert not d  # a: unreachable, b: backed off - both keep version 1 for now
    d = decide(EDGE, 2, fleet, old, max_parallel=1)
    assert d.stop == [("x-b1", Reason.SUPERSEDED)] and d.start == ["b"]


def test_the_cluster_cap_leaves_the_nodes_past_its_room_waiting_in_id_order() -> None:
    """Rule 7: with room for one more instance, of three nodes lacking one only the first by
    id gets it; the others are capped, not started, and none is stopped for it."""
    fleet = nodes(c=Node(EDGE), a=Node(EDGE), b=Node(EDGE), d=Node(EDGE))
    d = decide(EDGE, 1, fleet, [Placed("x-d", "d", 1)], room=1)
    assert d.start == ["a"] and d.capped == ["b", "c"] and d.stop == []
    full = decide(EDGE, 1, fleet, [Placed("x-d", "d", 1)], room=0)
    assert full.start == [] and full.capped == ["a", "b", "c"] and not full
    # No cap (None) and room enough leave nothing waiting.
    assert decide(EDGE, 1, fleet, [], room=None).start == ["a", "b", "c", "d"]
    roomy = decide(EDGE, 1, fleet, [], room=4)
    assert roomy.start == ["a", "b", "c", "d"] and roomy.capped == []


def test_a_node_whose_old_version_is_swapped_needs_no_room_at_the_cap() -> None:
    """Rule 7 with rule 6: a new version's instance replaces its node's own old one, so a
    full cluster still rolls; a node with no instance at all waits for room."""
    fleet = nodes(a=Node(EDGE), b=Node(EDGE))
    d = decide(EDGE, 2, fleet, [Placed("x-a", "a", 1)], room=0)
    assert d.stop == [("x-a", Reason.SUPERSEDED)] and d.start == ["a"]
    assert d.capped == ["b"]


def test_a_capped_node_gets_its_instance_once_room_appears() -> None:
    fleet = nodes(a=Node(EDGE), b=Node(EDGE))
    live = [Placed("x-a", "a", 1)]
    assert decide(EDGE, 1, fleet, live, room=0).capped == ["b"]
    later = decide(EDGE, 1, fleet, live, room=1)  # an instance elsewhere ended
    assert later.start == ["b"] and later.capped == []
