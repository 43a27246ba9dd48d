"""Chaos, the short version: `python -m gavel.bench.chaos` for ~40 s against real child processes
(nats-server, a broker, three workers) with every kind of fault injected at least once, then
the invariants — never timings — checked from git, agent.json and the live processes.

Every part runs on its own identity (`gavel auth init`'s seeds and nats-server config), and
the server's log holds no permissions violation at the end.

The faults come from the seed, so a failure here replays with
``python -m gavel.bench.chaos --duration 40 --workers 3 --seed 4 --state DIR``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gavel.bench.chaos import FAULTS, KINDS, foreign_times, node_ids, schedule, submissions
from gavel.bench.chaosplan import minimums

pytestmark = pytest.mark.integration

SEED, DURATION, WORKERS = 4, 40.0, 3


def test_the_seed_decides_every_fault() -> None:
    nodes = node_ids(WORKERS)
    first = schedule(SEED, DURATION, nodes)
    assert first == schedule(SEED, DURATION, nodes)
    assert foreign_times(SEED, DURATION) == foreign_times(SEED, DURATION)
    assert submissions(SEED, DURATION) == submissions(SEED, DURATION)
    assert {f.kind for f in first} == set(KINDS), "each fault at least once, however short"
    assert schedule(SEED + 1, DURATION, nodes) != first


def chaos_summary(module: str, args: list[str], timeout: float) -> dict[str, Any]:
    """`python -m module args --json`'s summary, checked ok, with 0 lost and 0 duplicated."""
    proc = subprocess.run([sys.executable, "-m", module, *args, "--json"],
                          capture_output=True, text=True, timeout=timeout, check=False)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no summary on stdout; stderr:\n{proc.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    assert summary["ok"], f"{summary['errors']}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0
    assert summary["lost"] == 0 and summary["duplicated"] == 0
    return summary


def test_chaos_keeps_every_invariant(tmp_path: Path) -> None:
    state = tmp_path / "chaos"
    summary = chaos_summary("gavel.bench.chaos", [
        "--duration", str(DURATION), "--workers", str(WORKERS), "--seed", str(SEED),
        "--settle", "90", "--state", str(state)], timeout=420)
    assert summary["submitted"] > 0
    # Instances the broker ended lost are counted on their own, never among "terminal".
    assert "lost" not in summary["terminal"]
    assert summary["placed_once"] + sum(summary["terminal"].values()) \
        + summary["ended_lost"] + summary["unschedulable"] == summary["submitted"]
    assert summary["clean"] == (summary["ended_lost"] == 0)
    assert set(summary["faults"]) == set(FAULTS)
    assert all(n >= 1 for n in summary["faults"].values()), summary["faults"]
    assert all(summary["faults"][k] >= n for k, n in minimums(DURATION).items())
    assert summary["rejoined_after_move"] >= 1
    # Per-node identities: the config init wrote has one nkey user per node beside the
    # broker's and the operators', and nats-server logged no permissions violation.
    conf = (state / "auth" / "nats.conf").read_text()
    assert conf.count("{ nkey: ") == WORKERS + 2
    assert all(f"# node {n}\n" in conf for n in node_ids(WORKERS))
    assert summary["auth"] == {"nodes": WORKERS, "violations": 0}
    assert "Violation" not in (state / "logs" / "nats.log").read_text()
