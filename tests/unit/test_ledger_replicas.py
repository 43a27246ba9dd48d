"""The state indexes each service's replicas, so the spread of a service's awards reads its
own replicas and never every instance: how many live replicas each node holds."""

from __future__ import annotations

from pathlib import Path

from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, State
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

SPEC = Spec(name="web", type="service", command=["true"])


def replica(iid: str, service: str = "web",
            state: InstanceState = InstanceState.QUEUED) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, spec=SPEC, service=service, state=state)


def node(nid: str, *iids: str) -> NodeFile:
    return NodeFile(node_id=nid, instances={i: Assignment(instance_id=i, auction_id="a")
                                            for i in iids})


def test_held_by_counts_live_placed_replicas_per_node() -> None:
    st = State()
    for rec in (replica("w1"), replica("w2"), replica("w3"), replica("w4"),
                replica("w5", state=InstanceState.FAILED), replica("o1", service="other"),
                InstanceRecord(instance_id="j1", spec=Spec(name="j", command=["true"]))):
        st.put_instance(rec.instance_id, rec)
    st.put_node("n1", node("n1", "w1", "w2", "o1", "j1"))
    st.put_node("n2", node("n2", "w3", "w5"))
    assert st.held_by("web") == {"n1": 2, "n2": 1}  # w4 waits, w5 ended
    assert st.held_by("other") == {"n1": 1}
    assert st.held_by("nothing") == {}
    assert sorted(r.instance_id for r in st.replicas_of("web")) == [
        "w1", "w2", "w3", "w4", "w5"]


def test_a_record_renamed_to_another_service_or_removed_counts_where_it_belongs() -> None:
    st = State()
    st.put_instance("w1", replica("w1"))
    st.put_instance("w2", replica("w2"))
    st.put_node("n1", node("n1", "w1", "w2"))
    st.put_instance("w1", replica("w1", service="api"))
    assert st.held_by("web") == {"n1": 1}
    assert st.held_by("api") == {"n1": 1}
    st.put_instance("w2", None)
    assert "web" not in st.replicas or not st.replicas_of("web")
    assert st.held_by("web") == {}


def test_a_full_read_of_the_repository_indexes_the_replicas(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    ledger.apply(Change(instances={"w1": replica("w1"), "w2": replica("w2")},
                        nodes={"n1": node("n1", "w1")}), "replicas", None)
    fresh = Ledger(tmp_path / "state.git").state()
    assert fresh.held_by("web") == {"n1": 1}
    assert sorted(fresh.replicas["web"]) == ["w1", "w2"]


def test_held_by_is_kept_until_a_record_or_a_node_file_changes() -> None:
    """Asked once per auction, counted once per change: every way a count can move is
    seen, and a caller that adds to the answer changes nothing kept."""
    st = State()
    for iid in ("w1", "w2", "w3"):
        st.put_instance(iid, replica(iid))
    st.put_node("n1", node("n1", "w1"))
    first = st.held_by("web")
    first["n9"] = 5  # the auctioneer adds awards in flight to its copy
    assert st.held_by("web") == {"n1": 1}
    st.put_node("n2", node("n2", "w2"))  # a placement
    assert st.held_by("web") == {"n1": 1, "n2": 1}
    st.put_instance("w1", replica("w1", state=InstanceState.FAILED))  # an end
    assert st.held_by("web") == {"n2": 1}
    st.put_node("n2", node("n2", "w2", "w3"))  # grown
    assert st.held_by("web") == {"n2": 2}
    st.put_node("n2", None)  # a node file gone
    assert st.held_by("web") == {}
