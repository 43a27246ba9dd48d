"""`shared.waiting`: which waiting instances are parked until a retry time."""

from __future__ import annotations

from gavel.shared import waiting
from gavel.shared.waiting import Retries, added, tail


def test_an_instance_is_parked_until_its_time_and_no_longer() -> None:
    r = Retries()
    r.park("a", 10.0)
    r.park("b", 5.0)
    r.due(4.9)
    assert r.parked == {"a", "b"} and r.earliest() == 5.0
    r.due(5.0)
    assert r.parked == {"a"} and r.earliest() == 10.0
    r.due(10.0)
    assert r.parked == set() and r.earliest() == float("inf")
    assert r.at == {"a": 10.0, "b": 5.0}  # the times stay, as the auctioneer's retry_at


def test_parked_again_later_is_not_unparked_at_the_earlier_time() -> None:
    """Rule 2: the old heap entry is stale once the instance has a new time."""
    r = Retries()
    r.park("a", 5.0)
    r.park("a", 20.0)
    r.due(5.0)
    assert r.parked == {"a"} and r.earliest() == 20.0
    r.due(20.0)
    assert r.parked == set()


def test_parked_again_sooner_is_unparked_at_the_sooner_time() -> None:
    r = Retries()
    r.park("a", 20.0)
    r.park("a", 5.0)
    assert r.earliest() == 5.0
    r.due(5.0)
    assert r.parked == set() and r.earliest() == float("inf")


def test_cleared_nothing_is_parked_and_old_entries_unpark_nothing() -> None:
    r = Retries()
    r.park("a", 5.0)
    r.clear()
    r.park("b", 1.0)
    r.due(6.0)
    assert r.parked == set() and r.at == {"b": 1.0}


def test_what_was_added_since_a_tail_is_read_from_the_end_oldest_first() -> None:
    """Rule 4."""
    before = dict.fromkeys(["a", "b", "c"])
    since = tail(before)
    assert since == (3, "c")
    assert added({**before, "d": None, "e": None}, since, 10) == ["d", "e"]
    assert added({**before, "d": None, "e": None}, since, 1) is None  # more than `most`
    assert added({"a": None, "b": None, "d": None}, since, 10) is None  # "c" left
    assert added({"b": None, "c": None, "d": None, "e": None}, since, 10) is None  # "a" left
    assert added({"a": None, "b": None, "d": None, "c": None}, since, 10) is None  # "c" again
    assert added(["x"], (0, None), 10) == ["x"]  # from nothing
    assert added(iter(["x"]), since, 10) is None and tail(iter(["x"])) is None


def test_the_backlog_is_the_pending_work_less_what_is_held_counted_by_size() -> None:
    """Rule 5: nothing is read; what is not a sized collection says nothing waits."""
    pending = dict.fromkeys(f"i{k}" for k in range(10))
    assert waiting.backlog(pending, {"i0", "i1"}, {"i9"}) == 7
    assert waiting.backlog(pending) == 10
    assert waiting.backlog(pending, set(pending), {"gone"}) == 0  # never below nothing
    assert waiting.backlog(iter(pending), {"i0"}) == 0
