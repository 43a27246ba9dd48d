"""The Caddy JSON a route table becomes, and the admin requests that install it, in memory:
`plan` against configs as Caddy answers them, applied to a small model of the admin API's
path semantics (the real Caddy answers the same in tests/integration/test_gateway.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gavel.gateway.caddyconfig import (
    NOT_FOUND_ID,
    ROUTES_ID,
    Desired,
    Op,
    caddy_route,
    desired,
    not_found,
    plan,
    routes_object,
    server_id,
    server_object,
)
from gavel.shared.api import Endpoint, NodeAddress
from gavel.shared.routes import RouteEntry, Upstream, derive
from gavel.shared.spec import Route

NODES = [NodeAddress(node_id="n1", address="10.0.0.1", health="healthy",
                     workdir="/w/instances")]


def table(*routes: Route, n: int = 2) -> list[RouteEntry]:
    eps = [Endpoint(instance_id=f"web-{i}", name="web", state="running", node_id="n1",
                    ports={"http": 30000 + i}, routes=list(routes)) for i in range(n)]
    return derive(eps, NODES)


def want(*routes: Route, n: int = 2, listen: tuple[str, ...] = (":8080",)) -> Desired:
    return desired(table(*routes, n=n), "gavel", listen)


HAND = {"match": [{"path": ["/hand"]}], "handle": [{"handler": "static_response",
                                                    "body": "by hand"}]}


# -- a model of the admin API ---------------------------------------------------------------
class AdminModel:
    """``/config/<path>`` and ``/id/<id>/<path>``: GET, PUT (create; insert into an array),
    POST (append to an array, set otherwise), PATCH (replace), DELETE - and a config with
    one @id twice refused, as Caddy refuses it."""

    def __init__(self, config: Any = None) -> None:
        self.config = copy.deepcopy(config)

    def _find_id(self, node: Any, wanted: str, path: list[Any]) -> list[Any] | None:
        if isinstance(node, dict):
            if node.get("@id") == wanted:
                return path
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            return None
        for key, child in items:
            found = self._find_id(child, wanted, [*path, key])
            if found is not None:
                return found
        return None

    def _path(self, url: str) -> list[Any]:
        parts = [p for p in url.split("/") if p]
        if parts[0] == "id":
            base = self._find_id(self.config, parts[1], [])
            assert base is not None, f"unknown id {parts[1]}"
            rest = parts[2:]
        else:
            assert parts[0] == "config"
            base, rest = [], parts[1:]
        return base + [int(p) if p.isdigit() else p for p in rest]

    def apply(self, op: Op) -> None:
        path = self._path(op.path)
        body = copy.deepcopy(op.body)
        if not path:
            assert op.method in ("PUT", "POST", "PATCH")
            self.config = body
            return
        if self.config is None:  # Caddy takes PUT /config/apps on a Caddy with no config
            self.config = {}
        parent: Any = self.config
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        if op.method == "DELETE":
            del parent[last]
        elif op.method == "PATCH":
            assert (last < len(parent)) if isinstance(parent, list) else last in parent
            parent[last] = body
        elif op.method == "PUT":
            if isinstance(parent, list):
                parent.insert(last, body)
            else:
                assert last not in parent, f"PUT {op.path}: key exists"
                parent[last] = body
        elif op.method == "POST":
            target = parent[last] if not isinstance(parent, list) and last in parent else None
            if isinstance(target, list):
                target.append(body)
            else:
                parent[last] = body
        ids = _ids(self.config)
        assert len(ids) == len(set(ids)), f"{op}: an @id twice"

    def converge(self, goal: Desired) -> list[Op]:
        ops = plan(self.config, goal)
        for op in ops:
            self.apply(op)
        return ops


def _ids(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["@id"]] if "@id" in node else []
        return own + [i for v in node.values() for i in _ids(v)]
    if isinstance(node, list):
        return [i for v in node for i in _ids(v)]
    return []


def server_routes(model: AdminModel, name: str = "gavel") -> list[Any]:
    routes: list[Any] = model.config["apps"]["http"]["servers"][name]["routes"]
    return routes


# -- the JSON --------------------------------------------------------------------------------
def test_a_port_route_is_one_reverse_proxy_balancing_round_robin_over_every_replica() -> None:
    (entry,) = table(Route(host="web.example", path="/api/", port="http", strip_prefix=True),
                     n=3)
    assert caddy_route(entry) == {
        "@id": entry.id,
        "match": [{"host": ["web.example"], "path": ["/api", "/api/*"]}],
        "handle": [
            {"handler": "rewrite", "strip_path_prefix": "/api"},
            {"handler": "reverse_proxy",
             "upstreams": [{"dial": "10.0.0.1:30000"}, {"dial": "10.0.0.1:30001"},
                           {"dial": "10.0.0.1:30002"}],
             "load_balancing": {"selection_policy": {"policy": "round_robin"},
                                "try_duration": "1s"},
             "health_checks": {"passive": {"fail_duration": "5s"}}}],
        "terminal": True}


def test_a_files_route_goes_to_the_confined_file_server_and_a_catch_all_has_no_matcher(
        ) -> None:
    """An instance's directory is never Caddy's file_server's (it follows links out of it,
    finding 2 of issue 29): its requests go to the gateway's own file server as
    ``/<route id>/<path>``; an operator's static root stays a file_server."""
    entry = RouteEntry(id="gavel-site-x", name="site", path="/", files="www",
                       root="/w/instances/site-1/www", strip_prefix=True)
    assert caddy_route(entry, "unix//run/f.sock") == {
        "@id": "gavel-site-x", "terminal": True, "handle": [
            {"handler": "rewrite", "uri": "/gavel-site-x{http.request.uri.path}"},
            {"handler": "reverse_proxy", "upstreams": [{"dial": "unix//run/f.sock"}]}]}
    assert routes_object([entry]) == {"@id": ROUTES_ID, "handle": [{"handler": "subroute"}]}
    static = RouteEntry(id="gavel-docs-x", name="docs", path="/", files="/srv/docs",
                        root="/srv/docs")
    assert caddy_route(static)["handle"] == [{"handler": "file_server", "root": "/srv/docs"}]
    host = RouteEntry(id="i", name="x", host="x.example", port="http",
                      upstreams=[Upstream(instance_id="x-1", node_id="n1", address="fd00::2",
                                          port=8)])
    route = caddy_route(host)
    assert route["match"] == [{"host": ["x.example"]}]
    assert route["handle"][0]["upstreams"] == [{"dial": "[fd00::2]:8"}]


def test_routes_that_lead_nowhere_are_left_out_and_an_empty_table_has_no_route_list() -> None:
    live = table(Route(path="/web", port="http"))
    dead = table(Route(path="/gone", port="http"), n=0)
    assert dead == []
    nowhere = RouteEntry(id="gavel-x-0", name="x", path="/x", port="http")
    obj = routes_object([*live, nowhere])
    assert [r["@id"] for r in obj["handle"][0]["routes"]] == [live[0].id]
    assert routes_object([nowhere]) == {"@id": ROUTES_ID, "handle": [{"handler": "subroute"}]}


# -- the requests ----------------------------------------------------------------------------
@pytest.mark.parametrize("start", [
    None,
    {"admin": {"listen": "127.0.0.1:2019"}},
    {"apps": {"tls": {}}},
    {"apps": {"http": {"grace_period": "2s"}}},
    {"apps": {"http": {"servers": {"site": {"listen": [":443"], "routes": [HAND]}}}}},
])
def test_a_caddy_without_the_server_gets_one_made_in_one_request(start: Any) -> None:
    model = AdminModel(start)
    goal = want(Route(path="/web", port="http"))
    ops = model.converge(goal)
    assert len(ops) == 1 and ops[0].method == "PUT"
    srv = model.config["apps"]["http"]["servers"]["gavel"]
    assert srv == server_object("gavel", [":8080"], goal.routes)
    assert srv["automatic_https"] == {"disable": True} and srv["@id"] == server_id("gavel")
    assert plan(model.config, goal) == []
    if start and "admin" in start:
        assert model.config["admin"] == start["admin"]  # nothing else is rewritten
    if start and "site" in str(start):
        assert model.config["apps"]["http"]["servers"]["site"]["routes"] == [HAND]


def test_an_operators_server_keeps_its_routes_in_place_around_gavels() -> None:
    before = {"apps": {"http": {"servers": {"gavel": {"listen": [":80"], "routes": [HAND]}}}}}
    model = AdminModel(before)
    goal = want(Route(path="/web", port="http"))
    ops = model.converge(goal)
    assert [str(o) for o in ops] == ["PUT /config/apps/http/servers/gavel/routes/0",
                                     "POST /config/apps/http/servers/gavel/routes"]
    assert server_routes(model) == [goal.routes, HAND, not_found()]
    # The operator's server: its listen is theirs, never rewritten to gavel's setting.
    assert model.config["apps"]["http"]["servers"]["gavel"]["listen"] == [":80"]
    assert plan(model.config, goal) == []


def test_a_changed_table_is_one_patch_of_gavels_route_and_nothing_else() -> None:
    model = AdminModel()
    model.converge(want(Route(path="/web", port="http")))
    server_routes(model).insert(1, copy.deepcopy(HAND))  # an operator adds one by hand
    for goal in (want(Route(path="/web", port="http"), n=3), want(Route(path="/web", port="http"),
                                                                  n=0)):
        ops = model.converge(goal)
        assert [str(o) for o in ops] == [f"PATCH /id/{ROUTES_ID}"]
        assert server_routes(model) == [goal.routes, HAND, not_found()]
    assert server_routes(model)[0] == {"@id": ROUTES_ID, "handle": [{"handler": "subroute"}]}


def test_a_route_added_after_the_not_found_route_moves_it_not_the_route() -> None:
    model = AdminModel()
    goal = want(Route(path="/web", port="http"))
    model.converge(goal)
    server_routes(model).append(copy.deepcopy(HAND))
    ops = model.converge(goal)
    assert [str(o) for o in ops] == [f"DELETE /id/{NOT_FOUND_ID}",
                                     "POST /config/apps/http/servers/gavel/routes"]
    assert server_routes(model) == [goal.routes, HAND, not_found()]


def test_a_caddy_that_lost_gavels_routes_gets_them_back_and_nothing_doubles() -> None:
    model = AdminModel()
    goal = want(Route(path="/web", port="http"))
    model.converge(goal)
    settled = copy.deepcopy(model.config)
    del server_routes(model)[0]  # gone by hand
    assert [str(o) for o in model.converge(goal)] == [
        "PUT /config/apps/http/servers/gavel/routes/0"]
    assert model.config == settled
    server_routes(model).clear()
    assert [str(o) for o in model.converge(goal)] == [
        "PATCH /config/apps/http/servers/gavel/routes"]
    del model.config["apps"]["http"]["servers"]["gavel"]["routes"]
    assert [str(o) for o in model.converge(goal)] == [
        "PUT /config/apps/http/servers/gavel/routes"]
    assert model.config == settled
    for _ in range(3):
        assert model.converge(goal) == []
    assert _ids(model.config).count(ROUTES_ID) == 1


def test_gavels_routes_follow_the_server_setting_and_its_own_servers_listen() -> None:
    model = AdminModel()
    model.converge(want(Route(path="/web", port="http")))
    moved = desired(table(Route(path="/web", port="http")), "edge", (":9090",))
    ops = model.converge(moved)
    assert [str(o) for o in ops[:2]] == [f"DELETE /id/{ROUTES_ID}", f"DELETE /id/{NOT_FOUND_ID}"]
    servers = model.config["apps"]["http"]["servers"]
    assert servers["gavel"]["routes"] == [] and servers["edge"]["listen"] == [":9090"]
    assert plan(model.config, moved) == []
    relisten = desired(table(Route(path="/web", port="http")), "edge", ("127.0.0.1:9091",))
    assert [str(o) for o in model.converge(relisten)] == [f"PATCH /id/{server_id('edge')}/listen"]
    assert servers["edge"]["listen"] == ["127.0.0.1:9091"]


def test_every_request_names_gavels_own_objects_or_appends_or_inserts() -> None:
    """Rule 1, over every start above: no request addresses a route by its position except to
    insert at the front or append, and no request names an id gavel did not make."""
    starts: list[Any] = [
        None, {"apps": {"http": {"servers": {"gavel": {"routes": [HAND, HAND]}}}}},
        {"apps": {"http": {"servers": {"gavel": {"routes": [HAND, not_found(), HAND]}},
                           "other": {"routes": [routes_object([])]}}}},
    ]
    ours = {ROUTES_ID, NOT_FOUND_ID, server_id("gavel")}
    for start in starts:
        for op in plan(start, want(Route(path="/web", port="http"))):
            if op.path.startswith("/id/"):
                assert op.path.split("/")[2] in ours, op
            elif op.path.endswith("/routes/0"):
                assert op.method == "PUT"
            elif "/routes/" in op.path:
                raise AssertionError(f"{op} addresses a route by position")
