"""`shared.retries`: which waiting instances are parked until a retry time."""

from __future__ import annotations

from gavel.shared.retries import Retries


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
