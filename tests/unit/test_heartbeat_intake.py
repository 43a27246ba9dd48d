"""Heartbeats in: a heartbeat larger than its node could send is refused by its length,
before it is decoded; one that decodes but lists more instances than the node could hold
is refused next; a node with many placements may list them all, and still may while it
stops them after git moved them away; forged node ids cost no memory; and a heartbeat
older than an event the broker heard says nothing of health.

A real `Broker` on a real git repository, its heartbeat handler fed directly (no NATS)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gavel.broker.heartbeats import TOO_LARGE, TOO_MANY
from gavel.broker.ledger.plan import View, place, requeue, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.bounds import FIXED_BYTES, SPARE_INSTANCES
from gavel.shared.messages import Capacity, Event, Heartbeat, InstanceReport, Request, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.timing import Timing
from tests.unit.fuzzkit import Msg

_enc = msgspec.msgpack.Encoder()
SPEC = Spec(name="web", command=["true"], cpu=0.01, memory_mb=1, ports=["http"])


def broker(root: Path) -> Broker:
    return Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing()))


def beat(b: Broker, node: str, data: bytes) -> None:
    b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=node), data))


def heartbeat(node: str, ids: list[str]) -> bytes:
    return _enc.encode(Heartbeat(
        node_id=node, strategy="least-loaded", capacity=Capacity(cpu=64, memory_mb=65536,
                                                                 ports=1000),
        port_range=[20000, 20999],
        instances=[InstanceReport(instance_id=i, state="running", pid=4242, attempt=1,
                                  ports={"http": 20000 + k}) for k, i in enumerate(ids)]))


def place_many(b: Broker, node: str, n: int) -> list[str]:
    view = View(b.ledger.state())
    ids = [f"web-{k:04d}" for k in range(n)]
    for iid in ids:
        submit(view, InstanceRecord(instance_id=iid, spec=SPEC))
        won = Awarded(request=Request.of(iid, SPEC), winner=NodeBid(
            node_id=node, load=0.1, strategy="least-loaded"), tie_broken=False, bids=[],
            declines=[], silent=[])
        assert place(view, won, "auction-0", [20000, 29999]) is not None
    b.ledger.apply(view.change, "place", b.ledger.state().head)
    return ids


def test_a_heartbeat_too_large_for_its_node_is_refused_before_it_is_decoded(
        tmp_path: Path) -> None:
    b = broker(tmp_path)
    # Not msgpack at all: decoded, it would count as malformed. Counted by its size instead.
    beat(b, "n1", b"\xc1" * (b.heartbeats.bound("n1").size + 1))
    assert b.rejects.counts == {TOO_LARGE: 1}
    beat(b, "n1", b"\xc1" * 100)  # small garbage is decoded, and malformed
    assert b.rejects.counts == {TOO_LARGE: 1, "malformed heartbeat": 1}
    assert b.liveness.known() == []


def test_a_heartbeat_listing_more_than_its_node_could_hold_is_refused(tmp_path: Path) -> None:
    b = broker(tmp_path)
    many = heartbeat("n1", [f"i{k}" for k in range(SPARE_INSTANCES + 1)])
    assert len(many) < FIXED_BYTES  # small enough in bytes: refused by its count
    beat(b, "n1", many)
    assert b.rejects.counts == {TOO_MANY: 1}
    beat(b, "n1", heartbeat("n1", [f"i{k}" for k in range(SPARE_INSTANCES)]))
    assert b.rejects.counts == {TOO_MANY: 1}
    assert b.liveness.known() == ["n1"]


def test_a_node_lists_all_it_holds_even_after_git_moved_it_away(tmp_path: Path) -> None:
    b = broker(tmp_path)
    ids = place_many(b, "n1", 1500)
    everything = heartbeat("n1", ids)
    empty = b.heartbeats.bound("nobody")  # more than a node with nothing could send
    assert len(everything) > empty.size and len(ids) > empty.instances
    beat(b, "n1", everything)
    assert b.rejects.counts == {}
    view = View(b.ledger.state())  # git moves every one of them away...
    for iid in ids:
        assert requeue(view, iid, "n1", Reason.MIGRATED, free=True) is not None
    b.ledger.apply(view.change, "move", b.ledger.state().head)
    assert "n1" not in b.ledger.state().where.values()
    beat(b, "n1", everything)  # ... and the node, still stopping them, may say so
    assert b.rejects.counts == {}
    beat(b, "n1", heartbeat("n1", [*ids, *ids, *[f"x{k}" for k in range(SPARE_INSTANCES + 1)]]))
    assert set(b.rejects.counts) <= {TOO_LARGE, TOO_MANY} and b.rejects.counts


def test_forged_node_ids_take_no_memory(tmp_path: Path) -> None:
    b = broker(tmp_path)
    for k in range(1000):
        beat(b, f"forged-{k}", b"\xc1" * 10)
    assert b.heartbeats._most == {}


def test_a_heartbeat_older_than_an_event_heard_says_nothing_of_health(tmp_path: Path) -> None:
    """Heartbeats come through the stream, events straight: a heartbeat the node took
    before its last event can arrive after it, and must not undo what the event said."""
    b = broker(tmp_path)
    (iid,) = place_many(b, "n1", 1)

    def beat_saying(health: str, seq: int, reported: int) -> None:
        beat(b, "n1", _enc.encode(Heartbeat(
            node_id="n1", seq=seq, reported=reported, capacity=Capacity(cpu=4, memory_mb=64),
            instances=[InstanceReport(instance_id=iid, state="running", health=health)])))

    def event(type_: str, seq: int) -> None:
        b.promises.on_report(Msg(subjects.REPORT.format(node="n1"), _enc.encode(Event(
            instance_id=iid, type=type_, node_id="n1", attempt=1, seq=seq))))

    beat_saying("checking", seq=1, reported=0)
    event("running", seq=1)
    event("healthy", seq=2)
    beat_saying("checking", seq=2, reported=1)  # taken between the two events: stale
    assert b.promises.health[iid].health == "healthy"
    beat_saying("unhealthy", seq=3, reported=2)  # taken after both: the node's word
    assert b.promises.health[iid].health == "unhealthy"
    # The agent started again: it counts its events anew, and its heartbeats count again.
    beat_saying("healthy", seq=1, reported=0)
    assert b.promises.health[iid].health == "healthy"
    assert b.rejects.counts == {}


def test_a_node_that_stops_draining_makes_waiting_work_due_at_once(tmp_path: Path) -> None:
    """Rule 3: a node that takes work again is room that may have come, as a node that comes
    up is: what waits unschedulable (backed off, `shared.auctioneer` rule 7) is asked at
    the next pass, not after its wait."""
    b = broker(tmp_path)
    hb = msgspec.msgpack.decode(heartbeat("n1", []), type=Heartbeat)
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=1, draining=True)))
    core = b.auctioneer.core
    core.unschedulable("waiting", b.now())
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=2, draining=True)))
    assert "waiting" in core.retry_at  # still draining: nothing changed
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=3, draining=False)))
    assert core.retry_at == {}


@pytest.mark.parametrize("change", ["labels", "capacity"])
def test_a_node_with_new_labels_or_capacity_makes_waiting_work_due_at_once(
        tmp_path: Path, change: str) -> None:
    """Rule 3: new labels or a new capacity may make waiting work placeable there."""
    b = broker(tmp_path)
    hb = msgspec.msgpack.decode(heartbeat("n1", []), type=Heartbeat)
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=1)))
    core = b.auctioneer.core
    core.unschedulable("waiting", b.now())
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=2)))
    assert "waiting" in core.retry_at  # the same node: nothing changed
    new = {"labels": {"zone": "b"}} if change == "labels" else {
        "capacity": msgspec.structs.replace(hb.capacity, cpu=hb.capacity.cpu + 4)}
    beat(b, "n1", _enc.encode(msgspec.structs.replace(hb, seq=3, **new)))
    assert core.retry_at == {}
