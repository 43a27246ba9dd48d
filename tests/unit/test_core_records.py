"""Auction records ride in commit messages as one trailer line each, and come back intact.

A batch auction is one `BatchRecord` line (bids per shape, an outcome per instance); reading
it back expands it to one `AuctionRecord` per instance, as the first releases wrote them.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import (
    Bid,
    BidReply,
    Capacity,
    Decline,
    InstanceState,
    Request,
    Shape,
    Spec,
)
from gavel.shared.records import (
    TRAILER,
    Assignment,
    AuctionRecord,
    BatchRecord,
    InstanceRecord,
    NodeFile,
    Outcome,
    ShapeRecord,
    auction_trailer,
    parse_trailers,
)

RECORD = AuctionRecord(
    auction_id="a-1", instance_id="i-1", winner="n2", load=0.25, tie_broken=True,
    bids=[NodeBid(node_id="n1", load=0.25, strategy="binpack"),
          NodeBid(node_id="n2", load=0.25, strategy="binpack")],
    declines=[NodeDecline(node_id="n3", reason="missing label", detail="region=eu")],
    silent=["n4"],
)


def test_trailer_is_one_line_with_the_prefix() -> None:
    line = auction_trailer(RECORD)
    assert line.startswith("Gavel-Auction: ")
    assert "\n" not in line


def test_commit_message_round_trip_keeps_order_and_ignores_other_lines() -> None:
    other = AuctionRecord(auction_id="a-1", instance_id="i-2", reason="all nodes full",
                          summary="0/3 nodes bid: 3 no free ports")
    message = "\n".join([
        "place i-1 on n2, i-2 unschedulable",
        "",
        "Gavel-Auction is the trailer below; this line only mentions it.",
        "",
        auction_trailer(RECORD),
        "Signed-off-by: broker <broker@gavel>",
        auction_trailer(other),
        "",
    ])
    assert parse_trailers(message) == [RECORD, other]
    assert parse_trailers("just a subject\n\nand a body") == []


def test_crlf_commit_messages_parse() -> None:
    message = "subject\r\n\r\n" + auction_trailer(RECORD) + "\r\n"
    assert parse_trailers(message) == [RECORD]


def test_a_decided_auction_records_round_trip() -> None:
    auction = Auction("a-7", [Request(instance_id="i-1", cpu=1.0, memory_mb=64)],
                      ["n1", "n2", "n3"], opened_at=0.0, deadline_s=1.0)
    auction.receive(BidReply(auction_id="a-7", node_id="n1",
                             answers=[Bid(shape=0, load=0.5)]), 0.1)
    auction.receive(BidReply(auction_id="a-7", node_id="n2",
                             answers=[Decline(shape=0, reason="draining")]), 0.1)
    [d] = auction.decide(1.0)
    assert isinstance(d, Awarded)
    record = AuctionRecord(auction_id="a-7", instance_id="i-1", winner=d.winner.node_id,
                           load=d.winner.load, tie_broken=d.tie_broken, bids=list(d.bids),
                           declines=list(d.declines), silent=list(d.silent))
    [back] = parse_trailers("award\n\n" + auction_trailer(record))
    assert back == record
    assert (back.winner, back.silent) == ("n1", ["n3"])


# -- batch records: one line per auction -------------------------------------------------


SMALL = Shape(cpu=0.5, memory_mb=64)
BIG = Shape(cpu=2.0, memory_mb=512, labels={"region": "eu"})
BATCH = BatchRecord(
    auction_id="a-9",
    shapes=[ShapeRecord(shape=SMALL,
                        bids=[NodeBid(node_id="n1", load=0.25, strategy="spread"),
                              NodeBid(node_id="n2", load=0.25, strategy="spread")],
                        declines=[NodeDecline(node_id="n3", reason="draining")],
                        silent=["n4"]),
            ShapeRecord(shape=BIG,
                        declines=[NodeDecline(node_id="n1", reason="missing label",
                                              detail="region=eu")],
                        silent=["n2", "n3", "n4"])],
    outcomes=[Outcome(instance_id="i-1", shape=0, winner="n1", load=0.25, tie_broken=True),
              Outcome(instance_id="i-2", shape=1, reason="missing label",
                      summary="0/4 nodes bid: 3 no answer before the deadline, "
                              "1 missing label region=eu"),
              Outcome(instance_id="i-3", shape=0, winner="n2", load=0.25, tie_broken=True)],
)


def test_a_batch_record_expands_to_one_record_per_instance_in_order() -> None:
    small, big = BATCH.shapes
    assert BATCH.expand() == [
        AuctionRecord(auction_id="a-9", instance_id="i-1", winner="n1", load=0.25,
                      tie_broken=True, bids=small.bids, declines=small.declines,
                      silent=small.silent),
        AuctionRecord(auction_id="a-9", instance_id="i-2", declines=big.declines,
                      silent=big.silent, reason="missing label",
                      summary=BATCH.outcomes[1].summary),
        AuctionRecord(auction_id="a-9", instance_id="i-3", winner="n2", load=0.25,
                      tie_broken=True, bids=small.bids, declines=small.declines,
                      silent=small.silent),
    ]


def test_a_batch_is_one_trailer_line_and_round_trips() -> None:
    line = auction_trailer(BATCH)
    assert line.startswith(TRAILER) and "\n" not in line
    assert msgspec.json.decode(line[len(TRAILER):], type=BatchRecord) == BATCH
    assert parse_trailers("place 2 of 3\n\n" + line + "\n") == BATCH.expand()


def test_old_and_batch_trailers_mix_in_one_message_in_order() -> None:
    message = "\n".join(["subject", "", auction_trailer(RECORD), auction_trailer(BATCH),
                         auction_trailer(RECORD)])
    assert parse_trailers(message) == [RECORD, *BATCH.expand(), RECORD]


def _batch_of(auction: Auction, decisions: list[Decision]) -> BatchRecord:
    """As the broker writes it: each shape's answers from its last decision (whose declines
    include every node that ran out of room during the batch), an outcome per instance."""
    last = {s: d for d, s in zip(decisions, auction.shape_of, strict=True)}
    outcomes = [
        Outcome(instance_id=d.request.instance_id, shape=s, winner=d.winner.node_id,
                load=d.winner.load, tie_broken=d.tie_broken) if isinstance(d, Awarded)
        else Outcome(instance_id=d.request.instance_id, shape=s, reason=d.reason,
                     summary=d.summary)
        for d, s in zip(decisions, auction.shape_of, strict=True)]
    shapes = [ShapeRecord(shape=shape, bids=list(last[i].bids), declines=list(last[i].declines),
                          silent=list(last[i].silent)) for i, shape in enumerate(auction.shapes)]
    return BatchRecord(auction_id=auction.auction_id, shapes=shapes, outcomes=outcomes)


def test_a_decided_batch_round_trips_through_one_trailer() -> None:
    requests = [Request(instance_id=f"i-{k}", cpu=1.0, memory_mb=64) for k in range(3)]
    requests.append(Request(instance_id="i-big", cpu=4.0, memory_mb=64))
    auction = Auction("a-8", requests, ["n1", "n2", "n3"], opened_at=0.0, deadline_s=1.0)
    auction.receive(BidReply(auction_id="a-8", node_id="n1", answers=[
        Bid(shape=0, load=0.25, step=0.25, strategy="spread"),
        Decline(shape=1, reason="no room for cpu", detail="4")]), 0.1)
    auction.receive(BidReply(auction_id="a-8", node_id="n2", answers=[
        Bid(shape=0, load=0.5, step=0.25, strategy="spread"),
        Bid(shape=1, load=0.5, strategy="spread")]), 0.1)
    free = {"n1": Capacity(cpu=8.0, memory_mb=1024, ports=4),
            "n2": Capacity(cpu=3.0, memory_mb=1024, ports=4)}
    decisions = auction.decide(1.0, free=free)
    winners = [d.winner.node_id if isinstance(d, Awarded) else None for d in decisions]
    assert winners == ["n1", "n1", "n2", None]  # n2 then had 2 cpu left: no room for 4
    assert isinstance(decisions[-1], Unschedulable)
    record = _batch_of(auction, decisions)
    body = auction_trailer(record).removeprefix(TRAILER)
    assert msgspec.json.decode(body, type=BatchRecord) == record
    expanded = parse_trailers("award\n\n" + auction_trailer(record))
    assert [r.instance_id for r in expanded] == [r.instance_id for r in requests]
    assert [(r.winner, r.load, r.tie_broken) for r in expanded] == [
        ("n1", 0.25, False), ("n1", 0.5, True), ("n2", 0.5, False), ("", None, False)]
    big = expanded[-1]
    assert (big.reason, big.summary) == (decisions[-1].reason, decisions[-1].summary)
    assert big.declines == [NodeDecline(node_id="n1", reason="no room for cpu", detail="4"),
                            NodeDecline(node_id="n2", reason="no room for cpu", detail="4")]
    assert big.silent == ["n3"]
    # Instances of one shape share its bids, as received (not the effective loads).
    assert expanded[0].bids == expanded[2].bids == [
        NodeBid(node_id="n1", load=0.25, strategy="spread"),
        NodeBid(node_id="n2", load=0.5, strategy="spread")]


# Workers choose node ids and decline details; any text they send must survive the trailer,
# including characters Python's str.splitlines() treats as line breaks (U+2028, U+0085, ...).
texts = st.text(max_size=20) | st.sampled_from(['"outcomes":', '{"outcomes": []}', "outcomes"])
node_bids = st.builds(NodeBid, node_id=texts,
                      load=st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
                      strategy=texts)
node_declines = st.builds(NodeDecline, node_id=texts, reason=texts, detail=texts)
records = st.builds(
    AuctionRecord,
    auction_id=texts, instance_id=texts, winner=texts,
    load=st.none() | st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    tie_broken=st.booleans(),
    bids=st.lists(node_bids, max_size=4),
    declines=st.lists(node_declines, max_size=4),
    silent=st.lists(texts, max_size=4),
    reason=texts, summary=texts,
)


@given(st.lists(records, max_size=3), texts)
def test_any_record_round_trips_through_a_commit_message(batch: list[AuctionRecord],
                                                          subject: str) -> None:
    subject = subject.replace("\n", " ").replace("\r", " ")
    if subject.startswith(TRAILER):
        subject = "x" + subject
    message = subject + "\n\n" + "\n".join(auction_trailer(r) for r in batch)
    assert parse_trailers(message) == batch


shape_records = st.builds(
    ShapeRecord,
    shape=st.builds(Shape, cpu=st.floats(0.0, 64.0), memory_mb=st.integers(0, 2**20),
                    ports=st.integers(0, 64), labels=st.dictionaries(texts, texts, max_size=2)),
    bids=st.lists(node_bids, max_size=3),
    declines=st.lists(node_declines, max_size=3),
    silent=st.lists(texts, max_size=3),
)


@st.composite
def batch_records(draw: st.DrawFn) -> BatchRecord:
    shapes = draw(st.lists(shape_records, min_size=1, max_size=3))
    outcomes = draw(st.lists(st.builds(
        Outcome, instance_id=texts, shape=st.integers(0, len(shapes) - 1), winner=texts,
        load=st.none() | st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
        tie_broken=st.booleans(), reason=texts, summary=texts), max_size=4))
    return BatchRecord(auction_id=draw(texts), shapes=shapes, outcomes=outcomes)


@given(st.lists(records | batch_records(), max_size=3))
def test_any_mix_of_records_round_trips_through_a_commit_message(
        batch: list[AuctionRecord | BatchRecord]) -> None:
    """Old per-instance lines and batch lines alike, whatever text they carry (a detail that
    spells `"outcomes":` must not make an old line read as a batch)."""
    message = "subject\n\n" + "\n".join(auction_trailer(r) for r in batch)
    expected: list[AuctionRecord] = []
    for r in batch:
        expected.extend(r.expand() if isinstance(r, BatchRecord) else [r])
    assert parse_trailers(message) == expected


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c"])
def test_unicode_line_separators_in_details_do_not_break_the_trailer(separator: str) -> None:
    record = AuctionRecord(auction_id="a-1", instance_id="i-1",
                           declines=[NodeDecline(node_id="n1", reason="draining",
                                                 detail=f"before{separator}after")])
    assert parse_trailers("subject\n\n" + auction_trailer(record)) == [record]


def test_state_files_round_trip_as_json() -> None:
    spec = Spec(name="web", command=["run"], secrets=["token"])
    node_file = NodeFile(node_id="n1", instances={
        "i-1": Assignment(instance_id="i-1", auction_id="a-1", attempt=2, cpu=spec.cpu,
                          memory_mb=spec.memory_mb, ports={"http": 8080}),
    })
    assert msgspec.json.decode(msgspec.json.encode(node_file), type=NodeFile) == node_file
    rec = InstanceRecord(instance_id="i-1", spec=spec, state=InstanceState.RUNNING, attempt=1,
                         node_id="n1", excluded=("n3",))
    assert msgspec.json.decode(msgspec.json.encode(rec), type=InstanceRecord) == rec
    assert InstanceRecord(instance_id="i-2", spec=spec).state is InstanceState.QUEUED


def test_the_records_a_broker_keeps_by_the_thousand_are_not_tracked_by_the_collector() -> None:
    """A broker holds a record and an assignment for every instance and each node's last
    reported list; as GC-tracked objects they were most of what its young collections
    scanned, pausing the event loop ~10-20 ms every 50,000. No cycle can run through them."""
    import gc

    from gavel.shared.messages import InstanceReport

    spec = Spec(name="s", command=["true"], ports=["http"], env={"A": "1"})
    rec = InstanceRecord(instance_id="i", spec=spec, excluded=("n1",))
    placed = Assignment(instance_id="i", auction_id="a", ports={"http": 20000})
    report = InstanceReport(instance_id="i", state="running", ports={"http": 20000})
    decoded = msgspec.json.decode(msgspec.json.encode(rec), type=InstanceRecord)
    assert not any(gc.is_tracked(o) for o in (rec, placed, report, decoded))
    assert decoded == rec and isinstance(decoded.excluded, tuple)
