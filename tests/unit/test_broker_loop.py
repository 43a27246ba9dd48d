"""A tick's passes each take a turn of the loop of their own (`broker.service` rule 9): a
request that arrives while the auctioneer reconciles is served before the services' pass,
not after every pass of the tick."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_fuzz_broker import Rig


def test_a_request_is_served_between_a_ticks_passes(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    b = rig.b
    order: list[str] = []

    def reconcile(now: float) -> None:
        order.append("reconcile")
        rig.loop.call_soon(order.append, "request")  # arrives meanwhile

    monkeypatch.setattr(b.auctioneer, "reconcile", reconcile)
    async def services(now: float) -> None:  # the services' pass is read in steps
        order.append("services")

    monkeypatch.setattr(b.services, "watch", services)
    monkeypatch.setattr(b.retention, "watch", lambda: order.append("retention"))

    async def one_tick() -> None:
        task = asyncio.ensure_future(b._loop())
        while "retention" not in order:
            await asyncio.sleep(0)
        task.cancel()

    rig.run(one_tick())
    assert order[:4] == ["reconcile", "request", "services", "retention"], order
