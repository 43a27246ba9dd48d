"""Chaos with several brokers, the short version: `python -m gavel.bench.chaosha` for 20 s
against real child processes (three clustered nats-servers, three `gavel broker --ha`, a
bare remote, two workers on their own nkeys) with two leader kills, a standby kill, a
nats-server kill and a worker kill, then the invariants - never timings - checked from the
remote's history, agent.json and the live processes.

The faults come from the seed, so a failure here replays with
``python -m gavel.bench.chaosha --duration 20 --workers 2 --leader-kills 2 --seed 1
--state DIR``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.bench.chaosplan import HA_KINDS, ha_schedule, node_ids
from tests.integration.test_chaos import chaos_summary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SEED, DURATION, WORKERS, LEADER_KILLS = 1, 20.0, 2, 2


def test_the_seed_decides_every_ha_fault() -> None:
    nodes = node_ids(WORKERS)
    least = {"leader_kill": LEADER_KILLS, "standby_kill": 1, "nats_restart": 1,
             "worker_kill": 1}
    first = ha_schedule(SEED, DURATION, nodes, least=least)
    assert first == ha_schedule(SEED, DURATION, nodes, least=least)
    assert {f.kind for f in first} == set(HA_KINDS)
    assert sum(f.kind == "leader_kill" for f in first) >= LEADER_KILLS
    assert ha_schedule(SEED + 1, DURATION, nodes, least=least) != first


def test_chaos_ha_fails_over_and_loses_and_doubles_nothing(tmp_path: Path) -> None:
    summary = chaos_summary("gavel.bench.chaosha", [
        "--duration", str(DURATION), "--workers", str(WORKERS), "--leader-kills",
        str(LEADER_KILLS), "--seed", str(SEED), "--settle", "60", "--state",
        str(tmp_path / "chaos-ha")], timeout=220)
    assert summary["submitted"] > 0 and summary["accepted"] == summary["submitted"]
    assert summary["placed_once"] + sum(summary["terminal"].values()) \
        + summary["ended_lost"] + summary["unschedulable"] == summary["submitted"]
    assert summary["failovers"] >= LEADER_KILLS
    assert summary["faults"]["leader_kill"] >= LEADER_KILLS
    assert all(summary["faults"][k] >= 1 for k in HA_KINDS), summary["faults"]
    assert summary["auth"]["violations"] == 0
