"""The route claims the broker reads from its state (`gavel.broker.routeowners`), in memory."""

from __future__ import annotations

from gavel.broker.ledger.state import State
from gavel.broker.routeowners import claims, refusal
from gavel.shared.messages import InstanceState
from gavel.shared.records import Deployment, InstanceRecord, ServiceRecord, ServiceVersion
from gavel.shared.spec import Route, Spec


def spec(name: str, *paths: str) -> Spec:
    return Spec(name=name, command=["x"], ports=["http"],
                routes=[Route(path=p, port="http") for p in paths])


def test_services_claim_their_version_and_the_one_they_roll_from_and_jobs_while_live() -> None:
    st = State(head="h1")
    st.services["web"] = ServiceRecord(
        name="web", version=2, deployment=Deployment(to_version=2, from_version=1),
        versions=[ServiceVersion(version=1, spec=spec("web", "/old")),
                  ServiceVersion(version=2, spec=spec("web", "/new"))])
    st.services["api"] = ServiceRecord(name="api", version=1, stopped=True, versions=[
        ServiceVersion(version=1, spec=spec("api", "/api"))])
    job = spec("job", "/job")
    for iid, state in (("job-2", InstanceState.QUEUED), ("job-1", InstanceState.QUEUED),
                       ("gone-1", InstanceState.CANCELLED)):
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=job if iid != "gone-1"
                                            else spec("gone", "/gone"), state=state))
    st.put_instance("web-1", InstanceRecord(instance_id="web-1", spec=spec("web", "/x"),
                                            service="web"))
    assert [(o, r.path) for o, r in claims(st)] == [
        ("api", "/api"), ("web", "/new"), ("web", "/old"), ("job", "/job")]
    assert "owned by 'web'" in refusal(st, spec("thief", "/old/x"))
    assert refusal(st, spec("free", "/gone")) == ""
    assert refusal(st, spec("web", "/old")) == ""


def test_claims_are_read_again_when_the_head_moves() -> None:
    st = State(head="h1")
    assert claims(st) == []
    st.put_instance("j-1", InstanceRecord(instance_id="j-1", spec=spec("j", "/j")))
    assert claims(st) == []  # the same head: the same claims (the state moves by commits)
    st.head = "h2"
    assert [o for o, _ in claims(st)] == ["j"]
