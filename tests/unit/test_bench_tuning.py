"""`gavel bench --tuning` in memory: the interleaved segments (which settings each applies,
which side each round and placement is counted for, the order alternating), the pooled
figures and their ratios, the verdicts, and the flags it refuses. (The sitting itself, on a
real broker over real NATS, is tests/integration/test_bench_run.py's.)"""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path
from typing import Any

import pytest

from gavel.bench import tuning as tu
from gavel.bench.bare import p99
from gavel.bench.verify import VerifyError
from gavel.cli.main import main
from gavel.shared.api import TuneReply


def _seg(side: str, rounds: list[float], placed: int = 0, seconds: float = 1.0) -> tu.Segment:
    return tu.Segment(side, seconds, placed, rounds)


def test_a_sides_p99_pools_every_round_it_closed() -> None:
    c = tu.Comparison("open", "round_p99_ms", 1.5, most=True, segments=[
        _seg("defaults", [10.0] * 99), _seg("reference", [10.0] * 50),
        _seg("defaults", [40.0] * 2), _seg("reference", [20.0] * 50)])
    # 101 rounds of the defaults, the slowest two 40 ms: the pooled p99 is 40
    assert c.figure("defaults") == 40.0 and c.figure("reference") == 20.0
    assert c.pooled == 2.0
    assert c.pair_ratios == [1.0, 2.0]  # each pair of segments alone (rule 6)
    assert c.ratio == 1.5 and c.met  # judged: the median of the pairs


def test_one_stalled_segment_moves_one_pair_not_the_verdict() -> None:
    segs = [_seg(side, [10.0] * 100) for _ in range(5) for side in ("defaults", "reference")]
    segs[4] = _seg("defaults", [10.0] * 90 + [600.0] * 10)  # a stall of the machine
    c = tu.Comparison("open", "round_p99_ms", 1.5, most=True, segments=segs)
    assert c.pair_ratios == [1.0, 1.0, 60.0, 1.0, 1.0]
    assert c.pooled == 60.0 and c.ratio == 1.0 and c.met
    segs[0] = segs[8] = _seg("defaults", [10.0] * 90 + [600.0] * 10)  # three pairs of five
    assert c.ratio == 60.0 and not c.met


def test_a_closed_loops_figure_is_placements_over_seconds() -> None:
    c = tu.Comparison("closed", "placements_per_s", 0.9, most=False, segments=[
        _seg("reference", [], 1000, 0.5), _seg("defaults", [], 1800, 2.0),
        _seg("reference", [], 3000, 1.5), _seg("defaults", [], 1800, 2.0)])
    assert c.figure("reference") == 2000.0 and c.figure("defaults") == 900.0
    assert c.pooled == 0.45 and c.pair_ratios == [0.45, 0.45] and not c.met
    c.segments[1].placed = c.segments[3].placed = 3600
    assert c.pair_ratios == [0.9, 0.9] and c.ratio == 0.9 and c.met  # at the bound is met
    c.segments[3].placed = 1800
    assert c.pair_ratios == [0.9, 0.45] and c.ratio == 0.675 and not c.met
    d = c.as_dict()
    assert d["met"] is False and d["ratio"] == 0.675 and len(d["segments"]) == 4
    assert d["pooled"] == 0.675 and d["pair_ratios"] == [0.9, 0.45]


def _closed(ratios: list[float]) -> tu.Comparison:
    """A closed loop whose pairs' ratios are `ratios` (the reference places 1,000 a second)."""
    return tu.Comparison("closed", "placements_per_s", 0.9, most=False, segments=[
        seg for r in ratios for seg in (_seg("defaults", [], round(1000 * r)),
                                        _seg("reference", [], 1000))])


def test_the_median_comes_with_the_interval_its_pairs_give_it() -> None:
    # eleven pairs: the 3rd and 9th smallest hold the median with 1 - 2 * 67/2048 = 93.5%;
    # the 4th and 8th (1 - 2 * 232/2048 = 77%) would not
    c = _closed([0.5, 0.6, 0.7, 0.8, 0.85, 0.95, 1.0, 1.1, 1.2, 1.3, 1.4])
    assert c.ratio == 0.95 and c.met and c.interval == (0.7, 1.2)
    assert not c.decisive  # 0.9 lies inside: this sitting cannot tell
    assert "93" not in c.line() and "interval 0.7-1.2: the bound lies inside it" in c.line()
    d = c.as_dict()
    assert d["interval"] == (0.7, 1.2) and d["decisive"] is False
    assert _closed([1.0 + k / 100 for k in range(11)]).decisive  # all well above the bound
    low = _closed([0.5 + k / 100 for k in range(11)])
    assert low.decisive and not low.met and "cannot tell" not in low.line()
    # five pairs: the outermost hold it with 1 - 2/32; four cannot hold it at 90%
    assert _closed([1.0, 2.0, 3.0, 4.0, 5.0]).interval == (1.0, 5.0)
    four = _closed([1.0, 2.0, 3.0, 4.0])
    assert four.interval is None and not four.decisive and "interval" not in four.line()
    # forty-four pairs (an open loop's): the 17th from each end (1 - 2 * P(16 or fewer) = 90.4%)
    many = _closed([1 + k / 100 for k in range(44)])
    assert many.interval == (1.16, 1.27)


def test_no_rounds_or_no_seconds_make_no_figure() -> None:
    c = tu.Comparison("open", "round_p99_ms", 1.5, most=True)
    assert c.figure("defaults") == 0.0 and c.ratio == 0.0 and not c.met
    c.segments = [_seg("defaults", []), _seg("reference", [10.0]),  # a stalled segment
                  _seg("defaults", [30.0]), _seg("reference", [10.0])]
    assert c.pair_ratios == [3.0] and c.ratio == 3.0  # the pair without a figure has none
    assert p99([]) == 0.0 and p99([3.0]) == 3.0
    assert p99([float(v) for v in range(1, 201)]) == 198.0


class _FakeBroker:
    """A broker whose rounds take 10 ms under the defaults and 20 ms pinned, one a tune."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.total = 0

    async def tune(self, settings: dict[str, Any], apply: bool = True) -> TuneReply:
        pinned = bool(self.applied and self.applied[-1])
        if not apply:  # a read: where the running tuner stands
            return TuneReply(batch_max=24, max_auctions=1, commit_gap_ms=20.0, pinned=[],
                             level=0 if pinned else 5, changes=len(self.applied), round_ms=[],
                             rounds=0, placed_total=self.total)
        self.applied.append(dict(settings))
        self.total += 7
        return TuneReply(batch_max=24, max_auctions=1, commit_gap_ms=20.0, pinned=[],
                         level=0, changes=0, round_ms=[20.0 if pinned else 10.0], rounds=1,
                         placed_total=self.total)

    async def placed(self) -> int:
        return self.total


class _FakeLoad:
    open_ended = False  # an open loop's: submitted for the segments' seconds

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.started: list[float] = []
        self.stopped = False

    async def start(self, seconds: float) -> None:
        self.started.append(seconds)

    async def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize("reference_first", [False, True])
def test_the_segments_alternate_and_each_is_counted_for_the_side_it_ran(
        reference_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    broker, load = _FakeBroker(), _FakeLoad()
    c = tu.Comparison("open", "round_p99_ms", 1.5, most=True)
    monkeypatch.setattr(tu, "WARM_S", 0.01)
    asyncio.run(tu._interleave(broker, c, tu.LATENCY, 3, 0.01, reference_first,
                               load))  # type: ignore[arg-type]
    first, second = ("reference", "defaults") if reference_first else ("defaults",
                                                                      "reference")
    # AB BA AB: the order alternates from pair to pair (rule 5)
    assert [s.side for s in c.segments] == [first, second, second, first, first, second]
    settings = {"defaults": tu.DEFAULTS, "reference": tu.LATENCY}
    # the first side warms up uncounted; each segment's settings applied as it began; the
    # defaults again after the last
    assert broker.applied == [settings[first]] + [settings[s.side] for s in c.segments] + [
        tu.DEFAULTS]
    # a tune's reply carries the rounds of the settings it replaced
    assert [s.round_ms for s in c.segments] == [
        [20.0 if s.side == "reference" else 10.0] for s in c.segments]
    assert c.figure("reference") / c.figure("defaults") == 2.0
    assert all(s.placed == 7 for s in c.segments)
    # where each segment's tuner stood as it ended, read before the change
    assert [s.level for s in c.segments] == [0 if s.side == "reference" else 5
                                             for s in c.segments]
    assert [s.changes for s in c.segments] == list(range(2, 8))
    assert load.started == [pytest.approx(0.07)] and load.stopped


@pytest.mark.parametrize("flag", [["--batch-max", "24"], ["--rate", "100"], ["--targets"],
                                  ["--only", "sampled"], ["--ha"], ["--placements", "100"]])
def test_flags_of_one_run_do_not_go_with_tuning(flag: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--tuning", *flag]) == 2
    assert "cannot go with --tuning" in capsys.readouterr().err


def test_a_sitting_cannot_be_scaled_up(capsys: pytest.CaptureFixture[str]) -> None:
    """Rule 7: `--scale` makes a sitting smaller, never larger, and says so."""
    assert main(["bench", "--tuning", "--scale", "2"]) == 2
    assert "--scale 2 with --tuning: a sitting can be made smaller" in capsys.readouterr().err
    for wrong in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="a sitting's scale lies in"):
            tu.Scaled.at(wrong)


_Seen = tuple[str, float, float | None, int | None]


def _dry_sitting(monkeypatch: pytest.MonkeyPatch, scale: float = 1.0
                 ) -> tuple[list[_Seen], list[tu.Scaled]]:
    """A sitting of four pairs at `scale` with nothing run: each comparison's name, segment
    seconds, warm-up and closed-loop depth as `_interleave` was asked, and the size each
    capacity measurement was asked at."""
    seen: list[_Seen] = []
    capacities: list[tu.Scaled] = []

    async def interleave(broker: Any, c: tu.Comparison, reference: dict[str, Any],
                         pairs: int, segment_s: float, reference_first: bool, load: Any,
                         warm_s: float | None = None) -> None:
        seen.append((c.name, segment_s, warm_s, getattr(load, "n", None)))

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    async def capacity(*args: Any) -> float:
        capacities.append(args[-1])
        return 100.0

    monkeypatch.setattr(tu, "_interleave", interleave)
    monkeypatch.setattr(tu, "until_healthy", nothing)
    monkeypatch.setattr(tu, "_capacity", capacity)
    monkeypatch.setattr(tu, "verify_churn", lambda *_: None)
    monkeypatch.setattr(tu, "_Broker", lambda _: _FakeBroker())
    rig = types.SimpleNamespace(nc=None, opts=types.SimpleNamespace(agents=1), root=None,
                                broker=None)
    asyncio.run(tu.sitting(4, scale=scale)(rig))  # type: ignore[arg-type]
    return seen, capacities


def test_a_scaled_sitting_shrinks_its_closed_loops_depths_and_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 7: at a quarter, the closed loops keep a quarter of their depths, the closed
    loop's segments and warm-up and the capacity's counted seconds are a quarter as long;
    the open loops are as they were. A depth is never below one submission."""
    seen, capacities = _dry_sitting(monkeypatch, 0.25)
    assert [s[1:3] for s in seen[:3]] == [(tu.SEGMENT_S, None)] * 3
    assert seen[3] == ("closed loop", tu.CLOSED_SEGMENT_S / 4, tu.CLOSED_WARM_S / 4,
                       tu.BACKLOG_N // 4)
    assert capacities == [tu.Scaled(tu.BACKLOG_N // 4, tu.CAPACITY_N // 4,
                                    tu.CAPACITY_S / 4, tu.CLOSED_SEGMENT_S / 4,
                                    tu.CLOSED_WARM_S / 4)] * 3
    assert tu.Scaled.at(1.0) == tu.Scaled(tu.BACKLOG_N, tu.CAPACITY_N, tu.CAPACITY_S,
                                          tu.CLOSED_SEGMENT_S, tu.CLOSED_WARM_S)
    tiny = tu.Scaled.at(0.001)
    assert tiny.backlog_n == tiny.capacity_n == 1000  # one submission


def test_the_closed_loop_makes_a_pair_for_every_four_open_loop_pairs_and_at_least_one() -> None:
    """Rule 4: the closed loop's segments are long (8 s), so it makes fewer pairs than the
    open loops' many short ones; a quick sitting (`--repeat 1`) still makes one."""
    assert tu.closed_pairs(tu.PAIRS) == 11 and tu.PAIRS * tu.SEGMENT_S == 22.0
    assert tu.closed_pairs(1) == tu.closed_pairs(4) == 1 and tu.closed_pairs(8) == 2
    assert tu.CLOSED_SEGMENT_S > tu.SEGMENT_S


def test_the_first_segment_begins_only_after_the_warm_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 5: what runs before the first segment is not counted; told a warm-up, the first
    side runs that long first, and the load is asked for it too."""
    class Timed(_FakeBroker):
        def __init__(self) -> None:
            super().__init__()
            self.at: list[float] = []

        async def tune(self, settings: dict[str, Any], apply: bool = True) -> TuneReply:
            if apply:
                self.at.append(time.perf_counter())
            return await super().tune(settings, apply)

    monkeypatch.setattr(tu, "WARM_S", 0.0)
    broker, load = Timed(), _FakeLoad()
    c = tu.Comparison("closed loop", "placements_per_s", 0.9, most=False)
    asyncio.run(tu._interleave(broker, c, tu.THROUGHPUT, 1, 0.01, True, load,  # type: ignore[arg-type]
                               0.3))
    assert broker.at[1] - broker.at[0] >= 0.3  # the warm-up, then the first segment's start
    assert load.started == [pytest.approx(0.32)]
    assert len(c.segments) == 2


def test_the_sittings_closed_loop_warms_up_until_its_priming_is_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 5: the closed loop's priming leaves a deeper queue than the loop keeps, so it
    warms up for `CLOSED_WARM_S` (two of its segments); the open loops for `WARM_S`."""
    seen, _ = _dry_sitting(monkeypatch)
    warms = [(name, warm) for name, _, warm, _ in seen]
    assert [w for _, w in warms] == [None, None, None, tu.CLOSED_WARM_S]
    assert warms[-1][0] == "closed loop"
    assert tu.CLOSED_WARM_S >= 2 * tu.CLOSED_SEGMENT_S


@pytest.mark.parametrize("open_ended", [True, False])
def test_a_closed_loops_segment_lasts_its_seconds_however_slow_the_change_before_it(
        open_ended: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 4: a broker that answers a change late (here 0.25 s, a segment being 0.1 s) does
    not shorten the closed loop's next segment to a sliver; an open loop's keep to the grid
    its load was submitted for."""
    class Slow(_FakeBroker):
        async def tune(self, settings: dict[str, Any], apply: bool = True) -> TuneReply:
            if apply and len(self.applied) == 2:  # the first segment's end
                await asyncio.sleep(0.25)
            return await super().tune(settings, apply)

    monkeypatch.setattr(tu, "WARM_S", 0.0)
    load = _FakeLoad()
    load.open_ended = open_ended  # type: ignore[misc]
    c = tu.Comparison("loop", "placements_per_s", 0.9, most=False)
    asyncio.run(tu._interleave(Slow(), c, tu.THROUGHPUT, 2, 0.1, False,  # type: ignore[arg-type]
                               load))
    seconds = [s.seconds for s in c.segments]
    if open_ended:
        assert all(s >= 0.1 for s in seconds), seconds
    else:  # the grid: the segment after the slow change is what is left of its tenth
        assert seconds[0] >= 0.35 and seconds[1] < 0.05, seconds


@pytest.mark.parametrize("lands_after_s", [0.15, None])
def test_a_closed_loops_empty_segment_waits_for_its_first_landing(
        lands_after_s: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 4: a closed-loop segment (0.1 s) in which nothing has landed by its end goes on
    until its first placement lands (here after 0.15 s), and no longer than `STRETCH` times
    its seconds when nothing does; an open loop's empty segment keeps to its grid."""
    class Late(_FakeBroker):
        """Nothing lands in the first segment until `lands_after_s` into it."""

        def __init__(self) -> None:
            super().__init__()
            self.first_at: float | None = None

        async def tune(self, settings: dict[str, Any], apply: bool = True) -> TuneReply:
            if apply:
                if len(self.applied) == 1:  # the first segment begins with this change
                    self.first_at = time.perf_counter()
                return await super().tune(settings, apply)
            if self.first_at is not None and len(self.applied) == 2:  # within the first
                landed = lands_after_s is not None and \
                    time.perf_counter() - self.first_at >= lands_after_s
                if landed:
                    self.total += 100
            return await super().tune(settings, apply)

    monkeypatch.setattr(tu, "WARM_S", 0.0)
    monkeypatch.setattr(tu, "STRETCH_EVERY_S", 0.01)
    for open_ended in (True, False):
        load = _FakeLoad()
        load.open_ended = open_ended  # type: ignore[misc]
        c = tu.Comparison("loop", "placements_per_s", 0.9, most=False)
        asyncio.run(tu._interleave(Late(), c, tu.THROUGHPUT, 1, 0.1, False,  # type: ignore[arg-type]
                                   load))
        first = c.segments[0]
        if not open_ended:  # an open loop: the grid, however empty
            assert first.seconds < 0.14, first
        elif lands_after_s is None:  # nothing landed: three segments' seconds, then on
            assert 0.3 <= first.seconds < 0.4 and first.placed == 7, first
        else:
            assert 0.15 <= first.seconds < 0.25 and first.placed == 107, first


@pytest.mark.parametrize("lands_after_s", [0.05, 0.15, None])
def test_an_empty_capacity_window_waits_for_its_first_landing(
        lands_after_s: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 2: a capacity window (0.1 s) counts what landed over its seconds; one in which
    nothing has landed by its end goes on until its first placement lands (after 0.15 s),
    and no longer than `STRETCH` times its seconds when none does (a capacity of 0 then)."""
    class Late(_FakeBroker):
        def __init__(self) -> None:
            super().__init__()
            self.began: float | None = None

        async def placed(self) -> int:
            now = time.perf_counter()
            if self.began is None:
                self.began = now
            elif lands_after_s is not None and now - self.began >= lands_after_s:
                self.total = 100
            return self.total

    monkeypatch.setattr(tu, "STRETCH_EVERY_S", 0.01)
    landed, seconds = asyncio.run(tu._landed_over(Late(), 0.1))  # type: ignore[arg-type]
    if lands_after_s == 0.05:  # within the window: its seconds, as they were
        assert landed == 100 and 0.1 <= seconds < 0.3, seconds
    elif lands_after_s is None:  # nothing landed: three windows' seconds, then on
        assert landed == 0 and 0.3 <= seconds < 0.8, seconds
    else:  # stretched until it landed, not to its end
        assert landed == 100 and 0.15 <= seconds < 0.3, seconds


def test_the_sitting_reads_git_again_while_a_requeued_award_is_landing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 5: awards counted reach what was asked one early for a requeued instance; the
    check is read again until its second award lands, and a failure that never heals (a
    double award) is still raised."""
    calls: list[int] = []

    def landing(*_: Any) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise VerifyError("x-1 won 1 awards in git history, not one and one for each of "
                              "its 1 requeues")

    monkeypatch.setattr(tu, "verify_churn", landing)
    asyncio.run(tu._verified(Path("."), ["x-1"], within_s=5.0, every_s=0.01))
    assert len(calls) == 3

    def double(*_: Any) -> None:
        raise VerifyError("x-1 won 2 awards in git history, not one")

    monkeypatch.setattr(tu, "verify_churn", double)
    with pytest.raises(VerifyError, match="won 2 awards"):
        asyncio.run(tu._verified(Path("."), ["x-1"], within_s=0.05, every_s=0.01))
