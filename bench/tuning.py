"""`gavel bench --tuning`: the self-tuning defaults against the hand-tuned settings,
interleaved in one run.

Rules:
1. One run (`bench.run.run_with`): one nats-server, one broker started with nothing pinned,
   one set of agents. The broker's settings change while it runs (the `tune` verb), so both
   sides of every comparison meet the same machine within the same seconds: a busy minute
   slows both, and the ratio is the code's, not the hour's. The cluster churns (`options`:
   each instance ends `CHURN_S` after it starts, at most `ENDED_MAX` ended records kept),
   so its tree, and with it what a commit costs, stays the same size from the first
   comparison to the last: the rates offered stay the fractions of capacity they were.
2. Capacity just before each open loop: the latency-tuned settings (`LATENCY`) pinned, a
   closed loop (like rule 4's, `CAPACITY_N` deep) whose awards are counted over `CAPACITY_S`
   once the first instances end (the churn's steady state: ends cost the broker too); its
   placements/s is the load the latency target is claimed at (above it the latency-tuned
   broker no longer keeps up, and its round p99 stops saying what a user waits). Measured
   again before each open loop, it follows a machine whose load moves from minute to minute;
   an open loop's rate is its fraction of the median of the measurements so far (one window
   of 4 s read 1,670 and the next 2,920/s in a quiet hour: 80% of the second was more than
   the machine then placed). A window in which nothing has landed by its end goes on until
   its first placement lands, at most `STRETCH` times its seconds, as rule 4's segments do:
   beside the test suite and a benchmark, twenty agents' commits at the latency end landed
   further apart than a scaled window lasts, and a capacity of 0 offers no load at all.
3. An open loop at each fraction of capacity in `FRACTIONS`: submissions at that rate through
   `pairs` x 2 segments of `SEGMENT_S`, the settings changing at each segment between the
   defaults (every value tuned: a fresh tuner at the latency end, as a broker started with no
   flags has) and the latency-tuned settings. A side's figure is the p99 of the rounds closed
   under it; target defaults over latency-tuned at most `LATENCY_RATIO`.
4. A closed loop: the bench keeps `BACKLOG_N` placements asked for and not yet placed,
   about half of them waiting for a round (pending, or submitted and still landing: more
   than the throughput end holds in flight) and the rest in the rounds and in awards whose
   commits are landing, while its segments (`CLOSED_SEGMENT_S` each, a pair for
   every `CLOSED_PER` of rule 3's) alternate between the defaults and
   the throughput-tuned settings (`THROUGHPUT`); a side's figure is its placements over its
   seconds; target defaults over throughput-tuned at least `THROUGHPUT_RATIO`. Each segment
   lasts its seconds from when it began (its settings' `tune` answered): a broker too busy
   to answer the change for seconds (20 agents beside the test suite) would otherwise leave
   the next segment a sliver that placed nothing. One in which nothing has landed by its end
   goes on until its first placement lands (at most `STRETCH` times its seconds): where a
   side's commits land further apart than a segment lasts (twenty agents at the throughput
   end beside the test suite and a benchmark), an empty segment would leave its pair without
   a ratio, and dropping those pairs favours the side whose commits are slow; stretched, it
   counts that side's rate over the time its commit took. An open loop's segments keep to
   the grid its load was submitted for, or its last segments would see no arrivals.
5. Which side a comparison starts with alternates from comparison to comparison, and runs
   `WARM_S` uncounted first (what the drain before left settles; a closed loop
   `CLOSED_WARM_S`, until the queue its priming built is gone); within a comparison the
   order alternates from pair to pair (AB BA AB ...), so a drift over its seconds (a machine
   slowing, a queue growing) favours neither side. Every segment begins with its settings
   applied afresh (a defaults segment from the latency end), whichever side ran before. Between
   comparisons the queue drains, so one comparison's work does not land in the next; at the
   end every placement asked for is verified in git (`bench.verify.verify_churn`: each won
   exactly one award and is placed, succeeded or forgotten; read again for up to a minute
   while a requeued instance's second award lands). Placements are counted as awards
   (`placed_total`): with churn the placed instances also leave.
6. A comparison is judged (`bench.verdict`) by the median of its pairs' ratios (each
   pair: two neighbouring segments, one a side, side by side in time; a pair one of whose
   segments closed no round has no ratio): a stall of the machine that falls in one segment
   moves one pair, not the verdict. The ratio of the sides' figures pooled over all
   their segments is printed beside it, and so is the interval the pairs give the median
   (`interval`: two of their order statistics that hold the median of the distribution
   the pairs are drawn from with at least `CONFIDENCE`, from a binomial count alone, so
   it assumes nothing of their spread); a verdict whose bound lies inside it is one the
   sitting could not tell, and says so. A closed loop's pairs spread because its awards
   land in commits of thousands seconds apart, not because of the hour
   (docs/performance.md): beside the test suite its median is known to a quarter. Each
   segment also keeps where its tuner stood as it ended (level, changes: read just before
   the next change), so a figure says what the defaults did to make it.
7. A sitting at `scale` below 1 (`--scale`: a quick look on a small rig, the test suite's
   twenty agents) keeps rules 2 and 4's depths, rule 4's segments and warm-up and rule 2's
   counted seconds at that fraction (`Scaled`; depths at least one submission): most of a
   sitting's minutes are its closed loops filling, counting and draining. Its figures are
   not the targets'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gavel.bench.run import Options, Rig, submit_all
from gavel.bench.verdict import CONFIDENCE, Comparison, Report, Segment
from gavel.bench.verify import VerifyError, verify_churn
from gavel.bench.waits import until_healthy
from gavel.shared.api import StatsReply, StatsRequest, TuneReply, TuneRequest
from gavel.transport.client import call

__all__ = ["BACKLOG_N", "CAPACITY_N", "CAPACITY_S", "CLOSED_PER", "CLOSED_SEGMENT_S",
           "CLOSED_WARM_S", "CONFIDENCE", "FRACTIONS", "LATENCY", "LATENCY_RATIO", "PAIRS",
           "SEGMENT_S", "STRETCH", "STRETCH_EVERY_S", "THROUGHPUT", "THROUGHPUT_RATIO",
           "Comparison", "Report", "Scaled", "Segment", "closed_pairs", "sitting"]

#: The hand-tuned settings (`TuneRequest` fields).
LATENCY: dict[str, Any] = {"max_auctions": 1, "batch_max": 24, "commit_gap_ms": 20.0}
THROUGHPUT: dict[str, Any] = {"max_auctions": 16, "batch_max": 256, "commit_gap_ms": 0.0}
DEFAULTS: dict[str, Any] = {}
#: What the defaults are held to (rules 3, 4).
FRACTIONS = (0.2, 0.5, 0.8)
LATENCY_RATIO = 1.5
THROUGHPUT_RATIO = 0.9
#: Rule 2: the seconds over which capacity is counted.
CAPACITY_S = 4.0
#: Rule 3: an open loop's segment seconds; rules 3, 4: the first side's uncounted seconds.
#: A pair's ratio spreads as widely whether its segments last 0.5 s or 2 s (the log of it
#: has a deviation of 0.8-1.0, quiet or beside the test suite), so the same minute makes a
#: tighter median from more, shorter pairs.
SEGMENT_S = 0.5
WARM_S = 1.0
#: Rule 4: a closed loop's segment seconds: its rounds and commits take up to a second on a
#: busy machine, and a segment counts what the one before had in flight (a commit of 4,000
#: awards lands in one segment or the next).
CLOSED_SEGMENT_S = 8.0
#: Rule 5: a closed loop's uncounted seconds. Its priming leaves a queue deeper than the loop
#: keeps (all it asked for landed at once, where the loop's later submissions land a few at
#: a time), and the first instances' ends have not begun: after one second the first segment
#: placed 1.16-1.61 times the median of a sitting's later segments (seven of seven sittings),
#: the second 0.90-1.36, the third 0.89-1.22; one side against itself, the first pair read
#: 1.72 and 1.94. The side that opens the comparison gained that pair.
CLOSED_WARM_S = 2 * CLOSED_SEGMENT_S
#: Rules 2, 4: a capacity window or a closed loop's segment in which nothing has landed by its
#: end goes on until its first placement lands, up to this many times its seconds.
STRETCH = 3.0
#: Rules 2, 4: how often a stretched window or segment looks for its first placement.
STRETCH_EVERY_S = 0.05
#: Pairs of open-loop segments a comparison makes unless told (rule 3): 44 of 0.5 s give a
#: median whose standard error is about a quarter of its log, where 11 of 2 s left a third
#: (an A/A sitting, both sides the latency-tuned settings, read up to 1.58 with 11).
PAIRS = 44
#: Rule 4: a closed loop makes one pair for every `CLOSED_PER` open-loop pairs, at least one:
#: eleven by default. A closed-loop pair's log ratio spreads 0.2-0.7 beside the test suite
#: (0.07-0.23 quiet), so six pairs left the median's error near a fifth of the ratio there,
#: as wide as the bound's margin; eleven take a quarter off it for 80 s more.
CLOSED_PER = 4
#: Rule 4: placements asked for and not yet placed in the closed loop, by submissions of
#: `_CHUNK`, at most `_FEEDING` at once. Between generations of rounds a closed loop has
#: none in flight, and its awards' commits still landing hold as many as the throughput end's
#: rounds (4,096): at 8,000 asked for, at most four submissions landing, the 4,000 waiting
#: were just under what jumps a fresh tuner to the throughput end (`shared.tuning` rule 4),
#: and each defaults segment of a loaded machine began with 0.5-2.5 s of rounds of 24.
BACKLOG_N = 16_000
_CHUNK = 1000
_FEEDING = 8
#: Rule 2: the capacity's closed loop, at the latency end (one round of 24 in flight), needs
#: no more than this; each of its placements ends `CHURN_S` after it starts, and twice as many
#: ending during the open loop that follows left its half-second segments a broker busy with
#: the ends (with 20 agents, comparisons whose segments closed no round on either side).
CAPACITY_N = 8000
_CAPACITY_FEEDING = 4
#: Rule 1: the churn.
CHURN_S = 3.0
ENDED_MAX = 5000


Say = Callable[[str], None]
#: What a stretched window reads (`_first_landing`).
R = TypeVar("R")


class _Broker:
    """The running broker's settings and counts, through its API."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc

    async def tune(self, settings: dict[str, Any], apply: bool = True) -> TuneReply:
        return await call(self.nc, "tune", TuneRequest(**settings, apply=apply), TuneReply,
                          timeout=30)

    async def placed(self) -> int:
        """Awards made so far (rule 5)."""
        stats = await call(self.nc, "stats", StatsRequest(), StatsReply, timeout=30)
        return stats.placed_total


def options(base: Options) -> Options:
    """The run a sitting drives: `base` (agents, mode) with rule 1's churn."""
    return dataclasses.replace(base, lifetime_s=CHURN_S, ended_max=ENDED_MAX, idle_s=0.0)


def closed_pairs(pairs: int) -> int:
    """Rule 4: the closed loop's pairs for `pairs` open-loop pairs."""
    return max(1, pairs // CLOSED_PER)


@dataclass(frozen=True)
class Scaled:
    """Rule 7: the closed loops' depths and seconds of a sitting at `scale`."""

    backlog_n: int
    capacity_n: int
    capacity_s: float
    closed_segment_s: float
    closed_warm_s: float

    @classmethod
    def at(cls, scale: float) -> Scaled:
        if not (0.0 < scale <= 1.0):
            raise ValueError(f"a sitting's scale lies in (0, 1], not {scale:g}")
        return cls(max(_CHUNK, round(BACKLOG_N * scale)),
                   max(_CHUNK, round(CAPACITY_N * scale)), CAPACITY_S * scale,
                   CLOSED_SEGMENT_S * scale, CLOSED_WARM_S * scale)


def sitting(pairs: int = PAIRS, say: Say = lambda _: None,
            segment_s: float = SEGMENT_S, scale: float = 1.0
            ) -> Callable[[Rig], Awaitable[Report]]:
    """The driver (for `bench.run.run_with`) of one sitting: rules 1-7."""
    size = Scaled.at(scale)

    async def drive(rig: Rig) -> Report:
        await until_healthy(rig.nc, rig.opts.agents, rig.root, rig.broker)
        broker = _Broker(rig.nc)
        asked: list[str] = []
        comparisons, capacities = [], []
        for k, frac in enumerate(FRACTIONS):
            say(f"capacity {k + 1}: latency-tuned, closed loop")
            capacities.append(await _capacity(rig, broker, asked, f"cap{k}-", size))
            capacity = round(statistics.median(capacities), 1)  # rule 2: of those so far
            rate = round(frac * capacity, 1)
            c = Comparison(f"open loop {frac:.0%} ({rate:,.0f}/s)", "round_p99_ms",
                           LATENCY_RATIO, most=True, rate=rate, capacity=capacity)
            say(c.name)
            await _interleave(broker, c, LATENCY, pairs, segment_s, k % 2 == 1,
                              _Open(rig, rate, f"o{k}-", asked))
            comparisons.append(c)
        c = Comparison("closed loop", "placements_per_s", THROUGHPUT_RATIO, most=False)
        say(c.name)
        await _interleave(broker, c, THROUGHPUT, closed_pairs(pairs),
                          size.closed_segment_s, len(FRACTIONS) % 2 == 1,
                          _Closed(rig, broker, asked, "cl-", size.backlog_n),
                          size.closed_warm_s)
        comparisons.append(c)
        await broker.tune(DEFAULTS)
        try:
            await _verified(rig.root, asked)
        except VerifyError as exc:
            raise VerifyError(f"the tuning sitting: {exc}") from exc
        return Report(capacities, comparisons)
    return drive


async def _capacity(rig: Rig, broker: _Broker, asked: list[str], prefix: str,
                    size: Scaled) -> float:
    """Rule 2 (at rule 7's `size`)."""
    await broker.tune(LATENCY)
    base, before = await broker.placed(), len(asked)
    load = _Closed(rig, broker, asked, prefix, size.capacity_n, _CAPACITY_FEEDING)
    await load.start(0.0)
    await asyncio.sleep(CHURN_S)  # the first instances end: the steady state begins
    landed, elapsed = await _landed_over(broker, size.capacity_s)
    await load.stop()
    await broker.tune(DEFAULTS)  # the backlog drains at the defaults' pace
    await _placed(broker, base + len(asked) - before)
    return round(landed / elapsed, 1)


async def _landed_over(broker: _Broker, seconds: float) -> tuple[int, float]:
    """Rule 2: the placements landed over `seconds` from now, and the seconds they were
    counted over; a window in which none landed goes on until the first does, at most
    `STRETCH` times its seconds (rule 4's segments do the same, for the same reason)."""
    first, started = await broker.placed(), time.perf_counter()
    await asyncio.sleep(seconds)
    last = await _first_landing(broker.placed, lambda n: n, first,
                                started + STRETCH * seconds)
    return last - first, time.perf_counter() - started


async def _first_landing(read: Callable[[], Awaitable[R]], placed: Callable[[R], int],
                         before: int, stretch_to: float) -> R:
    """Rules 2, 4: `read()` again every `STRETCH_EVERY_S` while what it says was placed is
    still `before` and `stretch_to` (a `perf_counter` time) has not come; the last read."""
    got = await read()
    while placed(got) == before and time.perf_counter() < stretch_to:
        await asyncio.sleep(STRETCH_EVERY_S)
        got = await read()
    return got


class _Open:
    """Rule 3's load: submissions at `rate` for the segments' seconds."""

    #: Submitted for the segments' seconds from the start: its segments keep to that grid.
    open_ended = False

    def __init__(self, rig: Rig, rate: float, prefix: str, asked: list[str]) -> None:
        self.rig, self.rate, self.prefix, self.asked = rig, rate, prefix, asked
        self._submitting: asyncio.Future[list[None]] | None = None

    async def start(self, seconds: float) -> None:
        n = max(1, round(self.rate * seconds))
        ids, self._submitting = submit_all(self.rig.nc, _opts(self.rig, n, self.rate),
                                           time.perf_counter(), self.prefix)
        self.asked += ids

    async def stop(self) -> None:
        if self._submitting is not None:
            await self._submitting


class _Closed:
    """Rule 4's load (rule 2's, with its own depth): `n` asked for from the start, by at most
    `feeding` submissions at once, topped up until stopped."""

    #: Fed until stopped: each segment lasts its full seconds (rule 4).
    open_ended = True

    def __init__(self, rig: Rig, broker: _Broker, asked: list[str], prefix: str,
                 n: int, feeding: int = _FEEDING) -> None:
        self.rig, self.broker, self.asked, self.prefix = rig, broker, asked, prefix
        self.n, self.feeding = n, feeding  # the depth: rule 7's, at the sitting's scale
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._full = asyncio.Event()

    async def start(self, seconds: float) -> None:
        del seconds  # fed until stopped
        self._task = asyncio.get_running_loop().create_task(self._feed())
        await asyncio.wait([self._task, asyncio.ensure_future(self._full.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            self._task.result()  # it failed: say why

    async def _feed(self) -> None:
        base = await self.broker.placed()
        submitted, k = 0, 0
        feeding: set[asyncio.Future[list[None]]] = set()
        while not self._stop.is_set():
            waiting = submitted - (await self.broker.placed() - base)
            while waiting < self.n and len(feeding) < self.feeding:
                ids, sent = submit_all(self.rig.nc, _opts(self.rig, _CHUNK, 0.0),
                                       time.perf_counter(), f"{self.prefix}{k:05d}-")
                feeding.add(sent)
                self.asked += ids
                submitted, waiting, k = submitted + len(ids), waiting + len(ids), k + 1
            if submitted >= self.n:  # primed: the segments may begin
                self._full.set()
            done, _ = await asyncio.wait(feeding, timeout=0.05) if feeding else (set(), None)
            for sent in done:
                sent.result()  # a refused submission says why
            feeding -= done
            if not feeding:
                await asyncio.sleep(0.05)
        if feeding:
            await asyncio.gather(*feeding)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


async def _interleave(broker: _Broker, c: Comparison, reference: dict[str, Any],
                      pairs: int, segment_s: float, reference_first: bool,
                      load: _Open | _Closed, warm_s: float | None = None) -> None:
    """Rules 3-5: `pairs` x 2 segments of `load` under alternating settings after `warm_s`
    uncounted (`WARM_S` unless told), recorded in `c`; then, under the defaults, the queue
    drains."""
    warm_s = WARM_S if warm_s is None else warm_s
    first, second = ("reference", "defaults") if reference_first else ("defaults",
                                                                      "reference")
    sides = [s for k in range(pairs) for s in ((first, second) if k % 2 == 0
                                               else (second, first))]
    settings = {"defaults": DEFAULTS, "reference": reference}
    base = await broker.placed()
    before = len(load.asked)
    c.load = (os.getloadavg()[0], 0.0)
    await load.start(warm_s + 2 * pairs * segment_s)
    await broker.tune(settings[sides[0]])
    await asyncio.sleep(warm_s)  # the load settles; what it closed is not counted
    placed_at = (await broker.tune(settings[sides[0]])).placed_total
    started = at = time.perf_counter()
    for k in range(2 * pairs):
        # rule 4: a closed loop's segment lasts its seconds from its own start; an open loop's
        # ends on the grid its load was submitted for
        end = at + segment_s if load.open_ended else started + (k + 1) * segment_s
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        last = k + 1 == 2 * pairs
        ending = await _first_landing(  # rule 4: an empty closed-loop segment waits for it
            lambda: broker.tune({}, apply=False), lambda r: r.placed_total, placed_at,
            at + STRETCH * segment_s if load.open_ended else 0.0)
        reply = await broker.tune(DEFAULTS if last else settings[sides[k + 1]])
        now = time.perf_counter()
        c.segments.append(Segment(sides[k], now - at, reply.placed_total - placed_at,
                                  list(reply.round_ms), ending.level, ending.changes))
        placed_at, at = reply.placed_total, now
    await load.stop()
    await _placed(broker, base + len(load.asked) - before)
    c.load = (c.load[0], os.getloadavg()[0])


async def _verified(root: Path, asked: list[str], within_s: float = 60.0,
                    every_s: float = 1.0) -> None:
    """Rule 5's check, read again until it holds or `within_s` has passed: the awards
    counted reach what was asked one early for each requeued instance, whose second award
    can still be landing then. A double award never heals; its error is raised at the end."""
    limit = time.monotonic() + within_s
    while True:
        try:
            await asyncio.to_thread(verify_churn, root, asked)
            return
        except VerifyError:
            if time.monotonic() >= limit:
                raise
        await asyncio.sleep(every_s)


async def _placed(broker: _Broker, n: int, timeout_s: float = 600.0) -> None:
    """Until `n` instances are placed (at most `timeout_s`)."""
    limit = time.monotonic() + timeout_s
    while (got := await broker.placed()) < n:
        if time.monotonic() > limit:
            raise VerifyError(f"only {got}/{n} placed in {timeout_s:g}s")
        await asyncio.sleep(0.1)


def _opts(rig: Rig, placements: int, rate: float) -> Options:
    return dataclasses.replace(rig.opts, placements=placements, rate=rate, chunk=_CHUNK)
