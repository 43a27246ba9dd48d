"""A broker killed -9 while its writer held its working copy's branch lock leaves the lock
behind; restarted, it must clear it (`broker.ha` rule 5) and lead again, not die at its
first takeover. Real nats-servers, a real remote, `gavel broker --ha` child processes.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.ha_rig import REF, HaRig
from tests.integration.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[HaRig]:
    r = HaRig(tmp_path)
    try:
        yield r
    finally:
        await r.close()


async def test_a_broker_restarted_over_its_own_stale_branch_lock_leads_again(
        rig: HaRig) -> None:
    await rig.start(brokers=1)
    op = await rig.operator()
    first = await rig.wait_leader(op, healthy=3)
    rig.signal("b1", signal.SIGKILL)
    rig.brokers["b1"].proc.wait()
    lock = rig.root / "b1" / "state.git" / f"{REF}.lock"
    lock.write_text("0" * 40 + "\n")  # what a writer killed between lock and rename leaves
    restarted = rig.start_broker("b1")

    async def leads_again() -> bool:
        assert restarted.proc.poll() is None, restarted.log.read_text()[-3000:]
        reply = await rig.leader(op)
        return reply is not None and reply.leader == "b1" and reply.epoch > first.epoch
    await wait_for(leads_again, 90, every=0.3, what="b1 leading again after its restart")
    assert not lock.exists()
    assert "Traceback" not in restarted.log.read_text()
