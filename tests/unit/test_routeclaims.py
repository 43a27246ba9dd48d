"""Route ownership in memory (`gavel.shared.routeclaims`) and the wildcard rule of a route's
host (`gavel.shared.suffixes`)."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared.routeclaims import conflict, overlap
from gavel.shared.spec import Route


def r(host: str = "", path: str = "") -> Route:
    return Route(host=host, path=path, port="http")


@pytest.mark.parametrize(("a", "b", "both"), [
    (r("web.example.com"), r("web.example.com"), True),
    (r("web.example.com"), r("web.example.com", "/"), True),  # "/" is every path
    (r("web.example.com"), r("web.example.com", "/api"), True),
    (r("web.example.com", "/api"), r("web.example.com", "/api/v2"), True),
    (r("web.example.com", "/api"), r("web.example.com", "/apix"), False),
    (r("web.example.com", "/a"), r("web.example.com", "/b"), False),
    (r(path="/api"), r(path="/api/v2"), True),
    (r(path="/api"), r("web.example.com", "/api"), False),  # a host beats none
    (r(path="/api"), r("web.example.com"), False),
    (r("a.example.com"), r("b.example.com"), False),
    (r("*.example.com"), r("web.example.com"), False),  # the exact host always wins
    (r("*.example.com"), r("*.example.com", "/x"), True),
    (r("*.example.com"), r(path="/x"), False),
])
def test_two_routes_overlap_when_one_request_could_match_both(a: Route, b: Route,
                                                              both: bool) -> None:
    assert overlap(a, b) is both and overlap(b, a) is both


def test_the_owner_is_named_and_may_claim_its_own_routes_again() -> None:
    owners = [("web", r("web.example.com")), ("api", r(path="/api"))]
    assert conflict(owners, "web", [r("web.example.com", "/")]) == ""
    why = conflict(owners, "thief", [r("web.example.com", "/")])
    assert why == ("web.example.com overlaps web.example.com, owned by 'web' (the first "
                   "workload to claim a route owns it)")
    assert "/api/v2 overlaps /api, owned by 'api'" in conflict(owners, "thief",
                                                               [r(path="/api/v2")])
    assert conflict(owners, "new", [r("new.example.com"), r(path="/new")]) == ""
    assert conflict(owners, "wild", [r("*.example.com")]) == ""


@pytest.mark.parametrize("host", ["*.com", "*.co.uk", "*.github.io", "*.localhost"])
def test_a_wildcard_over_a_public_suffix_alone_is_refused(host: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="covers a public suffix"):
        msgspec.convert({"host": host, "port": "http"}, Route)


@pytest.mark.parametrize("host", ["*.example.com", "*.shop.co.uk", "*.me.github.io"])
def test_a_wildcard_under_a_domain_of_ones_own_is_accepted(host: str) -> None:
    assert msgspec.convert({"host": host, "port": "http"}, Route).host == host
