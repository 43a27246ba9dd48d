"""The auctioneer's self-tuning (`shared.tuning`), in memory: it climbs to the throughput
end for a backlog many times what its level holds (a closed loop's, not an open loop's
bursts near capacity, nor a short queue behind every round), a step at a time for a queue
that outlasts its windows (a shallow closed loop's, not a stall's as it drains), and holds
it while the step below could not hold the work in flight; comes back to the latency end as
the queue drains or rounds queue behind each other, holds still under a steady load, paces
commits by what they cost, pins what is given, says why in its trace, and the simulator's
production auctioneer drives it."""

from __future__ import annotations

from typing import Any

import msgspec

from gavel.shared.auction import Auction
from gavel.shared.auctionworld import Decided, Open
from gavel.shared.messages import Request, Spec
from gavel.shared.tuning import (
    BACKLOG,
    IDLE_S,
    LADDER,
    QUIET_ROUNDS,
    WINDOW,
    Tuner,
    saturated,
)
from gavel.sim.policies import plan, run_policy
from gavel.sim.scenario import parse_scenario

TOP = len(LADDER) - 1


def windows(t: Tuner, n: int, pattern: list[bool], round_s: float = 0.004,
            start: float = 0.0, demand: list[int] | None = None) -> list[int]:
    """`n` windows of closes saturated as `pattern` repeats, the work in flight after each
    close as `demand` repeats (none: nothing); the level after each."""
    levels, now = [], start
    for _ in range(n):
        for k in range(t.window):
            now += round_s
            t.closed(round_s, pattern[k % len(pattern)], now,
                     demand[k % len(demand)] if demand else 0)
        levels.append(t.level)
    return levels


def at(level: int, round_s: float = 0.004, **pinned: Any) -> Tuner:
    """A tuner at `level`, its last close at time 0: a backlog took it to the throughput end
    (rule 4) and windows that drained brought it down (rule 2)."""
    t = Tuner(**pinned)
    t.waiting(10 ** 6)
    steps = t.level - level
    windows(t, steps, [False], round_s=round_s, start=-t.window * steps * round_s)
    assert t.level == level
    return t


def test_a_round_is_saturated_when_no_room_is_left_and_the_last_round_opened_was_full(
        ) -> None:
    assert saturated([24], 1, 1, 24)
    assert not saturated([10], 1, 1, 24)  # the work drained into a partial round
    assert not saturated([24], 1, 2, 24)  # room was left: nothing waited for it
    assert not saturated([], 0, 1, 24)  # nothing opened after the close
    assert saturated([24, 24], 2, 2, 24) and not saturated([24, 3], 2, 2, 24)


def test_saturated_windows_hold_the_level_and_only_a_backlog_climbs() -> None:
    # An open loop at the latency end's capacity on a busy machine: a short queue waits
    # behind every round, window after window. Larger rounds would only be longer.
    t = Tuner()
    assert (t.max_auctions, t.batch_max, t.commit_gap_s) == (1, 24, 0.020)
    assert windows(t, 5, [True]) == [0] * 5
    assert [j.step for j in t.trace] == [0] * 5 and t.changes == 0
    assert t.waiting(BACKLOG * 4096) and t.level == TOP
    assert (t.max_auctions, t.batch_max, t.commit_gap_s) == (16, 256, 0.0)
    assert windows(t, 3, [True]) == [TOP] * 3  # held, window by window
    assert t.changes == 1


def test_a_closed_loops_backlog_jumps_to_the_throughput_end_at_once() -> None:
    # The bench's closed loop: its 8,000 waiting land before its first pass, which begins
    # with more than the throughput end holds in flight, and so opens its rounds.
    t = Tuner()
    assert t.waiting(8000) and t.level == TOP
    assert (t.max_auctions, t.batch_max, t.commit_gap_s) == (16, 256, 0.0)
    assert t.changes == 1
    assert t.trace[-1].line() == \
        "level 0: 0/0 saturated, peak 0, backlog 8000, round 0.0 ms, step +5"
    # the bound is what the throughput end holds, whatever the level
    holds = LADDER[TOP].max_auctions * LADDER[TOP].batch_max
    for level in range(TOP):
        t2 = at(level)
        assert not t2.waiting(BACKLOG * holds - 1) and t2.level == level
        assert t2.waiting(BACKLOG * holds) and t2.level == TOP
        assert not t2.waiting(10 ** 6)  # at the top already


def test_work_in_flight_beyond_what_the_level_holds_counts_as_waiting() -> None:
    # `gavel tune` released the throughput end's pinned setting to a fresh tuner while a
    # closed loop kept its sixteen rounds of 256 full, and 3,900 more wait: had the latency
    # end been in force, all but its one round of 24 would be waiting.
    holds = LADDER[TOP].max_auctions * LADDER[TOP].batch_max
    t = Tuner()
    assert not t.waiting(3900, in_flight=LADDER[0].batch_max) and t.level == 0
    assert t.waiting(3900, in_flight=holds) and t.level == TOP
    assert t.trace[-1].backlog == 3900 + holds - LADDER[0].batch_max
    # what a level holds in flight is its own: only a backlog beyond it jumps
    for level in range(TOP):
        t2 = at(level)
        assert not t2.waiting(BACKLOG * holds - 1, in_flight=t2.holds(level))
        assert t2.level == level


def test_a_stalls_queue_in_an_open_loop_at_80_percent_does_not_jump() -> None:
    # Beside a busy neighbour the machine stalls for a second or two; an open loop at 80%
    # of the latency end's capacity (1,000-1,500/s there) is left with that long's arrivals
    # waiting, and clears them at level 0 (it places more than arrives). Rounds of 256
    # would take 200-800 ms there: the jump waits for a queue that would fill them.
    for stall_s in (1.0, 2.0):
        for capacity in (1000, 1500):
            t = Tuner()
            backlog = round(0.8 * capacity * stall_s)
            while backlog > 0:
                assert not t.waiting(backlog)
                backlog -= round(0.2 * capacity * 0.05)  # 50 ms of its surplus
            assert (t.level, t.changes) == (0, 0)
    # a pinned batch counts as pinned in what the throughput end holds
    t = Tuner(batch_max=24)
    assert not t.waiting(16 * 24 - 1) and t.waiting(16 * 24) and t.level == TOP


def test_an_open_loops_bursts_at_80_percent_do_not_jump() -> None:
    # An open loop at 80% of the latency end's capacity, at its rate (the bench sends a
    # fiftieth of a second's placements at a time: 8 to 40 a chunk), as brokers saw it at
    # level 0: a burst of 20 to 120 waits as a pass begins, some closes saturated, the work
    # draining at least once a window. It stays at the latency end, round after round.
    t = Tuner()
    full, part = _auction("a", 24), _auction("b", 9)
    bursts = [20, 64, 120, 88, 40, 0, 16, 96, 112, 72, 30, 8, 0, 48, 24, 0]
    for w in range(20):
        for k, backlog in enumerate(bursts):
            opened = full if backlog else part
            assert not t.waiting(backlog)
            t.took([Decided(full, [], 0.012), Open(opened, None)], 1, w + k * 0.012,
                   len(opened.requests))
    assert (t.level, t.changes) == (0, 0)
    assert {j.backlog for j in t.trace} == {120} and len(t.trace) == 20
    assert BACKLOG * LADDER[TOP].max_auctions * LADDER[TOP].batch_max > 120


def queued(t: Tuner, n: int, backlog: list[int], round_s: float = 0.010) -> list[int]:
    """`n` windows of saturated closes, each heard after a pass with the work waiting as
    `backlog` repeats; the level after each."""
    levels, now, k = [], 0.0, 0
    for _ in range(n):
        for _ in range(t.window):
            now += round_s
            t.waiting(backlog[k % len(backlog)])
            k += 1
            t.closed(round_s, True, now)
        levels.append(t.level)
    return levels


def test_a_shallow_closed_loops_queue_climbs_a_step_a_window_it_outlasts() -> None:
    # Clients that keep 2,000 or 3,000 placements asked for: fewer than the jump's bound
    # wait (rule 4), but a window's worth of the level's rounds waits at every pass, and
    # the queue is as long as the window ends as it began. It climbs while that holds.
    holds = [LADDER[k].max_auctions * LADDER[k].batch_max for k in range(TOP + 1)]
    assert [WINDOW * h for h in holds[:4]] == [384, 768, 2048, 8192]
    for n, top in ((2000, 2), (3000, 3)):
        t = Tuner()
        sawtooth = [n - 200, n - 600, n - 100, n - 400, n - 200]  # submissions landing
        assert queued(t, 6, sawtooth) == [*range(1, top + 1), *[top] * (6 - top)]
        assert [j.step for j in t.trace] == [1] * top + [0] * (6 - top)
        assert t.changes == top and t.trace[0].line() == \
            f"level 0: 16/16 saturated, peak 0, backlog {n - 100}, round 10.0 ms, step +1"


def test_a_queue_that_shrinks_or_dips_below_a_windows_worth_does_not_climb() -> None:
    # An open loop at 80% of the latency end's capacity (1,000/s) after a stall of two
    # seconds: 1,600 wait, and each window's 384 placements clear 77 more than arrive.
    # The bench sends a fiftieth of a second's arrivals at a time (16): the queue a pass
    # hears is up to a chunk longer than the trend.
    t = Tuner()
    drain = [round(1600 - 77 * k / WINDOW + 16 * (k % 3 == 0)) for k in range(20 * WINDOW)]
    assert queued(t, 20, drain) == [0] * 20
    # a queue a window's worth long that was once shorter in the window: the work caught up
    assert queued(t, 3, [400] * 7 + [383] + [400] * 8) == [0] * 3
    # a short queue behind every round (an open loop near its level's capacity)
    assert queued(t, 3, [100]) == [0] * 3
    assert t.changes == 0
    # a queue heard at no pass of the window says nothing
    assert windows(t, 3, [True]) == [0] * 3
    # a window with a close that drained does not climb
    t2 = Tuner()
    now = 0.0
    for k in range(2 * WINDOW):
        now += 0.01
        t2.waiting(2000)
        t2.closed(0.01, k % WINDOW != 3, now)
    assert t2.level == 0


def test_it_backs_off_one_step_a_window_as_the_queue_drains() -> None:
    t = at(TOP)
    assert windows(t, TOP + 3, [False]) == [*range(TOP - 1, -1, -1), 0, 0, 0]


def test_a_steady_load_between_the_two_tests_holds_its_level() -> None:
    # Bursts that take a few full rounds, then drain (an open loop near capacity): the work
    # drains at a quarter of the closes, neither never nor half the time.
    t = Tuner()
    assert windows(t, 50, [True, True, True, False]) == [0] * 50
    t2 = at(3)
    changes = t2.changes
    assert windows(t2, 50, [True, True, True, False]) == [3] * 50
    assert t.changes == 0 and t2.changes == changes


def test_a_window_is_judged_only_when_full() -> None:
    t = at(2)
    judged = len(t.trace)
    for k in range(WINDOW - 1):
        assert not t.closed(0.004, False, k * 0.004)
    assert t.level == 2 and len(t.trace) == judged
    assert t.closed(0.004, False, 1.0) and t.level == 1 and len(t.trace) == judged + 1


def test_long_rounds_and_a_drain_now_and_then_hold_the_level() -> None:
    # Rule 3: rounds forty times the latency end's (a busy machine), the work draining at
    # a quarter or half of the closes: neither says the step below would keep up.
    t = at(4)
    changes = t.changes
    assert windows(t, 3, [True, True, True, False], round_s=0.160) == [4] * 3
    assert windows(t, 3, [True, False], round_s=0.160) == [4] * 3
    assert windows(t, 1, [True, False, False, False]) == [3]  # at RETURN of the closes
    assert t.changes == changes + 1


def test_a_closed_loop_climbs_to_the_throughput_end_and_holds_it() -> None:
    # A closed loop as the bench drives it (8,000 kept waiting, by submissions of 1,000),
    # window by window as brokers logged it: its backlog jumps to the top at once; at the top
    # each submission fits in the rounds in flight, so the work drains at 15 of 16 closes
    # with up to 3,744 requests in flight after them; one step down the work drains at 9 of
    # 16, and below that at 2 of 16, with rounds 7 to 30 times the latency end's because
    # the machine is busy. Judged by drains alone it stepped down from the top to level 4
    # and held there (and with a step down at half drained, or for rounds 4x the latency
    # end's, it stepped down to level 1 or 2 and hunted: 8 and 9 changes a run).
    model = {TOP: ([True] + [False] * 15, [3744, 3488, 2816, 1024], 0.330),
             TOP - 1: ([True] * 7 + [False] * 9, [2048, 1792], 0.300)}
    t = Tuner()
    levels = [t.level] if t.waiting(8000) else []  # rule 4: the first pass's backlog
    for _ in range(10):
        drains, demand, round_s = model.get(t.level, ([True] * 14 + [False] * 2, [512],
                                                      0.070))
        levels += windows(t, 1, drains, round_s=round_s, demand=demand)
    assert levels == [5, *[5] * 10]
    assert t.changes == 1
    assert t.trace[-1].line() == \
        "level 5: 1/16 saturated, peak 3744, backlog 0, round 330.0 ms, step +0"


def test_only_a_peak_the_step_below_holds_leaves_the_top() -> None:
    # The top step keeps the batch (sixteen rounds of 256 to eight): the work drained at
    # every close, and the step below is taken once no close left more in flight than it
    # holds; a step to a smaller batch is taken on drains alone.
    below = LADDER[TOP - 1].max_auctions * LADDER[TOP - 1].batch_max
    t = at(TOP)
    assert windows(t, 2, [False], demand=[below + 1, 0]) == [TOP, TOP]
    assert windows(t, 1, [False], demand=[below, 0]) == [TOP - 1]
    assert windows(t, 1, [False], demand=[below]) == [TOP - 2]  # a smaller batch: drains
    assert t.holds(TOP - 1) == below
    pinned = at(2, batch_max=64)  # a pinned batch: every step keeps it
    assert windows(pinned, 1, [False], demand=[2 * 64]) == [2]
    assert windows(pinned, 1, [False], demand=[64]) == [1]


def test_a_commit_landing_is_not_quiet() -> None:
    # A closed loop on a busy machine: the rounds closed, and the next submissions wait on a
    # commit that takes longer than IDLE_S; the pass after it lands is not after a quiet spell.
    t = at(3)
    last = 0.0
    t.committed(1.5 * IDLE_S, last + 1.5 * IDLE_S)
    assert not t.passed(last + 1.5 * IDLE_S, 0) and t.level == 3
    assert t.passed(last + 3 * IDLE_S, 0) and t.level == 0  # nothing since: quiet


def test_a_busy_machine_s_quiet_spell_is_as_long_as_its_rounds() -> None:
    # Rounds of 300 ms (a loaded hour's closed loop): the wait for the next submissions is
    # as slow, and a second without a close is not quiet yet.
    t = at(3, round_s=0.3)
    last = 0.0
    assert QUIET_ROUNDS * 0.3 > 2 * IDLE_S
    assert not t.passed(last + 2 * IDLE_S, 0) and t.level == 3
    assert t.passed(last + 1.1 * QUIET_ROUNDS * 0.3, 0) and t.level == 0


def test_commits_are_paced_by_their_cost_up_to_the_levels_cap() -> None:
    t = Tuner()
    t.committed(0.004, 0.0)
    assert t.commit_gap_s == 0.004  # a quick commit waits little
    for _ in range(50):
        t.committed(0.100, 0.0)
    assert t.commit_gap_s == LADDER[0].gap_cap_s  # a slow one at most the cap
    t.waiting(10 ** 6)
    assert t.commit_gap_s == 0.0  # the throughput end has none


def test_a_quiet_spell_returns_to_the_latency_end() -> None:
    t = at(3)
    last = 0.0
    assert not t.passed(last + IDLE_S / 2, 0)  # not quiet long enough
    assert not t.passed(last + 2 * IDLE_S, 1)  # a round is still open
    assert t.passed(last + 2 * IDLE_S, 0) and t.level == 0


def test_work_landing_is_not_a_quiet_spell() -> None:
    # between a closed loop's generations of rounds nothing is in flight while a commit of
    # their awards is written, for longer than IDLE_S on a loaded machine
    t = at(TOP)
    assert not t.passed(2 * IDLE_S, 0, landing=True) and t.level == TOP
    assert not t.passed(2.5 * IDLE_S, 0) and t.level == TOP  # quiet counts from then
    assert t.passed(3.5 * IDLE_S, 0) and t.level == 0


def test_what_is_given_is_pinned_and_the_rest_is_tuned() -> None:
    t = Tuner(batch_max=32, commit_gap_s=0.0)
    t.waiting(10 ** 6)
    assert (t.batch_max, t.commit_gap_s, t.max_auctions) == (32, 0.0, LADDER[TOP].max_auctions)
    everything = Tuner(batch_max=32, max_auctions=2, commit_gap_s=0.005)
    everything.waiting(10 ** 6)
    windows(everything, TOP, [False])
    assert (everything.batch_max, everything.max_auctions, everything.commit_gap_s) == (
        32, 2, 0.005)
    assert (everything.level, everything.changes) == (0, 0)  # nothing moved: nothing to tune
    assert not everything.tuning and Tuner(batch_max=1).tuning


def _auction(aid: str, n: int) -> Auction:
    spec = Spec(name="w", command=["true"], cpu=0.1, memory_mb=16)
    return Auction(aid, [Request.of(f"{aid}-{k}", spec) for k in range(n)], ["n1"], 0.0,
                   1.0)


def test_it_reads_the_cores_actions_rounds_decided_and_those_opened_after_each() -> None:
    t = Tuner()
    full, part = _auction("a", 24), _auction("b", 5)
    for k in range(3):  # each close followed by a full round, no room left
        t.took([Decided(full, [], 0.004), Open(full, None)], 1, k * 0.004, 24)
    assert t.level == 0
    # a round opened before the close does not count: after it, nothing opened
    assert not t.took([Open(full, None), Decided(full, [], 0.004)], 0, 1.0)
    for k in range(WINDOW - 4):
        t.took([Decided(full, [], 0.004), Open(full, None)], 1, k * 0.004, 24)
    assert t.level == 0 and t.changes == 0  # judged: drained once, so it held
    assert t.trace[-1].saturated == WINDOW - 1 and t.trace[-1].peak == 0
    t2 = Tuner()
    for k in range(WINDOW):
        t2.took([Decided(full, [], 0.004), Open(part, None)], 1, k * 0.004)
    assert t2.level == 0  # every close drained into a partial round


SCENARIO = b"""
name = "tuned"
seed = 5
duration_s = %(duration)s
[[nodes]]
count = 40
cpu = 64.0
memory_mb = 262144
[[gavel]]
name = "tuned"
mix = [{ strategy = "least-loaded", share = 1.0 }]
auctioneer = "production"
mode = "sample"
[baselines]
run = []
[market]
tune = true
commit_lag_s = 0.01
[workload]
rate = %(rate)s
[[workload.classes]]
name = "tiny"
cpu = 0.01
memory_mb = 1.0
duration_s = { dist = "constant", value = 20.0 }
[network]
latency_s = { dist = "constant", value = 0.002 }
"""


def _simulate(rate: float, duration: float = 3.0) -> tuple[int, int]:
    """The tuned market's level and level changes at the end of a run at `rate`."""
    from gavel.sim.market import Market

    seen: list[Market] = []
    real = Market.run

    def keep(self: Market) -> object:
        seen.append(self)
        return real(self)

    s = parse_scenario(SCENARIO % {b"rate": str(rate).encode(),
                                   b"duration": str(duration).encode()})
    [spec] = plan(s, s.seed)
    Market.run = keep  # type: ignore[method-assign, assignment]
    try:
        run_policy(s, s.seed, spec)
    finally:
        Market.run = real  # type: ignore[method-assign]
    [market] = seen
    assert market.tuner is not None
    return market.tuner.level, market.tuner.changes


def test_the_simulators_production_auctioneer_drives_the_tuner() -> None:
    # A trickle is placed at the latency end; arrivals far beyond what rounds of 24 take
    # (about 24 / 4 ms = 6,000/s at this latency) climb the ladder.
    assert _simulate(rate=200.0) == (0, 0)
    level, changes = _simulate(rate=30_000.0, duration=0.5)
    assert level >= 2 and changes >= 2


def test_a_tuned_scenario_field_defaults_off() -> None:
    s = parse_scenario(SCENARIO % {b"rate": b"1", b"duration": b"1"})
    assert s.market.tune
    assert not msgspec.structs.replace(s.market, tune=False).tune
