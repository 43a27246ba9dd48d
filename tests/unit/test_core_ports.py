"""Port allocation: the lowest free ports in the node's range, one per name, or None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.ports import allocate


def test_lowest_free_ports_in_name_order() -> None:
    got = allocate(["http", "admin"], [8000, 8010], {8000, 8002})
    assert got == {"http": 8001, "admin": 8003}


def test_range_is_inclusive() -> None:
    assert allocate(["a"], [8000, 8000], []) == {"a": 8000}
    assert allocate(["a", "b"], [8000, 8001], []) == {"a": 8000, "b": 8001}


def test_no_names_need_no_ports() -> None:
    assert allocate([], [8000, 8000], [8000]) == {}
    assert allocate([], [], []) == {}


def test_too_few_free_ports_is_none() -> None:
    assert allocate(["a", "b"], [8000, 8002], [8001, 8002]) is None
    assert allocate(["a"], [8000, 8000], [8000]) is None


def test_a_bad_range_is_none() -> None:
    assert allocate(["a"], [8010, 8000], []) is None
    assert allocate(["a"], [8000], []) is None
    assert allocate(["a"], [8000, 8001, 8002], []) is None


@given(
    names=st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=4), unique=True, max_size=6),
    first=st.integers(1024, 1100),
    width=st.integers(0, 10),
    used=st.sets(st.integers(1020, 1115), max_size=12),
)
def test_allocation_is_distinct_free_in_range_and_complete(names: list[str], first: int,
                                                          width: int, used: set[int]) -> None:
    last = first + width
    free = sorted(set(range(first, last + 1)) - used)
    got = allocate(names, [first, last], used)
    if len(free) < len(names):
        assert got is None
    else:
        assert got is not None
        assert list(got) == names
        assert list(got.values()) == free[: len(names)]  # lowest first, in name order
