"""Who owns a route: the first workload (a service, or a job's spec name) to claim a host, or
a host and path prefix, owns it; a claim of another workload that overlaps it is refused.

Rules:
1. Two routes overlap when they name the same host (two exact hosts, two wildcards, or
   both none) and their path prefixes overlap: equal, either matches every path, or one is
   the other plus more segments (``/api`` holds ``/api/v2``). ``/`` is no prefix at all (it
   matches every path).
2. Hosts of different kinds never overlap: an exact host always beats a wildcard, and a
   wildcard a route with no host (`gavel.shared.routes` rule 4), whatever their paths, so
   the less specific claim cannot take the more specific one's traffic, and a more
   specific claim carves its names out of the wider one (``web.example.com`` out of
   ``*.example.com``, as a DNS zone's exact record does out of its wildcard).
3. A claim of the owner itself (a new version of a service, another job instance of the
   same spec name) is never refused: a workload may change its own routes.
4. The first owner found in `claims`' order is the one named; the broker passes the claims
   in a fixed order (services by name, then jobs by instance id), so the same state gives
   the same sentence.
"""

from __future__ import annotations

from collections.abc import Iterable

from gavel.shared.spec import Route

__all__ = ["conflict", "overlap"]


def _prefix(route: Route) -> str:
    return "" if route.prefix == "/" else route.prefix


def _paths_overlap(p: str, q: str) -> bool:
    return not p or not q or p == q or q.startswith(p + "/") or p.startswith(q + "/")


def overlap(a: Route, b: Route) -> bool:
    """Rules 1-2."""
    return a.host == b.host and _paths_overlap(_prefix(a), _prefix(b))


def _label(route: Route) -> str:
    return f"{route.host}{_prefix(route)}" or "every request"


def conflict(claims: Iterable[tuple[str, Route]], workload: str,
             routes: Iterable[Route]) -> str:
    """Why `workload` may not claim `routes` given the owners' `claims` (workload, route):
    one sentence naming the route and its owner, or "" when every route is free (rule 3)."""
    wanted = list(routes)
    for owner, owned in claims:
        if owner == workload:
            continue
        for route in wanted:
            if overlap(route, owned):
                return (f"{_label(route)} overlaps {_label(owned)}, owned by {owner!r} "
                        "(the first workload to claim a route owns it)")
    return ""
