"""Self-fencing (`worker.converge` rule 6) as a lifecycle edge in memory: a node cut off
from NATS longer than `offline_s` stops what it holds (the broker has declared it offline
and moved its work), once a silence, and runs work again after contact returns."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_ha_epochs import agent, award


async def test_a_node_silent_past_offline_fences_everything_once(tmp_path: Path) -> None:
    a = agent(tmp_path)
    sup, conv = a._supervisor, a.converger
    now = [100.0]
    conv._clock = lambda: now[0]
    offline = a.timing.offline_s
    await sup.restore()
    try:
        conv.contact()
        await a._on_award(award("web-1", 0))
        assert sup.held() == {"web-1": 1}
        now[0] += offline  # silent exactly as long as offline: not declared offline yet
        assert not conv.fence_if_cut_off() and sup.held() == {"web-1": 1}
        now[0] += 0.1
        assert conv.fence_if_cut_off() and conv.self_fenced
        assert sup.held() == {}  # being stopped, and not reported (rule 4)
        now[0] += offline
        assert not conv.fence_if_cut_off()  # once a silence
        conv.contact()
        assert not conv.self_fenced and not conv.fence_if_cut_off()
    finally:
        await sup.shutdown(kill=True)
