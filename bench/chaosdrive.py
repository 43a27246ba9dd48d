"""What every chaos run does around its faults: the steady stream of submissions, the watch
of the state branch's heads, progress lines, settling, and the verdict read from the
outside (`bench.chaoscheck`). `bench.chaos` (one broker) and `bench.chaosha` (several,
one leading) add their faults on top.

Rules:
1. A submission that fails (no broker, NATS down, a failover under way) is retried with the
   same instance id and the same idempotency key (`SubmitRequest.key`): the broker answers
   a retry of a try that landed as it answered that try; a duplicate reply (the id without
   the key's record) also means an earlier try was accepted. Retries stop `settle_s` after
   the faults end.
2. The verdict is read from one repository (`repo_path`): the broker's own state with one
   broker, the remote every broker pushes to with several - what is durable.
3. Settling restarts whatever died by itself (`revive`, a crash is recorded) until every
   submitted instance is accounted for, or `settle_s` has passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from gavel.bench.chaoscheck import (
    Foreign,
    Verdict,
    alive_by_node,
    chain_errors,
    read_head,
    verify,
)
from gavel.bench.chaosplan import BLIP, SLEEPER, TIMING, Submission
from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.reasons import Reason
from gavel.transport.client import BrokerRefused, call

__all__ = ["Drive", "Run", "broken", "count_in", "finish", "options", "report", "say",
           "until"]


def say(text: str, started: float | None = None) -> None:
    stamp = f"[{time.monotonic() - started:7.1f}s] " if started is not None else ""
    sys.stderr.write(f"chaos: {stamp}{text}\n")
    sys.stderr.flush()


async def until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def count_in(log: Path, needle: bytes) -> int:
    """How often `log` says `needle`."""
    try:
        return log.read_bytes().count(needle)
    except OSError:
        return 0


def options(p: argparse.ArgumentParser, workers: int, settle_s: float) -> None:
    """The command-line options every chaos run takes."""
    p.add_argument("--workers", type=int, default=workers, metavar="N")
    p.add_argument("--seed", type=int, default=1, metavar="N")
    p.add_argument("--settle", type=float, default=settle_s, metavar="S",
                   help="at most this long for the cluster to settle after the faults")
    p.add_argument("--state", type=Path, default=None, metavar="DIR",
                   help="keep state and logs here (default: a temp dir, removed if ok)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir even if ok")
    p.add_argument("--json", action="store_true", help="stdout is only the JSON summary")


def finish(summary: dict[str, Any], root: Path, state: Path | None, keep: bool) -> None:
    """Say what failed; remove the run's temp dir if every check held (and none was asked
    to stay)."""
    for e in summary["errors"]:
        say(f"FAILED: {e}")
    if summary["ok"] and state is None and not keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        say(f"kept {root}")


def broken(exc: BaseException, seed: int, faults: dict[str, int],
           **extra: Any) -> dict[str, Any]:
    """The summary of a run that itself broke (never ok)."""
    say(f"FAILED: the run stopped: {exc!r}")
    return {"submitted": 0, "placed_once": 0, "lost": 0, "duplicated": 0, "ended_lost": 0,
            "unschedulable": 0, "faults": faults, "ok": False, "clean": False,
            "terminal": {}, "seed": seed, **extra, "errors": [f"the run stopped: {exc!r}"]}


def report(summary: dict[str, Any], line: str, json_only: bool) -> int:
    """The summary on stdout (after `line` and its verdict, unless `json_only`), last; the
    exit status: 0 only when every check held."""
    if not json_only:
        verdict = "clean" if summary["clean"] else "ok" if summary["ok"] else "FAILED"
        print(f"{line}: {verdict}")
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


@dataclass
class Run:
    """What one run saw while it drove the cluster."""

    submitted: dict[str, bool] = field(default_factory=dict)
    accepted: set[str] = field(default_factory=set)
    retries: int = 0
    heads: list[str] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


class Drive:
    """Rules 1-3 for one run against `nc` (an operator's connection that reconnects)."""

    def __init__(self, *, root: Path, repo_path: Path, nc: Any, settle_s: float,
                 revive: Callable[[], None]) -> None:
        self.root = root
        self.nc = nc
        self.settle_s = settle_s
        self.revive = revive
        self.repo_path = repo_path
        self.repo = pygit2.Repository(str(repo_path))
        self.ledger = Ledger(repo_path)
        self.seen = Run()
        self.started = time.monotonic()
        self.stop_at = float("inf")  # submissions give up retrying after this
        self.verdict = Verdict()
        self._submits: set[asyncio.Task[None]] = set()
        self._faults: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def say(self, text: str) -> None:
        say(text, self.started)

    @staticmethod
    def spawn(tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def pending(self) -> list[asyncio.Task[None]]:
        return [*self._submits, *self._faults, *self._tasks]

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(10 * TIMING.heartbeat_s)
            st = self.ledger.state()
            self.say(f"{len(self.seen.accepted)}/{len(self.seen.submitted)} accepted, "
                     f"{len(st.where)} placed, {len(self.seen.heads)} heads seen, "
                     f"{self.seen.retries} submit retries")

    async def watch_heads(self) -> None:
        while True:
            head = read_head(self.repo)
            if head is not None and (not self.seen.heads or self.seen.heads[-1] != head):
                self.seen.heads.append(head)
            await asyncio.sleep(0.02)

    # -- submissions (rule 1) --------------------------------------------------------------
    async def stream(self, subs: list[Submission], t0: float) -> None:
        for s in subs:
            await until(t0 + s.at)
            self.seen.submitted[s.instance_id] = s.long
            self.spawn(self._submits, self._submit(s))

    async def _submit(self, s: Submission) -> None:
        spec = SLEEPER if s.long else BLIP
        req = SubmitRequest(spec=spec, instance_id=s.instance_id, key=f"key-{s.instance_id}")
        while True:
            try:
                await call(self.nc, "submit", req, SubmitReply, timeout=3.0)
                self.seen.accepted.add(s.instance_id)
                return
            except BrokerRefused as exc:
                if str(exc).startswith(Reason.DUPLICATE):  # an earlier try landed
                    self.seen.accepted.add(s.instance_id)
                    return
                self.say(f"submit {s.instance_id} refused: {exc}; retrying")
            except Exception:  # broker down, NATS down or reconnecting: same id again
                pass
            self.seen.retries += 1
            if time.monotonic() > self.stop_at:
                return
            await asyncio.sleep(0.3)

    # -- settling and checking (rules 2, 3) -------------------------------------------------
    def check(self) -> Verdict:
        alive = alive_by_node(self.root / "workers")
        return verify(self.ledger.state(), self.seen.submitted, self.seen.accepted, alive)

    async def settle(self) -> Verdict:
        self.stop_at = time.monotonic() + self.settle_s
        while True:
            self.revive()
            v = await asyncio.to_thread(self.check)
            if v.settled and not self._submits and not self._tasks:
                self.say("settled")
                return v
            if time.monotonic() > self.stop_at:
                self.say(f"did not settle: {len(v.errors)} problems left")
                return v
            await asyncio.sleep(0.5)

    def heads(self) -> tuple[list[str], str | None]:
        """Every head seen, the final one last."""
        final = read_head(self.repo)
        heads = list(self.seen.heads)
        if final and (not heads or heads[-1] != final):
            heads.append(final)
        return heads, final

    def counts(self, errors: list[str]) -> dict[str, Any]:
        """The summary's fields every run has; `errors` gains the verdict's and the
        history's."""
        v, seen = self.verdict, self.seen
        heads, final = self.heads()
        errors += [*v.errors, *chain_errors(self.repo, heads, seen.foreign, final)]
        return {
            "submitted": len(seen.submitted),
            "placed_once": v.placed_once,
            # lost: submitted work gavel neither placed nor ended honestly (missing); what
            # the broker itself ended `lost` is counted on its own (ended_lost).
            "lost": len(v.missing),
            "duplicated": len(v.duplicated),
            "ended_lost": len(v.ended_lost),
            # Still waiting for room: the fleet was too small, nothing was lost.
            "unschedulable": len(v.unschedulable),
            "accepted": len(seen.accepted),
            "terminal": dict(sorted(v.terminal.items())),
            "submit_retries": seen.retries,
            "heads_seen": len(heads),
        }
