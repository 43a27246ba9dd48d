"""Port allocation from a node's free set — no hashing, no collisions.

Rule: a node offers a port range; the ports in use are exactly those recorded in its
node.json (plus any the worker reported as taken by something outside gavel). An instance
gets the lowest free ports, one per name, so the same state always gives the same ports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["allocate"]


def allocate(
    names: Sequence[str], port_range: Sequence[int], in_use: Iterable[int]
) -> dict[str, int] | None:
    """One port per name from ``[first, last]`` avoiding `in_use`; None if too few are free."""
    if not names:
        return {}
    if len(port_range) != 2 or port_range[0] > port_range[1]:
        return None
    used = set(in_use)
    out: dict[str, int] = {}
    port = port_range[0]
    it = iter(names)
    name = next(it, None)
    while name is not None and port <= port_range[1]:
        if port not in used:
            out[name] = port
            name = next(it, None)
        port += 1
    return out if name is None else None
