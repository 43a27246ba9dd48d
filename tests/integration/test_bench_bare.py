"""The bare auctioneer (`bench.bare`) against real bench agents on a real nats-server: its
rounds place, each award is confirmed and held by the agent it went to, and a ceiling that
placed nothing is an error, not a rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import nats
import pytest

from gavel.bench import bare
from gavel.bench.agentprocs import BARE_PREFIX, FORGET, FORGET_S, node_id, start_agents, stop
from gavel.shared import subjects
from gavel.shared.messages import RFB, Award, Request


async def test_the_bare_rounds_place_on_real_agents_and_each_award_is_held(
        nats_url: str, tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await start_agents(nats_url, 20, 2, tmp_path / "logs", started=procs)
        got = await bare.measure(nats_url, 20, 2, batch=6, d=2, seconds=0.5)
    finally:
        stop(procs)
    assert got.rounds > 1 and got.awarded >= 6
    assert got.confirmed == got.awarded  # every award taken and confirmed
    assert got.placements_per_s == pytest.approx(got.confirmed / got.seconds, rel=0.01)
    assert got.asked_per_round > 10  # d x batch distinct nodes of the 20, and the last winner
    assert 0 < got.round_p99_ms < 1000 * got.seconds  # its rounds are timed (rule 1)
    # every agent took its awards, and forgot them once asked (rule 3): what they say they
    # hold as they stop is nothing
    assert got.forgotten == got.confirmed
    held = [json.loads(p.stdout.read().splitlines()[-1])["held"] for p in procs
            if p.stdout is not None]
    assert held == [0, 0]


@pytest.mark.parametrize("client", ["lite", "nats-py"])
async def test_awards_queued_behind_a_backlog_are_taken_before_the_forget(
        nats_url: str, tmp_path: Path, client: str) -> None:
    """`bench.agentprocs` rule 3: the awards reach an agent on its own connection, the
    `FORGET` on the process's control connection, and here 100,000 RFBs queue before the
    awards: the process answers only once its agents took every award sent before the
    `FORGET`, and forgets them all - none is left held, to be listed in heartbeats that no
    broker admits."""
    procs: list[subprocess.Popen[bytes]] = []
    nc = await nats.connect(nats_url)
    try:
        await start_agents(nats_url, 2, 1, tmp_path / "logs", started=procs, client=client)
        enc = msgspec.msgpack.Encoder()
        shape = Request.of(bare.PREFIX, bare.SPEC).shape()
        backlog = enc.encode(RFB(auction_id="backlog", shapes=[shape], deadline_s=60.0))
        for _ in range(100_000):
            await nc.publish(subjects.RFB, backlog)
        for k in range(20):
            await nc.publish(subjects.AWARD.format(node=node_id(0)), enc.encode(Award(
                auction_id="a", instance_id=f"{BARE_PREFIX}a-{k}", node_id=node_id(0),
                spec=bare.SPEC)))
        answers = await nc.subscribe(nc.new_inbox())
        await nc.publish(FORGET, answers.subject.encode())
        answer = await answers.next_msg(timeout=FORGET_S)
    finally:
        await nc.close()
        stop(procs)
    assert int(answer.data) == 20
    (proc,) = procs
    assert proc.stdout is not None
    assert json.loads(proc.stdout.read().splitlines()[-1])["held"] == 0


async def test_a_ceiling_that_placed_nothing_is_an_error(nats_url: str) -> None:
    with pytest.raises(RuntimeError, match=r"awards in .* rounds to 5 agents .* were "
                                           r"never confirmed"):
        await bare.measure(nats_url, 5, 0, seconds=0.2, confirm_s=0.5)  # no agents there


def test_the_command_measures_with_agents_of_its_own(tmp_path: Path) -> None:
    """Rule 4: standalone, as a commit without the ceiling is measured beside it."""
    proc = subprocess.run([sys.executable, "-m", "gavel.bench.bare", "--agents", "8",
                           "--processes", "2", "--batch", "4", "--seconds", "0.5"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["confirmed"] == got["awarded"] > 0 and got["placements_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # its server's and agents' directory removed
