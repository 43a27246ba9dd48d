"""`transport.ports`: free ports below the kernel's ephemeral range, walked per process."""

from __future__ import annotations

import socket

from gavel.transport import ports
from gavel.transport.ports import free_port, walk_range


def test_the_walk_stays_below_the_ephemeral_range() -> None:
    assert walk_range((32768, 60999)) == range(10000, 20000)
    assert walk_range((16000, 60999)) == range(10000, 16000)
    assert walk_range((1024, 65535)) is None  # rule 4: nothing below to walk
    assert walk_range(None) is None


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    low, high = ports._ephemeral() or (0, 0)
    chosen = [free_port() for _ in range(50)]
    assert len(set(chosen)) == 50
    if walk_range((low, high)) is not None:
        assert all(10000 <= p < min(low, 20000) for p in chosen)
    for p in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))


def test_a_port_something_listens_on_is_skipped() -> None:
    walk = ports._Walk()
    if walk.ports is None:
        return
    while not ports._bindable(walk.ports[walk.at]):
        walk.at += 1
    start = walk.ports[walk.at]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", start))
        s.listen()
        assert walk.next() != start
