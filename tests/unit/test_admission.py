"""`shared.admission`: the caps on one service's replicas and on the cluster's live instances,
in memory (tests/integration/test_admission.py puts them to a real broker)."""

from __future__ import annotations

import msgspec

from gavel.shared.admission import DEFAULT_CAPS, Caps, refusal, room
from gavel.shared.api import REPLY_IDS_MAX, SubmitReply, counted_ids
from gavel.shared.reasons import Reason

CAPS = Caps(per_service=10, instances=100)


def test_within_the_caps_is_admitted() -> None:
    assert refusal(CAPS, live=90, adding=10) == ""
    assert refusal(CAPS, live=90, adding=10, service_count=10) == ""


def test_beyond_a_cap_is_one_sentence_naming_it_and_its_flag() -> None:
    over = refusal(CAPS, live=0, adding=11, service_count=11)
    assert over.startswith(Reason.OVER_SERVICE_CAP) and "cap is 10" in over
    assert "--max-service-count" in over
    full = refusal(CAPS, live=95, adding=6)
    assert full.startswith(Reason.OVER_CLUSTER_CAP) and "cap is 100" in full
    assert "95 live and 6 more" in full and "--max-instances" in full


def test_zero_is_no_cap_and_the_defaults_admit_a_large_cluster() -> None:
    assert refusal(Caps(0, 0), live=10**9, adding=10**6, service_count=10**6) == ""
    assert refusal(DEFAULT_CAPS, live=0, adding=100_000, service_count=100_000) != ""


def test_a_large_submits_answer_is_its_first_id_and_count() -> None:
    """`SubmitReply.of`: up to `REPLY_IDS_MAX` ids listed, beyond that the first and the
    count, and `ids()` gives every id back either way."""
    many = counted_ids("web-ab12cd", REPLY_IDS_MAX + 1)
    big = SubmitReply.of(many)
    assert big.instance_ids == [] and big.count == len(many) and big.ids() == many
    assert len(msgspec.msgpack.encode(SubmitReply.of(counted_ids("w", 100_000)))) < 100
    few = counted_ids("web", 3)
    assert SubmitReply.of(few).instance_ids == few and SubmitReply.of(few).ids() == few
    assert SubmitReply.of(["one"]).ids() == ["one"]


def test_the_room_left_under_the_cluster_cap() -> None:
    """Rule 4: what the broker may still make on its own; none past the cap, any with none."""
    assert room(CAPS, live=97) == 3
    assert room(CAPS, live=100) == 0 and room(CAPS, live=120) == 0
    assert room(Caps(10, 0), live=10**9) is None
