"""A restarted broker finds placements in git: they are not fresh awards. A node that is quiet
for less than `offline_s` keeps its instances, restart or not (found by `bench.chaos`: a
broker restarted while a worker was down for 4 s revoked everything that worker ran)."""

from __future__ import annotations

from gavel.broker.ledger.state import State
from gavel.broker.watchdog import Action, Kind, Timers, due
from gavel.shared.health import Liveness
from gavel.shared.messages import Heartbeat, Spec
from gavel.shared.records import Assignment, InstanceRecord, NodeFile
from gavel.shared.timing import Timing

T = Timing()


def state_with(placements: dict[str, str]) -> State:
    st = State(head="0" * 40)
    for iid in placements:
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=Spec(name="s",
                                                                       command=["true"])))
    for node in sorted(set(placements.values())):
        st.put_node(node, NodeFile(node_id=node, instances={
            iid: Assignment(instance_id=iid, auction_id="a") for iid, n in placements.items()
            if n == node}))
    return st


def restarted(st: State) -> tuple[Timers, Liveness]:
    timers, live = Timers(started=0.0), Liveness(T)
    for node in st.nodes:
        live.presume(node, 0.0)
    timers.resume(st, T)
    return timers, live


def test_a_quiet_node_keeps_its_instances_across_a_broker_restart() -> None:
    st = state_with({"i1": "a", "i2": "a"})
    timers, live = restarted(st)
    quiet = T.unreachable_s + T.provisioning_s  # unreachable, far from offline
    assert due(st, live, timers, T, quiet) == []
    assert due(st, live, timers, T, T.offline_s + 1) == [Action(Kind.EXPIRE, "i1", "a"),
                                                          Action(Kind.EXPIRE, "i2", "a")]


def test_the_provisioning_clock_starts_at_the_nodes_first_heartbeat() -> None:
    st = state_with({"held": "a", "missing": "a"})
    timers, live = restarted(st)
    back = T.unreachable_s
    live.record(Heartbeat(node_id="a"), back)
    timers.heard("a", {"held"}, back)
    assert due(st, live, timers, T, back + T.provisioning_s / 2) == []
    assert due(st, live, timers, T, back + T.provisioning_s) == [
        Action(Kind.REVOKE, "missing", "a")]
    timers.heard("a", set(), back + 1)  # only the first heartbeat after the restart counts
    assert list(timers.awaiting) == ["missing"]


def test_a_resumed_instance_placed_again_keeps_its_new_clock() -> None:
    st = state_with({"i": "a"})
    timers, _live = restarted(st)
    timers.placed("i", "b", 5.0, T, None)  # expired off a, re-placed on b
    timers.heard("a", set(), 6.0)  # a comes back without it
    assert timers.awaiting == {"i": ("b", 5.0)}
    assert timers.resumed == {} and timers.resumed_on == {}
