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
   *drained* (`saturated`).
2. Every `WINDOW` rounds closed at one level, the window is judged: if every one of its
   rounds was saturated the work never drained, so the level is too small for the load and
   the tuner climbs one step; if the work drained at `RETURN` of its closes or more, the
   step below would have kept up and it steps down. Between the two it holds.
3. The band between is wide because in a closed loop neither a drain now and then nor long
   rounds say the step below would keep up: the work drains between the submissions at up
   to half the closes of a level the step below cannot carry, and the rounds are long
   because the machine is busy. A step down at half the closes drained, or for rounds four
   times the latency end's, stepped into the level just outgrown, which climbed again: the
   tuner hunted below the throughput end.
4. Commits are paced by what they cost: the gap before the next commit is the recent commit
   time (a moving average), at most the level's cap - a writer busy at most half the time
   leaves the cores to the rounds under load, and a light load's small, quick commits wait
   little. The cap bounds the feedback between gap and commit size (a longer gap makes a
   bigger commit, which takes longer), and the throughput end has none.
5. A pass with no round in flight after a quiet spell - no round closed and no commit
   landed for `IDLE_S`, or for `QUIET_ROUNDS` of the last window's median round if that is
   longer - returns the tuner to the latency end: the next burst after a quiet spell starts
   from the shortest rounds. A commit is not quiet, and a busy machine's spells are as long
   as its rounds: in a closed loop the next submissions wait on the commits and on a machine
   whose rounds take a second.
6. A value given (`batch_max`, `max_auctions`, `commit_gap_s`) is pinned: the tuner never
   changes it, and tunes only the others; with all three given its level stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gavel.shared.auctionworld import Action, Decided, Open

__all__ = ["IDLE_S", "LADDER", "QUIET_ROUNDS", "RETURN", "WINDOW", "Setting", "Tuner",
           "saturated"]


class Setting(NamedTuple):
    """One step of the ladder: rounds in flight, requests a round, the commit gap's cap."""

    max_auctions: int
    batch_max: int
    gap_cap_s: float


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
#: Rounds closed per judgement (rule 2).
WINDOW = 16
#: The share of a window's closes that drained for a step down (rules 2, 3).
RETURN = 0.75
#: Seconds without a round that return the tuner to the latency end (rule 5).
IDLE_S = 1.0
#: A quiet spell lasts at least this many of the last window's median round (rule 5).
QUIET_ROUNDS = 10
#: Weight of the newest commit time in the moving average (rule 4).
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
        #: The last window's median round (rule 5), once one was judged.
        self.round_s: float | None = None
        #: The last close or commit (rule 5).
        self._last_busy: float | None = None

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
        """Rule 4 (or the pinned gap)."""
        if self.pinned_gap_s is not None:
            return self.pinned_gap_s
        cap = self.setting.gap_cap_s
        return cap if self.commit_s is None else min(cap, self.commit_s)

    @property
    def tuning(self) -> bool:
        """Whether anything is left to tune (a fully pinned tuner only reports)."""
        return self.pinned_batch_max is None or self.pinned_max_auctions is None \
            or self.pinned_gap_s is None

    # -- what the shell tells it ---------------------------------------------------------------
    def committed(self, commit_s: float, now: float) -> None:
        """A commit took `commit_s` to write and landed by `now` (rules 4, 5)."""
        self._last_busy = now
        last = self.commit_s
        self.commit_s = commit_s if last is None else \
            last + _COMMIT_WEIGHT * (commit_s - last)

    def closed(self, round_s: float, saturated: bool, now: float) -> bool:
        """A round closed after `round_s`, `saturated` or not (rule 1); whether the level
        changed (rules 2, 3)."""
        self._last_busy = now
        if not self.tuning:
            return False  # rule 6: nothing to tune
        self._rounds.append(round_s)
        self._saturated += saturated
        if len(self._rounds) < self.window:
            return False
        rounds, sat = sorted(self._rounds), self._saturated
        self._rounds, self._saturated = [], 0
        self.round_s = rounds[len(rounds) // 2]
        if sat == len(rounds):
            return self._step(+1)
        if len(rounds) - sat >= RETURN * len(rounds):
            return self._step(-1)
        return False

    def took(self, actions: Sequence[Action], open_rounds: int, now: float) -> bool:
        """What the core asked for in one `take`, with `open_rounds` open after it: each
        round it decided is told to `closed`, saturated by rule 1 (the rounds opened after
        the last one decided); whether the level changed."""
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
            changed = self.closed(round_s, full, now) or changed
        return changed

    def passed(self, now: float, in_flight: int) -> bool:
        """A pass ran with `in_flight` rounds open; whether the level changed (rule 5)."""
        quiet_s = max(IDLE_S, QUIET_ROUNDS * (self.round_s or 0.0))
        if in_flight or self.level == 0 or self._last_busy is None \
                or now - self._last_busy < quiet_s:
            return False
        self._rounds, self._saturated = [], 0
        return self._step(-self.level)

    def _step(self, by: int) -> bool:
        level = min(max(self.level + by, 0), len(self.ladder) - 1)
        if level == self.level:
            return False
        self.level = level
        self.changes += 1
        return True
