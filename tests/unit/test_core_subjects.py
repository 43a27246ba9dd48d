"""Subjects: every per-node subject ends with the node token and matches its wildcard."""

from __future__ import annotations

import pytest

from gavel.shared import subjects


def nats_match(pattern: str, subject: str) -> bool:
    """NATS wildcard rules: ``*`` is one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


PER_NODE = [
    (subjects.BIDS, subjects.BIDS_ALL),
    (subjects.HEARTBEAT, subjects.HEARTBEAT_ALL),
    (subjects.REPORT, subjects.REPORT_ALL),
    (subjects.ASSIGN, subjects.ASSIGN_ALL),
]


@pytest.mark.parametrize(("template", "wildcard"), PER_NODE)
def test_node_publishes_on_a_subject_naming_itself(template: str, wildcard: str) -> None:
    subject = template.format(node="node-7")
    assert subjects.node_of(subject) == "node-7"
    assert nats_match(wildcard, subject)
    assert not nats_match(wildcard, template.format(node="a.b"))  # ids must be one token


@pytest.mark.parametrize("template", [subjects.RFB_NODE, subjects.AWARD, subjects.CANCEL])
def test_broker_to_node_subjects_end_with_the_node(template: str) -> None:
    assert subjects.node_of(template.format(node="n1")) == "n1"


def test_events_wildcard_covers_every_instance() -> None:
    assert nats_match(subjects.EVENTS_ALL, subjects.EVENTS.format(instance="i-1"))
    assert not nats_match(subjects.BIDS_ALL, subjects.HEARTBEAT.format(node="n1"))


def test_the_matcher_itself() -> None:
    assert nats_match("a.*", "a.b") and not nats_match("a.*", "a.b.c")
    assert nats_match("a.>", "a.b.c") and not nats_match("a.>", "a")


SUBJECTS = ["gavel.hb.n1", "gavel.hb", "gavel.hb.n1.x", "gavel.hbx.n1",
            "$KV.gavel-nodes.a", "gavel.api.status", "gavel.events.i-1", "gavel.events.a.b",
            "gavel.rfb", "gavel.rfb.n1", "_INBOX_a.x", "_INBOX_a"]
PATTERNS = ["gavel.hb.*", "gavel.events.>", "gavel.rfb", "gavel.api.status", "gavel.*.n1",
            "_INBOX_a.>", ">", "*"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_matcher_and_matches_are_natss_rule(pattern: str) -> None:
    fast = subjects.matcher(pattern)
    for subject in SUBJECTS:
        assert subjects.matches(pattern, subject) == nats_match(pattern, subject), subject
        assert fast(subject) == subjects.matches(pattern, subject), (pattern, subject)
    for broken in ("gavel.hb.", "gavel..n1", "gavel.events.a..b", "_INBOX_a.x.", ""):
        assert not subjects.matches(pattern, broken)  # an empty token is no subject
        assert fast(broken) == subjects.matches(pattern, broken), (pattern, broken)


def test_the_peer_is_the_node_a_subject_from_a_node_names() -> None:
    assert subjects.peer_of("gavel.hb.node-7") == "node-7"
    assert subjects.peer_of("gavel.assign.a") == "a"
    assert subjects.peer_of("gavel.award.a") == ""  # to a node, not from one
    assert subjects.peer_of("gavel.api.status") == ""
    assert subjects.peer_of("gavel.bids.a.b") == "" and subjects.peer_of("$KV.gavel-nodes.a") == ""
