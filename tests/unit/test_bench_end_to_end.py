"""`gavel bench --end-to-end`'s flags and its report (`cli.benchend`, `bench.endreport`), and
how a measured instance's events are read (`bench.endtoend._Watch`), in memory."""

from __future__ import annotations

import argparse

import pytest

from gavel.bench.endreport import KINDS, KindFigures, Report, percentile, summarize
from gavel.bench.endtoend import NO_ENGINE, _Watch
from gavel.cli import bench, benchend
from gavel.shared.messages import Event


def _parsed(*argv: str) -> tuple[argparse.Namespace, dict[str, object]]:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv)), vars(p.parse_args([]))


def test_end_to_end_takes_its_own_flags_and_the_load_rate() -> None:
    args, defaults = _parsed("--end-to-end", "--n", "3", "--rate", "50", "--no-containers",
                             "--json")
    assert benchend.clash(args, defaults) == ""
    assert (args.end_to_end, args.n, args.rate, args.no_containers) == (True, 3, 50.0, True)
    args, defaults = _parsed("--end-to-end")
    assert (args.n, args.rate, args.no_containers) == (20, None, False)


@pytest.mark.parametrize(("argv", "said"), [
    (["--end-to-end", "--agents", "5"], "--agents cannot go with --end-to-end: it takes --n, "
     "--rate, --no-containers, --state and --json."),
    (["--end-to-end", "--targets"], "--targets cannot go with --end-to-end: it takes --n, "
     "--rate, --no-containers, --state and --json."),
    (["--n", "3"], "--n only goes with --end-to-end."),
    (["--no-containers"], "--no-containers only goes with --end-to-end."),
])
def test_flags_that_do_not_go_with_end_to_end_are_one_sentence(argv: list[str],
                                                               said: str) -> None:
    args, defaults = _parsed(*argv)
    assert benchend.clash(args, defaults) == said


def test_the_placement_run_keeps_its_flags() -> None:
    args, defaults = _parsed("--agents", "5", "--rate", "100")
    assert benchend.clash(args, defaults) == ""


def test_a_percentile_is_a_sample_never_between_two() -> None:
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(samples, 0.5) == 3.0
    assert percentile(samples, 0.99) == 5.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_a_kind_summary_orders_its_figures_and_gives_the_ratio() -> None:
    samples = {"placed": [10.0, 20.0, 30.0], "running": [40.0, 50.0, 90.0],
               "healthy": [60.0, 70.0, 100.0]}
    k = summarize("process", samples, reqreply_p50_ms=2.0)
    assert (k.n, k.placed_p50_ms, k.running_p50_ms, k.healthy_p50_ms) == (3, 20.0, 50.0, 70.0)
    assert (k.running_p99_ms, k.healthy_p99_ms) == (90.0, 100.0)
    assert (k.running_p50_in_reqreply_p50, k.healthy_p50_in_reqreply_p50) == (25.0, 35.0)
    assert summarize("process", samples, 0.0).running_p50_in_reqreply_p50 == 0.0
    with pytest.raises(ValueError, match="same number of samples"):
        summarize("process", {**samples, "healthy": [1.0]}, 2.0)


def _report() -> Report:
    measured = summarize("process", {"placed": [1.0], "running": [2.0], "healthy": [3.0]}, 1.0)
    skipped = [KindFigures(kind=k, skipped=NO_ENGINE) for k in KINDS[1:]]
    return Report(n=1, offered_per_s=50.0, sent_per_s=49.5, load_refused=0, loadavg_start=3.0,
                  loadavg_end=4.0, cores=2, nats_reqreply_p50_ms=1.0,
                  nats_reqreply_p99_ms=5.0, round_p50_ms=6.0, round_p99_ms=9.0, seconds=2.0,
                  kinds=[measured, *skipped])


def test_the_report_has_every_kind_the_load_and_the_skipped_sentence() -> None:
    d = _report().as_dict()
    assert [k["kind"] for k in d["kinds"]] == list(KINDS)
    assert d["offered_per_s"] == 50.0 and d["loadavg_end"] == 4.0
    for key in ("placed", "running", "healthy"):
        assert d["kinds"][0][f"{key}_p50_ms"] <= d["kinds"][0][f"{key}_p99_ms"]
    assert d["kinds"][1]["skipped"] == NO_ENGINE and d["kinds"][1]["n"] == 0
    lines = _report().lines()
    assert lines[0].startswith("offered load 50 submits/s (sent 49.5/s, 0 refused); load "
                               "average 3.0 -> 4.0 on 2 cores")
    assert f"  container-warm  skipped: {NO_ENGINE}" in lines


def _event(kind: str, reason: str = "") -> Event:
    return Event(instance_id="i", type=kind, reason=reason)


def test_a_watch_has_every_stage_then_the_end() -> None:
    w = _Watch()
    for at, kind in enumerate(["scheduled", "placed", "provisioning", "running", "running",
                               "healthy"]):
        w.heard(_event(kind), float(at))
    assert w.all_seen.is_set() and not w.failure
    assert w.seen == {"placed": 1.0, "running": 3.0, "healthy": 5.0}  # the first of each
    assert not w.ended.is_set()
    w.heard(_event("cancelled"), 9.0)
    assert w.ended.is_set() and not w.failure


def test_a_watch_says_why_a_start_failed() -> None:
    w = _Watch()
    w.heard(_event("running"), 1.0)
    w.heard(_event("unhealthy", "health check failing"), 2.0)
    assert w.all_seen.is_set() and w.failure == "unhealthy: health check failing"
    assert not w.ended.is_set()  # the worker may restart it: its end is still to come
    w = _Watch()
    w.heard(_event("unschedulable", "no node bid"), 1.0)
    assert w.failure == "unschedulable: no node bid"


def test_a_stage_heard_before_an_earlier_one_ends_the_wait_as_lost() -> None:
    """The events of one instance come in order: healthy without running means running's
    event was lost (`bench.endtoend` rule 6), and the start is not timed."""
    w = _Watch()
    w.heard(_event("placed"), 1.0)
    w.heard(_event("healthy"), 3.0)
    assert w.all_seen.is_set() and w.lost == ["running"] and not w.failure


def test_lost_starts_are_counted_beside_the_figures() -> None:
    k = summarize("container-cold", {"placed": [1.0], "running": [2.0], "healthy": [3.0]},
                  1.0, lost_events=2)
    assert k.lost_events == 2 and k.n == 1
    lines = Report(n=3, offered_per_s=50.0, sent_per_s=50.0, load_refused=0,
                   loadavg_start=1.0, loadavg_end=1.0, cores=2, nats_reqreply_p50_ms=1.0,
                   nats_reqreply_p99_ms=1.0, round_p50_ms=1.0, round_p99_ms=1.0, seconds=1.0,
                   kinds=[k]).lines()
    assert lines[3].endswith("(2 not timed: an event lost)")
