"""Periodic jobs against a real broker, real workers and real processes: a job scheduled
every second runs again and again, each run an ordinary instance placed by an auction;
with overlap = "skip" a fire time that comes while the last run still runs is skipped,
with "allow" runs overlap; a broker started again neither loses nor doubles a fire time;
`gavel cancel NAME` stops the schedule; `gavel status NAME` shows the history."""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    DeployReply,
    DeployRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.cron import unstamp
from gavel.shared.messages import EventType, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import PeriodicRecord, PeriodicRun
from gavel.transport.client import BrokerRefused
from tests.integration.clibatch import Line, run_all
from tests.integration.harness import TIMING, Cluster, wait_for

EVERY_SECOND = "* * * * * *"


def job(cluster: Cluster, name: str) -> PeriodicRecord:
    assert cluster.broker is not None
    return cluster.broker.ledger.state().periodic[name]


def runs(cluster: Cluster, name: str) -> list[PeriodicRun]:
    return [h for h in job(cluster, name).history if h.instance_id]


def ended(cluster: Cluster, iid: str) -> str:
    """The run's state if it ended (its record's terminal state), else ""."""
    assert cluster.broker is not None
    rec = cluster.broker.ledger.state().instances.get(iid)
    return str(rec.state) if rec is not None and rec.state.terminal else ""


def gate_spec(name: str, gate: Path, **kw: object) -> Spec:
    """A run that lasts until the file `gate` exists."""
    code = f"import pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.05)"
    return Spec(name=name, command=[sys.executable, "-c", code], schedule=EVERY_SECOND,
                **kw)  # type: ignore[arg-type]


async def test_a_periodic_job_runs_twice_shows_its_history_and_cancel_stops_it(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = Spec(name="tick", command=["true"], schedule=EVERY_SECOND)
    got = await cluster.call("submit", SubmitRequest(spec=spec), SubmitReply)
    assert got.instance_id == "tick"
    await wait_for(lambda: sum(1 for r in runs(cluster, "tick")
                               if ended(cluster, r.instance_id) == "succeeded") >= 2, 60,
                   what="two runs that succeeded")
    made = runs(cluster, "tick")
    assert len({r.instance_id for r in made}) == len(made)  # each run its own instance
    assert cluster.broker is not None
    for r in made[:2]:  # each placed by an auction like any instance
        assert any(e.instance_id == r.instance_id and e.type == EventType.PLACED
                   for e in cluster.broker.events)
    broker = cluster.broker
    assert any(e.instance_id == "tick" and e.type == EventType.PERIODIC_RUN
               and e.detail.startswith(made[0].instance_id) for e in broker.events)
    await wait_for(lambda: (broker.metrics.registry.get_sample_value(
        "gavel_periodic_runs_total", {"outcome": "run"}) or 0) >= 2, 30, what="runs counted")

    # The history keeps the latest `HISTORY` runs and a run fires every second: a run that
    # had succeeded before the call and is still kept after it was shown while it ran.
    steady: set[str] = set()
    for _ in range(5):
        before = {r.instance_id for r in runs(cluster, "tick")
                  if ended(cluster, r.instance_id) == "succeeded"}
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gavel", "status", "tick", "--nats",
                             cluster.url], capture_output=True, text=True, timeout=60)
        steady = before & {r.instance_id for r in runs(cluster, "tick")}
        if steady:
            break
    assert steady, "no run stayed in the history across a status call"
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("periodic job tick: schedule '* * * * * *' (UTC), overlap "
                                   "skip\n"), shown.stdout
    for iid in steady:
        assert f"{iid}  succeeded" in shown.stdout.replace("   ", "  "), shown.stdout

    web = Spec(name="tick", type="service", command=["sleep", "60"])  # one name, one thing
    with pytest.raises(BrokerRefused, match=f"{Reason.NAME_TAKEN}: tick is a periodic job"):
        await cluster.call("deploy", DeployRequest(spec=web), DeployReply)

    reply = await cluster.call("cancel", CancelRequest(instance_id="tick"), CancelReply)
    assert reply.state == "cancelled"
    assert job(cluster, "tick").stopped
    last = job(cluster, "tick").last_run
    t0 = time.time()
    await wait_for(lambda: time.time() >= t0 + 3, 10, what="three more fire times")
    await asyncio.sleep(0.5)  # a tick of the broker's loop after them
    assert job(cluster, "tick").last_run == last  # no fire time was acted on since
    st = await cluster.call("status", StatusRequest(instance_id="tick"), StatusReply)
    assert st.periodic is not None and st.periodic.stopped and st.periodic.next_run == ""


async def test_overlap_skip_skips_while_the_run_still_runs_and_allow_overlaps(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    gate = tmp_path / "gate"
    await cluster.call("submit", SubmitRequest(spec=gate_spec("slow", gate)), SubmitReply)
    await wait_for(lambda: any(h.skipped for h in job(cluster, "slow").history), 60,
                   what="a fire time skipped while the first run runs")
    history = job(cluster, "slow").history
    assert len(runs(cluster, "slow")) == 1  # one run made, the rest skipped
    assert {h.skipped for h in history if not h.instance_id} == {Reason.PERIODIC_OVERLAP}
    assert cluster.broker is not None
    broker = cluster.broker
    await wait_for(lambda: any(  # told once the commit is durable
        e.instance_id == "slow" and e.type == EventType.PERIODIC_SKIPPED
        and e.reason == Reason.PERIODIC_OVERLAP for e in broker.events), 30,
        what="the periodic-skipped event")
    assert (broker.metrics.registry.get_sample_value(
        "gavel_periodic_runs_total", {"outcome": "skipped"}) or 0) >= 1
    first = runs(cluster, "slow")[0].instance_id
    gate.touch()  # the first run ends: the next fire time makes a run again
    await wait_for(lambda: len(runs(cluster, "slow")) >= 2, 60, what="the second run")
    assert ended(cluster, first) == "succeeded"
    await cluster.call("cancel", CancelRequest(instance_id="slow"), CancelReply)

    gate2 = tmp_path / "gate2"
    await cluster.call("submit", SubmitRequest(spec=gate_spec("both", gate2,
                                                              overlap="allow")), SubmitReply)

    def live_at_once() -> int:
        return sum(1 for r in runs(cluster, "both") if not ended(cluster, r.instance_id))
    await wait_for(lambda: live_at_once() >= 2, 60, what="two runs live at once")
    assert not any(h.skipped for h in job(cluster, "both").history)
    reply = await cluster.call("cancel", CancelRequest(instance_id="both"), CancelReply)
    assert reply.state == "cancelled"
    await wait_for(lambda: live_at_once() == 0, 60, what="cancel to end the live runs")
    assert {ended(cluster, r.instance_id) for r in runs(cluster, "both")} == {"cancelled"}


#: A commit line of a run or a skip (`broker.periodic`) and the missed count it ends with.
LINE = r"^periodic {name}: (?:run (?P<id>{name}-\S+) for|skip) (?P<when>[\d-]+ [\d:]+) UTC"
MISSED = re.compile(r"\((\d+) earlier fire times missed\)$")


def recorded(state: Path, name: str) -> list[tuple[int, int, str]]:
    """Every fire time of job `name` the branch's commits acted on, read afresh from git:
    (the time, the fire times missed before it, the run's id or "" for a skip)."""
    line_of = re.compile(LINE.format(name=re.escape(name)))
    out = []
    for commit in Ledger(state / "state.git").history():
        for line in commit.message.splitlines():
            m = line_of.match(line.strip())
            if m is not None:
                at = unstamp(m["when"].replace(" ", "T") + "Z")
                assert at is not None
                missed = MISSED.search(line.strip())
                out.append((at, int(missed[1]) if missed else 0, m["id"] or ""))
    return sorted(out)


def accounted(got: list[tuple[int, int, str]]) -> None:
    """Every fire time of an every-second schedule from the first recorded to the last is
    recorded once: a run, a skip, or counted as missed in the next one recorded; no run twice."""
    times = [at for at, _, _ in got]
    assert len(times) == len(set(times)), got  # none twice
    runs = [iid for _, _, iid in got if iid]
    assert len(runs) == len(set(runs))
    for (before, _, _), (at, missed, _) in itertools.pairwise(got):
        assert at - before == 1 + missed, (before, at, missed)  # none lost


async def test_a_cancelled_jobs_record_leaves_the_tree_after_the_retention_window(
        cluster: Cluster) -> None:
    """`periodic/<name>.json` of a cancelled job is kept `retention_s` (status answers, with
    its history), then leaves the tree in a commit that says so; the name is free again."""
    broker = await cluster.start_broker(timing=msgspec.structs.replace(TIMING,
                                                                       retention_s=2.0))
    spec = Spec(name="gone", command=["true"], schedule=EVERY_SECOND)
    await cluster.call("submit", SubmitRequest(spec=spec), SubmitReply)
    await wait_for(lambda: len(runs(cluster, "gone")) >= 1, 30, what="a run (queued)")
    await cluster.call("cancel", CancelRequest(instance_id="gone"), CancelReply)
    st = await cluster.call("status", StatusRequest(instance_id="gone"), StatusReply)
    assert st.periodic is not None and st.periodic.stopped and st.periodic.history
    assert job(cluster, "gone").stopped_at

    def in_tree() -> bool:
        ledger = cluster.ledger()
        tree = ledger.repo[ledger.head()].peel(pygit2.Tree)
        return "periodic" in tree and "gone.json" in tree["periodic"].peel(pygit2.Tree)
    assert in_tree()
    await wait_for(lambda: "gone" not in broker.ledger.state().periodic, 30,
                   what="the cancelled record forgotten")
    assert not in_tree()
    assert any("periodic gone: forget its record, cancelled " in c.message
               for c in cluster.ledger().history())
    with pytest.raises(BrokerRefused, match=Reason.UNKNOWN_INSTANCE):
        await cluster.call("status", StatusRequest(instance_id="gone"), StatusReply)
    web = Spec(name="gone", type="service", command=["sleep", "60"], count=0)
    await cluster.call("deploy", DeployRequest(spec=web), DeployReply)  # the name is free


async def test_a_broker_started_again_neither_loses_nor_doubles_a_fire_time(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = Spec(name="beat", command=["true"], schedule=EVERY_SECOND, overlap="allow")
    await cluster.call("submit", SubmitRequest(spec=spec), SubmitReply)
    await wait_for(lambda: len(runs(cluster, "beat")) >= 2, 60, what="two runs")
    await cluster.stop_broker()
    before = cluster.ledger().state().periodic["beat"]
    t0 = time.time()
    await wait_for(lambda: time.time() >= t0 + 3, 10, what="fire times while no broker runs")
    await cluster.start_broker()
    await wait_for(lambda: job(cluster, "beat").last_run > before.last_run, 60,
                   what="the schedule to go on")
    resumed = next(h for h in job(cluster, "beat").history if h.at > before.last_run)
    assert resumed.missed >= 2 and resumed.instance_id, resumed  # the latest ran once
    await wait_for(lambda: len([h for h in job(cluster, "beat").history
                                if h.at > before.last_run]) >= 3, 60, what="more runs")
    accounted(recorded(cluster.state, "beat"))


async def test_the_api_refuses_an_id_or_a_count_it_would_not_use(cluster: Cluster) -> None:
    """A periodic or system job is named by its spec's name: a submit naming another id, or
    asking a count, is refused with one sentence (not dropped) and writes nothing; its own
    name is taken."""
    broker = await cluster.start_broker()
    tick = Spec(name="tick", command=["true"], schedule="@daily")
    agent = Spec(name="agent", type="system", command=["sleep", "60"])
    for req, words in [
            (SubmitRequest(spec=tick, instance_id="other"),
             "--id 'other' does not apply to a periodic job"),
            (SubmitRequest(spec=tick, count=2), "count 2 does not apply to a periodic job"),
            (SubmitRequest(spec=agent, instance_id="other"),
             "--id 'other' does not apply to a system job"),
            (SubmitRequest(spec=agent, count=3), "count 3 does not apply to a system job")]:
        with pytest.raises(BrokerRefused, match=re.escape(words)):
            await cluster.call("submit", req, SubmitReply)
    state = broker.ledger.state()
    assert not state.periodic and not state.services and not state.instances
    got = await cluster.call("submit", SubmitRequest(spec=tick, instance_id="tick"),
                             SubmitReply)
    assert got.instance_id == "tick" and "tick" in broker.ledger.state().periodic


def test_bad_periodic_specs_are_refused_at_submit_naming_the_field(tmp_path: Path) -> None:
    cases = {
        "cron": ('schedule = "61 * * * *"', "schedule '61 * * * *' is not a cron expression"),
        "zone": ('schedule = "@daily"\ntime_zone = "Mars/Olympus"',
                 "time_zone 'Mars/Olympus' is not a time zone"),
        "service": ('type = "service"\nschedule = "@daily"',
                    "schedule applies to a job (type = \"job\"), not to a service"),
        "system": ('type = "system"\nschedule = "@daily"', "not to a system job"),
        "overlap": ('schedule = "@daily"\noverlap = "queue"',
                    "overlap 'queue' is not one of: skip, allow"),
        # --id names one instance: a periodic or system job is named by its spec's name.
        "id": ('schedule = "@daily"', "--id 'other' does not apply to a periodic job: it is "
               "named by its spec's name ('p') and names each run by its fire time"),
        "id-system": ('type = "system"', "--id 'other' does not apply to a system job"),
    }
    lines = []
    for name, (fields, _) in cases.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(f'name = "p"\ncommand = ["true"]\n{fields}\n')
        lines.append(Line(["submit", str(path), "--nats", "nats://127.0.0.1:1",
                           *(["--id", "other"] if name.startswith("id") else [])], tmp_path))
    for proc, (name, (_, words)) in zip(run_all(lines, tmp_path / "out.json"), cases.items(),
                                        strict=True):
        assert proc.returncode == 2, (name, proc.stderr)
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (name, proc.stderr)
