"""The route table, derived in memory: live instances + node addresses + health -> routes
(`gavel.shared.routes`)."""

from __future__ import annotations

import random

import pytest

from gavel.shared.api import Endpoint, NodeAddress
from gavel.shared.nodebook import KnownNode
from gavel.shared.routes import RouteEntry, Upstream, derive, route_id
from gavel.shared.spec import Route

WEB = [Route(path="/web", port="http")]


def ep(iid: str, node: str = "n1", *, name: str = "web", state: str = "running",
       health: str = "", port: int = 30000, routes: list[Route] | None = None,
       service: str = "", version: int = 0) -> Endpoint:
    return Endpoint(instance_id=iid, name=name, state=state, node_id=node,
                    ports={"http": port}, health=health, service=service, version=version,
                    routes=WEB if routes is None else routes)


def node(node_id: str, address: str = "10.0.0.1", health: str = "healthy",
         workdir: str = "/var/lib/gavel/instances") -> NodeAddress:
    return NodeAddress(node_id=node_id, address=address, health=health, workdir=workdir)


NODES = [node("n1", "10.0.0.1"), node("n2", "10.0.0.2"), node("n3", "10.0.0.3")]


def dials(entry: RouteEntry) -> list[str]:
    return [u.dial for u in entry.upstreams]


def test_one_route_leads_to_every_running_replica_at_its_node_and_port() -> None:
    table = derive([ep("web-3", "n3", port=30003), ep("web-1", "n1", port=30001),
                    ep("web-2", "n2", port=30002)], NODES)
    assert len(table) == 1
    (entry,) = table
    assert (entry.name, entry.host, entry.path, entry.port) == ("web", "", "/web", "http")
    assert dials(entry) == ["10.0.0.1:30001", "10.0.0.2:30002", "10.0.0.3:30003"]
    assert entry.upstreams[0] == Upstream(instance_id="web-1", node_id="n1",
                                          address="10.0.0.1", port=30001)
    assert entry.replicas == 3 and entry.leads_somewhere
    assert entry.id == route_id("web", "", "/web")


@pytest.mark.parametrize(("change", "counts"), [
    ({"health": "healthy"}, True),
    ({"health": ""}, True),  # no checks (or none reported yet): running is what counts
    ({"health": "unhealthy"}, False),
    ({"health": "checking"}, False),
    ({"state": "placed"}, False),
    ({"state": "provisioning"}, False),
    ({"state": "queued", "node": ""}, False),
    ({"state": "cancelling"}, False),
])
def test_a_replica_counts_only_running_and_not_known_unhealthy(change: dict[str, str],
                                                               counts: bool) -> None:
    change = {"node": "n2", **change}
    table = derive([ep("web-1", port=30001), ep("web-2", port=30002, **change)], NODES)
    assert dials(table[0]) == (["10.0.0.1:30001", "10.0.0.2:30002"] if counts
                               else ["10.0.0.1:30001"])
    assert table[0].replicas == 2


@pytest.mark.parametrize("n2", [node("n2", health="unreachable"), node("n2", health="offline"),
                                node("n2", address=""), node("n2", address="evil/x"),
                                node("n2", address="a b"), node("n2", address="host:80")])
def test_a_replica_on_a_node_not_heard_from_or_not_advertised_does_not_count(
        n2: NodeAddress) -> None:
    table = derive([ep("web-1", port=30001), ep("web-2", "n2", port=30002)],
                   [node("n1"), n2])
    assert dials(table[0]) == ["10.0.0.1:30001"]
    assert derive([ep("web-2", "n2")], [n2])[0].upstreams == []
    assert derive([ep("web-2", "n9")], NODES)[0].upstreams == []  # a node never heard of


def test_a_moved_replica_is_followed_to_its_new_node_and_port() -> None:
    before = derive([ep("web-1", "n1", port=30001)], NODES)
    after = derive([ep("web-1", "n2", port=31005)], NODES)
    assert dials(before[0]) == ["10.0.0.1:30001"] and dials(after[0]) == ["10.0.0.2:31005"]
    assert before[0].id == after[0].id


def test_a_route_with_no_counting_replica_stays_in_the_table_leading_nowhere() -> None:
    (entry,) = derive([ep("web-1", state="provisioning")], NODES)
    assert entry.upstreams == [] and not entry.leads_somewhere and entry.replicas == 1
    assert derive([], NODES) == []


def test_the_table_is_ordered_most_specific_first_and_marks_what_is_shadowed() -> None:
    eps = [ep("root-1", name="root", routes=[Route(path="/", port="http")]),
           ep("api-1", name="api", routes=[Route(path="/api", port="http")]),
           ep("v2-1", name="v2", routes=[Route(path="/api/v2", port="http")]),
           ep("site-1", name="site", routes=[Route(host="a.example", port="http")]),
           ep("siteapi-1", name="siteapi", routes=[Route(host="a.example", path="/api",
                                                         port="http")]),
           ep("other-1", name="other", routes=[Route(path="/api/", port="http")])]
    table = derive(eps, NODES)
    assert [(e.host, e.path, e.name) for e in table] == [
        ("a.example", "/api", "siteapi"), ("a.example", "", "site"), ("", "/api/v2", "v2"),
        ("", "/api", "api"), ("", "/api", "other"), ("", "/", "root")]
    assert [e.shadowed_by for e in table] == ["", "", "", "", "api", ""]


def test_the_same_inputs_give_the_same_table_in_any_order() -> None:
    eps = [ep(f"web-{i}", f"n{1 + i % 3}", port=30000 + i) for i in range(9)]
    eps += [ep(f"api-{i}", "n1", name="api", port=31000 + i,
               routes=[Route(host="api.example", port="http")]) for i in range(3)]
    want = derive(eps, NODES)
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(eps)
        nodes = list(NODES)
        rng.shuffle(nodes)
        assert derive(eps, nodes) == want


def test_a_route_id_depends_on_its_workload_host_and_prefix_only() -> None:
    alone = derive([ep("web-1")], NODES)[0].id
    crowded = derive([ep("web-1"), ep("api-1", name="api",
                                      routes=[Route(path="/web/x", port="http")])], NODES)
    assert alone in {e.id for e in crowded}
    assert route_id("web", "", "/web") != route_id("web", "", "/web2") \
        != route_id("api", "", "/web")
    assert alone.startswith("gavel-web-")


def test_a_services_replicas_share_its_routes_and_the_newest_version_declares_them() -> None:
    old = [Route(path="/shop", port="http")]
    new = [Route(path="/shop", port="http", strip_prefix=True)]
    eps = [ep("shop-a", name="shop", service="shop", version=1, port=30001, routes=old),
           ep("shop-b", "n2", name="shop", service="shop", version=2, port=30002, routes=new),
           ep("shop-c", "n3", name="shop", service="shop", version=2, port=30003, routes=new,
              health="unhealthy")]
    (entry,) = derive(eps, NODES)
    assert entry.name == "shop" and entry.strip_prefix
    assert not derive(eps[:1], NODES)[0].strip_prefix  # a port route's default
    assert dials(entry) == ["10.0.0.1:30001", "10.0.0.2:30002"]  # both versions balance
    assert entry.replicas == 3


def test_a_files_route_serves_the_first_counting_replicas_directory_on_its_node() -> None:
    files = [Route(path="/out", files="www/")]
    eps = [ep("job-2", "n2", name="job", routes=files), ep("job-1", "n1", name="job",
                                                           routes=files, state="placed"),
           ep("job-3", "n3", name="job", routes=files)]
    (entry,) = derive(eps, NODES)
    assert entry.root == "/var/lib/gavel/instances/job-2/www" and entry.files == "www/"
    assert entry.strip_prefix  # mounted at its path, by default
    assert entry.upstreams == [] and entry.leads_somewhere and not entry.static
    # A node that names no (absolute) directory offers none: the next replica's is served.
    (other,) = derive(eps, [node("n1"), node("n2", workdir=""), node("n3", workdir="rel")])
    assert other.root == ""
    (third,) = derive(eps, [node("n1"), node("n2", workdir=""), node("n3")])
    assert third.root == "/var/lib/gavel/instances/job-3/www"


def test_a_static_root_is_served_while_a_replica_runs() -> None:
    static = [Route(host="docs.example", files="/srv/docs/./site")]
    (entry,) = derive([ep("docs-1", name="docs", routes=static)], NODES)
    assert entry.root == "/srv/docs/site" and entry.static
    (gone,) = derive([ep("docs-1", name="docs", routes=static, state="placed")], NODES)
    assert gone.root == "" and not gone.leads_somewhere


def test_an_ipv6_address_is_dialled_in_brackets() -> None:
    (entry,) = derive([ep("web-1", port=30001)], [node("n1", address="fd00::1")])
    assert dials(entry) == ["[fd00::1]:30001"]


def test_an_exact_host_beats_a_wildcard_and_slash_is_no_prefix() -> None:
    """Finding 4: ``*.example.com`` sorted before the exact host, and ``host + "/"`` before
    the bare host, so Caddy sent the exact host's traffic elsewhere."""
    eps = [ep("wild-1", name="wild", routes=[Route(host="*.example.com", port="http")]),
           ep("web-1", name="web", routes=[Route(host="web.example.com", port="http")]),
           ep("slash-1", name="slash", routes=[Route(host="web.example.com", path="/",
                                                     port="http")]),
           ep("any-1", name="any", routes=[Route(path="/x", port="http")])]
    table = derive(eps, NODES)
    assert [(e.host, e.name) for e in table] == [
        ("web.example.com", "slash"), ("web.example.com", "web"), ("*.example.com", "wild"),
        ("", "any")]
    # "/" and no path match the same requests: the second is shadowed by the first.
    assert [e.shadowed_by for e in table] == ["", "slash", "", ""]


def test_a_route_that_leads_nowhere_shadows_nothing_as_caddy_skips_it() -> None:
    """`gavel routes` names the winner Caddy uses: a first claimant with no counting replica
    is left out of Caddy, so the next one serves and is not marked shadowed."""
    eps = [ep("a-1", name="a", state="placed", routes=[Route(host="h.example", port="http")]),
           ep("b-1", name="b", routes=[Route(host="h.example", port="http")])]
    table = derive(eps, NODES)
    assert [(e.name, e.leads_somewhere, e.shadowed_by) for e in table] == [
        ("a", False, ""), ("b", True, "")]


@pytest.mark.parametrize(("health", "counts"), [
    ("healthy", True), ("", False), ("checking", False), ("unhealthy", False)])
def test_a_replica_whose_spec_has_checks_counts_only_once_they_pass(health: str,
                                                                    counts: bool) -> None:
    """Issue 30 item 2: a replica with checks whose health is not yet known got traffic."""
    e = ep("web-1", health=health)
    e.checked = True
    assert derive([e], NODES)[0].leads_somewhere is counts


def test_with_a_node_book_an_upstream_is_the_books_address_and_a_port_in_its_range() -> None:
    """Finding 3: a node heartbeated a range holding the cluster's own ports and advertised
    127.0.0.1. With the book the operator wrote, what it advertises is not used."""
    book = {"n1": KnownNode(address="10.0.0.1", ports=(30000, 30099)),
            "n2": KnownNode(address="10.0.0.2", ports=(30000, 30099))}
    liars = [node("n1", "127.0.0.1"), node("n2", "10.0.0.2"), node("n3", "127.0.0.1")]
    eps = [ep("web-1", "n1", port=30001), ep("web-2", "n2", port=4222),
           ep("web-3", "n3", port=30003)]
    (entry,) = derive(eps, liars, book=book)
    assert dials(entry) == ["10.0.0.1:30001"]  # n2's port is outside its range, n3 unknown
    (open_,) = derive(eps, liars)
    assert dials(open_) == ["127.0.0.1:30001", "10.0.0.2:4222", "127.0.0.1:30003"]


def test_a_reserved_port_of_the_cluster_is_never_an_upstream() -> None:
    eps = [ep("web-1", "n1", port=2019), ep("web-2", "n2", port=30002)]
    (entry,) = derive(eps, NODES, reserved={2019, 4222})
    assert dials(entry) == ["10.0.0.2:30002"]
    (alone,) = derive(eps[:1], NODES, reserved={2019})
    assert not alone.leads_somewhere


def test_with_a_node_book_a_files_route_is_under_the_books_instance_directory() -> None:
    """A node reports its own instance directory; the book's, when it names one, wins."""
    site = [Route(path="/site", files="www")]
    book = {"n1": KnownNode(address="10.0.0.1", ports=(1, 2), workdir="/srv/gavel"),
            "n2": KnownNode(address="10.0.0.2", ports=(1, 2))}
    lying = [node("n1", workdir="/etc"), node("n2", workdir="/var/n2")]
    (one,) = derive([ep("site-1", "n1", routes=site)], lying, book=book)
    assert one.root == "/srv/gavel/site-1/www"
    (two,) = derive([ep("site-2", "n2", routes=site)], lying, book=book)
    assert two.root == "/var/n2/site-2/www"
