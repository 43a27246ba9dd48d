"""`gavel.client.jobwait` rule 5: every wait of the client's - a system job's, a job's end, an
instance running - ends when the nodes decline an instance, not when none answered before
the bid deadline (the instance is asked again a heartbeat later). The broker's answers are
stand-ins (a real cluster: tests/integration/test_system_wait.py,
tests/integration/test_client_wait.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from gavel.client import jobwait, runwait
from gavel.shared.api import InstanceStatus, ServiceReply, ServiceStatus, StatusReply
from gavel.shared.messages import Event, EventType
from gavel.shared.reasons import Reason


class _Sub:
    """No event comes, or the ones given, each once."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events

    async def next_msg(self, timeout: float) -> Any:
        if self.events:
            return _Msg(self.events.pop(0))
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def unsubscribe(self) -> None:
        return None


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


class _Nc:
    def __init__(self, events: list[bytes] | None = None) -> None:
        self.events = events or []

    async def subscribe(self, subject: str) -> _Sub:
        return _Sub(self.events)


class _Client:
    """Answers `service` with these statuses in turn (the last repeated)."""

    def __init__(self, statuses: list[ServiceStatus]) -> None:
        self.nc = _Nc()
        self.statuses = statuses
        self.looks = 0

    async def status(self, instance_id: str = "") -> Any:
        raise AssertionError("a system job's wait asks `service`")

    async def request(self, verb: str, request: Any, reply_type: Any,
                      timeout: float | None = None) -> Any:
        assert verb == "service"
        self.looks += 1
        return ServiceReply(service=self.statuses[min(self.looks, len(self.statuses)) - 1])


class _InstanceClient:
    """Answers `status` (and the `status` request) with these instances in turn, the last
    repeated; `events` are heard one a look."""

    def __init__(self, instances: list[InstanceStatus], events: list[bytes] | None = None
                 ) -> None:
        self.nc = _Nc(events)
        self.instances = instances
        self.looks = 0

    async def status(self, instance_id: str = "") -> StatusReply:
        self.looks += 1
        return StatusReply(instances=[
            self.instances[min(self.looks, len(self.instances)) - 1]])

    async def request(self, verb: str, request: Any, reply_type: Any,
                      timeout: float | None = None) -> Any:
        assert verb == "status"
        return await self.status()


def _instance(state: str, reason: str = "") -> InstanceStatus:
    return InstanceStatus(instance_id="job-1", name="job", state=state, reason=reason,
                          health="healthy" if state == "running" else "",
                          detail="0/2 nodes bid: 2 no answer before the deadline"
                          if reason == Reason.NO_BIDS else "")


def _unschedulable_event(reason: Reason) -> bytes:
    return msgspec.msgpack.encode(Event(instance_id="job-1", type=EventType.UNSCHEDULABLE,
                                        reason=reason, detail=reason.value))


def _status(state: str, reason: str = "", waiting: tuple[str, ...] = ("node-a",)
            ) -> ServiceStatus:
    replica = InstanceStatus(instance_id="agent-1", name="agent", state=state,
                             reason=reason, detail="0/1 nodes bid: 1 no answer before the "
                             "deadline" if reason == Reason.NO_BIDS else "", version=1)
    return ServiceStatus(name="agent", version=1, count=1, system=True, replicas=[replica],
                         nodes=["node-a"], waiting=list(waiting))


def test_a_node_that_did_not_answer_in_time_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobwait, "POLL_S", 0.01)
    client = _Client([_status("unschedulable", Reason.NO_BIDS),
                      _status("running", waiting=())])
    st = asyncio.run(jobwait.system_running(client, "agent", 5.0))
    assert st.waiting == [] and client.looks == 2


def test_a_job_whose_nodes_did_not_answer_in_time_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobwait, "POLL_S", 0.01)
    client = _InstanceClient([_instance("unschedulable", Reason.NO_BIDS),
                              _instance("succeeded")])
    st = asyncio.run(jobwait.job_end(client, "job-1", 5.0))
    assert st.instances[0].state == "succeeded" and client.looks == 2


@pytest.mark.parametrize("kind", ["system job", "job"])
def test_the_nodes_declining_ends_the_wait_with_their_reason(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobwait, "POLL_S", 0.01)
    if kind == "job":
        said = "job-1"
        wait = jobwait.job_end(_InstanceClient([
            _instance("unschedulable", Reason.NO_ROOM_MEMORY)]), "job-1", 5.0)
    else:
        said = "agent: agent-1"
        wait = jobwait.system_running(_Client([
            _status("unschedulable", Reason.NO_ROOM_MEMORY)]), "agent", 5.0)
    with pytest.raises(jobwait.Ended, match=f"{said} is unschedulable: "
                                            f"{Reason.NO_ROOM_MEMORY.value}"):
        asyncio.run(wait)


def test_an_instance_whose_nodes_did_not_answer_in_time_is_waited_until_it_runs() -> None:
    """The status says unschedulable for silence, and so does the event heard meanwhile."""
    client = _InstanceClient([_instance("unschedulable", Reason.NO_BIDS),
                              _instance("unschedulable", Reason.NO_BIDS),
                              _instance("running")],
                             events=[_unschedulable_event(Reason.NO_BIDS)])
    got = asyncio.run(runwait.running(client, "job-1", 5.0, poll_s=0.01))
    assert got.state == "running" and client.looks == 3


@pytest.mark.parametrize("heard", ["status", "event"])
def test_an_instance_its_nodes_declined_ends_the_wait_with_their_reason(heard: str) -> None:
    if heard == "status":
        client = _InstanceClient([_instance("unschedulable", Reason.NO_ROOM_CPU)])
    else:
        client = _InstanceClient([_instance("pending"), _instance("pending")],
                                 events=[_unschedulable_event(Reason.NO_ROOM_CPU)])
    with pytest.raises(jobwait.Ended, match=f"job-1 is unschedulable: "
                                            f"{Reason.NO_ROOM_CPU.value}"):
        asyncio.run(runwait.running(client, "job-1", 5.0, poll_s=0.01))
