"""Chaos, the short version: `python -m gavel.bench.chaos` for 20 s against real child processes
(nats-server, a broker, three workers) with every kind of fault injected at least once, then
the invariants — never timings — checked from git, agent.json and the live processes. The
slow suite runs it for 40 s as well, with more faults of each kind (`chaosplan.minimums`).

Every part runs on its own identity (`gavel auth init`'s seeds and nats-server config), and
the server's log holds no permissions violation at the end.

The faults come from the seed, so a failure here replays with
``python -m gavel.bench.chaos --duration 20 --workers 3 --seed 5 --state DIR`` (or
``--duration 40 --seed 4``).
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

WORKERS = 3
#: (seed, seconds): the default suite's run - a seed whose faults all end early - and the
#: slow suite's longer one, with more of each kind.
SHORT, LONG = (5, 20.0), (4, 40.0)
RUNS = [pytest.param(*SHORT, id="20s"), pytest.param(*LONG, id="40s", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("seed", "duration"), [SHORT, LONG], ids=["20s", "40s"])
def test_the_seed_decides_every_fault(seed: int, duration: float) -> None:
    nodes = node_ids(WORKERS)
    first = schedule(seed, duration, nodes)
    assert first == schedule(seed, duration, nodes)
    assert foreign_times(seed, duration) == foreign_times(seed, duration)
    assert submissions(seed, duration) == submissions(seed, duration)
    assert {f.kind for f in first} == set(KINDS), "each fault at least once, however short"
    assert schedule(seed + 1, duration, nodes) != first


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


@pytest.mark.parametrize(("seed", "duration"), RUNS)
def test_chaos_keeps_every_invariant(tmp_path: Path, seed: int, duration: float) -> None:
    state = tmp_path / "chaos"
    summary = chaos_summary("gavel.bench.chaos", [
        "--duration", str(duration), "--workers", str(WORKERS), "--seed", str(seed),
        "--settle", "90", "--state", str(state)], timeout=420)
    assert summary["submitted"] > 0
    # Instances the broker ended lost are counted on their own, never among "terminal".
    assert "lost" not in summary["terminal"]
    assert summary["placed_once"] + sum(summary["terminal"].values()) \
        + summary["ended_lost"] + summary["unschedulable"] == summary["submitted"]
    assert summary["clean"] == (summary["ended_lost"] == 0)
    assert set(summary["faults"]) == set(FAULTS)
    assert all(n >= 1 for n in summary["faults"].values()), summary["faults"]
    assert all(summary["faults"][k] >= n for k, n in minimums(duration).items())
    assert summary["rejoined_after_move"] >= 1
    # Per-node identities: the config init wrote has one nkey user per node beside the
    # broker's and the operators', and nats-server logged no permissions violation.
    conf = (state / "auth" / "nats.conf").read_text()
    assert conf.count("{ nkey: ") == WORKERS + 2
    assert all(f"# node {n}\n" in conf for n in node_ids(WORKERS))
    assert summary["auth"] == {"nodes": WORKERS, "violations": 0}
    assert "Violation" not in (state / "logs" / "nats.log").read_text()
