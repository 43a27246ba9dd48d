"""The gateway's route table, derived from what runs where: a pure function of the live
instances whose specs declare routes, the nodes' addresses and the health each node reports.

Rules:
1. A route is one (workload, host, path prefix). A workload is a service (its replicas), or
   otherwise a spec name (the instances of a job submitted with a count): each route its
   spec declares leads to all of them at once.
2. A replica counts when it runs (state ``running``) on a node that is heard from (healthy)
   and has a usable address (an IP address or a DNS name: anything else would make Caddy
   refuse the whole table), and its own health is ``healthy`` - or, only for a spec that
   declares no checks, not known - never ``checking`` or ``unhealthy``: a replica whose
   spec has checks gets traffic only once they pass, in a rollout too.
3. A port route balances across every counting replica, at its node's address and the port
   the allocator gave it. A files route serves one directory: a static root (an absolute
   `Route.files`) as written, or the directory inside the instance's own directory on its
   node, of the first counting replica (lowest instance id) whose node names that directory.
   Either way a route leads somewhere only while a replica counts.
4. The table is in the order a gateway must try it (the first route that matches wins): a
   route with an exact host, then one with a wildcard host, then one without a host (an
   exact host always beats a wildcard); a longer path prefix before a shorter (``/`` is no
   prefix); then by host, prefix and workload - a total order, so the same inputs give the
   same table wherever it is derived. A route matching exactly what an earlier one that
   leads somewhere matches is kept, marked as shadowed by that one's workload: it is what
   the gateway really serves (`gavel.shared.routeclaims` refuses such a claim at submit;
   the rule covers claims that raced past it).
5. A route with nowhere to lead stays in the table, with no upstream and no root: `gavel
   routes` shows it, a gateway leaves it out (a request for it is not found).
6. A route's id is made from its workload, host and prefix, never from a position: a route
   that does not change keeps its id while others come and go.
7. When replicas of one workload run versions whose specs declare one route differently,
   the newest version's declaration (then the lowest instance id's) decides the route's
   kind, port name and prefix stripping; each replica is reached by its own spec's port.
8. Given the cluster's node book (`gavel.shared.nodebook`), an upstream is only ever a
   node's address as the book gives it and a port inside the book's range for that node
   (and a files route's directory is under the book's instance directory, when it names one):
   what a node advertises in its heartbeats is not used, and a node the book does not name
   leads nowhere. Without a book, the address the node advertises is used (a gateway says
   so when it starts). A port in `reserved` - the cluster's own: Caddy's listeners and
   admin, NATS, the dashboard, the API and metrics - is never an upstream, on any address.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Collection, Iterable, Mapping

import msgspec

from gavel.shared.api import Endpoint, NodeAddress
from gavel.shared.nodebook import KnownNode, usable_address
from gavel.shared.spec import Route

__all__ = ["RouteEntry", "Upstream", "counts", "derive", "route_id", "usable_address"]

RUNNING = "running"
#: The instance healths that let a running replica count (rule 2): healthy, or not known.
HEALTHY = "healthy"
ROUTABLE_HEALTH = frozenset({"", HEALTHY})
#: The node health whose instances can be reached (`gavel.shared.health.Health.HEALTHY`).
NODE_HEARD = "healthy"


class Upstream(msgspec.Struct, kw_only=True, frozen=True):
    """One replica a port route leads to."""

    instance_id: str
    node_id: str
    address: str
    port: int

    @property
    def dial(self) -> str:
        """``address:port``, an IPv6 address in brackets."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


class RouteEntry(msgspec.Struct, kw_only=True):
    """One row of the table: what it matches and where it leads now."""

    id: str
    #: The workload: the service's name, or the spec name of a job's instances.
    name: str
    host: str = ""
    #: The path prefix matched ("" for none; never a trailing slash, "/" matches all).
    path: str = ""
    strip_prefix: bool = False
    #: A port route: the port name it reaches.
    port: str = ""
    #: A files route: the directory as the spec names it, and the one served now.
    files: str = ""
    root: str = ""
    upstreams: list[Upstream] = []
    #: The workload's live instances declaring this route, counting or not.
    replicas: int = 0
    #: The workload of an earlier route that matches the same host and prefix (rule 4).
    shadowed_by: str = ""

    @property
    def static(self) -> bool:
        """A files route with a static root (an absolute directory on the gateway's host)."""
        return self.files.startswith("/")

    @property
    def leads_somewhere(self) -> bool:
        return bool(self.upstreams) if self.port else bool(self.root)


def route_id(name: str, host: str, prefix: str) -> str:
    """Rule 6: ``gavel-<workload>-<10 hex digits of host and prefix>``."""
    digest = hashlib.sha1(f"{host}\0{prefix}".encode()).hexdigest()[:10]
    return f"gavel-{name}-{digest}"


def counts(ep: Endpoint, nodes: dict[str, NodeAddress]) -> bool:
    """Rule 2: the replica may be led to."""
    node = nodes.get(ep.node_id)
    healthy = ep.health == HEALTHY if ep.checked else ep.health in ROUTABLE_HEALTH
    return (ep.state == RUNNING and healthy and node is not None
            and node.health == NODE_HEARD and usable_address(node.address))


def _root(route: Route, ep: Endpoint, nodes: dict[str, NodeAddress]) -> str:
    files = route.files or ""
    if files.startswith("/"):
        return posixpath.normpath(files)
    workdir = nodes[ep.node_id].workdir
    if not workdir.startswith("/"):
        return ""
    return posixpath.normpath(posixpath.join(workdir, ep.instance_id, files))


def _order(entry: RouteEntry) -> tuple[int, int, str, str, str]:
    """Rule 4: exact hosts, wildcards, no host; longer prefixes first; then host, prefix,
    workload."""
    kind = 2 if not entry.host else 1 if entry.host.startswith("*.") else 0
    path = "" if entry.path == "/" else entry.path
    return (kind, -len(path), entry.host, path, entry.name)


def _known(nodes: Iterable[NodeAddress],
           book: Mapping[str, KnownNode] | None) -> dict[str, NodeAddress]:
    """Rule 8: each node at the address (and instance directory, if it has one) the book
    gives it; a node it does not name, nowhere."""
    if book is None:
        return {n.node_id: n for n in nodes}
    return {n.node_id: msgspec.structs.replace(n, address=book[n.node_id].address,
                                               workdir=book[n.node_id].workdir or n.workdir)
            for n in nodes if n.node_id in book}


def _allowed_port(port: int, node_id: str, book: Mapping[str, KnownNode] | None,
                  reserved: Collection[int]) -> bool:
    """Rule 8."""
    return port not in reserved and (book is None or book[node_id].holds(port))


def derive(endpoints: Iterable[Endpoint], nodes: Iterable[NodeAddress], *,
           book: Mapping[str, KnownNode] | None = None,
           reserved: Collection[int] = ()) -> list[RouteEntry]:
    """The route table (rules 1-8), in the order a gateway tries it."""
    where = _known(nodes, book)
    groups: dict[tuple[str, str, str], list[tuple[Endpoint, Route]]] = {}
    # Newest version first, then by id: the first of a group declares its route (rule 7),
    # and upstreams come out in instance-id order whatever order the broker answered in.
    for ep in sorted(endpoints, key=lambda e: (-e.version, e.instance_id)):
        for route in ep.routes:
            groups.setdefault((ep.service or ep.name, *route.key), []).append((ep, route))
    table: list[RouteEntry] = []
    for (name, host, prefix), members in groups.items():
        first = members[0][1]
        entry = RouteEntry(id=route_id(name, host, prefix), name=name, host=host,
                           path=prefix, strip_prefix=first.strips,
                           port=first.port or "", files=first.files or "",
                           replicas=len(members))
        live = sorted(((ep, r) for ep, r in members if counts(ep, where)),
                      key=lambda m: m[0].instance_id)
        if entry.port:
            entry.upstreams = [
                Upstream(instance_id=ep.instance_id, node_id=ep.node_id,
                         address=where[ep.node_id].address, port=ep.ports[r.port])
                for ep, r in live if r.port is not None and r.port in ep.ports
                and _allowed_port(ep.ports[r.port], ep.node_id, book, reserved)]
        else:
            entry.root = next((root for ep, r in live if r.files is not None
                               and (root := _root(r, ep, where))), "")
        table.append(entry)
    table.sort(key=_order)
    first_of: dict[tuple[str, str], str] = {}
    for entry in table:
        match = (entry.host, "" if entry.path == "/" else entry.path)
        if match in first_of:
            entry.shadowed_by = first_of[match]
        elif entry.leads_somewhere:
            first_of[match] = entry.name
    return table
