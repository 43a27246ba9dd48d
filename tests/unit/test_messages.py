"""Wire contracts: every message survives msgpack through a tagged-union decoder, wire messages
tolerate fields they do not know, and a Spec rejects bad input naming the field."""

from __future__ import annotations

import math
from typing import Any, Union

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared import api, messages
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import (
    RFB,
    ApiError,
    AssignmentRequest,
    Award,
    Bid,
    BidReply,
    Cancel,
    Capacity,
    Decline,
    Event,
    EventType,
    Heartbeat,
    HostStats,
    InstanceReport,
    InstanceState,
    Message,
    Request,
    Shape,
    Spec,
    WatchGrant,
    WatchRequest,
)
from gavel.shared.records import AuctionRecord, Deployment, PeriodicRun
from gavel.shared.spec import Check, Restart, Route

SPEC = Spec(name="web-1", command=["python", "-m", "http.server"], env={"A": "b"}, cpu=0.5,
            memory_mb=256, ports=["http", "admin"], labels={"region": "eu"}, timeout_s=30.0,
            attempts=2, secrets=["token"])

SAMPLES: list[Message] = [
    RFB(auction_id="a-1", shapes=[Request.of("i-1", SPEC).shape(), Shape(cpu=1.0, memory_mb=64)],
        deadline_s=0.2, counts=[3, 1]),
    Bid(shape=0, load=0.25, step=-0.125, strategy="binpack"),
    Decline(shape=1, reason="draining", detail="maintenance"),
    BidReply(auction_id="a-1", node_id="n1",
             answers=[Bid(shape=0, load=0.0, step=math.inf), Decline(shape=1,
                                                                       reason="no free ports")]),
    Award(auction_id="a-1", instance_id="i-1", node_id="n1", spec=SPEC,
          ports={"http": 8080, "admin": 8081}, attempt=2, commit="0" * 40,
          secret_env={"TOKEN": "s3cret"}),
    Cancel(instance_id="i-1", node_id="n1"),
    Heartbeat(node_id="n1", seq=7, strategy="spread", labels={"region": "eu"},
              capacity=Capacity(cpu=4.0, memory_mb=8192, ports=20),
              committed=Capacity(cpu=1.5, memory_mb=512, ports=2),
              stats=HostStats(cpu_ratio=0.3, memory_ratio=0.4, cpu_count=4,
                              memory_total_mb=8192),
              draining=True,
              instances=[InstanceReport(instance_id="i-1", state="running", pid=1234, attempt=1,
                                        ports={"http": 8080})]),
    Event(instance_id="i-1", type=EventType.EXITED, node_id="n1", reason="timeout",
          detail="after 30 s", exit_code=137, attempt=2, at=1700000000.5,
          ports={"http": 8081}, taken=[8080]),
    AssignmentRequest(instance_id="i-1", node_id="n1"),
    WatchRequest(node_id="n1", deliver="_INBOX_n1.x", consumer="n1_0123456789abcdef"),
    WatchGrant(consumer="n1_0123456789abcdef", epoch=1),
    ApiError(error="no such instance"),
]

WireMessage = (RFB | Bid | Decline | BidReply | Award | Cancel | Heartbeat | Event
               | AssignmentRequest | WatchRequest | WatchGrant | ApiError)
decoder = msgspec.msgpack.Decoder(WireMessage)


def _wire_classes(module: str = "gavel.shared.messages") -> set[type[Message]]:
    """Every Message subclass defined in `module` (other modules' endpoints are not ours)."""
    found: set[type[Message]] = set()
    todo = list(Message.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__module__ == module:
            found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_wire_message_has_a_sample_and_is_in_the_union() -> None:
    # A message added later without a sample here (or outside the union) fails this test.
    assert {type(m) for m in SAMPLES} == _wire_classes()
    assert set(WireMessage.__args__) == _wire_classes()


def test_tags_are_unique_and_named_kind() -> None:
    tags = [cls.__struct_config__.tag for cls in _wire_classes()]
    assert len(tags) == len(set(tags))
    assert all(cls.__struct_config__.tag_field == "kind" for cls in _wire_classes())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_msgpack_round_trip_through_the_tagged_union(msg: Message) -> None:
    raw = msgspec.msgpack.encode(msg)
    back = decoder.decode(raw)
    assert type(back) is type(msg)
    assert back == msg
    assert msgspec.msgpack.decode(raw)["kind"] == msg.__struct_config__.tag


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_wire_messages_ignore_unknown_fields(msg: Message) -> None:
    """A newer peer may send fields this version does not know: they are dropped, not fatal."""
    assert not type(msg).__struct_config__.forbid_unknown_fields
    newer = msgspec.to_builtins(msg) | {"added_in_v9": {"x": [1, 2]}}
    assert decoder.decode(msgspec.msgpack.encode(newer)) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_an_endpoint_decoder_rejects_other_messages(msg: Message) -> None:
    only_bids = msgspec.msgpack.Decoder(BidReply)
    raw = msgspec.msgpack.encode(msg)
    if isinstance(msg, BidReply):
        assert only_bids.decode(raw) == msg
    else:
        with pytest.raises(msgspec.ValidationError):
            only_bids.decode(raw)


def test_an_unknown_kind_and_garbage_are_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'telepathy'"):
        decoder.decode(msgspec.msgpack.encode({"kind": "telepathy", "node_id": "n1"}))
    with pytest.raises(msgspec.DecodeError):
        decoder.decode(b"\xc1\xff\x00")


def test_an_old_minimal_heartbeat_still_decodes() -> None:
    """Fields beyond the node id have defaults, so the smallest heartbeat is still valid."""
    raw = msgspec.msgpack.encode({"kind": "heartbeat", "node_id": "n1"})
    assert decoder.decode(raw) == Heartbeat(node_id="n1")


@given(
    load=st.floats(allow_nan=False),
    step=st.floats(allow_nan=False),
    shape=st.integers(-(2**63), 2**63 - 1),
    text=st.text(max_size=64),  # the longest strategy name a bid may carry
    node=st.text(min_size=1),
)
def test_bid_replies_round_trip_any_load_step_index_and_text(load: float, step: float,
                                                             shape: int, text: str,
                                                             node: str) -> None:
    msg = BidReply(auction_id=text, node_id=node,
                   answers=[Bid(shape=shape, load=load, step=step, strategy=text),
                            Decline(shape=shape, reason=text, detail=text)])
    assert decoder.decode(msgspec.msgpack.encode(msg)) == msg


def test_over_long_strategy_and_detail_are_refused_at_decode() -> None:
    for answer in ({"kind": "bid", "shape": 0, "load": 0.1, "strategy": "s" * 65},
                   {"kind": "decline", "shape": 0, "reason": "r", "detail": "d" * 257}):
        raw = msgspec.msgpack.encode({"kind": "bids", "auction_id": "a", "node_id": "n",
                                      "answers": [answer]})
        with pytest.raises(msgspec.ValidationError, match="length <= "):
            decoder.decode(raw)


def test_nan_load_and_step_survive_the_wire_so_the_auction_can_reject_them() -> None:
    back = decoder.decode(msgspec.msgpack.encode(Bid(shape=0, load=math.nan, step=math.nan)))
    assert isinstance(back, Bid) and math.isnan(back.load) and math.isnan(back.step)


def test_step_and_counts_are_optional_on_the_wire() -> None:
    """A bid without a step prices every instance alike; counts are informational."""
    raw = msgspec.msgpack.encode({"kind": "bid", "shape": 2, "load": 0.5})
    assert decoder.decode(raw) == Bid(shape=2, load=0.5, step=0.0)
    raw = msgspec.msgpack.encode({"kind": "rfb", "auction_id": "a-1", "deadline_s": 1.0,
                                  "shapes": [{"cpu": 1.0, "memory_mb": 64}]})
    assert decoder.decode(raw) == RFB(auction_id="a-1", shapes=[Shape(cpu=1.0, memory_mb=64)],
                                      deadline_s=1.0, counts=[])


# -- Spec: user input, strictly validated --------------------------------------------------


def _spec(**fields: Any) -> dict[str, Any]:
    return {"name": "web-1", "command": ["sleep", "1"]} | fields


def test_minimal_spec_gets_defaults() -> None:
    spec = msgspec.json.decode(msgspec.json.encode(_spec()), type=Spec)
    assert spec == Spec(name="web-1", command=["sleep", "1"])
    assert (spec.cpu, spec.memory_mb, spec.attempts, spec.timeout_s) == (0.1, 64, 3, None)


def test_full_spec_round_trips_through_json() -> None:
    assert msgspec.json.decode(msgspec.json.encode(SPEC), type=Spec) == SPEC


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"cpu": "lots"}, "$.cpu"),
        ({"cpu": 0}, "$.cpu"),
        ({"cpu": -1.5}, "$.cpu"),
        ({"memory_mb": 0}, "$.memory_mb"),
        ({"memory_mb": 1.5}, "$.memory_mb"),
        ({"name": "Web 1"}, "$.name"),
        ({"name": ""}, "$.name"),
        ({"name": "x" * 64}, "$.name"),
        ({"command": "sleep 1"}, "$.command"),
        ({"ports": ["HTTP"]}, "$.ports[0]"),
        ({"ports": "http"}, "$.ports"),
        ({"env": {"A": 1}}, "$.env"),
        ({"labels": ["region=eu"]}, "$.labels"),
        ({"timeout_s": 0}, "$.timeout_s"),
        ({"attempts": 0}, "$.attempts"),
        ({"attempts": 101}, "$.attempts"),
        ({"secrets": [1]}, "$.secrets[0]"),
    ],
)
def test_bad_spec_values_are_rejected_naming_the_field(fields: dict[str, Any],
                                                       where: str) -> None:
    raw = msgspec.json.encode(_spec(**fields))
    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.json.decode(raw, type=Spec)
    assert f"`{where}" in str(err.value)
    with pytest.raises(msgspec.ValidationError) as err:
        msgspec.convert(_spec(**fields), Spec)  # from TOML: already a dict
    assert f"`{where}" in str(err.value)


@pytest.mark.parametrize("typo", ["cpus", "memory", "label", "Name"])
def test_unknown_spec_fields_are_rejected_by_name(typo: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=f"unknown field `{typo}`"):
        msgspec.convert(_spec(**{typo: 1}), Spec)


def test_missing_required_spec_field_is_named() -> None:
    with pytest.raises(msgspec.ValidationError, match="missing required field `name`"):
        msgspec.convert({"command": ["true"]}, Spec)
    # command is optional beside an image: a spec with neither names both in one sentence
    with pytest.raises(msgspec.ValidationError, match=r"a spec runs a command \(command"):
        msgspec.convert({"name": "web-1"}, Spec)


def test_request_of_spec_keeps_what_a_bidder_sees() -> None:
    req = Request.of("i-9", SPEC)
    assert req == Request(instance_id="i-9", cpu=0.5, memory_mb=256, ports=2,
                          labels={"region": "eu"})
    req.labels["zone"] = "b"
    assert SPEC.labels == {"region": "eu"}  # a copy, not the spec's own dict


def test_terminal_states() -> None:
    terminal = {s for s in InstanceState if s.terminal}
    assert terminal == {InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.LOST,
                        InstanceState.CANCELLED}


def test_public_names_exist() -> None:
    for name in messages.__all__:
        assert hasattr(messages, name), name


# -- the CLI ⇄ broker API (shared.api): same rules, its own endpoint -----------------------

def _filled(cls: type[Message]) -> Message:
    """A sample with every field set from its type: for replies of plain numbers, whose exact
    field list moves with the measurements."""
    values = {int: 3, float: 1.5, str: "x"}
    hints = msgspec.structs.fields(cls)
    return msgspec.convert({f.encode_name: values[f.type] for f in hints
                            if f.required}, cls)


_STATUS = api.InstanceStatus(instance_id="i-1", name="web-1", state="running", node_id="n1",
                             attempt=1, reason="", detail="", ports={"http": 8080})
SERVICE = Spec(name="web", command=["python3", "-m", "http.server"], type="service", count=3,
               ports=["http"], checks=[Check(type="http", port="http", path="/health")],
               restart=Restart(attempts=1), spread="zone")
API_SAMPLES: list[Message] = [
    api.SubmitRequest(spec=SPEC, instance_id="i-1", count=3),
    api.SubmitReply(instance_id="i-1", instance_ids=["i-1-1", "i-1-2", "i-1-3"]),
    api.StatsRequest(),
    _filled(api.StatsReply),
    api.TuneRequest(batch_max=8, max_auctions=2, commit_gap_ms=5.0),
    api.TuneRequest(apply=False),
    api.TuneReply(batch_max=8, max_auctions=2, commit_gap_ms=5.0,
                  pinned=["batch_max", "max_auctions", "commit_gap_ms"], level=0, changes=0,
                  round_ms=[1.5, 2.25], rounds=2, placed_total=40),
    api.StatusRequest(instance_id="i-1"),
    api.StatusReply(instances=[_STATUS]),
    api.NodesRequest(),
    api.NodesReply(nodes=[api.NodeStatus(node_id="n1", health="healthy", strategy="spread",
                                         labels={"a": "b"}, capacity=Capacity(cpu=2.0),
                                         draining=True, instances=3, last_seen_s=1.5)],
                   rejected={"late bid": 2}),
    api.WhyRequest(instance_id="i-1"),
    api.WhyReply(instance=_STATUS, auctions=[AuctionRecord(
        auction_id="a-1", instance_id="i-1", winner="n1", load=0.5,
        bids=[NodeBid(node_id="n1", load=0.5)],
        declines=[NodeDecline(node_id="n2", reason="draining")], silent=["n3"])]),
    api.EventsRequest(instance_id="i-1", limit=5),
    api.EventsReply(events=[Event(instance_id="i-1", type=EventType.PLACED, node_id="n1")]),
    api.CancelRequest(instance_id="i-1"),
    api.CancelReply(instance_id="i-1", state="cancelled"),
    api.DrainRequest(node_id="n1", undo=True, migrate=True),
    api.DrainReply(node_id="n1", draining=True, migrating=2),
    api.DeployRequest(spec=SERVICE, key="k-1"),
    api.DeployReply(name="web", version=2, changed=False),
    api.ServiceRequest(name="web"),
    api.ServiceReply(service=api.ServiceStatus(
        name="web", version=2, count=3, healthy_version=1,
        deployment=Deployment(to_version=2, from_version=1, state="running"),
        versions=[api.VersionStatus(version=1, replicas=2, healthy=2)], replicas=[_STATUS])),
    api.ServicesRequest(),
    api.ServicesReply(services=[api.ServiceStatus(name="web", version=1, count=0,
                                                  stopped=True)]),
    api.ScaleRequest(name="web", count=5),
    api.StopServiceRequest(name="web"),
    api.RollbackRequest(name="web", to_version=1),
    api.EndpointsRequest(),
    api.EndpointsReply(
        endpoints=[api.Endpoint(instance_id="web-1", name="web", state="running", node_id="n1",
                                ports={"http": 8080}, health="healthy", service="web",
                                version=2, routes=[Route(path="/web", port="http")])],
        nodes=[api.NodeAddress(node_id="n1", address="10.0.0.1", health="healthy",
                               workdir="/var/lib/gavel/instances")]),
    api.PeriodicJobsRequest(),
    api.PeriodicJobsReply(jobs=[api.PeriodicStatus(
        name="nightly", schedule="0 2 * * *", last_run="2026-12-02T02:00:00Z",
        next_run="2026-12-03T02:00:00Z",
        history=[PeriodicRun(at="2026-12-02T02:00:00Z", instance_id="nightly-20261202t020000z",
                             outcome="succeeded")])]),
    ApiError(error="no such instance"),
]
_api_types = tuple({type(m) for m in API_SAMPLES})
api_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Union[_api_types])  # noqa: UP007


def test_every_api_message_has_a_sample() -> None:
    assert {type(m) for m in API_SAMPLES} - {ApiError} == (
        _wire_classes("gavel.shared.api") | _wire_classes("gavel.shared.retuning"))


@pytest.mark.parametrize("msg", API_SAMPLES, ids=lambda m: type(m).__name__)
def test_api_round_trip_through_its_tagged_union(msg: Message) -> None:
    back = api_decoder.decode(msgspec.msgpack.encode(msg))
    assert type(back) is type(msg)
    assert back == msg
    newer = msgspec.to_builtins(msg) | {"added_in_v9": True}
    assert api_decoder.decode(msgspec.msgpack.encode(newer)) == msg


# -- wire names are a contract with older peers -------------------------------------------

#: The keys each message has carried since the per-shape protocol (RFBs ask per shape, answers
#: name a shape index), which deliberately replaced the first release's per-instance keys.
#: Adding fields is fine (with a default); renaming or removing one of these breaks every peer
#: of the older version.
V2_KEYS: dict[type[Message], set[str]] = {
    RFB: {"kind", "auction_id", "shapes", "deadline_s", "counts"},
    Bid: {"kind", "shape", "load", "step", "strategy"},
    Decline: {"kind", "shape", "reason", "detail"},
    BidReply: {"kind", "auction_id", "node_id", "answers"},
    Award: {"kind", "auction_id", "instance_id", "node_id", "spec", "ports", "attempt", "commit",
            "secret_env"},
    Cancel: {"kind", "instance_id", "node_id"},
    Heartbeat: {"kind", "node_id", "seq", "strategy", "labels", "capacity", "committed", "stats",
                "draining", "instances"},
    Event: {"kind", "instance_id", "type", "node_id", "reason", "detail", "exit_code", "attempt",
            "at"},
    AssignmentRequest: {"kind", "instance_id", "node_id"},
    WatchRequest: {"kind", "node_id", "deliver", "consumer"},
    WatchGrant: {"kind", "consumer", "epoch"},
    ApiError: {"kind", "error"},
}


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_protocol_wire_keys_are_still_sent(msg: Message) -> None:
    sent = set(msgspec.msgpack.decode(msgspec.msgpack.encode(msg)))
    assert V2_KEYS.get(type(msg), {"kind"}) <= sent


@pytest.mark.parametrize(
    ("first_release", "missing"),
    [
        ({"kind": "rfb", "auction_id": "a-1", "deadline_s": 1.0,
          "requests": [{"instance_id": "i-1", "cpu": 1.0, "memory_mb": 64}]}, "shapes"),
        ({"kind": "bid", "instance_id": "i-1", "load": 0.5}, "shape"),
        ({"kind": "decline", "instance_id": "i-1", "reason": "draining"}, "shape"),
    ],
)
def test_a_first_release_per_instance_message_is_refused_loudly(first_release: dict[str, Any],
                                                               missing: str) -> None:
    """The per-instance protocol is not read as a per-shape one with defaults filled in."""
    with pytest.raises(msgspec.ValidationError, match=f"missing required field `{missing}`"):
        decoder.decode(msgspec.msgpack.encode(first_release))


def test_request_keys_are_stable() -> None:
    sent = set(msgspec.to_builtins(Request(instance_id="i", cpu=1.0, memory_mb=1)))
    assert {"instance_id", "cpu", "memory_mb", "ports", "labels"} <= sent


def test_a_shape_is_a_request_without_its_id() -> None:
    req = Request(instance_id="i-1", cpu=1.5, memory_mb=64, ports=2, labels={"b": "2", "a": "1"})
    shape = req.shape()
    assert set(msgspec.to_builtins(shape)) == {"cpu", "memory_mb", "ports", "labels", "image",
                                               "volumes", "root", "priority"}
    assert shape == Shape(cpu=1.5, memory_mb=64, ports=2, labels={"a": "1", "b": "2"})
    assert shape.key() == req.key() == (1.5, 64, 2, (("a", "1"), ("b", "2")), "", (), False,
                                        50)
    assert isinstance(req, Shape)  # a request can be priced wherever a shape is
    with pytest.raises(AttributeError):
        shape.cpu = 2.0  # type: ignore[misc]
    other = Request(instance_id="i-2", cpu=1.5, memory_mb=64, ports=2, labels={"a": "1"})
    assert other.key() != req.key()


def test_every_message_carries_the_protocol_version_and_refuses_another() -> None:
    from gavel.shared.messages import PROTOCOL, Heartbeat

    wire = msgspec.msgpack.encode(Heartbeat(node_id="a"))
    assert msgspec.msgpack.decode(wire)["v"] == PROTOCOL
    other = msgspec.msgpack.decode(wire)
    other["v"] = PROTOCOL + 1
    with pytest.raises(msgspec.ValidationError,
                       match=f"protocol version {PROTOCOL + 1}; this gavel speaks {PROTOCOL}"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(other), type=Heartbeat)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"command": []}, "names neither"),
        ({"command": [], "image": "Web:1"}, "is not an image reference"),
        ({"image": "web:1", "volumes": [{"name": "data"}]}, "names the path it is mounted"),
        ({"volumes": [{"name": "data", "path": "data"}]}, "its path is absolute"),
        ({"volumes": [{"name": "d", "path": "/a"}, {"name": "d", "path": "/b"}]},
         "distinct host volumes"),
    ],
)
def test_a_spec_runs_a_command_or_an_image(fields: dict[str, Any], says: str) -> None:
    """`command` is optional beside `image`; a spec with neither, or with a malformed image
    reference, is refused with a sentence."""
    with pytest.raises(msgspec.ValidationError, match=says):
        msgspec.convert(_spec(**fields), Spec)


def test_an_image_spec_needs_no_command() -> None:
    spec = msgspec.convert({"name": "web", "image": "gavel-web:v1@sha256:" + "a" * 64,
                            "volumes": [{"name": "data", "path": "/data"}]}, Spec)
    assert spec.command == [] and spec.volumes[0].name == "data"
    assert Request.of("web-1", spec).shape().key()[-4:-1] == (spec.image, ("data",), False)
