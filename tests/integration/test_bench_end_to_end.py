"""`gavel bench --end-to-end` for real at a small n: a nats-server, the broker process, the
load's bench agents and a real `gavel worker`; a process at an offered load, with the
containers skipped (one sentence, not an error) where no engine answers, and all three kinds
where the suite's Docker Engine does. The figures are checked for their order, never for a
time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gavel.bench.endreport import KINDS, STAGES
from gavel.bench.endtoend import NO_ENGINE

pytestmark = pytest.mark.integration


def _bench(*flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    # The bench's own clocks, not the suite's tenfold-fast ones.
    run_env = {k: v for k, v in os.environ.items() if k != "GAVEL_FAST_TIMERS"}
    proc = subprocess.run([sys.executable, "-m", "gavel", "bench", "--end-to-end", "--json",
                           *flags], capture_output=True, text=True, timeout=170, check=False,
                          env={**run_env, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _ordered(kind: dict[str, Any], n: int) -> None:
    assert kind["n"] == n and not kind["skipped"]
    for stage in STAGES:
        assert 0 < kind[f"{stage}_p50_ms"] <= kind[f"{stage}_p99_ms"], (stage, kind)
    for q in ("p50", "p99"):  # each sample is later at each stage, so each quantile is too
        assert kind[f"placed_{q}_ms"] <= kind[f"running_{q}_ms"] <= kind[f"healthy_{q}_ms"]
    assert kind["running_p50_in_reqreply_p50"] > 0


def test_a_process_at_an_offered_load_and_containers_skipped_without_an_engine(
        tmp_path: Path) -> None:
    r = _bench("--n", "2", "--rate", "5",
               env={"DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"})
    assert [k["kind"] for k in r["kinds"]] == list(KINDS)
    _ordered(r["kinds"][0], 2)
    for skipped in r["kinds"][1:]:
        assert skipped["skipped"] == NO_ENGINE and skipped["n"] == 0
    assert r["offered_per_s"] == 5.0 and r["sent_per_s"] > 0 and r["load_refused"] == 0
    assert r["nats_reqreply_p50_ms"] <= r["nats_reqreply_p99_ms"]
    assert r["round_p50_ms"] <= r["round_p99_ms"]
    assert r["loadavg_start"] >= 0 and r["cores"] >= 1


def test_a_process_and_warm_and_cold_containers_on_the_engine(docker: Any) -> None:
    before = {t for i in docker.images.list() for t in i.tags}
    r = _bench("--n", "1")
    assert [k["kind"] for k in r["kinds"]] == list(KINDS)
    for kind in r["kinds"]:
        _ordered(kind, 1)
    assert r["offered_per_s"] == 0.0 and r["sent_per_s"] == 0.0
    after = {t for i in docker.images.list() for t in i.tags}
    assert not {t for t in after - before if t.startswith("gavel-bench-start:e2e-")}
