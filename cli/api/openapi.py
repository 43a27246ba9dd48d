"""The OpenAPI 3.1 document of the HTTP API, made from its route table and the NATS API's
structs (``msgspec.json.schema_components``): nothing is described twice.

Rules:
1. Every route is one operation: its path and query parameters (each a field of the
   request struct, with that field's schema), its JSON body (the request struct, where the
   route reads one; the ``kind`` tag may be left out, the decoder does not need it), its
   reply's schema under 200 and `ApiError` under every status it may refuse with.
2. A streaming route answers ``text/event-stream``; its description names each event and
   the struct its ``data`` line carries, and those structs are among the components.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gavel import __version__
from gavel.cli.api.routes import IDEMPOTENCY, ROUTES, Route
from gavel.shared.api import EventsRequest
from gavel.shared.execstream import ExecExit, ExecOutput
from gavel.shared.logstream import LogChunk, LogsDone
from gavel.shared.messages import ApiError, Event

__all__ = ["STREAMED", "document"]

REF = "#/components/schemas/{name}"
#: Rule 2: what each event's data is.
STREAMED: dict[str, Any] = {"event": Event, "chunk": LogChunk, "done": LogsDone,
                            "output": ExecOutput, "exit": ExecExit, "error": ApiError}
_REFUSALS = {"400": "The request is malformed (one sentence says what is wrong)",
             "403": "This token, or the API's own NATS identity, may only read",
             "404": "No such instance, node or service", "409": "The cluster refused it",
             "503": "No broker answers"}


def _field_schemas(kind: type[Any], schemas: dict[str, Any]) -> dict[str, Any]:
    return dict(schemas[kind.__name__]["properties"])


def _operation(route: Route, schemas: dict[str, Any], refs: dict[Any, Any]) -> dict[str, Any]:
    props = _field_schemas(route.request, schemas)
    params = [{"name": name, "in": "path", "required": True, "schema": props[name]}
              for name in route.pattern.groupindex]
    params += [{"name": name, "in": "query", "required": False, "schema": props[name],
                **({"style": "form", "explode": False} if name == "streams" else {})}
               for name in route.query]
    if route.stream and route.request is EventsRequest:
        params.append({"name": "Last-Event-ID", "in": "header", "required": False,
                       "schema": {"type": "string", "pattern": "^[0-9]+$"},
                       "description": "Resume after the event with this id: every event "
                       "stored since, in order, each once (a reconnecting client's)."})
    if route.keyed:
        params.append({"name": "Idempotency-Key", "in": "header", "required": False,
                       "schema": {"type": "string"}, "description": "A retry with the same "
                       "key makes nothing new and is answered what the first request was."})
    op: dict[str, Any] = {"operationId": f"{route.verb}_{route.method.lower()}_"
                          + "_".join(p.strip("{}") for p in route.path.split("/")[2:]),
                          "summary": route.summary, "tags": [route.path.split("/")[2]],
                          "parameters": params}
    if route.body:
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": refs[route.request]}}}
    error = {"application/json": {"schema": refs[ApiError]}}
    if route.stream:
        events = ", ".join(f"`{e}` ({STREAMED[e].__name__})" for e in (*route.stream, "error"))
        ok = {"description": f"Server-sent events: {events}; each `data:` line is one JSON "
              "object of that struct.", "content": {"text/event-stream": {
                  "schema": {"type": "string"}}}}
    else:
        ok = {"description": "The verb's reply", "content": {"application/json": {
            "schema": refs[route.reply]}}}
    op["responses"] = {"200": ok, **{code: {"description": what, "content": error}
                                     for code, what in _REFUSALS.items()}}
    return op


def document() -> dict[str, Any]:
    """Rule 1: the whole document."""
    kinds: list[Any] = [ApiError, *STREAMED.values()]
    for route in ROUTES:
        kinds += [route.request] + ([route.reply] if route.reply is not None else [])
    unique = list(dict.fromkeys(kinds))
    refs_list, schemas = msgspec.json.schema_components(unique, ref_template=REF)
    refs = dict(zip(unique, refs_list, strict=True))
    for route in ROUTES:  # rule 1: the tag (and what the path gives) may be left out
        schema = schemas[route.request.__name__]
        schema["required"] = [r for r in schema.get("required", [])
                              if r != "kind" and r not in route.pattern.groupindex]
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schemas,
                                                                            refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "gavel", "version": __version__,
                 "description": "The HTTP API of a gavel cluster: the NATS API's verbs, "
                 "resource-shaped. Errors are `ApiError` with one sentence. Send "
                 "`Authorization: Bearer TOKEN` where the server requires a token, and "
                 "`Content-Type: application/json` with every POST."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
        "x-idempotency-header": IDEMPOTENCY,
    }
