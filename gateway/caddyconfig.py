"""The route table as Caddy JSON, and the admin API requests that make a Caddy hold it: pure
functions of the table and of the config Caddy answers ``GET /config/`` with.

Rules:
1. gavel owns exactly three objects in a Caddy, each tagged with an ``@id``: the server it
   creates when the named one is missing (``gavel-server-<name>``), one route holding every
   gavel route (``gavel-routes``, a subroute) and the not-found route (``gavel-not-found``).
   Every request it makes names one of them, or appends to / inserts into the server's route
   list: a route or server gavel did not create is never read back, rewritten or removed.
2. One route holds all of gavel's routes, each route of the table a route inside it, rather
   than one top-level route per service or per instance: Caddy takes the first route that
   matches, so the table's order (`gavel.shared.routes` rule 4) is kept by writing the whole
   table in one request, atomically, and an operator's own routes keep their places around
   it. A route per service inside it balances across the replicas (one reverse_proxy with
   every replica as an upstream); a route per instance could not, the first one to match
   would take every request. Each inner route carries its table id too, so
   ``GET /id/<route id>`` shows one.
3. The not-found route answers 404 for what nothing else matched (a Caddy that matches
   nothing answers an empty 200, which would make a route that went away look up); it is
   kept the last of the server's routes, so an operator's route added after it still serves.
4. `plan` compares what Caddy holds with what it should hold and answers only the requests
   that close the gap: none when they agree, so re-deriving the same table changes nothing,
   and a Caddy that lost its config (restarted) gets all of it back.
5. A files route of an instance's own directory is proxied to the gateway's confined file
   server (`gateway.files`: ``/<route id>/<path>`` on its unix socket), never served by
   Caddy's file_server, which follows symbolic links out of the directory; without that
   server (`files_dial` empty) such a route is left out. A static root - a directory the
   operator offered (`keeper` rule 6) - is Caddy's file_server's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gavel.shared.routes import RouteEntry

__all__ = ["NOT_FOUND_ID", "ROUTES_ID", "Desired", "Op", "caddy_route", "desired", "not_found",
           "plan", "routes_object", "server_id", "server_object"]

ROUTES_ID = "gavel-routes"
NOT_FOUND_ID = "gavel-not-found"
NOT_FOUND_BODY = "no gavel route matches this request\n"
#: How long a proxied request may try the other replicas after one refused it, and how long
#: Caddy leaves a replica that failed out of the rotation (until the next table says more).
TRY_DURATION = "1s"
FAIL_DURATION = "5s"

JSON = dict[str, Any]


@dataclass(frozen=True)
class Op:
    """One admin API request: ``method path`` with a JSON body (None: no body)."""

    method: str
    path: str
    body: Any = None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Desired:
    """What the Caddy should hold: gavel's routes, in the server `server` (which gavel
    creates, listening on `listen`, when it is missing)."""

    server: str
    listen: tuple[str, ...]
    routes: JSON


def server_id(name: str) -> str:
    return f"gavel-server-{name}"


def caddy_route(entry: RouteEntry, files_dial: str = "") -> JSON:
    """One table row as a Caddy route (rules 2 and 5); the caller leaves out rows that lead
    nowhere."""
    match: JSON = {}
    if entry.host:
        match["host"] = [entry.host]
    if entry.path and entry.path != "/":
        match["path"] = [entry.path, f"{entry.path}/*"]
    handle: list[JSON] = []
    if entry.strip_prefix and entry.path not in ("", "/"):
        handle.append({"handler": "rewrite", "strip_path_prefix": entry.path})
    if entry.port:
        handle.append({
            "handler": "reverse_proxy",
            "upstreams": [{"dial": u.dial} for u in entry.upstreams],
            "load_balancing": {"selection_policy": {"policy": "round_robin"},
                               "try_duration": TRY_DURATION},
            "health_checks": {"passive": {"fail_duration": FAIL_DURATION}},
        })
    elif entry.static:
        handle.append({"handler": "file_server", "root": entry.root})
    else:
        handle += [{"handler": "rewrite", "uri": f"/{entry.id}{{http.request.uri.path}}"},
                   {"handler": "reverse_proxy", "upstreams": [{"dial": files_dial}]}]
    route: JSON = {"@id": entry.id, "handle": handle, "terminal": True}
    if match:
        route["match"] = [match]
    return route


def routes_object(entries: Iterable[RouteEntry], files_dial: str = "") -> JSON:
    """The one route holding gavel's routes (rule 2). Caddy leaves an empty list out when it
    answers, so an empty table is written without one: what is written is what is read."""
    inner = [caddy_route(e, files_dial) for e in entries if e.leads_somewhere
             and (e.port or e.static or files_dial)]
    subroute: JSON = {"handler": "subroute"}
    if inner:
        subroute["routes"] = inner
    return {"@id": ROUTES_ID, "handle": [subroute]}


def not_found() -> JSON:
    return {"@id": NOT_FOUND_ID, "handle": [{"handler": "static_response", "status_code": 404,
                                              "body": NOT_FOUND_BODY}]}


def server_object(name: str, listen: Sequence[str], routes: JSON) -> JSON:
    """A server gavel creates: plain HTTP (an operator who wants TLS names a server of their
    own, whose automatic HTTPS then covers gavel's hosts too)."""
    return {"@id": server_id(name), "listen": list(listen), "routes": [routes, not_found()],
            "automatic_https": {"disable": True}}


def desired(entries: Iterable[RouteEntry], server: str, listen: Sequence[str],
            files_dial: str = "") -> Desired:
    return Desired(server=server, listen=tuple(listen),
                   routes=routes_object(entries, files_dial))


def _dig(config: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(config, dict):
            return None
        config = config.get(key)
    return config


def _id_of(route: Any) -> Any:
    return route.get("@id") if isinstance(route, dict) else None


def plan(config: Any, want: Desired) -> list[Op]:
    """The requests that make a Caddy whose ``GET /config/`` answered `config` hold `want`
    (rule 4): [] when it already does."""
    ops: list[Op] = []
    servers = _dig(config, "apps", "http", "servers")
    servers = servers if isinstance(servers, dict) else {}
    ours = servers.get(want.server)
    # Our routes in any other server (the server setting changed): removed, by id.
    for name, srv in servers.items():
        if name == want.server:
            continue
        for route in _dig(srv, "routes") or []:
            if _id_of(route) in (ROUTES_ID, NOT_FOUND_ID):
                ops.append(Op("DELETE", f"/id/{_id_of(route)}"))
    if not isinstance(ours, dict):
        fresh = server_object(want.server, want.listen, want.routes)
        if not isinstance(_dig(config, "apps"), dict):
            return [*ops, Op("PUT", "/config/apps", {"http": {"servers": {want.server: fresh}}})]
        if not isinstance(_dig(config, "apps", "http"), dict):
            return [*ops, Op("PUT", "/config/apps/http", {"servers": {want.server: fresh}})]
        if not isinstance(_dig(config, "apps", "http", "servers"), dict):
            return [*ops, Op("PUT", "/config/apps/http/servers", {want.server: fresh})]
        return [*ops, Op("PUT", f"/config/apps/http/servers/{quote(want.server, safe='')}",
                         fresh)]
    base = f"/config/apps/http/servers/{quote(want.server, safe='')}"
    if ours.get("@id") == server_id(want.server) and ours.get("listen") != list(want.listen):
        ops.append(Op("PATCH", f"/id/{server_id(want.server)}/listen", list(want.listen)))
    routes = ours.get("routes")
    if not isinstance(routes, list) or not routes:
        method = "PUT" if "routes" not in ours else "PATCH"
        return [*ops, Op(method, f"{base}/routes", [want.routes, not_found()])]
    ids = [_id_of(r) for r in routes]
    if ROUTES_ID not in ids:
        ops.append(Op("PUT", f"{base}/routes/0", want.routes))  # inserts: first to match
    elif routes[ids.index(ROUTES_ID)] != want.routes:
        ops.append(Op("PATCH", f"/id/{ROUTES_ID}", want.routes))
    if ids[-1] != NOT_FOUND_ID or routes[-1] != not_found():
        if NOT_FOUND_ID in ids:
            ops.append(Op("DELETE", f"/id/{NOT_FOUND_ID}"))
        ops.append(Op("POST", f"{base}/routes", not_found()))  # appends: the last (rule 3)
    return ops
