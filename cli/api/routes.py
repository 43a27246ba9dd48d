"""The HTTP API's routes: each a method and a path over one verb of the NATS API, its request
built from the verb's own struct (`gavel.shared.api`) and its reply that verb's reply.

Rules:
1. A path parameter, a query parameter and a field of a JSON body all name a field of the
   verb's request struct, by that field's name; the struct's own constraints (and the
   spec's) judge the values. A body is a JSON object; a field it does not know is refused
   (the spec inside refuses its own unknown fields), as is a body field that says otherwise
   than the path.
2. Every request that changes something is a POST, PUT or DELETE, and a POST or PUT carries
   ``Content-Type: application/json`` even with no body: a browser page elsewhere cannot send
   one without asking first (CORS), so it cannot submit or stop anything on a loopback API.
3. `submit` and `deploy` take their idempotency key from the ``Idempotency-Key`` header (or
   the body's ``key``; both given must agree): a retry with the same key makes nothing new
   and is answered what the first request was.
4. Three routes stream server-sent events rather than answer once: the events of an
   instance (or all) as they happen, an instance's output, and a command run inside an
   instance (``POST .../exec``: its output, then how it ended).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gavel.cli.specfile import humanize
from gavel.client import Client
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    DeployReply,
    DeployRequest,
    DrainReply,
    DrainRequest,
    EndpointsReply,
    EndpointsRequest,
    EventsReply,
    EventsRequest,
    NodesReply,
    NodesRequest,
    PeriodicJobsReply,
    PeriodicJobsRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    ServicesReply,
    ServicesRequest,
    StatsReply,
    StatsRequest,
    StatusReply,
    StatusRequest,
    StopServiceRequest,
    SubmitReply,
    SubmitRequest,
    TuneReply,
    TuneRequest,
    WhyReply,
    WhyRequest,
    key_problem,
)
from gavel.shared.execstream import ExecRequest
from gavel.shared.logstream import LogsRequest
from gavel.shared.messages import Message, Spec
from gavel.shared.planning import PlanReply, PlanRequest
from gavel.shared.routes import RouteEntry

__all__ = ["BODY_MAX", "ROUTES", "BadRequest", "Route", "build", "find"]

#: The largest request body read (bytes): a spec is a few kilobytes.
BODY_MAX = 1 << 20
#: The header rule 3 reads.
IDEMPOTENCY = "idempotency-key"

Call = Callable[[Client, Any], Awaitable[Any]]


class BadRequest(Exception):
    """A request this API refuses before asking the cluster: its status and sentence."""

    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status


@dataclass(frozen=True)
class Route:
    method: str
    #: ``/v1/instances/{instance_id}``: each ``{name}`` a field of `request`.
    path: str
    #: The NATS API's verb (``gavel.api.<verb>``) and its structs.
    verb: str
    request: type[Message]
    reply: Any
    summary: str
    #: The request's fields read from the query string (rule 1).
    query: tuple[str, ...] = ()
    #: A JSON body is read into the request (rule 1).
    body: bool = False
    #: Rule 3.
    keyed: bool = False
    #: Rule 4: the route answers with server-sent events of these types.
    stream: tuple[Any, ...] = ()
    #: How the client asks it (default: `Client.request` of `verb`).
    call: Call | None = None
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.path))
        object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))

    async def ask(self, client: Client, request: Any) -> Any:
        if self.call is not None:
            return await self.call(client, request)
        return await client.request(self.verb, request, self.reply)


def _submit(c: Client, r: SubmitRequest) -> Awaitable[SubmitReply]:
    return c.submit(r.spec, instance_id=r.instance_id, count=r.count, key=r.key)


def _deploy(c: Client, r: DeployRequest) -> Awaitable[DeployReply]:
    return c.deploy(r.spec, key=r.key, check_index=r.check_index)


def _tune_read(c: Client, _r: TuneRequest) -> Awaitable[TuneReply]:
    """``GET /v1/tune`` reads (rule 2: a GET changes nothing), whatever the request's
    default."""
    return c.tune(apply=False)


def _routes(c: Client, _r: EndpointsRequest) -> Awaitable[list[RouteEntry]]:
    return c.routes()


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/instances", "submit", SubmitRequest, SubmitReply,
          "Submit a spec: one instance, or `count` of them", body=True, keyed=True,
          call=_submit),
    Route("GET", "/v1/instances", "status", StatusRequest, StatusReply,
          "Every instance and its state"),
    Route("GET", "/v1/instances/{instance_id}", "status", StatusRequest, StatusReply,
          "One instance's state"),
    Route("DELETE", "/v1/instances/{instance_id}", "cancel", CancelRequest, CancelReply,
          "Cancel an instance (SIGTERM, then SIGKILL after the grace)"),
    Route("GET", "/v1/instances/{instance_id}/why", "why", WhyRequest, WhyReply,
          "Why an instance is where it is: every auction, bid and decline"),
    Route("GET", "/v1/instances/{instance_id}/logs", "logs", LogsRequest, None,
          "An instance's output, read from its node (server-sent events)",
          query=("streams", "tail", "since", "follow", "node_id"),
          stream=("chunk", "done")),
    Route("POST", "/v1/instances/{instance_id}/exec", "exec", ExecRequest, None,
          "Run a command inside a running instance, as `gavel exec` does without a "
          "terminal: its output as it comes, then its exit (server-sent events); the "
          "node's limits and its exec event are the same", body=True,
          stream=("output", "exit")),
    Route("GET", "/v1/nodes", "nodes", NodesRequest, NodesReply,
          "Every node, its health and load"),
    Route("GET", "/v1/nodes/{node_id}", "nodes", NodesRequest, NodesReply,
          "One node in detail: what runs there, its ports, its recent declines"),
    Route("POST", "/v1/nodes/{node_id}/drain", "drain", DrainRequest, DrainReply,
          "Drain a node (or take it back with undo)", body=True),
    Route("GET", "/v1/events", "events", EventsRequest, EventsReply,
          "The newest events the broker keeps", query=("instance_id", "limit", "since")),
    Route("GET", "/v1/events/stream", "events", EventsRequest, None,
          "The events kept (as /v1/events), then every new one as it happens "
          "(server-sent events)", query=("instance_id", "limit", "since"),
          stream=("event",)),
    Route("GET", "/v1/services", "services", ServicesRequest, ServicesReply,
          "Every service, its versions, counts and deploys"),
    Route("POST", "/v1/services", "deploy", DeployRequest, DeployReply,
          "Create a service, or deploy its spec as the next version", body=True,
          keyed=True, call=_deploy),
    Route("POST", "/v1/plan", "plan", PlanRequest, PlanReply,
          "Plan a spec: where each instance would go and why, what a deploy would change "
          "and stop, and the service's version index; nothing is committed or reserved",
          body=True),
    Route("GET", "/v1/services/{name}", "service", ServiceRequest, ServiceReply,
          "One service: its versions, its deploy, its replicas"),
    Route("POST", "/v1/services/{name}/scale", "scale", ScaleRequest, ServiceReply,
          "Set a service's number of replicas", body=True),
    Route("POST", "/v1/services/{name}/stop", "stop", StopServiceRequest, ServiceReply,
          "Stop every replica of a service", body=True),
    Route("POST", "/v1/services/{name}/rollback", "rollback", RollbackRequest, ServiceReply,
          "Roll a service back (to_version 0: the last healthy one)", body=True),
    Route("GET", "/v1/routes", "endpoints", EndpointsRequest, list[RouteEntry],
          "The route table a gateway derives: every route and where it leads",
          call=_routes),
    Route("GET", "/v1/endpoints", "endpoints", EndpointsRequest, EndpointsReply,
          "Every live instance that declares routes, and where each node is reached"),
    Route("GET", "/v1/stats", "stats", StatsRequest, StatsReply,
          "The broker's own measurements"),
    Route("GET", "/v1/tune", "tune", TuneRequest, TuneReply,
          "The auctioneer's settings in force, which are pinned, and the bid rounds closed "
          "since they last changed", call=_tune_read),
    Route("POST", "/v1/tune", "tune", TuneRequest, TuneReply,
          "Pin the auctioneer's batch_max, max_auctions and commit_gap_ms given, the rest "
          "tuned (none given: all tuned again), from a fresh tuner; not kept across a "
          "restart. The reply's rounds are those of the settings replaced", body=True),
    Route("GET", "/v1/periodic", "periodic", PeriodicJobsRequest, PeriodicJobsReply,
          "Every periodic job: its schedule, next fire time and latest runs"),
)


def find(method: str, path: str) -> tuple[Route, dict[str, str]] | int:
    """The route for `method` and `path` and its path parameters; else 404 (no such path)
    or 405 (the path takes other methods)."""
    allowed = False
    for route in ROUTES:
        m = route.pattern.match(path)
        if m is None:
            continue
        if route.method == method or (method == "HEAD" and route.method == "GET"):
            return route, m.groupdict()
        allowed = True
    return 405 if allowed else 404


def _fields(kind: type[Message]) -> set[str]:
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    return {f.encode_name for f in info.fields}


def _is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"


def build(route: Route, path: dict[str, str], query: dict[str, str], headers: dict[str, str],
          body: bytes) -> Any:
    """Rules 1-3: the request struct of `route`, or `BadRequest`."""
    fields: dict[str, Any] = {}
    if route.method in ("POST", "PUT"):
        if not _is_json(headers.get("content-type", "")):
            raise BadRequest(415, "the request body must be JSON: send Content-Type: "
                             "application/json")
        if body.strip():
            try:
                got = msgspec.json.decode(body)
            except (msgspec.DecodeError, RecursionError) as exc:
                raise BadRequest(400, f"request body: not valid JSON: {exc}") from None
            if not isinstance(got, dict):
                raise BadRequest(400, "request body: expected a JSON object")
            fields = got
    known = _fields(route.request)
    unknown = sorted(set(fields) - known - {"kind"})
    if unknown:
        raise BadRequest(400, f"request body: invalid request: unknown field `{unknown[0]}`")
    for name, value in path.items():
        if name in fields and fields[name] != value:
            raise BadRequest(400, f"request body: field {name!r} says {fields[name]!r} but "
                             f"the path says {value!r}")
        fields[name] = value
    for name in route.query:
        if name in query:
            fields[name] = query[name].split(",") if name == "streams" else query[name]
    fields.pop("kind", None)
    if route.verb == "logs":  # the node is the instance's unless asked (`app` finds it)
        fields.setdefault("node_id", "")
    if "spec" in fields:  # judged as the CLI judges a spec file, in the same sentence
        try:
            msgspec.convert(fields["spec"], type=Spec)
        except msgspec.ValidationError as exc:
            raise BadRequest(400, f"request body: invalid spec: {humanize(str(exc))}") \
                from None
    if route.keyed:
        _key(route, fields, headers.get(IDEMPOTENCY, ""))
    try:
        return msgspec.convert(fields, type=route.request, strict=not route.query)
    except msgspec.ValidationError as exc:
        raise BadRequest(400, f"request: invalid request: {humanize(str(exc))}") from None


def _key(route: Route, fields: dict[str, Any], header: str) -> None:
    """Rule 3."""
    if not header:
        return
    given = fields.get("key")
    if given and given != header:
        raise BadRequest(400, "the Idempotency-Key header and the body's key differ: give "
                         "one")
    if route.verb == "submit" and (problem := key_problem(header)):
        raise BadRequest(400, f"Idempotency-Key: {problem}")
    fields["key"] = header
