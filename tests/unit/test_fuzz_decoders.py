"""Every decoder gavel points at the outside world, fed random, truncated, mutated and
wrong-typed bytes: it returns its type or raises `msgspec.DecodeError` (whose subclass
`ValidationError` carries the field) — or, for input nested about a thousand deep,
`RecursionError`. Nothing else: each handler's ``except REFUSED`` covers every case."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gavel.cli.specfile import SpecError, load_spec
from gavel.shared import api
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.logstream import LogChunk, LogsDone, LogsRequest
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
    Heartbeat,
    HostStats,
    InstanceReport,
    Shape,
    Spec,
    WatchGrant,
    WatchRequest,
)
from gavel.shared.records import (
    Assignment,
    AuctionRecord,
    BatchRecord,
    Deployment,
    InstanceRecord,
    NodeFile,
    Outcome,
    Placement,
    ServiceRecord,
    ServiceVersion,
    ShapeRecord,
    auction_trailer,
    parse_trailers,
)
from gavel.worker import localstate
from gavel.worker.localstate import AgentFile, LocalInstance
from tests.unit.fuzzkit import FUZZ, REFUSED, bombs, garbage_for, mutated, wire_values

SPEC = Spec(name="web", command=["python", "-c", "pass"], cpu=0.5, memory_mb=128,
            ports=["http"], labels={"zone": "a"}, env={"A": "1"}, timeout_s=5.0)
SHAPE = Shape(cpu=0.5, memory_mb=128, ports=1, labels={"zone": "a"})
PLACEMENT = Placement(instance_id="web-1", spec=SPEC, auction_id="a1", ports={"http": 20000})
ASSIGNMENT = Assignment(instance_id="web-1", auction_id="a1", cpu=SPEC.cpu,
                        memory_mb=SPEC.memory_mb, ports={"http": 20000})
SERVICE = Spec(name="web", type="service", count=3, command=["serve"], ports=["http"])
SERVICE_RECORD = ServiceRecord(name="web", versions=[ServiceVersion(version=1, spec=SERVICE)],
                               version=1, count=3, healthy_version=1, deployment=Deployment(
                                   to_version=1, state="succeeded", reason="x"))
SERVICE_STATUS = api.ServiceStatus(name="web", version=1, count=3,
                                   deployment=SERVICE_RECORD.deployment,
                                   versions=[api.VersionStatus(version=1, replicas=3)])

#: One valid sample of every message that crosses NATS, per decoder type.
WIRE: dict[Any, list[msgspec.Struct]] = {
    Heartbeat: [Heartbeat(node_id="n1", seq=3, strategy="binpack", labels={"zone": "a"},
                          capacity=Capacity(cpu=4, memory_mb=4096, ports=100),
                          committed=Capacity(cpu=1, memory_mb=128, ports=1),
                          stats=HostStats(cpu_ratio=0.1, memory_ratio=0.2, cpu_count=4),
                          instances=[InstanceReport(instance_id="web-1", state="running",
                                                    ports={"http": 20000})],
                          port_range=[20000, 20999])],
    AssignmentRequest: [AssignmentRequest(instance_id="web-1", node_id="n1")],
    WatchRequest: [WatchRequest(node_id="n1", deliver="_INBOX_n1.x",
                                consumer="n1_0123456789abcdef")],
    WatchGrant | ApiError: [WatchGrant(consumer="n1_0123456789abcdef", epoch=2)],
    BidReply: [BidReply(auction_id="a1", node_id="n1",
                        answers=[Bid(shape=0, load=0.25, step=0.1, strategy="binpack"),
                                 Decline(shape=1, reason="no room for cpu", detail="2")])],
    Event: [Event(instance_id="web-1", type="running", node_id="n1", attempt=1, at=1.0,
                  ports={"http": 20001}, taken=[20000]),
            Event(instance_id="web-1", type="exited", node_id="n1", exit_code=3)],
    RFB: [RFB(auction_id="a1", shapes=[SHAPE, Shape(cpu=1, memory_mb=64)], deadline_s=0.2,
              counts=[2, 1])],
    Award: [Award(auction_id="a1", instance_id="web-1", node_id="n1", spec=SPEC,
                  ports={"http": 20000}, attempt=1, commit="abc", secret_env={"S": "x"})],
    Cancel: [Cancel(instance_id="web-1", node_id="n1")],
    Award | ApiError: [ApiError(error="no")],
    LogsRequest: [LogsRequest(node_id="n1", instance_id="web-1", streams=["stdout", "stderr"],
                              tail=10, since=1.5, follow=True, cursor={"stdout": 7})],
    LogChunk | LogsDone | ApiError: [
        LogChunk(instance_id="web-1", stream="stderr", data=b"x\n", end=2),
        LogsDone(instance_id="web-1", cursor={"stdout": 2}, more=True, skipped=3)],
}
#: The API: each verb's request, and each reply as the CLI decodes it (reply | ApiError).
API_REQUESTS: dict[Any, list[msgspec.Struct]] = {
    api.SubmitRequest: [api.SubmitRequest(spec=SPEC, instance_id="web-1", count=2)],
    api.StatusRequest: [api.StatusRequest(instance_id="web-1")],
    api.NodesRequest: [api.NodesRequest()],
    api.WhyRequest: [api.WhyRequest(instance_id="web-1")],
    api.EventsRequest: [api.EventsRequest(instance_id="web-1", limit=5)],
    api.StatsRequest: [api.StatsRequest()],
    api.CancelRequest: [api.CancelRequest(instance_id="web-1")],
    api.DrainRequest: [api.DrainRequest(node_id="n1", undo=False, migrate=True)],
    api.DeployRequest: [api.DeployRequest(spec=SERVICE, key="k")],
    api.ServiceRequest: [api.ServiceRequest(name="web")],
    api.ServicesRequest: [api.ServicesRequest()],
    api.ScaleRequest: [api.ScaleRequest(name="web", count=2)],
    api.StopServiceRequest: [api.StopServiceRequest(name="web")],
    api.RollbackRequest: [api.RollbackRequest(name="web", to_version=1)],
}
STATUS = api.InstanceStatus(instance_id="web-1", name="web", state="running", node_id="n1")
API_REPLIES: dict[Any, list[msgspec.Struct]] = {
    api.SubmitReply | ApiError: [api.SubmitReply(instance_id="web-1")],
    api.StatusReply | ApiError: [api.StatusReply(instances=[STATUS])],
    api.NodesReply | ApiError: [api.NodesReply(nodes=[api.NodeStatus(node_id="n1",
                                                                     health="healthy")],
                                               rejected={"malformed heartbeat": 2})],
    api.WhyReply | ApiError: [api.WhyReply(instance=STATUS, auctions=[AuctionRecord(
        auction_id="a1", instance_id="web-1", winner="n1", load=0.1,
        bids=[NodeBid(node_id="n1", load=0.1, strategy="binpack")],
        declines=[NodeDecline(node_id="n2", reason="draining")])])],
    api.EventsReply | ApiError: [api.EventsReply(events=WIRE[Event])],  # type: ignore[arg-type]
    api.CancelReply | ApiError: [api.CancelReply(instance_id="web-1", state="cancelling")],
    api.DrainReply | ApiError: [api.DrainReply(node_id="n1", draining=True)],
    api.DeployReply | ApiError: [api.DeployReply(name="web", version=2, changed=False)],
    api.ServiceReply | ApiError: [api.ServiceReply(service=SERVICE_STATUS)],
    api.ServicesReply | ApiError: [api.ServicesReply(services=[SERVICE_STATUS])],
}
#: Files gavel reads back: git's JSON records, the worker's own state file.
FILES: dict[Any, list[msgspec.Struct]] = {
    InstanceRecord: [InstanceRecord(instance_id="web-1", spec=SPEC, excluded=("n2",))],
    NodeFile: [NodeFile(node_id="n1", instances={"web-1": ASSIGNMENT}, blocked_ports=[20000])],
    ServiceRecord: [SERVICE_RECORD],
    AuctionRecord: API_REPLIES[api.WhyReply | ApiError][0].auctions,  # type: ignore[attr-defined]
    BatchRecord: [BatchRecord(auction_id="a1", shapes=[ShapeRecord(shape=SHAPE)],
                              outcomes=[Outcome(instance_id="web-1", winner="n1", load=0.5)])],
    AgentFile: [AgentFile(node_id="n1", instances={"web-1": LocalInstance(
        placement=PLACEMENT, state="running", pid=42, create_time=1.5)},
        finished=["web-0/1"])],
    Spec: [SPEC],
}

MSGPACK = {**WIRE, **API_REQUESTS, **API_REPLIES}
#: Thirty-odd decoders: fewer examples each keeps the suite within its time budget.
EACH = settings(FUZZ, max_examples=80)


def _name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("gavel.shared.api.", "").replace(
        "gavel.shared.messages.", "")


def _decodes_or_refuses(decoder: Any, t: Any, data: bytes) -> None:
    try:
        out = decoder.decode(data)
    except REFUSED:
        return
    assert isinstance(out, getattr(t, "__args__", (t,))), out


@pytest.mark.parametrize("t", list(MSGPACK), ids=_name)
@EACH
@given(data=st.data())
def test_msgpack_decoders_return_their_type_or_raise_decode_error(t: Any,
                                                                  data: st.DataObject) -> None:
    decoder = msgspec.msgpack.Decoder(t)
    for sample in MSGPACK[t]:
        assert decoder.decode(msgspec.msgpack.encode(sample)) == sample
    _decodes_or_refuses(decoder, t, data.draw(garbage_for(*MSGPACK[t])))


@pytest.mark.parametrize("t", list(FILES), ids=_name)
@EACH
@given(data=st.data())
def test_json_decoders_return_their_type_or_raise_decode_error(t: Any,
                                                               data: st.DataObject) -> None:
    decoder = msgspec.json.Decoder(t)
    samples = [msgspec.json.encode(s) for s in FILES[t]]
    payload = data.draw(st.one_of(
        st.binary(max_size=64),
        st.sampled_from(samples).flatmap(mutated),
        st.sampled_from(samples).flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),
        wire_values.filter(lambda v: not _has_bytes(v)).map(
            lambda v: msgspec.json.encode(v)),
        st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b'{"cpu": 1e999}',
                         b"\xef\xbb\xbf{}", b"[" * 2000, b'{"x":' * 2000])))
    _decodes_or_refuses(decoder, t, payload)


def _has_bytes(v: Any) -> bool:
    if isinstance(v, bytes):
        return True
    if isinstance(v, float) and not math.isfinite(v):
        return True  # JSON cannot say NaN; the sample list above tries the spellings
    if isinstance(v, list):
        return any(_has_bytes(x) for x in v)
    if isinstance(v, dict):
        return any(_has_bytes(x) for x in v.values())
    return False


@FUZZ
@given(payload=bombs)
def test_deep_nesting_raises_recursion_error_which_handlers_must_catch(payload: bytes) -> None:
    """Why `REFUSED` has two members: msgspec does not turn its recursion guard into a
    DecodeError, and the few KB it takes fit any NATS payload."""
    for t in (Heartbeat, BidReply, Award, api.SubmitRequest, NodeFile):
        with pytest.raises(REFUSED):
            msgspec.msgpack.decode(payload, type=t)
    with pytest.raises(RecursionError):
        msgspec.msgpack.decode(b"\x81\xa1k" * 100_000 + b"\xc0", type=Heartbeat)


@FUZZ
@given(text=st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["Gavel-Auction: ", "{", "}", '"outcomes":', "[]", "\n", "\r",
                              "\u2028", '"auction_id": "a"', ",", "null", "1e999"]),
             max_size=12).map("".join)))
def test_trailers_parse_or_raise_decode_error(text: str) -> None:
    valid = auction_trailer(FILES[BatchRecord][0])  # type: ignore[arg-type]
    try:
        records = parse_trailers(f"place web-1 on n1\n\n{valid}\n{text}")
    except msgspec.DecodeError:
        return
    assert records[0].instance_id == "web-1"


@FUZZ
@given(body=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.sampled_from([msgspec.json.encode(SPEC),
                                       b'name = "x"\ncommand = ["t"]\n']).flatmap(mutated)),
       suffix=st.sampled_from([".toml", ".json"]))
def test_spec_files_load_or_raise_one_spec_error(tmp_path: Path, body: bytes,
                                                 suffix: str) -> None:
    path = tmp_path / f"spec{suffix}"
    path.write_bytes(body)
    try:
        spec = load_spec(path)
    except SpecError as exc:
        text = str(exc)
        assert text.startswith(str(path)) and "\n" not in text.strip(), text
        return
    assert isinstance(spec, Spec)


@FUZZ
@given(body=st.one_of(st.binary(max_size=100),
                      st.just(msgspec.json.encode(FILES[AgentFile][0])).flatmap(mutated)))
def test_worker_state_file_loads_or_is_set_aside(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "agent.json"
    path.write_bytes(body)
    got = localstate.load(path)
    if got is None:
        assert not path.exists()  # set aside, not lost, not half-read
    else:
        assert isinstance(got, AgentFile)
    for p in tmp_path.iterdir():
        p.unlink()
