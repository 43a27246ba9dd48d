"""Group commit: every change ready at one moment lands in one git commit.

Rules:
1. Items queue up while a commit is being written; the next commit takes all of them.
2. Each item plans against the freshest state (plan, then apply). If the branch moved under
   us (`Conflict`), the whole batch is re-planned on the new head, a bounded number of times.
3. Nothing an item promises is published before its commit is durable: a plan's effects
   (`broker.effects`, carried out by `effects`, the one executor; no item hands the
   committer a callback) run only once the ref has moved, through the after-commit lane
   (`broker.ledger.afterlane`): its answers and wake-ups at once, the rest in commit order,
   then in the order each plan listed them, in slices of `slice_s` with the loop's other
   work between them, while the next commit is already being planned and written: the
   writer does not wait for the awards of the last commit to go out. Until its `Placed`
   effect runs, an award's capacity is still reserved, so the broker only ever
   under-counts a node's room.
4. Pinned or unwritable repository: nothing is written, and unwritable batches are retried
   after a back-off while the broker keeps serving. An item's `gave_up` effects run (a
   `broker.effects.Why` filled in with the reason) only when it is given up for good
   (pinned, or an item that is not retried): what heard it never lands.
   A retried item is planned afresh on the next try and hears nothing of the failed one.
   A plan that decided without writing (`Planned.only`: a refusal, nothing to do) has its
   effects run in commit order like any other's; given up, its own effects run rather than
   its `gave_up`: what it decided did not depend on the commit.
5. The commit that records an instance's end stamps it (`ended_at`, UTC, milliseconds): the
   retention of ended instances counts from there (`broker.retention`).
6. The broker encodes a commit's records as compact JSON; the writer formats them pretty
   for git (`Change.files_compact`): formatting is most of the encoding, and encoding a
   commit is time the event loop reads no bid reply (docs/performance.md).
7. With a commit gap (`gap_s`, 0 by default) the next commit starts no sooner than the gap
   after the last was written and takes everything queued by then: a commit's writer work
   is mostly per commit, so under sustained load fewer, bigger commits leave the cores to
   the bid rounds; at light load the bigger bursts of awards lengthen rounds, hence off by
   default (docs/performance.md).
8. One outcome per commit: a write that failed after the ref may have moved (its writer
   died, an error past the compare-and-swap) is settled by reading the ref
   (`Ledger.landed`): if the branch holds the commit, it landed and is adopted as if the
   write had returned; only if it does not is anyone told it failed.
9. A damaged repository (`Damaged`: an object missing or unreadable) stops the committer,
   and `on_damaged` hears it. Items whose commit surely did not land hear that they failed;
   when the ref cannot even be read to tell, they hear nothing: no answer, not a wrong one.
10. With `durable` (a leader of several brokers, `broker.ha`) a commit has landed only once
   it is on the remote every broker reads: its effects, and `on_durable` before them (the
   KV mirror), wait until a push covering it was accepted. Commits go on being
   written meanwhile, and one push carries all of them (`broker.ledger.remote` rule 6);
   without `durable` nothing waits.
11. A writer process that died (killed, OOM-killed, or dead while importing) is replaced by
   a fresh one, logged in one fixed sentence. A write it left unsettled is settled by rule
   8; one that did not land is written once more at once by the fresh writer, after the
   lock a writer killed between locking the ref and moving it left (`broker.ledger.
   stalelock`) is cleared - no item hears of the death. A fresh writer that dies too makes
   the batch unwritable (rule 4), and the next try starts another. After `WRITER_DEATHS`
   writers in a row died before a write of theirs landed (one that dies as it starts:
   a broken install, no memory for a process), commits are written on a thread from then
   on, said once: slower under load, but written.
12. A plan may read in steps (`broker.steps`: a service's over each of its replicas): it
   returns its steps instead of its result, and the committer drives them, giving the loop a
   turn between slices. Nothing but the committer changes the state it plans on, so the
   view holds still meanwhile; items submitted meanwhile wait for the next commit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgspec

from gavel.broker.effects import Effect, Effects, Why
from gavel.broker.ledger.afterlane import AFTER_SLICE_S, AfterLane, Durable
from gavel.broker.ledger.gitwriter import commit_files, make_executor
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.repository import Conflict, Damaged, Ledger, Pinned
from gavel.broker.ledger.state import Change, stamp
from gavel.broker.steps import Steps, drive
from gavel.shared.reasons import Reason
from gavel.shared.timing import Timing

__all__ = ["AFTER_SLICE_S", "Committer", "Durable", "Item", "Plan", "Planned", "and_then",
           "or_only"]

log = logging.getLogger("gavel.ledger")
_TIMING = Timing()
#: Writer processes in a row that may die before a write lands; then a thread writes (rule 11).
WRITER_DEATHS = 3


@dataclass
class Planned:
    """What a plan made of its view: the message lines and trailers it adds, and the
    effects that follow once the commit is durable (rule 3), as values."""

    lines: list[str]
    trailers: list[str] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    #: False: the plan changed nothing of the view (`only`; rule 4).
    writes: bool = True

    @classmethod
    def only(cls, *effects: Effect) -> Planned:
        """A plan that changes nothing and has only these effects (a refusal, a pass with
        nothing to do): they run in commit order, and stand if the commit is given up."""
        return cls(lines=[], effects=list(effects), writes=False)


def or_only(view: View, *, plan: Callable[[View], Planned | None],
            effects: tuple[Effect, ...]) -> Planned:
    """`plan`'s change and effects, or, when it has nothing to do, only `effects`."""
    got = plan(view)
    return got if got is not None else Planned.only(*effects)


#: What an item's plan returns: its result, or its steps (rule 12).
Plan = Callable[[View], Planned | Steps[Planned | None] | None]


def and_then(view: View, *, plan: Plan, effects: tuple[Effect, ...]
             ) -> Planned | Steps[Planned | None]:
    """`plan`'s change and effects followed by `effects`, or, when it has nothing to do,
    only `effects`: what a shell notes once its plan is over, planned or not (in steps, if
    `plan` is)."""
    got = plan(view)
    if isinstance(got, Generator):
        return _then_steps(got, effects)
    return _then(got, effects)


def _then_steps(steps: Steps[Planned | None], effects: tuple[Effect, ...]
                ) -> Steps[Planned | None]:
    got = yield from steps
    return _then(got, effects)


def _then(got: Planned | None, effects: tuple[Effect, ...]) -> Planned:
    if got is None:
        return Planned.only(*effects)
    got.effects.extend(effects)
    return got


@dataclass
class Item:
    plan: Plan
    retry: bool = True
    #: Effects carried out when the item is given up for good (rule 4).
    gave_up: list[Effect] = field(default_factory=list)


class Committer:
    def __init__(self, ledger: Ledger, *, retry_s: float = _TIMING.tick_s, max_conflicts: int = 8,
                 on_commit: Callable[[Change, str], None] | None = None,
                 writer: str = "thread", gap_s: float = 0.0,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 durable: Durable | None = None,
                 on_durable: Callable[[Change, str], None] | None = None,
                 on_damaged: Callable[[Damaged], None] | None = None,
                 metrics: Any = None, slice_s: float | None = AFTER_SLICE_S,
                 stale_lock_s: float = _TIMING.stale_lock_s,
                 orphan_s: float = _TIMING.orphan_s) -> None:
        self.ledger = ledger
        #: Rule 11: how long a lock a dead writer left must stay unchanged to be removed, and
        #: how often a writer process looks whether this broker is still there (`Timing`).
        self.stale_lock_s = stale_lock_s
        self.orphan_s = orphan_s
        #: The least time between one commit's write and the next one's start (rule 7).
        self.gap_s = gap_s
        self.wall = wall
        self.writer = writer
        self.on_commit = on_commit
        self.retry_s = retry_s
        self.max_conflicts = max_conflicts
        self._queue: list[Item] = []
        self._kick = asyncio.Event()
        self._committing = False
        self._pool = make_executor(writer, orphan_s)
        #: Writers in a row that died before a write of theirs landed (rule 11).
        self._deaths = 0
        #: Who carries out each kind of effect (rule 3), and the lane that does, once
        #: commits are durable (rule 10: `durable`, and `on_durable` hears of each).
        self.effects = Effects()
        self.lane = AfterLane(self.effects, slice_s, durable, on_durable)
        self.commits = 0
        self.conflicts = 0
        self.latencies: list[float] = []
        self.idle = asyncio.Event()
        self.idle.set()
        self.metrics = metrics
        self.closed = False
        #: Writers let go, each shutting down on a thread of its own (`join`).
        self._leaving: list[Future[None]] = []
        #: Told when the repository turned out damaged (rule 9); the committer stops.
        self.on_damaged = on_damaged
        self.damaged: Damaged | None = None
        #: The last planning's `Planned.only` results, by item (rule 4).
        self._decided: dict[int, tuple[Item, Planned]] = {}

    def submit(self, item: Item) -> None:
        self._queue.append(item)
        self.idle.clear()
        self._kick.set()

    async def run(self) -> None:
        # The after-work is this loop's own: a group, so a crash in it ends `run` at once
        # (the broker, its owner, reports it) and nothing of it outlives `run`.
        async with asyncio.TaskGroup() as group:
            afters = group.create_task(self.lane.run(self._maybe_idle), name="after-commit")
            try:
                await self._commits()
            finally:
                afters.cancel()
                self.close()

    async def _commits(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            items, self._queue = self._queue, []
            self._committing = bool(items)
            wrote = False
            if items:
                try:
                    wrote = await self._commit(items)
                except Damaged as exc:  # rule 9
                    log.error("%s", exc)
                    self.damaged = exc
                    if self.on_damaged is not None:
                        self.on_damaged(exc)
                    return
                except Exception:  # a bug in one plan must not stop every later commit
                    log.exception("commit of %d items failed; they are dropped", len(items))
                    for item in items:
                        self._give_up(item, Reason.LEDGER_UNWRITABLE,
                                      "internal error while planning")
            self._committing = False
            self._decided = {}
            self._maybe_idle()
            if wrote and self.gap_s > 0:
                await asyncio.sleep(self.gap_s)  # rule 7: what comes meanwhile waits

    def _maybe_idle(self) -> None:
        """Idle: nothing queued, nothing being committed, no after-work left."""
        if not self._queue and not self._committing and not self.lane.busy:
            self.idle.set()

    @property
    def durable(self) -> Durable | None:
        """Rule 10: where commits become durable off this host (None: on landing)."""
        return self.lane.durable

    @durable.setter
    def durable(self, durable: Durable | None) -> None:
        self.lane.durable = durable

    @property
    def on_durable(self) -> Callable[[Change, str], None] | None:
        """Rule 10: who hears of each commit once it is durable, before its effects."""
        return self.lane.on_durable

    @on_durable.setter
    def on_durable(self, heard: Callable[[Change, str], None] | None) -> None:
        self.lane.on_durable = heard

    def _landed(self, planned: list[Planned], sha: str, change: Change | None = None) -> None:
        self.lane.landed([p.effects for p in planned], sha, change)

    def close(self) -> None:
        """Let the writer go (idempotent; `run` also does it when it ends)."""
        if not self.closed:
            self.closed = True
            self._let_go(self._pool)

    def _let_go(self, pool: Executor) -> None:
        """The pool shuts down on a daemon thread of its own, which `join` can wait for: a
        writer that hangs holds up neither the loop nor the exit."""
        gone: Future[None] = Future()

        def shut_down() -> None:
            pool.shutdown(wait=True)
            gone.set_result(None)

        threading.Thread(target=shut_down, name="gavel-writer-shutdown", daemon=True).start()
        self._leaving = [f for f in self._leaving if not f.done()] + [gone]

    async def join(self, timeout_s: float) -> None:
        """Close, and wait up to `timeout_s` for every writer let go to be gone, the commit in
        hand written: a writer process's manager thread still alive when the interpreter
        exits races CPython's own exit hook (a wakeup written to a pipe the thread has just
        closed, printed as an ignored OSError with its traceback)."""
        self.close()
        leaving = [asyncio.wrap_future(f) for f in self._leaving if not f.done()]
        if leaving:
            _, left = await asyncio.wait(leaving, timeout=timeout_s)
            if left:
                log.warning("the git writer did not finish within %.1fs; leaving it",
                            timeout_s)

    async def _commit(self, items: list[Item]) -> bool:
        """Plan, write and adopt one group commit; whether the writer wrote one."""
        loop = asyncio.get_running_loop()
        rewritten = False
        for _ in range(self.max_conflicts):
            state = self.ledger.state()
            view = View(state)
            self._decided = {}
            planned = []
            for item in items:
                made = item.plan(view)
                p = (await drive(made))[0] if isinstance(made, Generator) else made  # rule 12
                if p is not None:
                    planned.append(p)
                    if not p.writes:
                        self._decided[id(item)] = (item, p)
            if not view.change:
                self._landed(planned, state.head or "")  # in order with earlier commits'
                return False
            _stamp_ends(view.change, stamp(self.wall()))
            message = _message(planned)
            started = time.perf_counter()
            files, compact = view.change.files_compact(state.flat)  # rule 6
            self.ledger.writing = True
            try:
                if isinstance(self._pool, ProcessPoolExecutor):
                    sha = await loop.run_in_executor(
                        self._pool, commit_files, str(self.ledger.path), self.ledger.ref,
                        files, message, state.head, compact, self.ledger.objects)
                else:
                    sha = await loop.run_in_executor(
                        self._pool, self.ledger.write_files, files, message, state.head,
                        compact)
            except Conflict:
                self.conflicts += 1
                self.ledger.forget_head()
                log.info("state branch moved under us; re-planning %d items", len(items))
                continue
            except Pinned:
                for item in items:
                    self._give_up(item, Reason.PINNED, self.ledger.ref)
                return False
            except Exception as exc:  # rule 8: the ref says whether it landed
                died = isinstance(exc, BrokenExecutor)
                if died:
                    self._new_writer()
                got = self.ledger.landed(state.head, message)
                if got is None and died and not rewritten:  # rule 11
                    rewritten = True
                    await asyncio.to_thread(self.ledger.clear_stale_lock, self.stale_lock_s)
                    continue
                if got is None:
                    self._unwritable(items, exc)
                    if isinstance(exc, Damaged):
                        raise
                    return False
                log.warning("the write of commit %s reported %s after the ref moved; it "
                            "landed", got[:12], exc)
                sha = got
            finally:  # no await between here and adopt(): nobody sees the ref move early
                self.ledger.writing = False
            elapsed = time.perf_counter() - started
            self._deaths = 0  # rule 11: this writer wrote
            self.latencies.append(elapsed)
            if self.metrics is not None:
                self.metrics.commit_seconds.observe(elapsed)
                self.metrics.commit_items.observe(len(planned))
            if len(self.latencies) > 10_000:
                del self.latencies[:5_000]
            self.ledger.adopt(view.change, state.head, sha)
            self.commits += 1
            if self.on_commit is not None:
                self.on_commit(view.change, sha)
            self._landed(planned, sha, view.change)
            return True
        self._unwritable(items, "the branch kept moving; giving up this batch")
        return False

    def _new_writer(self) -> None:
        """Rule 11: the writer died; a fresh one takes its place, a thread after
        `WRITER_DEATHS` in a row."""
        self._deaths += 1
        if self.writer == "process" and self._deaths >= WRITER_DEATHS:
            log.warning("%d writer processes in a row died before a write landed; commits "
                        "are written on a thread from now on", self._deaths)
            self.writer = "thread"
        else:
            log.warning("the writer process died; a new one takes over")
        self._let_go(self._pool)
        self._pool = make_executor(self.writer, self.orphan_s)

    def _unwritable(self, items: list[Item], why: object) -> None:
        """Nothing of `items` landed: the retried ones go again after the back-off, the others
        hear that they failed (rule 4)."""
        log.warning("%s: %s", Reason.LEDGER_UNWRITABLE, why)
        retry = [i for i in items if i.retry]
        for item in items:
            if not item.retry:
                self._give_up(item, Reason.LEDGER_UNWRITABLE, str(why))
        if retry:
            asyncio.get_running_loop().call_later(self.retry_s, self._requeue, retry)

    def _give_up(self, item: Item, reason: Reason, detail: str) -> None:
        """Rule 4: the item never lands; what heard of it hears so, and why - unless its plan
        decided without writing: then what it decided stands."""
        got = self._decided.get(id(item))
        decided = got[1] if got is not None and got[0] is item else None
        for effect in decided.effects if decided is not None else item.gave_up:
            try:
                if decided is None and isinstance(effect, Why):
                    effect = replace(effect, reason=str(reason), detail=detail)
                self.effects.run(effect, "")
            except Exception:
                log.exception("effect %r of a given-up item failed", effect)

    def _requeue(self, items: list[Item]) -> None:
        for item in items:
            self.submit(item)


#: Control characters become spaces in message lines (trailers are JSON: already escaped).
_CONTROLS = dict.fromkeys([*range(32), 127], " ")


def _stamp_ends(change: Change, now: str) -> None:
    """Rule 5: a terminal record written without an end stamp gets this commit's time."""
    for iid, rec in change.instances.items():
        if rec is not None and not rec.ended_at and rec.state.terminal:
            change.instances[iid] = msgspec.structs.replace(rec, ended_at=now)


def _message(planned: list[Planned]) -> str:
    # One line per line: text a worker sent (a decline's detail) must not start a line of its
    # own in the message, where it could pass for a `Gavel-Auction:` trailer, nor end the
    # message early (libgit2 stops at a NUL, taking the trailers with it).
    lines = [line.translate(_CONTROLS) for p in planned for line in p.lines]
    trailers = [t for p in planned for t in p.trailers]
    if len(lines) == 1:
        subject, body = lines[0], []
    else:
        subject, body = f"gavel: {len(lines)} changes", lines
    parts = [subject]
    if body:
        parts += ["", *body]
    if trailers:
        parts += ["", *trailers]
    return "\n".join(parts) + "\n"
