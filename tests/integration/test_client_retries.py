"""The typed client's retries (`gavel.client.aio` rule 2) against a real nats-server that no
broker answers on: the caller's `Retries` decide whether no broker at all is waited through (a
failover, as `gavel submit` does) or said at once (as `gavel deploy` does), and `on_retry`
hears each error the request was asked again past."""

from __future__ import annotations

import pytest

from gavel.client import Client, ClientError, NoBroker, Retries
from gavel.shared.messages import Spec

SPEC = Spec(name="web", type="service", command=["true"])


async def test_no_broker_is_said_at_once_without_failover(nats_url: str) -> None:
    heard: list[ClientError] = []
    async with await Client.connect(nats_url) as client:
        with pytest.raises(NoBroker):
            await client.deploy(SPEC, on_retry=heard.append,
                                retries=Retries(try_s=1.0, tries=3, failover=False))
    assert heard == []


async def test_no_broker_is_waited_through_with_failover(nats_url: str) -> None:
    heard: list[ClientError] = []
    async with await Client.connect(nats_url) as client:
        with pytest.raises(NoBroker):
            await client.submit(SPEC, key="k-1", on_retry=heard.append,
                                retries=Retries(try_s=1.0, tries=5, pause_s=0.05))
    assert heard and all(isinstance(e, NoBroker) for e in heard)
