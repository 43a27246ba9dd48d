"""The HTTP API's route table and its OpenAPI document, in memory: every route documented,
every request built from the verb's own struct, bad input refused with one sentence."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.cli.api.errors import status_for
from gavel.cli.api.openapi import document
from gavel.cli.api.routes import ROUTES, BadRequest, Route, build, find
from gavel.shared.api import DrainRequest, EventsRequest, SubmitRequest, TuneRequest
from gavel.shared.reasons import Reason

JSON = {"content-type": "application/json"}
SPEC = {"name": "a", "command": ["true"]}


def test_every_route_is_one_operation_of_the_document_and_every_ref_resolves() -> None:
    doc = document()
    ops = {(m.upper(), p) for p, o in doc["paths"].items() for m in o}
    assert ops == {(r.method, r.path) for r in ROUTES}
    assert len(ops) == len(ROUTES)
    text = json.dumps(doc)
    for ref in text.split('"$ref": "')[1:]:
        assert ref.split('"')[0].removeprefix("#/components/schemas/") in \
            doc["components"]["schemas"]
    ids = [op["operationId"] for o in doc["paths"].values() for op in o.values()]
    assert len(ids) == len(set(ids))


def test_a_route_is_found_by_method_and_path_else_404_or_405() -> None:
    found = find("GET", "/v1/instances/web-1")
    assert not isinstance(found, int) and found[1] == {"instance_id": "web-1"}
    assert find("HEAD", "/v1/nodes") != 405
    assert find("PUT", "/v1/instances") == 405
    assert find("GET", "/v1/nothing") == 404


def _build(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
           query: dict[str, str] | None = None) -> object:
    found = find(method, path)
    assert not isinstance(found, int)
    return build(found[0], found[1], query or {}, headers or {}, body)


def test_requests_are_the_verbs_own_structs_from_path_query_and_body() -> None:
    got = _build("POST", "/v1/instances", json.dumps({"spec": SPEC, "count": 2}).encode(),
                 JSON)
    assert isinstance(got, SubmitRequest) and got.count == 2 and got.spec.name == "a"
    got = _build("POST", "/v1/nodes/n1/drain", b'{"migrate": true}', JSON)
    assert got == DrainRequest(node_id="n1", migrate=True)
    got = _build("GET", "/v1/events", query={"limit": "5", "since": "12.5"})
    assert got == EventsRequest(limit=5, since=12.5)
    got = _build("POST", "/v1/instances", json.dumps({"spec": SPEC}).encode(),
                 {**JSON, "idempotency-key": "retry-me-1"})
    assert isinstance(got, SubmitRequest) and got.key == "retry-me-1"


@pytest.mark.parametrize(("body", "headers", "status", "sentence"), [
    (b"{", JSON, 400, "request body: not valid JSON"),
    (b"3", JSON, 400, "request body: expected a JSON object"),
    (json.dumps({"spec": SPEC}).encode(), {"content-type": "text/plain"}, 415,
     "the request body must be JSON"),
    (json.dumps({"spec": SPEC}).encode(), {}, 415, "the request body must be JSON"),
    (json.dumps({"spec": SPEC, "extra": 1}).encode(), JSON, 400,
     "request body: invalid request: unknown field `extra`"),
    (json.dumps({"spec": {**SPEC, "cmd": 1}}).encode(), JSON, 400,
     "request body: invalid spec: unknown field `cmd`"),
    (json.dumps({"spec": SPEC, "key": "a-key-0001"}).encode(),
     {**JSON, "idempotency-key": "b-key-0001"}, 400,
     "the Idempotency-Key header and the body's key differ"),
    (json.dumps({"spec": SPEC}).encode(), {**JSON, "idempotency-key": "short"}, 400,
     "Idempotency-Key: key 'short' is not usable"),
])
def test_bad_input_is_one_sentence_and_a_4xx(body: bytes, headers: dict[str, str],
                                             status: int, sentence: str) -> None:
    with pytest.raises(BadRequest) as info:
        _build("POST", "/v1/instances", body, headers)
    assert info.value.status == status
    assert str(info.value).startswith(sentence)


def test_tune_is_read_by_a_get_and_applied_by_a_post() -> None:
    got = _build("POST", "/v1/tune", b'{"batch_max": 8, "commit_gap_ms": 2.5}', JSON)
    assert got == TuneRequest(batch_max=8, commit_gap_ms=2.5)
    assert _build("POST", "/v1/tune", b"", JSON) == TuneRequest()  # every value tuned again
    asked: list[dict[str, object]] = []

    class Asked:
        async def tune(self, **kw: object) -> None:
            asked.append(kw)

    found = find("GET", "/v1/tune")
    assert not isinstance(found, int)
    route = found[0]
    asyncio.run(route.ask(Asked(), _build("GET", "/v1/tune")))  # type: ignore[arg-type]
    assert asked == [{"apply": False}]  # a GET changes nothing
    for body, sentence in ((b'{"batch_max": 0}', "field 'batch_max': expected `int` >= 1"),
                           (b'{"max_auctions": 8, "apply": false}',
                            "tune: values are only read with apply=false")):
        with pytest.raises(BadRequest) as info:
            _build("POST", "/v1/tune", body, JSON)
        assert info.value.status == 400
        assert str(info.value).startswith(f"request: invalid request: {sentence}"), info.value


def test_a_body_that_contradicts_the_path_is_refused() -> None:
    with pytest.raises(BadRequest, match="the path says 'n1'"):
        _build("POST", "/v1/nodes/n1/drain", b'{"node_id": "n2"}', JSON)


def test_a_refusals_status_follows_its_reason() -> None:
    assert status_for(f"{Reason.UNKNOWN_INSTANCE}: x") == 404
    assert status_for(f"{Reason.KEY_REUSED}: k made x") == 409
    assert status_for(f"{Reason.NOT_A_SERVICE}: x") == 422
    assert status_for(f"{Reason.PINNED} (refs/tags/v1)") == 409


def test_the_document_is_json_and_names_the_struct_each_event_carries() -> None:
    doc = msgspec.json.decode(msgspec.json.encode(document()))
    stream = doc["paths"]["/v1/events/stream"]["get"]["responses"]["200"]
    assert "text/event-stream" in stream["content"] and "(Event)" in stream["description"]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
_fields = st.sampled_from(["spec", "instance_id", "count", "key", "undo", "migrate",
                           "deadline_s", "to_version", "kind", "name", "node_id",
                           "batch_max", "max_auctions", "commit_gap_ms", "apply"])


@given(route=st.sampled_from([r for r in ROUTES if r.body]),
       body=st.one_of(st.binary(max_size=64),
                      st.dictionaries(_fields, _json, max_size=4).map(
                          lambda d: json.dumps(d).encode())),
       query=st.dictionaries(st.sampled_from(["limit", "since", "tail", "follow"]),
                             st.text(max_size=8), max_size=2))
def test_any_body_is_a_request_or_one_sentence_never_another_error(
        route: object, body: bytes, query: dict[str, str]) -> None:
    """What makes a 500 is an exception other than `BadRequest`: no body may raise one."""
    assert isinstance(route, Route)
    params = {name: "x1" for name in route.pattern.groupindex}
    try:
        got = build(route, params, query, JSON, body)
    except BadRequest as exc:
        assert 400 <= exc.status < 500 and "\n" not in str(exc)
    else:
        assert isinstance(got, route.request)


def test_tls_files_are_both_given_and_usable_or_one_sentence(tmp_path: Path) -> None:
    from gavel.cli.api import app

    assert app._tls("", "") is None
    with pytest.raises(app.ApiUnavailable, match="go together"):
        app._tls(str(tmp_path / "cert.pem"), "")
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    with pytest.raises(app.ApiUnavailable, match="cannot use the TLS certificate"):
        app._tls(str(tmp_path / "cert.pem"), str(tmp_path / "cert.pem"))
