"""The broker's move plan (`broker.reauction.plan_move`) as a pure function: a `View` of an
in-memory `State` in, the change, its line, its trailer and its effect out."""

from __future__ import annotations

from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.broker.reauction import Moved, plan_move
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Request, Spec
from gavel.shared.reauction import Judgement, Outcome
from gavel.shared.records import Assignment, InstanceRecord, NodeFile, parse_trailers

SPEC = Spec(name="web", type="service", command=["true"], cpu=0.5, memory_mb=64)
REQ = Request.of("web-1", SPEC, group="web")
DECISION = Awarded(request=REQ, winner=NodeBid(node_id="n2", load=0.1), tie_broken=False,
                   bids=[NodeBid(node_id="n2", load=0.1), NodeBid(node_id="n1", load=0.6)],
                   declines=[], silent=[])
VERDICT = Judgement(Outcome.SPREAD, "n2", 0.1, 0.6)


def _view(**rec: object) -> View:
    st = State(head="h")
    st.put_instance("web-1", InstanceRecord(instance_id="web-1", spec=SPEC, service="web",
                                            version=3, state=S.RUNNING, attempt=1,
                                            **rec))  # type: ignore[arg-type]
    st.put_node("n1", NodeFile(node_id="n1", instances={"web-1": Assignment(
        instance_id="web-1", auction_id="a", attempt=1, cpu=0.5, memory_mb=64)}))
    return View(st, Change())


def _move(view: View) -> object:
    return plan_move(view, old="web-1", holder="n1", new="web-2", decision=DECISION,
                     auction_id="re-1", port_range=[], judgement=VERDICT)


def test_a_move_places_a_copy_of_the_same_version_on_the_winner_and_says_why() -> None:
    view = _view()
    planned = _move(view)
    assert planned is not None
    copy = view.change.instances["web-2"]
    assert copy is not None and (copy.service, copy.version, copy.spec) == ("web", 3, SPEC)
    assert view.placed_on("web-2") == "n2" and view.placed_on("web-1") == "n1"
    assert planned.effects == [Moved(old="web-1", new="web-2", holder="n1", winner="n2")]
    assert planned.lines == [f"service web: re-auction moves web-1 from n1 to n2 as web-2: "
                             f"{VERDICT.sentence('n1')}"]
    [record] = parse_trailers("\n".join(planned.trailers))
    assert (record.instance_id, record.winner) == ("web-2", "n2")
    assert [b.node_id for b in record.bids] == ["n2", "n1"]  # the keep-bid is in it
    assert str(Outcome.SPREAD) in record.summary


def test_no_move_when_the_replica_no_longer_runs_on_its_holder() -> None:
    assert _move(_view(cancelling=True)) is None
    moved = _view()
    moved.state.put_node("n1", None)
    assert _move(moved) is None
