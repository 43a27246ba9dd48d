"""A periodic job's record in git: ``periodic/<name>.json``, written with a run's record in
one commit, read back by a broker started again; one that is not a periodic job's (no
schedule, another name) is unreadable, left as it is and ignored."""

from __future__ import annotations

from pathlib import Path

import pygit2

from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change
from gavel.shared.records import InstanceRecord, PeriodicRecord, PeriodicRun
from gavel.shared.spec import Spec

SPEC = Spec(name="tick", command=["true"], schedule="@hourly", time_zone="Europe/Riga")


def test_a_periodic_record_and_its_run_land_together_and_read_back(tmp_path: Path) -> None:
    pygit2.init_repository(str(tmp_path / "state.git"), bare=True)
    ledger = Ledger(tmp_path / "state.git")
    job = PeriodicRecord(name="tick", spec=SPEC, since="2026-12-02T06:00:00Z",
                         last_run="2026-12-02T07:00:00Z", history=[PeriodicRun(
                             at="2026-12-02T07:00:00Z", instance_id="tick-20261202t070000z")])
    run = InstanceRecord(instance_id="tick-20261202t070000z", spec=Spec(name="tick",
                                                                         command=["true"]))
    sha = ledger.apply(Change(instances={run.instance_id: run}, periodic={"tick": job}),
                       "periodic tick: run", None)
    assert ledger.state().periodic == {"tick": job}
    files = {e.name for e in ledger.repo[sha].peel(pygit2.Tree)["periodic"]}
    assert files == {"tick.json"}
    again = Ledger(tmp_path / "state.git").state()  # a broker started again
    assert again.periodic == {"tick": job}
    assert run.instance_id in again.instances


def test_a_file_that_is_no_periodic_job_is_unreadable(tmp_path: Path) -> None:
    pygit2.init_repository(str(tmp_path / "state.git"), bare=True)
    ledger = Ledger(tmp_path / "state.git")
    plain = PeriodicRecord(name="plain", spec=Spec(name="plain", command=["true"]))
    other = PeriodicRecord(name="someone", spec=SPEC)
    ledger.apply(Change(periodic={"plain": plain, "tick": other}), "by hand", None)
    st = Ledger(tmp_path / "state.git").state()
    assert st.periodic == {}
    assert st.unreadable == {"periodic/plain.json": "its spec has no schedule",
                             "periodic/tick.json": "it names periodic job 'someone'"}
