"""The auctioneer's self-tuning, sans-IO: how many requests a round carries, how many rounds
are in flight and how long the committer paces its commits, chosen from what the shell
measures (round time, commit time, whether work waits), never from a clock of its own.

A `Tuner` walks a ladder of settings (`LADDER`) from the latency end (one round of 24 in
flight, commits paced up to 20 ms apart: the setting that keeps a bid round shortest) to
the throughput end (sixteen rounds of 256, commits back to back: the setting that places
most a second when work queues). The shell tells it of every round that closes, of every
commit and of every pass, and reads `batch_max`, `max_auctions` and `commit_gap_s` back.

Rules:
1. A round that closes is *saturated* when the pass after it left no room for another round
   and the last round it opened was full: work was still waiting. Otherwise the work
   *drained* (`saturated`); then its *demand* is the requests in the rounds open after that
   pass.
2. Every `WINDOW` rounds closed at one level, the window is judged: if the work drained at
   `RETURN` of its closes or more, the step below would have kept up and the tuner steps
   down - but a step down that keeps the batch (the top step: only the rounds in flight
   change) is taken only if the step below holds the window's peak demand too (the most any
   drained close left in flight; a step holds its rounds in flight times its batch).
   A window every one of whose closes was saturated climbs one step if its queue outlasted
   it (rule 4); otherwise it holds: work that waits behind every round is a queue, and only
   a long one or one that lasts climbs.
3. The band between is wide because in a closed loop neither a drain now and then nor long
   rounds say the step below would keep up: the work drains between the submissions at up
   to half the closes of a level the step below cannot carry, and the rounds are long
   because the machine is busy. A step down at half the closes drained, or for rounds four
   times the latency end's, stepped into the level just outgrown, which climbed again: the
   tuner hunted below the throughput end. The peak demand guards the top the same way: at
   the throughput end a closed loop's submissions fit in the rounds in flight, so nearly
   every close drains, yet they are more than the step below holds. A step that keeps the
   batch shortens no round, so it is worth nothing unless the room it gives up was idle;
   a step to a smaller batch shortens every round, so drains alone take it (an open loop's
   bursts that a level carries with room to spare step down to quicker rounds).
4. The tuner climbs for a backlog alone, and at once: when the work waiting for a round as a
   pass begins or as rounds close (pending, neither in flight nor parked:
   `shared.auctioneer` rule 13; with the work the shell has accepted that is still on its
   way to being pending, as the broker's submissions landing in git: a closed loop's next
   submissions spend a second there on a busy broker, half of what waits) would fill every
   round the throughput end keeps in flight (`BACKLOG` times what it holds, or more), it
   goes to the throughput end and starts a new window, so that pass opens the throughput
   end's rounds. The requests in flight beyond what the level holds count as waiting too:
   rounds opened under a setting that held more (one pinned until `gavel tune` released it
   to a fresh tuner at the latency end) would have been waiting under this one, and a
   closed loop that kept the throughput end's rounds full has no more than that outside
   them. Its wait is the queue's, not the rounds', so the largest rounds clear it
   soonest, and the windows bring the level down as it drains (rule 2). A closed loop's
   submissions wait in thousands from its first pass. A smaller queue would leave the
   throughput end's rounds part empty, and the level clears it itself: an open loop at 80%
   of its capacity on a machine that stalls for a second or two (a busy neighbour) finds a
   second or two of its arrivals waiting after each stall - 1,000-2,500 requests, draining
   at a fifth of its capacity - and jumped for them when the bound was 64 generations of the
   latency end's rounds (1,536): rounds of 256 that took 200-800 ms there, for a queue the
   latency end was already clearing. An open loop near its level's capacity saturates window
   after window with a few rounds' worth waiting - on a busy machine, rounds that larger
   batches only lengthen: a climb for saturated windows took it up one step at a time, and a
   climb for a few saturated closes hunted, each to rounds longer than the latency end's for
   a queue that was short.
   A shorter queue climbs one step a window while it *outlasts* the windows: every close of
   the window saturated, at every pass a window's worth of the level's rounds waiting
   (`WINDOW` times what it holds: 384 at the latency end, then 768, 2,048, 8,192), and the
   queue as the window ended no shorter than as it began. That is a closed loop kept below
   the jump's bound (clients that each wait for their placements: with 2,000 asked for, the
   latency end places 0.88-0.91 of what the throughput end does), not a stall's
   queue, which shrinks from window to window as the level places more than arrives, nor an
   open loop's short queue behind every round near its level's capacity. The queue's length
   says how far: each step's rounds are filled by the queue the step below left waiting.
5. Commits are paced by what they cost: the gap before the next commit is the recent commit
   time (a moving average), at most the level's cap - a writer busy at most half the time
   leaves the cores to the rounds under load, and a light load's small, quick commits wait
   little. The cap bounds the feedback between gap and commit size (a longer gap makes a
   bigger commit, which takes longer), and the throughput end has none.
6. A pass with no round in flight after a quiet spell - no round closed and no commit
   landed for `IDLE_S`, or for `QUIET_ROUNDS` of the last window's median round if that is
   longer - returns the tuner to the latency end: the next burst after a quiet spell starts
   from the shortest rounds. A commit is not quiet, nor is work landing (a commit being
   written or its awards carried out, submissions on their way: `landing`), and a busy
   machine's spells are as long as its rounds: in a closed loop the next submissions wait
   on the commits and on a machine whose rounds take a second. Between a closed loop's
   generations of rounds nothing is in flight while their commits land, which on a loaded
   machine took longer than `IDLE_S`: a tuner that heard only the commits landed went back
   to the latency end up to seven times in eight seconds, and climbed again each time.
7. A value given (`batch_max`, `max_auctions`, `commit_gap_s`) is pinned: the tuner never
   changes it, and tunes only the others; with all three given its level stays where it is.
8. The last `TRACE` windows judged are kept (`trace`): the level, its closes saturated, the
   peak demand, the peak backlog, the median round and the step taken (a jump's window is
   cut short), for an operator to read why a level held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from gavel.shared.auctionworld import Action, Decided, Open

__all__ = ["AUCTIONS_MOST", "BACKLOG", "BATCH_MOST", "GAP_MS_MOST", "IDLE_S", "LADDER",
           "QUIET_ROUNDS", "RETURN", "TRACE", "WINDOW", "Judged", "Setting", "Tuner", "saturated"]


class Setting(NamedTuple):
    """One step of the ladder: rounds in flight, requests a round, the commit gap's cap."""

    max_auctions: int
    batch_max: int
    gap_cap_s: float


class Judged(NamedTuple):
    """One window judged (rule 8): at `level`, `saturated` of its `closes`, the peak demand
    and backlog, the median round (0: none closed) and the step taken."""

    level: int
    closes: int
    saturated: int
    peak: int
    backlog: int
    round_s: float
    step: int

    def line(self) -> str:
        return (f"level {self.level}: {self.saturated}/{self.closes} saturated, peak "
                f"{self.peak}, backlog {self.backlog}, round {1000 * self.round_s:.1f} ms, "
                f"step {self.step:+d}")


#: From the latency end to the throughput end (rule 2); each step about doubles what the
#: auctioneer holds in flight.
LADDER: tuple[Setting, ...] = (
    Setting(1, 24, 0.020),
    Setting(1, 48, 0.020),
    Setting(2, 64, 0.020),
    Setting(4, 128, 0.010),
    Setting(8, 256, 0.0),
    Setting(16, 256, 0.0),
)
#: Rounds closed per judgement (rule 2); a queue of this many of the level's rounds that
#: outlasts a window climbs a step (rule 4).
WINDOW = 16
#: Work waiting, in what the throughput end holds in flight (4,096), that jumps to it
#: (rule 4): below the 8,000 the bench's closed loop keeps waiting (pending or landing),
#: above the backlog an open loop at 80% of its capacity is left with after a stall of a
#: second or two.
BACKLOG = 1
#: The share of a window's closes that drained for a step down (rules 2, 3).
RETURN = 0.75
#: Seconds without a round that return the tuner to the latency end (rule 6).
IDLE_S = 1.0
#: A quiet spell lasts at least this many of the last window's median round (rule 6).
QUIET_ROUNDS = 10
#: Windows judged that `Tuner.trace` keeps (rule 8).
TRACE = 32
#: The most a value pinned (rule 7) may be, given in the broker's config or at runtime (`gavel
#: tune`): a round's requests, rounds in flight, and the commit gap in ms. One bound for
#: both ways in, far past the ladder's top (256, 16, 20 ms), so a pin may try beyond it.
BATCH_MOST = 10_000
AUCTIONS_MOST = 1000
GAP_MS_MOST = 10_000.0
#: Weight of the newest commit time in the moving average (rule 5).
_COMMIT_WEIGHT = 0.2


def saturated(opened: Sequence[int], open_rounds: int, max_auctions: int,
              batch_max: int) -> bool:
    """Rule 1: after a round closed, the pass opened rounds of `opened` requests (in order)
    and `open_rounds` are now open: whether work was left waiting."""
    return bool(opened) and open_rounds >= max_auctions and opened[-1] >= batch_max


class Tuner:
    def __init__(self, *, batch_max: int | None = None, max_auctions: int | None = None,
                 commit_gap_s: float | None = None,
                 ladder: Sequence[Setting] = LADDER, window: int = WINDOW) -> None:
        self.ladder = tuple(ladder)
        self.window = window
        self.pinned_batch_max = batch_max
        self.pinned_max_auctions = max_auctions
        self.pinned_gap_s = commit_gap_s
        self.level = 0
        #: How many times the level changed (a steady load should leave it alone).
        self.changes = 0
        self.commit_s: float | None = None
        self._rounds: list[float] = []
        self._saturated = 0
        #: The window's peak demand and backlog so far (rules 1, 2, 4, 8).
        self._peak = 0
        self._backlog = 0
        #: The window's queue: as its first pass heard it, its shortest and its last (rule 2).
        self._first: int | None = None
        self._low = 0
        self._last = 0
        #: The last window's median round (rule 6), once one was judged.
        self.round_s: float | None = None
        #: The last close or commit (rule 6).
        self._last_busy: float | None = None
        #: Rule 8.
        self.trace: deque[Judged] = deque(maxlen=TRACE)

    # -- what the shell reads ------------------------------------------------------------------
    @property
    def setting(self) -> Setting:
        return self.ladder[self.level]

    @property
    def batch_max(self) -> int:
        return self.pinned_batch_max or self.setting.batch_max

    @property
    def max_auctions(self) -> int:
        return self.pinned_max_auctions or self.setting.max_auctions

    @property
    def commit_gap_s(self) -> float:
        """Rule 5 (or the pinned gap)."""
        if self.pinned_gap_s is not None:
            return self.pinned_gap_s
        cap = self.setting.gap_cap_s
        return cap if self.commit_s is None else min(cap, self.commit_s)

    @property
    def tuning(self) -> bool:
        """Whether anything is left to tune (a fully pinned tuner only reports)."""
        return self.pinned_batch_max is None or self.pinned_max_auctions is None \
            or self.pinned_gap_s is None

    def holds(self, level: int) -> int:
        """The requests `level` holds in flight: its rounds times its batch (what is pinned
        counts as pinned)."""
        step = self.ladder[level]
        return (self.pinned_max_auctions or step.max_auctions) * \
            (self.pinned_batch_max or step.batch_max)

    # -- what the shell tells it ---------------------------------------------------------------
    def committed(self, commit_s: float, now: float) -> None:
        """A commit took `commit_s` to write and landed by `now` (rules 5, 6)."""
        self._last_busy = now
        last = self.commit_s
        self.commit_s = commit_s if last is None else \
            last + _COMMIT_WEIGHT * (commit_s - last)

    def closed(self, round_s: float, saturated: bool, now: float, demand: int = 0) -> bool:
        """A round closed after `round_s`, `saturated` or not, with `demand` requests in the
        rounds open after the pass (rule 1); whether the level changed (rules 2-4)."""
        self._last_busy = now
        if not self.tuning:
            return False  # rule 7: nothing to tune
        self._rounds.append(round_s)
        self._saturated += saturated
        if not saturated and demand > self._peak:
            self._peak = demand
        n, sat = len(self._rounds), self._saturated
        if n < self.window:
            return False
        if sat == n and self._outlasted():
            return self._judge(1)
        return self._judge(-1 if n - sat >= RETURN * n and self._below() else 0)

    def waiting(self, backlog: int, in_flight: int = 0) -> bool:
        """A pass begins with `backlog` requests waiting for a round and `in_flight` in the
        rounds open; whether the level changed (rule 4)."""
        if not self.tuning:
            return False  # rule 7: nothing to tune
        backlog += max(0, in_flight - self.holds(self.level))
        self._backlog = max(self._backlog, backlog)
        if self._first is None:
            self._first = self._low = backlog
        self._low, self._last = min(self._low, backlog), backlog
        top = len(self.ladder) - 1
        if self.level == top or backlog < BACKLOG * self.holds(top):
            return False
        return self._judge(top - self.level)

    def took(self, actions: Sequence[Action], open_rounds: int, now: float,
             in_flight: int = 0) -> bool:
        """What the core asked for in one `take`, with `open_rounds` open after it holding
        `in_flight` requests: each round it decided is told to `closed`, saturated by rule 1
        (the rounds opened after the last one decided); whether the level changed."""
        rounds: list[float] = []
        opened: list[int] = []
        for action in actions:
            if isinstance(action, Open):
                opened.append(len(action.auction.requests))
            elif isinstance(action, Decided):
                rounds.append(action.round_s)
                opened.clear()
        if not rounds:
            return False
        full = saturated(opened, open_rounds, self.max_auctions, self.batch_max)
        changed = False
        for round_s in rounds:
            changed = self.closed(round_s, full, now, in_flight) or changed
        return changed

    def passed(self, now: float, in_flight: int, landing: bool = False) -> bool:
        """A pass ran with `in_flight` rounds open and work `landing` or not; whether the
        level changed (rule 6)."""
        if landing:
            self._last_busy = now
        quiet_s = max(IDLE_S, QUIET_ROUNDS * (self.round_s or 0.0))
        if in_flight or self.level == 0 or self._last_busy is None \
                or now - self._last_busy < quiet_s:
            return False
        self._restart()
        return self._step(-self.level)

    def _below(self) -> bool:
        """Rule 2: whether the step below may be taken: a smaller batch always, the same
        batch if it holds the window's peak demand."""
        if self.level == 0:
            return False
        here, below = self.ladder[self.level], self.ladder[self.level - 1]
        same = self.pinned_batch_max is not None or here.batch_max == below.batch_max
        return not same or self._peak <= self.holds(self.level - 1)

    def _judge(self, by: int) -> bool:
        """Close the window with a step of `by` (rule 8 keeps it)."""
        rounds = sorted(self._rounds)
        if rounds:  # a jump's window may have none (rule 4)
            self.round_s = rounds[len(rounds) // 2]
        self.trace.append(Judged(self.level, len(rounds), self._saturated, self._peak,
                                 self._backlog, rounds[len(rounds) // 2] if rounds else 0.0,
                                 by))
        self._restart()
        return self._step(by)

    def _restart(self) -> None:
        """A new window begins."""
        self._rounds, self._saturated, self._peak, self._backlog = [], 0, 0, 0
        self._first, self._low, self._last = None, 0, 0

    def _outlasted(self) -> bool:
        """Rule 2: whether the window's queue outlasted it: a window's worth of the level's
        rounds waited at every pass, and it ended no shorter than it began."""
        return self.level < len(self.ladder) - 1 and self._first is not None \
            and self._low >= self.window * self.holds(self.level) \
            and self._last >= self._first

    def _step(self, by: int) -> bool:
        level = min(max(self.level + by, 0), len(self.ladder) - 1)
        if level == self.level:
            return False
        self.level = level
        self.changes += 1
        return True
