"""`gavel.client.jobwait` rule 2: a system job's wait ends when a node declines its instance,
not when a node did not answer before the bid deadline (its instance is asked again a
heartbeat later). The broker's answers are stand-ins (a real cluster:
tests/integration/test_system_wait.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gavel.client import jobwait
from gavel.shared.api import InstanceStatus, ServiceReply, ServiceStatus
from gavel.shared.reasons import Reason


class _Sub:
    async def next_msg(self, timeout: float) -> None:
        await asyncio.sleep(timeout)
        raise TimeoutError

    async def unsubscribe(self) -> None:
        return None


class _Nc:
    async def subscribe(self, subject: str) -> _Sub:
        return _Sub()


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


def test_a_node_that_declined_ends_the_wait_with_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobwait, "POLL_S", 0.01)
    client = _Client([_status("unschedulable", Reason.NO_ROOM_MEMORY)])
    with pytest.raises(jobwait.Ended, match=f"agent: agent-1 is unschedulable: "
                                            f"{Reason.NO_ROOM_MEMORY.value}"):
        asyncio.run(jobwait.system_running(client, "agent", 5.0))
