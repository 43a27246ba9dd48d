"""The node's `gavel exec` handler under hostile input, in memory: whatever arrives on
``gavel.exec.<node>.<operator>``, nothing raises out of it; a message that does not decode,
names another node, or asks for an answer outside its operator's own inbox is counted and
never answered; a start is answered with exactly one `ExecExit` on its reply subject; input
for a session its operator did not open is counted and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared import subjects
from gavel.shared.execstream import Ended, ExecExit, ExecInput, ExecStart
from gavel.worker.drivers import Target
from gavel.worker.execserver import ExecServer
from tests.unit.fuzzkit import FUZZ, Msg, bombs, garbage_for

NODE = "n1"
_enc = msgspec.msgpack.Encoder()
START = ExecStart(node_id=NODE, instance_id="i-1", session="ab" * 8, command=["true"])


class Sink:
    def __init__(self) -> None:
        self.counted = 0

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        self.counted += 1

    def count(self, kind: str, subject: str, peer: str = "") -> None:
        self.counted += 1


class Wire:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


def nobody(_iid: str) -> Target | Ended:
    return Ended.NOT_HELD


async def _no_report(*_args: Any) -> None:
    return None


def serve(subject: str, data: bytes, reply: str) -> tuple[Sink, Wire]:
    sink, wire = Sink(), Wire()
    server = ExecServer(node_id=NODE, target=nobody, report=_no_report, sink=sink,
                        nc=lambda: wire)

    async def go() -> None:
        await server.on_message(Msg(subject, data, reply))
        await server.close()
    asyncio.run(go())
    return sink, wire


subjects_ = st.sampled_from([subjects.EXEC.format(node=NODE, operator=o)
                             for o in ("operator", "alice", "a.b", "")]
                            + ["gavel.exec.n2.alice", "gavel.exec.n1"])
replies = st.sampled_from(["", "_INBOX.x", "_GAVEL_OP.alice.x", "_GAVEL_OP.bob.x",
                           "gavel.award.n1", "_INBOX_n1.x", "_GAVEL_OP.alice.*"])
payloads = st.one_of(
    garbage_for(START, ExecInput(node_id=NODE, session="ab" * 8, data=b"x")), bombs,
    st.builds(lambda n, s, c, t: _enc.encode(ExecStart(node_id=n, instance_id="i", session=s,
                                                       command=c, timeout_s=t)),
              st.sampled_from([NODE, "n2"]), st.sampled_from(["ab" * 8, "XYZ", ""]),
              st.lists(st.text(max_size=5), max_size=3), st.floats(0, 1e6)))


@FUZZ
@given(subject=subjects_, data=payloads, reply=replies)
def test_every_exec_message_is_counted_or_answered_once_where_it_may_be(
        subject: str, data: bytes, reply: str) -> None:
    sink, wire = serve(subject, data, reply)
    who = subjects.operator_of(subject) if subject.count(".") == 3 else ""
    inbox = subjects.operator_inbox(who) + "." if who else None
    for to, _ in wire.sent:
        assert inbox is not None and to == reply and to.startswith(inbox), (to, subject)
        assert "*" not in to
    if wire.sent:
        (_, answer), = wire.sent  # one answer: this node holds no instance
        assert isinstance(msgspec.msgpack.decode(answer, type=ExecExit), ExecExit)
        assert sink.counted == 0
    else:
        assert sink.counted == 1


def test_a_start_is_answered_under_its_operator_s_inbox_only() -> None:
    data = _enc.encode(START)
    for operator, reply, answered in (("alice", "_GAVEL_OP.alice.x", True),
                                      ("operator", "_INBOX.x", True),
                                      ("alice", "_INBOX.x", False),
                                      ("alice", "_GAVEL_OP.bob.x", False),
                                      ("operator", "gavel.award.n1", False)):
        sink, wire = serve(subjects.EXEC.format(node=NODE, operator=operator), data, reply)
        assert bool(wire.sent) is answered and sink.counted == (0 if answered else 1)
        if answered:
            (to, answer), = wire.sent
            assert to == reply
            assert msgspec.msgpack.decode(answer, type=ExecExit).reason == Ended.NOT_HELD


def test_input_for_a_session_no_one_opened_is_counted() -> None:
    data = _enc.encode(ExecInput(node_id=NODE, session="ab" * 8, data=b"rm -rf /\n"))
    sink, wire = serve(subjects.EXEC.format(node=NODE, operator="alice"), data,
                       "_GAVEL_OP.alice.x")
    assert sink.counted == 1 and wire.sent == []
