"""The door in front of every decoder (`transport.inbound` rules 4 and 5), in memory.

What must hold: a message is admitted only on a subject its subscription's pattern matches,
without headers and without a JetStream reply, each refusal under its fixed kind; a request
only with a reply under its requester's own inbox prefix - the prefix, a dot, then tokens
none of which is empty or a wildcard - and nowhere else, counted against the requester.
"""

from __future__ import annotations

import pytest

from gavel.shared import subjects
from gavel.transport.inbound import (
    CONTROL,
    HEADERS,
    JETSTREAM,
    OUTSIDE_INBOX,
    Door,
    answerable,
)
from gavel.transport.wire import Inbound
from tests.unit.fuzzkit import Msg


class Sink:
    def __init__(self) -> None:
        self.counted: list[tuple[str, str]] = []

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        raise AssertionError("a door never decodes")

    def count(self, kind: str, subject: str, peer: str = "") -> None:
        self.counted.append((kind, peer))


@pytest.mark.parametrize(("reply", "ok"), [
    ("_INBOX_a.x", True), ("_INBOX_a.x.y", True), ("_INBOX_a.x*y", True),
    ("_INBOX_a", False), ("_INBOX_a.", False), ("_INBOX_a..x", False), ("_INBOX_a.x.", False),
    ("_INBOX_a.*", False), ("_INBOX_a.>", False), ("_INBOX_a.x.>", False),
    ("_INBOX_ab.x", False), ("_INBOX_b.x", False), ("_INBOX.x", False), ("x._INBOX_a.y", False),
    ("_INBOX_a.x y", False), ("_INBOX_a.x\r\nPUB y 0", False), ("$KV.gavel-nodes.b", False),
])
def test_a_reply_is_answerable_only_under_the_inbox(reply: str, ok: bool) -> None:
    assert answerable(reply, "_INBOX_a") is ok


def test_what_is_no_message_of_gavels_is_refused_by_kind() -> None:
    sink = Sink()
    door = Door(sink, subjects.HEARTBEAT_ALL)
    assert door(Inbound("gavel.hb.a", b"x"))
    refused = [
        (Inbound("$KV.gavel-nodes.a", b"{}"), JETSTREAM),  # a push delivery's stream subject
        (Inbound("gavel.hb.a", b"{}", "$JS.ACK.KV_gavel-nodes.c.1.1.1.1.0"), JETSTREAM),
        (Inbound("gavel.hb.a", b"", "$JS.FC.KV_gavel-nodes.c.1"), CONTROL),
        (Inbound("gavel.hb.a", b"", "", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"), CONTROL),
        (Msg("gavel.hb.a", b"", headers={"Status": "100"}), CONTROL),
        (Inbound("gavel.hb.a", b"x", "", b"NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n"), HEADERS),
        (Msg("gavel.hb.a", b"x", headers={"KV-Operation": "DEL"}), HEADERS),
    ]
    for msg, kind in refused:
        assert not door(msg)
        assert door.refused == kind and door.reply == ""
    assert [k for k, _ in sink.counted] == [k for _, k in refused]


def test_a_request_is_answered_only_under_its_requesters_inbox() -> None:
    sink = Sink()
    door = Door(sink, subjects.ASSIGN_ALL, what="assignment request",
                inbox=lambda s: subjects.NODE_INBOX.format(node=subjects.node_of(s)),
                owner=subjects.node_of)
    assert door(Msg("gavel.assign.a", b"", reply="_INBOX_a.r.1"))
    assert door.reply == "_INBOX_a.r.1"
    assert not door(Msg("gavel.assign.a", b"", reply="_INBOX_b.r.1"))
    assert (door.refused, door.reply) == (OUTSIDE_INBOX, "")
    assert not door(Msg("gavel.assign.a", b""))
    assert door.refused == "assignment request without a reply subject"
    assert sink.counted == [(OUTSIDE_INBOX, "a"), ("assignment request without a reply subject",
                                                    "a")]
