"""The broker's wire handlers under hostile input, in memory and fast.

A real `Broker` (real ledger in a temp git repository, real auctioneer, promises, API) is
driven by calling its handlers with stand-in messages; only NATS is stood in for (`Wire`
records what would be published). For every payload: nothing raises out of a handler; a
message is either accepted as valid or counted under exactly one kind in
`broker.rejects.counts` — and a counted one changed nothing (git head, cached state,
liveness, auctions, clocks, events, nothing queued for commit, nothing published). A flood of
one garbage kind logs one line.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context as currently_fuzzing

from gavel.broker.heartbeats import TOO_LARGE
from gavel.broker.ledger.plan import View, place, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    DeployRequest,
    NodesReply,
    NodesRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceRequest,
    StopServiceRequest,
    SubmitReply,
    SubmitRequest,
    TuneRequest,
)
from gavel.shared.auction import Auction, Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import (
    ApiError,
    AssignmentRequest,
    Award,
    Bid,
    BidReply,
    Capacity,
    Decline,
    Event,
    Heartbeat,
    HostStats,
    InstanceReport,
    Request,
    Spec,
)
from gavel.shared.planning import PlanRequest
from gavel.shared.reasons import DECLINES, Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.timing import Timing
from tests.unit.fuzzkit import FUZZ, Msg, Wire, bombs, floats_hostile, garbage_for, wire_values

NODES = ("n1", "n2", "n3")
SPEC = Spec(name="web", command=["true"], cpu=0.5, memory_mb=128, ports=["http"])
SMALL = Spec(name="tiny", command=["true"], cpu=0.1, memory_mb=16)
NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
AID = "auction-1"
_enc = msgspec.msgpack.Encoder()
_EXTREME = itertools.count(1)


class Rig:
    """One broker, its event loop and a fixed clock; `feed` runs one handler call."""

    def __init__(self, root: Path, writer: str = "process") -> None:
        self.loop = asyncio.new_event_loop()
        self.now = 1000.0
        self.b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root,
                               timing=Timing().scaled(10), clock=lambda: self.now, writer=writer))
        self.wire = Wire()
        self.b.nc = self.b.outbox.nc = self.wire
        self.api = self.b.api
        self.api.nc = self.wire  # the API answers on the connection a request came in on
        self.tasks = [self.loop.create_task(self.b.committer.run()),
                      self.loop.create_task(self.b.outbox.run())]  # the broker's sender
        # git: "web-1" placed on n1, "tiny-1" queued
        view = View(self.b.ledger.state())
        submit(view, InstanceRecord(instance_id="tiny-1", spec=SMALL))
        self.b.ledger.apply(view.change, "seed", None)
        self.place_web()
        for n in NODES:  # three healthy nodes, through the real handler
            self.b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=n),
                                     _enc.encode(heartbeat(n))))
        assert self.b.liveness.eligible(self.now) == list(NODES)
        self.fresh_auction()

    def place_web(self) -> None:
        """(Re)place "web-1" on n1 in git, as a fresh queued instance placed by a commit."""
        state = self.b.ledger.state()
        if state.placement_of("web-1") == "n1":
            return
        view = View(state)
        view.put_instance(InstanceRecord(instance_id="web-1", spec=SPEC))
        won = Awarded(request=Request.of("web-1", SPEC), winner=NodeBid(node_id="n1", load=0.1,
                      strategy="least-loaded"), tie_broken=False, bids=[], declines=[],
                      silent=[])
        assert place(view, won, "auction-0", [20000, 20999]) is not None
        self.b.ledger.apply(view.change, "place web-1", state.head)

    def fresh_auction(self) -> None:
        """An open auction over two shapes that every node was asked to bid in."""
        self.open_auction([Request.of("tiny-1", SMALL), Request.of("web-2", SPEC)])

    def open_auction(self, requests: list[Request]) -> None:
        """`AID` open over `requests`, every node asked, as `Core.open` leaves it: its
        instances in flight until their commit lands. Without that, the pass its close
        starts (rule 5) auctions them again, and on a loaded machine that round's deadline
        passes before the first commit lands: a second recorded auction."""
        self.b.auctioneer.core.auctions = {AID: Auction(AID, requests, NODES, self.now, 1.0)}
        self.b.auctioneer.core.inflight.update(r.instance_id for r in requests)

    def run(self, coro: Awaitable[Any]) -> Any:
        out = self.loop.run_until_complete(coro)
        for _ in range(3):  # let queued publishes reach the wire
            self.loop.run_until_complete(asyncio.sleep(0))
        return out

    def answers(self, reply: str) -> list[bytes]:
        """What the broker published on `reply`, oldest first."""
        return [data for subject, data in self.wire.sent if subject == reply]

    def rejected(self) -> int:
        return sum(self.b.rejects.counts.values())

    def snapshot(self) -> dict[str, bytes]:
        """Everything a message could change, canonical (sorted sets, NaN-safe) per part."""
        b = self.b
        state = b.ledger.state()
        parts = {
            "head": b.ledger.head(), "instances": state.instances, "nodes": state.nodes,
            "pending": list(state.pending), "last_seen": b.liveness.last_seen,
            "heartbeats": b.liveness.heartbeats,
            "auctions": {aid: (a.answered, a.bid_counts(), a.decline_counts(), a.closed_at)
                         for aid, a in b.auctioneer.auctions.items()},
            "inflight": b.auctioneer.core.inflight, "retry_at": b.auctioneer.core.retry_at,
            "reserved": b.auctioneer.core.reserved,
            "timers": vars(b.timers), "live": b.promises.live, "acting": b.promises.acting,
            "migrating": b.promises.migrating, "events": list(b.events),
            "queued": not b.committer.idle.is_set(),
            "sent": [m for m in self.wire.sent if not m[0].startswith("_INBOX")],  # not replies
        }
        return {k: msgspec.json.encode(v, order="deterministic") for k, v in parts.items()}

    def feed(self, handler: Callable[[Msg], Awaitable[None] | None], msg: Msg) -> bool:
        """Run `handler` on `msg`; True when it was rejected (then nothing changed)."""
        self.b.committer.idle.set()
        before, counted = self.snapshot(), self.rejected()

        async def call() -> Awaitable[None] | None:  # in the loop, as NATS calls it
            return handler(msg)

        handled = self.loop.run_until_complete(call())  # raising: nothing may escape
        if handled is not None:  # the assignment endpoint answers: it waits on NATS
            self.run(handled)
        moved = self.rejected() - counted
        after = self.snapshot()
        self.run(self.b.committer.idle.wait())  # what a valid message queued has landed
        assert moved in (0, 1), self.b.rejects.counts
        if currently_fuzzing():
            event("rejected" if moved else "accepted")
        if moved:
            changed = sorted(k for k in before if before[k] != after[k])
            assert not changed, f"a rejected message changed {changed}"
        return moved == 1

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*self.tasks, return_exceptions=True))
        self.loop.close()


def heartbeat(node: str, **kw: Any) -> Heartbeat:
    fields: dict[str, Any] = {
        "node_id": node, "strategy": "least-loaded", "port_range": [20000, 20999],
        "capacity": Capacity(cpu=4.0, memory_mb=4096, ports=1000), **kw}
    return Heartbeat(**fields)


# -- heartbeats ------------------------------------------------------------------------------

ints_hostile = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, -1, 2**63]))
node_ids = st.one_of(st.sampled_from([*NODES, "n4", "", "a/b", "x" * 65, "N-5_z"]),
                     st.text(max_size=70))


@st.composite
def heartbeats(draw: st.DrawFn) -> tuple[str, bytes]:
    """A well-typed heartbeat with hostile values (or, half the time, plausible ones), on its
    own or another node's subject."""
    plausible = draw(st.booleans())
    node = draw(st.sampled_from([*NODES, "n4"]) if plausible else node_ids)
    subject_node = draw(st.just(node) if plausible else st.one_of(st.just(node), node_ids))
    floats = st.floats(0, 1e6) if plausible else floats_hostile
    ints = st.integers(0, 2**40) if plausible else ints_hostile
    hb = heartbeat(
        node, seq=draw(ints_hostile),
        capacity=Capacity(cpu=draw(floats), memory_mb=draw(ints), ports=draw(ints)),
        committed=Capacity(cpu=draw(floats_hostile)),
        stats=HostStats(cpu_ratio=draw(floats_hostile), memory_ratio=draw(floats_hostile)),
        instances=draw(st.lists(st.builds(InstanceReport,
                                          instance_id=st.sampled_from(["web-1", "tiny-1", "x"]),
                                          state=st.sampled_from(["running", "nonsense"])),
                                max_size=3)),
        port_range=draw(st.one_of(st.just([20000, 20999]), st.just([]),
                                  st.lists(ints, max_size=3))),
        labels=draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)))
    return subjects.HEARTBEAT.format(node=subject_node), _enc.encode(hb)


def sane_heartbeat(hb: Heartbeat) -> bool:
    c = hb.capacity
    ports_ok = hb.port_range == [] or (len(hb.port_range) == 2
                                       and 1 <= hb.port_range[0] <= hb.port_range[1] <= 65535)
    return (bool(NODE_ID.match(hb.node_id)) and math.isfinite(c.cpu) and c.cpu >= 0
            and c.memory_mb >= 0 and c.ports >= 0 and ports_ok)


@FUZZ
@given(case=st.one_of(heartbeats(), st.tuples(
    st.sampled_from([subjects.HEARTBEAT.format(node=n) for n in NODES]),
    garbage_for(heartbeat("n1", instances=[InstanceReport(instance_id="web-1",
                                                          state="running")])))))
def test_heartbeats_are_accepted_only_when_sane(rig: Rig, case: tuple[str, bytes]) -> None:
    subject, data = case
    if rig.feed(rig.b._on_heartbeat, Msg(subject, data)):
        return
    hb = msgspec.msgpack.decode(data, type=Heartbeat)
    assert subjects.node_of(subject) == hb.node_id
    assert sane_heartbeat(hb), f"accepted an impossible heartbeat: {hb}"
    assert _enc.encode(rig.b.liveness.heartbeats[hb.node_id]) == _enc.encode(hb)
    for n in NODES:  # keep the three nodes as the auction expects them
        rig.b.liveness.record(heartbeat(n), rig.now)


# -- bids ------------------------------------------------------------------------------------

@st.composite
def valid_replies(draw: st.DrawFn) -> tuple[str, bytes]:
    node = draw(st.sampled_from(NODES))
    answers: list[Bid | Decline] = []
    for shape in draw(st.lists(st.integers(0, 1), unique=True, max_size=2)):
        answers.append(draw(st.one_of(
            st.builds(Bid, shape=st.just(shape), load=st.floats(0, 1e300),
                      step=st.one_of(st.floats(-1e300, 1e300), st.just(math.inf)),
                      strategy=st.text(max_size=10)),
            st.builds(Decline, shape=st.just(shape), reason=st.sampled_from(sorted(DECLINES)),
                      detail=st.text(max_size=10)))))
    return (subjects.BIDS.format(node=node),
            _enc.encode(BidReply(auction_id=AID, node_id=node, answers=answers)))


@st.composite
def bid_replies(draw: st.DrawFn) -> tuple[str, bytes]:
    node = draw(st.sampled_from([*NODES, "n4", "stranger"]))
    subject_node = draw(st.one_of(st.just(node), st.sampled_from(NODES)))
    answers: list[Bid | Decline] = draw(st.lists(st.one_of(
        st.builds(Bid, shape=st.integers(-2, 3), load=floats_hostile, step=floats_hostile,
                  strategy=st.text(max_size=10)),
        st.builds(Decline, shape=st.integers(-2, 3),
                  reason=st.one_of(st.sampled_from(sorted(DECLINES)), st.text(max_size=10)),
                  detail=st.text(max_size=10))), max_size=4))
    aid = draw(st.sampled_from([AID, AID, "auction-0", "", "nope"]))
    return (subjects.BIDS.format(node=subject_node),
            _enc.encode(BidReply(auction_id=aid, node_id=node, answers=answers)))


def valid_reply(r: BidReply, subject: str) -> bool:
    shapes = [a.shape for a in r.answers]
    return (r.auction_id == AID and r.node_id in NODES and subjects.node_of(subject) == r.node_id
            and all(0 <= s < 2 for s in shapes) and len(set(shapes)) == len(shapes)
            and all(math.isfinite(a.load) and a.load >= 0 and not math.isnan(a.step)
                    and a.step != -math.inf for a in r.answers if isinstance(a, Bid))
            and all(a.reason in DECLINES for a in r.answers if isinstance(a, Decline)))


TEMPLATE_REPLY = BidReply(auction_id=AID, node_id="n1", answers=[
    Bid(shape=0, load=0.2, step=0.1, strategy="binpack"),
    Decline(shape=1, reason="no room for cpu", detail="0.5")])


@FUZZ
@given(case=st.one_of(valid_replies(), bid_replies(), st.tuples(
    st.sampled_from([subjects.BIDS.format(node=n) for n in NODES]), garbage_for(TEMPLATE_REPLY))),
    replay=st.booleans())
def test_bids_are_accepted_once_and_only_when_valid(rig: Rig, case: tuple[str, bytes],
                                                    replay: bool) -> None:
    rig.fresh_auction()
    subject, data = case
    auction = rig.b.auctioneer.auctions[AID]
    if rig.feed(rig.b.auctioneer.on_bids, Msg(subject, data)):
        try:
            reply = msgspec.msgpack.decode(data, type=BidReply)
        except (msgspec.DecodeError, RecursionError):
            return
        assert not valid_reply(reply, subject), f"refused a valid reply {reply}"
        return
    reply = msgspec.msgpack.decode(data, type=BidReply)
    assert valid_reply(reply, subject), f"accepted {reply} on {subject}"
    assert reply.node_id in auction.answered
    if replay:  # the same reply again: a duplicate, counted, changes nothing
        assert rig.feed(rig.b.auctioneer.on_bids, Msg(subject, data))


def test_a_bid_replayed_after_its_auction_closed_is_counted_and_changes_nothing(
        rig: Rig) -> None:
    rig.fresh_auction()
    answers: list[Bid | Decline] = [Bid(shape=0, load=0.5, step=0.1, strategy="x"),
                                    Bid(shape=1, load=0.5, step=0.1, strategy="x")]
    frames = [(subjects.BIDS.format(node=n), _enc.encode(BidReply(auction_id=AID, node_id=n,
                                                                  answers=answers)))
              for n in NODES]
    for subject, data in frames:
        assert not rig.feed(rig.b.auctioneer.on_bids, Msg(subject, data))
    assert AID not in rig.b.auctioneer.auctions  # every node answered: closed and decided
    quiesce(rig)  # what the award set going (its commit, what follows it) has run
    for subject, data in frames:
        assert rig.feed(rig.b.auctioneer.on_bids, Msg(subject, data))
    assert rig.b.rejects.counts["bid for an unknown auction"] == len(frames)


def quiesce(rig: Rig) -> None:
    """Until the broker stands still: two snapshots alike around a turn of its loop."""
    for _ in range(100):
        rig.run(rig.b.committer.idle.wait())
        before = rig.snapshot()
        rig.run(asyncio.sleep(0.01))
        rig.run(rig.b.committer.idle.wait())
        if rig.snapshot() == before:
            return


# -- reports ---------------------------------------------------------------------------------

EVENT_TYPES = ["provisioning", "running", "exited", "failed", "cancelled", "placed", "lost",
               "scheduled", "error", "bogus", ""]


@st.composite
def reports(draw: st.DrawFn) -> tuple[str, bytes]:
    plausible = draw(st.booleans())  # the holder's own report about it, half the time
    node = draw(st.just("n1") if plausible else st.sampled_from([*NODES, "n9"]))
    subject_node = draw(st.just(node) if plausible else st.sampled_from(NODES))
    ev = Event(instance_id=draw(st.just("web-1") if plausible
                                else st.sampled_from(["web-1", "tiny-1", "ghost", ""])),
               type=draw(st.sampled_from(EVENT_TYPES)), node_id=node,
               reason=draw(st.sampled_from(["", "driver failed to start", "timeout", "zzz"])),
               exit_code=draw(st.one_of(st.none(), ints_hostile)), attempt=draw(ints_hostile),
               at=draw(floats_hostile))
    return subjects.REPORT.format(node=subject_node), _enc.encode(ev)


@FUZZ
@given(case=st.one_of(reports(), st.tuples(
    st.sampled_from([subjects.REPORT.format(node=n) for n in NODES]),
    garbage_for(Event(instance_id="web-1", type="running", node_id="n1", attempt=1)))))
def test_reports_count_only_from_the_node_holding_the_instance(rig: Rig,
                                                               case: tuple[str, bytes]) -> None:
    subject, data = case
    rig.place_web()
    if rig.feed(rig.b.promises.on_report, Msg(subject, data)):
        return
    ev = msgspec.msgpack.decode(data, type=Event)
    assert ev.node_id == subjects.node_of(subject) == "n1" and ev.instance_id == "web-1"
    assert ev.type in ("provisioning", "running", "exited", "failed", "cancelled")
    rig.b.promises.live.clear()


def test_a_hand_back_blocks_only_the_awarded_ports_it_names(rig: Rig) -> None:
    """A node handing "web-1" back for want of ports names the ports it found taken: the
    one it was awarded is blocked on its node.json; one it was never awarded is not (a node
    cannot fill its file with blocks by naming any number)."""
    rig.place_web()
    awarded = rig.b.ledger.state().nodes["n1"].instances["web-1"].ports["http"]
    ev = Event(instance_id="web-1", type="failed", node_id="n1", attempt=1,
               reason=Reason.NO_ROOM_PORTS, detail="range", taken=[awarded, 20500, -1])
    assert not rig.feed(rig.b.promises.on_report, Msg("gavel.report.n1", _enc.encode(ev)))
    state = rig.b.ledger.state()
    assert state.placement_of("web-1") is None  # handed back: queued again
    assert state.nodes["n1"].blocked_ports == [awarded]


# -- assignment requests ---------------------------------------------------------------------

@FUZZ
@given(subject_node=st.sampled_from(NODES), data=st.one_of(
    garbage_for(AssignmentRequest(instance_id="web-1", node_id="n1")),
    st.builds(lambda i, n: _enc.encode(AssignmentRequest(instance_id=i, node_id=n)),
              st.sampled_from(["web-1", "tiny-1", "ghost"]), st.sampled_from(NODES))))
def test_assignment_requests_always_get_an_answer_and_change_nothing(
        rig: Rig, subject_node: str, data: bytes) -> None:
    inbox = f"_INBOX_{subject_node}.x"  # the asking node's own inbox
    msg = Msg(subjects.ASSIGN.format(node=subject_node), data, reply=inbox)
    before = rig.snapshot()
    sent = len(rig.wire.sent)
    rig.feed(rig.b.assignments.on_request, msg)
    assert [s for s, _ in rig.wire.sent[sent:]] == [inbox]  # never left waiting
    answer = msgspec.msgpack.decode(rig.wire.sent[-1][1], type=Award | ApiError)
    if isinstance(answer, Award):
        assert (answer.instance_id, answer.node_id, subject_node) == ("web-1", "n1", "n1")
    assert rig.snapshot() == before


# -- the API ---------------------------------------------------------------------------------

SERVICE = Spec(name="svc", type="service", command=["true"], cpu=0.1, memory_mb=16, count=2)
VERB_TEMPLATES: dict[str, Any] = {
    "submit": SubmitRequest(spec=SMALL, instance_id="tiny-9"),
    "status": None, "nodes": None, "why": None, "events": None, "stats": None,
    "cancel": None, "drain": None, "endpoints": None,
    "deploy": DeployRequest(spec=SERVICE), "service": ServiceRequest(name="svc"),
    "services": None, "scale": ScaleRequest(name="svc", count=1),
    "stop": StopServiceRequest(name="svc"), "rollback": RollbackRequest(name="svc"),
    "plan": PlanRequest(spec=SMALL), "periodic": None,
    "tune": TuneRequest(batch_max=8, max_auctions=2, commit_gap_ms=5.0),
}


def test_every_verb_is_fuzzed(rig: Rig) -> None:
    assert set(VERB_TEMPLATES) == set(rig.api.verbs)


@FUZZ
@given(verb=st.sampled_from(sorted(VERB_TEMPLATES)), data=st.data())
def test_api_answers_garbage_with_an_error_and_changes_nothing(
        rig: Rig, verb: str, data: st.DataObject) -> None:
    template = VERB_TEMPLATES[verb] or SubmitRequest(spec=SPEC)
    payload = data.draw(st.one_of(garbage_for(template), st.binary(max_size=32), bombs))
    reply_to = f"_INBOX.api.{len(rig.wire.sent)}"
    msg = Msg(subjects.API.format(verb=verb), payload, reply=reply_to)
    rejected = rig.feed(rig.api._handler(verb), msg)
    if rig.api._serving:  # a plan answers once its dry run's deadline has passed
        rig.run(asyncio.gather(*rig.api._serving.running))
    assert len(rig.answers(reply_to)) == 1
    if rejected:
        reply = msgspec.msgpack.decode(rig.answers(reply_to)[0], type=ApiError)
        assert reply.error.startswith(f"malformed {verb} request")


def test_submit_refuses_a_spec_no_node_could_ever_hold(rig: Rig) -> None:
    for spec, what in ((Spec(name="big", command=["true"], cpu=64.0),
                        "no node could ever offer the requested resources: asks 64 cpu"),
                       (Spec(name="big", command=["true"], memory_mb=10**6),
                        "no node could ever offer the requested resources: asks 1000000 MB"),
                       (None, "malformed submit request: cpu must be a finite number")):
        if spec is None:  # no Spec can hold it: send what a foreign client could
            raw = msgspec.msgpack.decode(_enc.encode(SubmitRequest(spec=SMALL)))
            raw["spec"]["cpu"] = math.inf
            payload = msgspec.msgpack.encode(raw)
        else:
            payload = _enc.encode(SubmitRequest(spec=spec))
        msg = Msg(subjects.API.format(verb="submit"), payload, reply="_INBOX.api")
        before = rig.snapshot()
        rig.run(rig.api._handler("submit")(msg))
        reply = msgspec.msgpack.decode(rig.answers("_INBOX.api")[-1], type=SubmitReply | ApiError)
        assert isinstance(reply, ApiError)
        assert what in reply.error, reply.error
        assert rig.snapshot() == before


@pytest.mark.parametrize("iid", ["a b", "x\r\nPUB gavel.hb.n1 0", "a/b", "../x", "a\x00b",
                                 "x" * 300, ".hidden"])
def test_submit_refuses_an_instance_id_that_is_no_subject_token_or_file_name(
        rig: Rig, iid: str) -> None:
    msg = Msg(subjects.API.format(verb="submit"),
              _enc.encode(SubmitRequest(spec=SMALL, instance_id=iid)), reply="_INBOX.api")
    before = rig.snapshot()
    rig.run(rig.api._handler("submit")(msg))
    reply = msgspec.msgpack.decode(rig.answers("_INBOX.api")[-1], type=SubmitReply | ApiError)
    assert isinstance(reply, ApiError) and "instance_id" in reply.error
    assert rig.snapshot() == before


def test_nodes_reply_exposes_the_reject_counts(rig: Rig) -> None:
    rig.feed(rig.b._on_heartbeat, Msg("gavel.hb.n1", b"\xc1"))
    rig.feed(rig.b.auctioneer.on_bids, Msg("gavel.bids.n1", b"\xc1"))
    msg = Msg(subjects.API.format(verb="nodes"), _enc.encode(NodesRequest()), reply="_INBOX.n")
    rig.run(rig.api._handler("nodes")(msg))
    reply = msgspec.msgpack.decode(rig.answers("_INBOX.n")[-1], type=NodesReply)
    assert reply.rejected["malformed heartbeat"] == 1
    assert reply.rejected["malformed bid reply"] == 1


# -- logged once per kind --------------------------------------------------------------------

def test_a_flood_of_one_garbage_kind_logs_one_line(rig: Rig,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    floods: list[tuple[Callable[[Msg], Awaitable[None] | None], Msg]] = [
        (rig.b._on_heartbeat, Msg("gavel.hb.n1", b"\xc1garbage")),
        (rig.b._on_heartbeat, Msg("gavel.hb.n2", _enc.encode(heartbeat("n1")))),
        (rig.b.auctioneer.on_bids, Msg("gavel.bids.n1", b"\x93")),
        (rig.b.auctioneer.on_bids, Msg("gavel.bids.n1", _enc.encode(
            BidReply(auction_id="gone", node_id="n1", answers=[])))),
        (rig.b.promises.on_report, Msg("gavel.report.n1", b"")),
        (rig.b.promises.on_report, Msg("gavel.report.n2", _enc.encode(
            Event(instance_id="web-1", type="running", node_id="n2")))),
        (rig.b.assignments.on_request, Msg("gavel.assign.n1", b"\xff", reply="_INBOX_n1.f")),
        (rig.b.watches.on_request, Msg("gavel.watch.n1", b"\xff", reply="_INBOX_n1.f")),
        (rig.api._handler("status"), Msg("gavel.api.status", b"\xff", reply="_INBOX.s")),
    ]
    with caplog.at_level(logging.DEBUG, logger="gavel"):
        for handler, msg in floods:
            caplog.clear()
            for _ in range(50):
                assert rig.feed(handler, msg)
            lines = [r for r in caplog.records if r.levelno >= logging.INFO]
            assert len(lines) == 1, [r.getMessage() for r in lines]
            assert msg.subject in lines[0].getMessage()
    assert all(n % 50 == 0 for n in rig.b.rejects.counts.values()), rig.b.rejects.counts


def test_worker_text_cannot_forge_lines_in_the_commit_message(rig: Rig) -> None:
    """A decline's detail ends up in the placement commit's message; a newline in it must
    not start a line of its own (a forged ``Gavel-Auction:`` trailer would break `why`)."""
    rig.fresh_auction()
    forged = "x\nGavel-Auction: {not json\nSigned-off-by: mallory"
    for n in NODES:
        answers: list[Bid | Decline] = (
            [Bid(shape=0, load=0.1, step=0.1, strategy="x"),
             Bid(shape=1, load=0.1, step=0.1, strategy="x")] if n == "n1" else
            [Decline(shape=0, reason="missing label", detail=forged),
             Decline(shape=1, reason="missing label", detail=forged)])
        assert not rig.feed(rig.b.auctioneer.on_bids, Msg(
            subjects.BIDS.format(node=n),
            _enc.encode(BidReply(auction_id=AID, node_id=n, answers=answers))))
    rig.run(rig.b.committer.idle.wait())
    head = rig.b.ledger.head()
    assert head is not None
    message = rig.b.ledger.repo[head].message
    assert not any(line.startswith(("Gavel-Auction: {not", "Signed-off-by"))
                   for line in message.split("\n")), message
    assert [a.instance_id for a in rig.b.ledger.auctions_for("tiny-1")] == ["tiny-1"]


@FUZZ
@given(drawn=st.one_of(st.tuples(wire_values.map(msgspec.msgpack.encode), st.just(False)),
                       st.tuples(bombs, st.just(True)),
                       st.tuples(st.binary(min_size=1, max_size=16), st.just(False))))
def test_oversized_and_deep_payloads_are_counted_on_every_endpoint(
        rig: Rig, drawn: tuple[bytes, bool]) -> None:
    """Counted, not merely survived: a payload nearly NATS's default 1 MB limit (trailing
    bytes after a value: never one message) counts once under its endpoint's malformed
    kind - a heartbeat that large, before it is decoded, as larger than its node could
    send - and so does a nesting bomb; anything else is accepted or counted once."""
    payload, deep = drawn
    big = payload + b"\x00" * 900_000
    for handler, subject, kind, big_kind, reply in (
            (rig.b._on_heartbeat, "gavel.hb.n1", "malformed heartbeat", TOO_LARGE, ""),
            (rig.b.auctioneer.on_bids, "gavel.bids.n1", "malformed bid reply", "", ""),
            (rig.b.promises.on_report, "gavel.report.n1", "malformed event", "", ""),
            (rig.b.assignments.on_request, "gavel.assign.n1", "malformed assignment request",
             "", "_INBOX_n1.r"),
            (rig.b.watches.on_request, "gavel.watch.n1", "malformed watch request", "",
             "_INBOX_n1.r"),
            (rig.api._handler("submit"), "gavel.api.submit", "malformed submit request", "",
             "_INBOX.x")):
        for data, must in ((payload, deep), (big, True)):
            # a heartbeat larger than its node could send is refused before it is decoded
            k = big_kind if big_kind and len(data) > rig.b.heartbeats.bound("n1").size \
                else kind
            counted = rig.b.rejects.counts.get(k, 0)
            rejected = rig.feed(handler, Msg(subject, data, reply=reply))
            if must:
                assert rejected, f"{len(data)} bytes on {subject} were not counted"
                assert rig.b.rejects.counts[k] == counted + 1, rig.b.rejects.counts


answer_lists = st.lists(st.integers(0, 1), unique=True, max_size=2).flatmap(
    lambda shapes: st.tuples(*[st.one_of(
        st.builds(Bid, shape=st.just(s), load=st.one_of(st.floats(0, 1e308),
                                                        st.sampled_from([0.0, 1e308])),
                  step=st.one_of(st.floats(-1e308, 1e308), st.sampled_from(
                      [math.inf, 1e308, -1e308, -0.0])), strategy=st.text(max_size=5)),
        st.builds(Decline, shape=st.just(s), reason=st.sampled_from(sorted(DECLINES)),
                  detail=st.text(max_size=10))) for s in shapes]))


@settings(FUZZ, max_examples=40)  # a commit or two per example
@given(replies=st.tuples(answer_lists, answer_lists, answer_lists))
def test_extreme_but_valid_bids_decide_commit_and_explain(
        rig: Rig, replies: tuple[tuple[Bid | Decline, ...], ...]) -> None:
    """Loads up to 1e308 and steps of ±1e308 (sums overflow): the batch still decides, the
    commit lands, and every recorded outcome reads back with a number for its winner."""
    for n in NODES:
        rig.b.liveness.record(heartbeat(n, capacity=Capacity(cpu=1e9, memory_mb=2**40,
                                                             ports=10**6)), rig.now)
    k = next(_EXTREME)  # ids never seen before in this rig, whatever earlier tests left
    ids = [f"a{k}", f"b{k}", f"c{k}"]
    specs = [SMALL, SMALL, SPEC]
    state = rig.b.ledger.state()
    view = View(state)
    for iid, spec in zip(ids, specs, strict=True):
        submit(view, InstanceRecord(instance_id=iid, spec=spec))
    rig.b.ledger.apply(view.change, "submit", state.head)
    rig.open_auction([Request.of(iid, spec) for iid, spec in zip(ids, specs, strict=True)])
    for n, answers in zip(NODES, replies, strict=True):
        assert not rig.feed(rig.b.auctioneer.on_bids, Msg(subjects.BIDS.format(node=n), _enc.encode(
            BidReply(auction_id=AID, node_id=n, answers=list(answers)))))
    assert AID not in rig.b.auctioneer.auctions
    rig.run(rig.b.committer.idle.wait())
    state = rig.b.ledger.state()
    for iid in ids:
        (record,) = rig.b.ledger.auctions_for(iid, limit=3)
        assert (record.winner != "") == (state.placement_of(iid) is not None)
        if record.winner:
            assert record.load is not None and not math.isnan(record.load), record


def test_an_auction_closing_is_recorded_once_however_late_its_commit_lands(rig: Rig) -> None:
    """The close of an auction starts the next pass (rule 5) before its commit lands; the
    instances it decided are still in flight then, so that pass does not auction them
    again, and no round of theirs can expire into a second record while the commit is
    slow (here: every round the pass opens expires at once, as on a loaded machine)."""
    rig.b.auctioneer.core.deadline_s = 0.0
    state = rig.b.ledger.state()
    view = View(state)
    submit(view, InstanceRecord(instance_id="slow-1", spec=SMALL))
    rig.b.ledger.apply(view.change, "submit", state.head)
    rig.open_auction([Request.of("slow-1", SMALL)])
    for n in NODES:
        assert not rig.feed(rig.b.auctioneer.on_bids, Msg(subjects.BIDS.format(node=n), _enc.encode(
            BidReply(auction_id=AID, node_id=n, answers=[
                Decline(shape=0, reason=Reason.NO_ROOM_CPU, detail="0.1")]))))
    rig.run(rig.b.committer.idle.wait())
    assert [r.auction_id for r in rig.b.ledger.auctions_for("slow-1")] == [AID]
    # the broker's own pass opens the same way: one round, expired, recorded once
    state = rig.b.ledger.state()
    view = View(state)
    submit(view, InstanceRecord(instance_id="slow-2", spec=SMALL))
    rig.b.ledger.apply(view.change, "submit", state.head)

    async def reconcile() -> None:
        rig.b.auctioneer.reconcile(rig.now)

    rig.run(reconcile())
    rig.run(rig.b.committer.idle.wait())
    assert len(rig.b.ledger.auctions_for("slow-2")) == 1
