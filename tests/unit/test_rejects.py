"""What the broker refuses is all counted, and the log gets one line per kind and peer per
interval (`transport.rejects`), on an injected clock.

What must hold: the counts and the Prometheus counter see every message; a flood of one
kind from one peer is one line an interval, and the next line says how many went unlogged;
another peer, or another kind, has a line of its own at once; the peer is the node a
per-node subject names unless the caller names one; senders that name a new peer on every
message cannot grow what the log keeps track of, nor flood it.
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from gavel.transport.rejects import INTERVAL_S, MAX_TRACKED, Rejects


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gavel.test"]


def test_one_line_per_kind_and_peer_per_interval(clock: Clock,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    counter = Counter("rejected", "test", ["kind"], registry=CollectorRegistry())
    rejects = Rejects(logging.getLogger("gavel.test"), counter, clock)
    caplog.set_level(logging.WARNING, logger="gavel.test")
    for _ in range(100):
        rejects.count("malformed heartbeat", "gavel.hb.a")
    assert lines(caplog) == ["rejected malformed heartbeat on gavel.hb.a from a (one line per "
                             f"kind and peer every {INTERVAL_S:g}s, all counted)"]
    rejects.count("malformed heartbeat", "gavel.hb.b")  # another peer: a line at once
    rejects.count("heartbeat for another node", "gavel.hb.a")  # another kind: the same
    assert len(lines(caplog)) == 3
    clock.now += INTERVAL_S - 0.001
    rejects.count("malformed heartbeat", "gavel.hb.a")
    assert len(lines(caplog)) == 3
    clock.now += 0.001  # the interval has passed: the next one is logged, with the tally
    rejects.count("malformed heartbeat", "gavel.hb.a")
    assert len(lines(caplog)) == 4
    assert "100 more since its last line" in lines(caplog)[-1]
    assert rejects.counts == {"malformed heartbeat": 103, "heartbeat for another node": 1}
    assert counter.labels(kind="malformed heartbeat")._value.get() == 103


def test_the_peer_is_the_subjects_node_or_the_one_the_caller_names(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    rejects = Rejects(logging.getLogger("gavel.test"), None, clock)
    caplog.set_level(logging.WARNING, logger="gavel.test")
    rejects.count("bid for an unknown auction", "gavel.bids.node-7")
    rejects.count("malformed status request", "gavel.api.status")  # names no node
    rejects.count("request with a reply subject outside the requester's inbox",
                  "gavel.assign.a (reply to '$KV.gavel-nodes.b')", "a")
    rejects.count("request with a reply subject outside the requester's inbox",
                  "gavel.api.submit (reply to 'gavel.events.x')", "an operator")
    got = lines(caplog)
    assert " from node-7 " in got[0]
    assert " from an unnamed peer " in got[1]
    assert " from a " in got[2] and " from an operator " in got[3]


def test_a_new_peer_on_every_message_cannot_grow_the_log_or_its_memory(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    rejects = Rejects(logging.getLogger("gavel.test"), None, clock)
    caplog.set_level(logging.WARNING, logger="gavel.test")
    n = MAX_TRACKED * 3
    for i in range(n):
        rejects.count("malformed heartbeat", f"gavel.hb.n{i}")
    assert rejects.counts["malformed heartbeat"] == n
    assert len(rejects.throttle._last) <= MAX_TRACKED + 1
    assert len(lines(caplog)) == MAX_TRACKED + 1  # one each, then one for "other peers"
    assert "from other peers" in lines(caplog)[-1]
    clock.now += INTERVAL_S  # an interval later the old peers are forgotten: room again
    rejects.count("malformed heartbeat", "gavel.hb.late")
    assert " from late " in lines(caplog)[-1]
    assert len(rejects.throttle._last) <= MAX_TRACKED + 1
