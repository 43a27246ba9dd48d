"""The worker's wire handlers under hostile input, in memory and fast.

A real `Agent` (real supervisor, strategies, state directory) is never connected: what it
would publish waits in its outbox, which is all these tests need. For every payload on the
RFB, award and cancel subjects: nothing raises out of a handler; an undecodable message
counts once in `agent.malformed`, a well-formed one meant for another node once in
`agent.ignored`, and neither changes anything (instances held, files written, the node's
view, messages sent). Every RFB that decodes and asks something gets one reply the broker
would accept; one that asks nothing is a hello, answered by a heartbeat. A flood of one kind
logs one line.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context as currently_fuzzing

from gavel.shared import subjects
from gavel.shared.messages import RFB, Award, Bid, BidReply, Cancel, Decline, Event, Shape, Spec
from gavel.shared.reasons import DECLINES
from gavel.shared.strategies import make_strategy, names
from gavel.shared.timing import Timing
from gavel.worker.agent import Agent
from tests.unit.fuzzkit import FUZZ, Msg, bombs, floats_hostile, garbage_for

NODE = "n1"
#: Each handler's subscription (the RFB handler also serves ``gavel.rfb.<node>``).
SUBJECT = {"rfb": subjects.RFB, "award": subjects.AWARD.format(node=NODE),
           "cancel": subjects.CANCEL.format(node=NODE)}
SPEC = Spec(name="web", command=[sys.executable, "-c", "pass"], cpu=0.5, memory_mb=64,
            ports=["http"])
_enc = msgspec.msgpack.Encoder()


class Rig:
    def __init__(self, root: Path, strategy: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.root = root
        self.agent = Agent(nats_url="nats://127.0.0.1:1", node_id=NODE,
                           strategy=make_strategy(strategy), labels={"zone": "a"},
                           state_dir=root, timing=Timing().scaled(10), cpu=4.0,
                           memory_mb=4096, port_range=(20000, 20099))

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def counted(self) -> int:
        return sum(self.agent.malformed.values()) + sum(self.agent.ignored.values())

    def snapshot(self) -> dict[str, bytes]:
        a = self.agent
        files = {str(p.relative_to(self.root)): p.read_bytes() if p.is_file() else b"/"
                 for p in sorted(self.root.rglob("*"))}
        parts = {"instances": a.instances(), "view": a._view, "draining": a.draining,
                 "outbox": a._outbox, "files": files}
        return {k: msgspec.msgpack.encode(v) for k, v in parts.items()}

    def feed(self, handler: Callable[[Msg], Awaitable[None]], msg: Msg) -> bool:
        """Run `handler`; True when the message was counted as malformed or ignored."""
        before, counted = self.snapshot(), self.counted()
        self.run(handler(msg))  # raising here fails the test: nothing may escape
        moved = self.counted() - counted
        assert moved in (0, 1), (self.agent.malformed, self.agent.ignored)
        if currently_fuzzing():
            event("counted" if moved else "answered")
        if moved:
            after = self.snapshot()
            changed = sorted(k for k in before if before[k] != after[k])
            assert not changed, f"a dropped message changed {changed}"
        return moved == 1

    def close(self) -> None:
        self.loop.close()


@pytest.fixture(params=names())
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, request.param)
    try:
        yield r
    finally:
        r.close()


shapes = st.builds(
    Shape, cpu=floats_hostile, memory_mb=st.integers(-(2**63), 2**63),
    ports=st.integers(-(2**31), 2**31),
    labels=st.dictionaries(st.sampled_from(["zone", "gpu", ""]), st.sampled_from(["a", "b"]),
                           max_size=2))
sane_shapes = st.builds(Shape, cpu=st.floats(0.01, 8), memory_mb=st.integers(1, 8192),
                        ports=st.integers(0, 200))
TEMPLATE_RFB = RFB(auction_id="a1", shapes=[Shape(cpu=0.5, memory_mb=64, ports=1)],
                   deadline_s=0.2, counts=[1])


def acceptable(answer: Bid | Decline, index: int) -> bool:
    """What the broker's auction accepts (see `shared.auction.Auction.receive`)."""
    if answer.shape != index:
        return False
    if isinstance(answer, Bid):
        return (math.isfinite(answer.load) and answer.load >= 0 and not math.isnan(answer.step)
                and answer.step != -math.inf)
    return answer.reason in DECLINES


@FUZZ
@given(data=st.one_of(
    st.builds(lambda s, d: _enc.encode(RFB(auction_id="a1", shapes=s, deadline_s=d)),
              st.lists(st.one_of(sane_shapes, shapes), max_size=4), floats_hostile),
    garbage_for(TEMPLATE_RFB)))
def test_every_rfb_that_decodes_gets_one_reply_the_broker_accepts(rig: Rig,
                                                                  data: bytes) -> None:
    sent = len(rig.agent._outbox)
    if rig.feed(rig.agent._on_rfb, Msg(subjects.RFB, data)):
        assert rig.agent.malformed["rfb"] >= 1
        return
    rfb = msgspec.msgpack.decode(data, type=RFB)
    if not rfb.shapes:  # a new leader's hello: no bids, a heartbeat at once
        assert rig.agent._outbox[sent:] == [] and rig.agent._wake.is_set()
        rig.agent._wake.clear()
        return
    (subject, payload), = rig.agent._outbox[sent:]
    rig.agent._outbox.clear()
    reply = msgspec.msgpack.decode(payload, type=BidReply)
    assert subject == subjects.BIDS.format(node=NODE)
    assert (reply.auction_id, reply.node_id) == (rfb.auction_id, NODE)
    assert len(reply.answers) == len(rfb.shapes)
    for i, (shape, ans) in enumerate(zip(rfb.shapes, reply.answers, strict=True)):
        assert acceptable(ans, i), (shape, ans)


AWARD = Award(auction_id="a1", instance_id="web-1", node_id="other-node", spec=SPEC,
              ports={"http": 20000})


@FUZZ
@given(data=st.one_of(
    garbage_for(AWARD),
    st.builds(lambda i, n: _enc.encode(Award(auction_id="a", instance_id=i, node_id=n,
                                             spec=SPEC)),
              st.text(max_size=10), st.sampled_from(["n2", "", "N1", "n1 "]))))
def test_awards_that_are_garbage_or_for_another_node_change_nothing(rig: Rig,
                                                                    data: bytes) -> None:
    assert rig.feed(rig.agent._on_award, Msg(subjects.AWARD.format(node=NODE), data))
    assert rig.agent.instances() == []


@FUZZ
@given(data=st.one_of(
    garbage_for(Cancel(instance_id="web-1", node_id="other-node")),
    st.builds(lambda i, n: _enc.encode(Cancel(instance_id=i, node_id=n)),
              st.text(max_size=10), st.sampled_from([NODE, "n2", ""]))))
def test_cancels_are_counted_or_confirmed_never_raise(rig: Rig, data: bytes) -> None:
    sent = len(rig.agent._outbox)
    if rig.feed(rig.agent._on_cancel, Msg(subjects.CANCEL.format(node=NODE), data)):
        return
    cancel = msgspec.msgpack.decode(data, type=Cancel)
    assert cancel.node_id == NODE
    (subject, payload), = rig.agent._outbox[sent:]  # nothing held: confirmed at once
    ev = msgspec.msgpack.decode(payload, type=Event)
    assert (subject, ev.type, ev.instance_id) == (subjects.REPORT.format(node=NODE),
                                                  "cancelled", cancel.instance_id)
    rig.agent._outbox.clear()


@pytest.mark.parametrize("payload", [b"\x81\xa1k" * 5000 + b"\xc0", b"\x91" * 100_000])
def test_deeply_nested_payloads_count_as_malformed(rig: Rig, payload: bytes) -> None:
    for handler, kind in ((rig.agent._on_rfb, "rfb"), (rig.agent._on_award, "award"),
                          (rig.agent._on_cancel, "cancel")):
        assert rig.feed(handler, Msg(SUBJECT[kind], payload))
        assert rig.agent.malformed[kind] == 1


@pytest.mark.parametrize("payload", [b"\x00" * 900_000,
                                     _enc.encode(TEMPLATE_RFB) + b"\x00" * 900_000])
def test_oversized_payloads_count_as_malformed(rig: Rig, payload: bytes) -> None:
    """Nearly NATS's default 1 MB limit, and a valid message with the rest of it trailing:
    counted once as malformed on each subject, not merely survived."""
    for handler, kind in ((rig.agent._on_rfb, "rfb"), (rig.agent._on_award, "award"),
                          (rig.agent._on_cancel, "cancel")):
        assert rig.feed(handler, Msg(f"gavel.{kind}.{NODE}", payload))
        assert rig.agent.malformed[kind] == 1


@FUZZ
@given(payload=bombs)
def test_bombs_never_escape_a_handler(rig: Rig, payload: bytes) -> None:
    for handler, kind in ((rig.agent._on_rfb, "rfb"), (rig.agent._on_award, "award"),
                          (rig.agent._on_cancel, "cancel")):
        assert rig.feed(handler, Msg(SUBJECT[kind], payload))


def test_a_flood_of_one_kind_logs_one_line(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    floods = [
        (rig.agent._on_rfb, "rfb", b"\xc1garbage"),
        (rig.agent._on_award, "award", b"\x93\x01\x02"),
        (rig.agent._on_award, "award", _enc.encode(AWARD)),  # for another node
        (rig.agent._on_cancel, "cancel", b""),
        (rig.agent._on_cancel, "cancel", _enc.encode(Cancel(instance_id="web-1", node_id="n2"))),
    ]
    with caplog.at_level(logging.DEBUG, logger="gavel"):
        for handler, kind, data in floods:
            caplog.clear()
            for _ in range(50):
                assert rig.feed(handler, Msg(SUBJECT[kind], data))
            lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
            assert len(lines) == 1, lines
    assert set(rig.agent.malformed.values()) == {50}
    assert set(rig.agent.ignored.values()) == {50}
