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
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Collection
from datetime import datetime

from gavel.broker.context import Context
from gavel.broker.keeper import CALM_TICKS, Backoff, Decision, Replica, decide
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, stop, submit
from gavel.broker.ledger.state import State, parse_stamp, stamp
from gavel.broker.promises import Promises
from gavel.broker.systems import is_system
from gavel.shared.messages import EventType, Health, InstanceState
from gavel.shared.reasons import Reason, render
from gavel.shared.records import InstanceRecord, ServiceRecord

__all__ = ["STOPS", "Services"]

#: The reasons the service itself stops a replica for: such an end is not replaced.
STOPS = frozenset({Reason.SCALED_DOWN.value, Reason.SERVICE_STOPPED.value,
                   Reason.SUPERSEDED.value, Reason.REBALANCED.value,
                   Reason.MOVE_ABANDONED.value})
#: Ends a deploying version's replica may come to on its own (keeper rule 4).
_OWN_ENDS = frozenset({InstanceState.FAILED, InstanceState.SUCCEEDED})
#: Rule 6: replicas one pass starts at most.
START_CHUNK = 2000
#: Rule 7: a service's passes take at most 1 / (1 + PASS_SHARE) of the loop.
PASS_SHARE = 4.0


class Services:
    def __init__(self, ctx: Context, promises: Promises, wall: Callable[[], datetime],
                 rng: random.Random | None = None, moving: Collection[str] = ()) -> None:
        self.ctx = ctx
        #: New copies a re-auction is moving replicas to (`broker.reauction`): the keeper
        #: counts them once they stand for the replica they replace, not before.
        self.moving = moving
        self.promises = promises
        self.wall = wall
        #: Draws the random part of replica ids (OS-seeded: a broker started again with a
        #: seed must not draw the ids of replicas it made before).
        self.rng = rng or random.Random()
        self._busy: set[str] = set()
        #: Replica -> when this broker first knew it, and since when it is healthy.
        self._first_seen: dict[str, float] = {}
        self._healthy_since: dict[str, float] = {}
        #: Service -> its replicas not yet ended, as the last pass saw them (plus those
        #: started since): a replica missing from the next pass has ended.
        self._live: dict[str, set[str]] = {}
        #: Service -> replicas that ended on their own and are not replaced yet, with why.
        self._ended: dict[str, list[tuple[str, str, str]]] = {}
        self._backoff: dict[str, Backoff] = {}
        #: Rule 6.
        self.start_chunk = START_CHUNK
        #: Rule 7: service -> when its next pass may run.
        self._next_pass: dict[str, float] = {}

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

    def _replicas(self, view: View | State, recs: list[InstanceRecord],
                  now: float) -> list[Replica]:
        """The keeper's view of the live replicas not being stopped."""
        out = []
        placed_on = view.placed_on if isinstance(view, View) else view.placement_of
        for r in recs:
            if r.state.terminal or r.cancelling or r.instance_id in self.moving:
                continue
            iid = r.instance_id
            waiting = placed_on(iid) is None
            since = None if waiting else self._healthy_since.get(iid)
            out.append(Replica(instance_id=iid, version=r.version, waiting=waiting,
                               healthy_for=None if since is None else now - since,
                               age=now - self._first_seen.get(iid, now)))
        return out

    @staticmethod
    def _failed_new(svc: ServiceRecord, recs: list[InstanceRecord]) -> list[str]:
        """Replicas of the deploying version that ended on their own since it began."""
        dep = svc.deployment
        if dep is None or dep.state != "running":
            return []
        began = parse_stamp(dep.started_at)
        out = []
        for r in recs:
            if r.version != dep.to_version or r.state not in _OWN_ENDS:
                continue
            at = parse_stamp(r.ended_at)  # none yet: it ended in the commit being planned
            if at is None or began is None or at >= began:
                out.append(r.instance_id)
        return out

    def _observe(self, name: str, svc: ServiceRecord, state: State,
                 recs: list[InstanceRecord], now: float) -> None:
        """Note what changed since the last pass: ends (rule 5), health, first sightings."""
        tick = self.ctx.timing.tick_s
        backoff = self._backoff.setdefault(name, Backoff())
        live = {r.instance_id for r in recs if not r.state.terminal}
        by_id = {r.instance_id: r for r in recs}
        for iid in self._live.get(name, set()) - live:
            self._first_seen.pop(iid, None)
            self._healthy_since.pop(iid, None)
            rec = by_id.get(iid)
            if rec is not None and rec.state is InstanceState.CANCELLED and \
                    (rec.reason in STOPS or rec.detail in STOPS):
                continue
            why = render(rec.reason, rec.detail) if rec is not None else \
                "its record left the state repository"
            self._ended.setdefault(name, []).append(
                (iid, str(rec.state) if rec is not None else "gone", why))
            backoff.ended(now, tick)
        self._live[name] = live
        for r in recs:
            iid = r.instance_id
            if r.state.terminal:
                continue
            self._first_seen.setdefault(iid, now)
            note = self.promises.health.get(iid)
            if self.health(r, state.placement_of(iid) is not None)[0] == Health.HEALTHY:
                self._healthy_since.setdefault(iid, note.since if note is not None else now)
            else:
                self._healthy_since.pop(iid, None)
        spec = svc.spec_of(svc.version)
        mine = self._replicas(state, recs, now)
        calm_s = max(CALM_TICKS * tick, spec.update.min_healthy_s if spec else 0.0)
        backoff.observe(now, not svc.stopped and len(mine) == svc.count and all(
            r.version == svc.version and r.healthy_for is not None for r in mine), calm_s)

    # -- the pass ------------------------------------------------------------------------
    def watch(self, now: float) -> None:
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
        for name, svc in state.services.items():
            if is_system(svc):  # kept by `broker.systems`
                continue
            if self._next_pass.get(name, now) > now:  # rule 7
                continue
            began = ctx.now()
            recs = state.replicas_of(name)
            self._observe(name, svc, state, recs, now)
            decided = name not in self._busy and self._decide(state, svc, recs, now)
            self._next_pass[name] = now + PASS_SHARE * max(0.0, ctx.now() - began)
            if not decided:
                continue
            self._busy.add(name)
            ctx.committer.submit(Item(plan=functools.partial(self._pass, name=name),
                                      failed=functools.partial(self._pass_failed, name),
                                      retry=False))

    def _decide(self, view: View | State, svc: ServiceRecord, recs: list[InstanceRecord],
                now: float) -> Decision:
        backoff = self._backoff.get(svc.name)
        return decide(svc, self._replicas(view, recs, now),
                      failed=self._failed_new(svc, recs),
                      hold=backoff is not None and backoff.holds(now),
                      stamp=stamp(self.wall()))

    def _pass_failed(self, name: str, _reason: Reason, _detail: str) -> None:
        self._busy.discard(name)

    def _pass(self, view: View, name: str) -> Planned | None:
        planned = self.keep(view, name)
        if planned is None:
            self._busy.discard(name)
            return None
        planned.after.append(lambda _sha: self._busy.discard(name))
        return planned

    def keep(self, view: View, name: str) -> Planned | None:
        """The keeper's decision for `name` on `view`, applied to it (rule 1)."""
        svc = view.service(name)
        if svc is None or is_system(svc):
            return None
        now = self.ctx.now()
        d = self._decide(view, svc, view.replicas(name), now)
        ended = self._ended.get(name, [])
        if not d:
            if d.missing is not None and d.missing <= 0:
                ended.clear()  # nothing missing: those ends need no replacement
            return None
        out = Planned(lines=[])
        verdict = Planned(lines=[])
        if d.record is not None:
            view.put_service(d.record)
            self._narrate(verdict, svc, d)
        target = d.record or svc
        spec = target.spec_of(target.version)
        made: list[str] = []
        starts = min(d.start, self.start_chunk) if spec is not None else 0  # rule 6
        for _ in range(starts):
            assert spec is not None
            iid = self._new_id(view, name)
            submit(view, InstanceRecord(instance_id=iid, spec=spec, service=name,
                                        version=target.version))
            made.append(iid)
            if ended:
                old, state, why = ended.pop(0)
                out.lines.append(f"service {name}: replace {old} ({state}: {why}) with {iid}")
                out.after.append(functools.partial(self.emit, name, EventType.REPLACED,
                                                   reason=why,
                                                   detail=f"{old} ({state}) by {iid}"))
            else:
                out.lines.append(f"service {name}: start {iid} (version {target.version})")
        if d.missing is not None and d.missing - starts <= 0:
            ended.clear()
        for iid, reason in d.stop:
            got = stop(view, iid, reason)
            if got is None:
                continue
            rec, node = got
            out.lines.append(f"service {name}: stop {iid} (version {rec.version}"
                             + (f" on {node}" if node else "") + f"): {reason}")
            out.after.append(functools.partial(self._stopped, name, iid, node, reason))
        out.after.append(functools.partial(self._started, name, made, now))
        out.lines += verdict.lines  # the steps, then what they came to
        out.after += verdict.after
        return out

    def _new_id(self, view: View, name: str) -> str:
        while True:
            iid = f"{name}-{self.rng.getrandbits(24):06x}"
            if view.instance(iid) is None:
                return iid

    def _started(self, name: str, made: list[str], now: float, _sha: str) -> None:
        """Replicas started: their deadline clocks run from now, and an end of theirs before
        the next pass is still noticed."""
        live = self._live.setdefault(name, set())
        for iid in made:
            self._first_seen.setdefault(iid, now)
            live.add(iid)
        if made:
            self.ctx.wake()

    def _stopped(self, name: str, iid: str, node: str, reason: Reason, _sha: str) -> None:
        if node:
            self.promises.send_cancel(iid, node)
        else:
            self.ctx.events.emit(iid, EventType.CANCELLED, reason=reason)
            self.promises.ended(iid)
        self.emit(name, EventType.STOPPING, reason=reason, detail=iid, node_id=node)

    def emit(self, name: str, kind: EventType, _sha: str = "", reason: str = "",
             detail: str = "", node_id: str = "") -> None:
        """An event of the service's own (rule 4), as an after-commit callback takes it."""
        self.ctx.events.emit(name, kind, node_id=node_id, reason=reason, detail=detail)

    def _narrate(self, out: Planned, before: ServiceRecord, d: Decision) -> None:
        """Lines, events and metrics for a change of the service record itself."""
        after = d.record
        assert after is not None
        name, ended = after.name, d.ended
        if ended is not None and ended.state == "failed":
            line = (f"service {name}: deploy of version {ended.to_version} failed: "
                    f"{Reason.DEPLOY_UNHEALTHY} ({ended.detail})")
            out.after.append(functools.partial(
                self.emit, name, EventType.DEPLOY_FAILED, reason=Reason.DEPLOY_UNHEALTHY,
                detail=f"version {ended.to_version}: {ended.detail}"))
            if after.version != before.version:
                line += f"; rolling back to version {after.version}"
                out.after.append(functools.partial(
                    self.emit, name, EventType.DEPLOYING, reason=Reason.ROLLED_BACK,
                    detail=f"version {after.version} (from {before.version})"))
            out.lines.append(line)
        elif ended is not None:
            what = "rolled back to" if ended.state == "rolled-back" else "deployed"
            out.lines.append(f"service {name}: {what} version {ended.to_version}: "
                             f"{after.count} replicas healthy")
            out.after.append(functools.partial(
                self.emit, name, EventType.DEPLOYED,
                reason=Reason.ROLLED_BACK if ended.state == "rolled-back" else "",
                detail=f"version {ended.to_version}"))
        elif after.healthy_version != before.healthy_version:
            out.lines.append(f"service {name}: version {after.healthy_version} is healthy "
                             f"({after.count} replicas)")
        if ended is not None:
            out.after.append(lambda _sha: self.ctx.metrics.deploys.labels(
                outcome=ended.state).inc())

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
