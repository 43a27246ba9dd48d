"""Services: the broker part that keeps each service at its count and rolls its deploys and
rollbacks (the operator's changes to a service are `broker.deploys`).

Rules:
1. A service's intent is its record in git (``services/<name>.json``); its replicas are
   ordinary instances (`InstanceRecord.service`, `.version`), placed by ordinary auctions.
   What to do is decided by `broker.keeper` from git and what this part knows of each
   replica's health; every step is a plan that decides again on its own view, so a pass run
   twice, or an operator's change and a pass in one commit, changes nothing the second time,
   and a
   broker restarted mid-way carries on from the branch (never a double replica: starts are
   counted against the replicas git holds).
2. One pass's commit in flight per service at a time; a pass that would change nothing
   submits nothing.
3. A replica is healthy as its node last said (`Promises.health`); one whose spec has no
   checks and of which nothing was said is healthy once it runs. What is remembered only in
   memory - when a replica was first seen (the deploy deadline's clock), since when it is
   healthy, the back-off of ends in a row - starts afresh with the broker, like every
   promise clock: a restart never makes a replica late, it only lets the first replacement
   after it go at once.
4. Each step is narrated: its commit message lines start ``service <name>:`` (``git log
   --grep`` reads as the service's deployment history), and the service's events carry its
   name as their instance (`gavel events NAME`); a replacement names the replica that ended
   and why, a stop names its reason.
5. A replica's end counts toward the back-off unless the service stopped it (scaled down,
   stopped, superseded); replicas whose service has no readable record are left alone.
6. One pass starts at most `start_chunk` replicas (`START_CHUNK`): a service scaled to a
   large count grows one commit of bounded size per pass, and between them the broker
   serves the API, auctions and heartbeats as at any other time. The next pass decides
   again on the branch and starts the next chunk (rule 1: nothing is started twice).
7. A pass over one service that held the loop for t seconds is not run for that service
   again within `PASS_SHARE` times t: a service of a hundred thousand replicas takes a
   visible share of the loop per pass, and passing over it every tick would leave the API,
   the auctions and the heartbeats no time at all. A small service's pass takes
   microseconds and runs every tick as before.
8. A pass's plan (`serviceplans.plan_keep`) reads what this part knew as it submitted it
   (`inputs`: the clock, the wall clock, the epoch, the back-off, the ends waiting, its
   replicas' clocks, a seed for the new ids), never this part while planning: what it
   learns meanwhile goes to the next pass.
9. A pass, and the plan it submits, read a service's replicas in steps (`broker.steps`):
   the loop answers the API, auctions and heartbeats between them, so a pass over a hundred
   thousand replicas is many short steps, not one long one (docs/performance.md, "Large
   counts"). Rule 7 counts the steps' own time. What the pass reads it reads as it comes
   to it; the replicas the last pass left live are taken as the steps begin, and those
   started meanwhile stay live for the next pass to see, so nothing started during the
   steps passes for an end.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from datetime import datetime

from gavel.broker.context import Context
from gavel.broker.keeper import CALM_TICKS, Backoff, Replica, decide
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import State, stamp
from gavel.broker.onepass import OnePass
from gavel.broker.promises import Promises
from gavel.broker.serviceplans import (
    Clocks,
    DeployEnded,
    Ended,
    EndsTaken,
    KeepInputs,
    Started,
    failed_new,
    is_system,
    plan_keep_in_steps,
    replicas_in_steps,
)
from gavel.broker.steps import Steps, chunks, drive
from gavel.shared.messages import Health, InstanceState
from gavel.shared.reasons import Reason, render
from gavel.shared.records import InstanceRecord, ServiceRecord

__all__ = ["STOPS", "Services"]

#: The reasons the service itself stops a replica for: such an end is not replaced.
STOPS = frozenset({Reason.SCALED_DOWN.value, Reason.SERVICE_STOPPED.value,
                   Reason.SUPERSEDED.value, Reason.REBALANCED.value,
                   Reason.MOVE_ABANDONED.value})
#: Rule 6: replicas one pass starts at most.
START_CHUNK = 2000
#: Rule 7: a service's passes take at most 1 / (1 + PASS_SHARE) of the loop.
PASS_SHARE = 4.0


class Services:
    def __init__(self, ctx: Context, promises: Promises, wall: Callable[[], datetime],
                 rng: random.Random | None = None,
                 moving: Mapping[str, str] | None = None) -> None:
        self.ctx = ctx
        #: New copies a re-auction is moving replicas to, and the replica each replaces
        #: (`broker.reauction` rule 5): the keeper counts them once they stand for it.
        self.moving: Mapping[str, str] = moving if moving is not None else {}
        self.promises = promises
        self.wall = wall
        #: Draws the random part of replica ids (OS-seeded: a broker started again with a
        #: seed must not draw the ids of replicas it made before).
        self.rng = rng or random.Random()
        #: Rule 2.
        self.passes = OnePass(ctx.committer)
        #: Replica -> when this broker first knew it, and since when it is healthy (what
        #: `_clocks` lends each plan, read only).
        self._first_seen: dict[str, float] = {}
        self._healthy_since: dict[str, float] = {}
        self._clocks = Clocks(self._first_seen, self._healthy_since, self.moving)
        #: Service -> its replicas not yet ended, as the last pass saw them (plus those
        #: started since): a replica missing from the next pass has ended.
        self._live: dict[str, set[str]] = {}
        #: Service -> replicas that ended on their own and are not replaced yet, with why.
        self._ended: dict[str, list[Ended]] = {}
        self._backoff: dict[str, Backoff] = {}
        #: Rule 6.
        self.start_chunk = START_CHUNK
        #: Rule 7: service -> when its next pass may run.
        self._next_pass: dict[str, float] = {}
        ctx.committer.effects.on(Started, self._started)
        ctx.committer.effects.on(EndsTaken, self._ends_taken)
        ctx.committer.effects.on(DeployEnded, lambda e, _sha: ctx.metrics.deploys.labels(
            outcome=e.outcome).inc())

    # -- what is known of replicas -------------------------------------------------------
    def health(self, rec: InstanceRecord, placed: bool = True) -> tuple[str, str]:
        """A replica's health as `status` shows it, and the check that decided (rule 3)."""
        if not placed:
            return "", ""
        note = self.promises.health.get(rec.instance_id)
        if note is not None:
            return str(note.health), note.check
        if not rec.spec.checks and self.promises.live.get(rec.instance_id) == \
                InstanceState.RUNNING:
            return str(Health.HEALTHY), ""
        return "", ""

    def _observe(self, name: str, svc: ServiceRecord, state: State, before: set[str],
                 now: float) -> Steps[tuple[list[InstanceRecord], list[Replica]]]:
        """Note what changed since the last pass: ends (rule 5), health, first sightings;
        the replicas' records and the keeper's view of them, as they are now. `before`: the
        replicas the last pass left live, taken as the pass began (rule 9)."""
        tick = self.ctx.timing.tick_s
        backoff = self._backoff.setdefault(name, Backoff())
        recs = yield from View(state).replicas_in_steps(name)
        live: set[str] = set()
        for part in chunks(recs):
            for r in part:
                if r.state.terminal:
                    continue
                iid = r.instance_id
                live.add(iid)
                self._first_seen.setdefault(iid, now)
                note = self.promises.health.get(iid)
                if self.health(r, state.placement_of(iid) is not None)[0] == Health.HEALTHY:
                    self._healthy_since.setdefault(iid, note.since if note is not None else now)
                else:
                    self._healthy_since.pop(iid, None)
            yield
        for iid in before - live:
            self._first_seen.pop(iid, None)
            self._healthy_since.pop(iid, None)
            rec = state.instances.get(iid)
            if rec is not None and rec.state is InstanceState.CANCELLED and \
                    (rec.reason in STOPS or rec.detail in STOPS):
                continue
            why = render(rec.reason, rec.detail) if rec is not None else \
                "its record left the state repository"
            self._ended.setdefault(name, []).append(
                (iid, str(rec.state) if rec is not None else "gone", why))
            backoff.ended(now, tick)
        self._live[name] = live | (self._live.get(name, set()) - before)  # started meanwhile
        spec = svc.spec_of(svc.version)
        mine = yield from replicas_in_steps(state, recs, self._clocks, now)
        calm_s = max(CALM_TICKS * tick, spec.update.min_healthy_s if spec else 0.0)
        backoff.observe(now, not svc.stopped and len(mine) == svc.count and all(
            r.version == svc.version and r.healthy_for is not None for r in mine), calm_s)
        return recs, mine

    # -- the pass ------------------------------------------------------------------------
    async def watch(self, now: float) -> None:
        """One pass over every service: observe, and commit what the keeper decides."""
        ctx = self.ctx
        if ctx.ledger.pinned:
            return
        state = ctx.ledger.state()
        for name in [n for n in self._live if n not in state.services]:
            for iid in self._live.pop(name):
                self._first_seen.pop(iid, None)
                self._healthy_since.pop(iid, None)
            self._ended.pop(name, None)
            self._backoff.pop(name, None)
            self._next_pass.pop(name, None)
        for name, svc in list(state.services.items()):
            if is_system(svc):  # kept by `broker.systems`
                continue
            if self._next_pass.get(name, now) > now:  # rule 7
                continue
            before = set(self._live.get(name, ()))  # rule 9: as the steps begin
            (recs, mine), ran = await drive(self._observe(name, svc, state, before, now),
                                            clock=ctx.now)
            began = ctx.now()
            d = None if self.passes.busy(name) else decide(
                svc, mine, failed=failed_new(svc, recs), hold=self._holds(name, now),
                stamp=stamp(self.wall()))  # what `decision` decides, on the replicas seen
            if d:
                self.passes.submit(name, functools.partial(
                    plan_keep_in_steps, name=name, inputs=self.inputs(name, recs, now)))
            self._next_pass[name] = now + PASS_SHARE * max(0.0, ran + ctx.now() - began)
            if d is not None and not d and d.missing is not None and d.missing <= 0:
                self._ended.pop(name, None)  # nothing missing: those ends need no replacement

    def _holds(self, name: str, now: float) -> bool:
        backoff = self._backoff.get(name)
        return backoff is not None and backoff.holds(now)

    def inputs(self, name: str, recs: list[InstanceRecord], now: float) -> KeepInputs:
        """What the keeper's plan for `name` reads besides its view (`recs`: its replicas in
        git), as this part knows it now (rule 8)."""
        return KeepInputs(now=now, stamp=stamp(self.wall()), epoch=self.ctx.leader.epoch,
                          seed=self.rng.getrandbits(64), start_chunk=self.start_chunk,
                          hold=self._holds(name, now), ended=tuple(self._ended.get(name, ())),
                          clocks=self._clocks.of([r.instance_id for r in recs]))

    def _started(self, e: Started, _sha: str) -> None:
        """Replicas started: their deadline clocks run from when they were planned, and an
        end of theirs before the next pass is still noticed."""
        live = self._live.setdefault(e.name, set())
        for iid in e.made:
            self._first_seen.setdefault(iid, e.at)
            live.add(iid)
        if e.made:
            self.ctx.wake()

    def _ends_taken(self, e: EndsTaken, _sha: str) -> None:
        ended = self._ended.get(e.name)
        if ended is not None:
            del ended[:e.taken]
            if e.settled:
                ended.clear()

    # -- metrics -------------------------------------------------------------------------
    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Services by state (running, deploying, failed, stopped) and their live replicas
        by health (healthy, unhealthy), for the scrape."""
        state = self.ctx.ledger.state()
        by_state = dict.fromkeys(("running", "deploying", "failed", "stopped"), 0)
        by_health = {"healthy": 0, "unhealthy": 0}
        for name, svc in state.services.items():
            dep = svc.deployment
            kind = "stopped" if svc.stopped else "deploying" if dep is not None and \
                dep.state == "running" else "failed" if dep is not None and \
                dep.state == "failed" else "running"
            by_state[kind] += 1
            for r in state.replicas_of(name):
                if not r.state.terminal:
                    placed = state.placement_of(r.instance_id) is not None
                    ok = self.health(r, placed)[0] == Health.HEALTHY
                    by_health["healthy" if ok else "unhealthy"] += 1
        return by_state, by_health
