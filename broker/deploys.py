"""The operator's changes to a service: deploy (a new service, or its next version), scale,
stop and rollback - each a plan that writes ``services/<name>.json`` and takes the keeper's
first steps in the same commit (`serviceplans.plan_keep`), so a deploy's first replicas are
in the commit that made its version.

Rules:
1. A spec equal to the running version but for its count is that version (a count alone
   is a scale, not a deploy); equal in all, on a service that runs, it changes nothing.
   Otherwise it becomes the next version, and a deployment to it begins; one that was
   running is cancelled (superseded). `deploy` sets the count to the spec's.
2. A deploy request with an idempotency key is answered, when retried, what the first was
   (the newest `KEYS_KEPT` keys, in memory: a broker started again finds the version
   deployed and changes nothing).
3. `stop` keeps the record (``stopped``): every replica stops, a running deployment is
   cancelled; a deploy starts it again. `rollback` goes back to a version the service had,
   in a deployment of its own: by default its last healthy version while it runs another,
   or, on its healthy version, the version healthy most recently before it - never the
   broken version an automatic revert left (`_back`).
4. A service whose file is not readable (`State.unreadable`) is never written: every verb
   is refused with the file's path and why.
5. A deploy with a version index (`gavel deploy --check-index N`, from `gavel plan`) is
   decided in its own commit's plan, on the view it writes: applied only while the
   service's index is still N (`shared.planning.version_index`), else refused with
   `Reason.STALE_INDEX` and nothing written.
6. Every verb is a plan (`plan_verb`) that returns its change and its answer as effects, a
   refusal on the view it plans on as its only effect (`Planned.only`): the committer
   answers, in commit order. A verb refused before it is queued (`refused`, the API's
   checks) is answered directly: it wrote nothing, so no commit of its own has to be durable
   before it is told.
7. A verb's plan reads nothing but its arguments: the request, and what the keeper's first
   steps read (`serviceplans.KeepInputs`, whose wall clock also stamps the version and
   the deployment), gathered as the verb is asked.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from gavel.broker.context import Context
from gavel.broker.effects import Answer, Emit, Refuse, Wake
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import State
from gavel.broker.routeowners import refusal_in
from gavel.broker.serviceplans import DeployEnded, KeepInputs, plan_keep
from gavel.broker.services import Services
from gavel.shared.api import DeployReply
from gavel.shared.messages import ApiError, EventType, Message, Spec
from gavel.shared.planning import version_index
from gavel.shared.reasons import Reason
from gavel.shared.records import Deployment, ServiceRecord, ServiceVersion, service_path
from gavel.transport.tasks import Tasks

__all__ = ["KEYS_KEPT", "Deploys", "plan_deploy", "plan_rollback", "plan_scale", "plan_stop",
           "plan_verb", "refusal"]

#: Idempotency keys of deploy requests remembered, newest last (rule 2).
KEYS_KEPT = 1024

#: What a verb's plan returns: the commit (None: nothing to write) and the reply to give
#: once it has landed (for no commit, the plan's only effect; None: the service's status).
Outcome = tuple[Planned | None, Message | None]


class Deploys:
    def __init__(self, ctx: Context, services: Services) -> None:
        self.ctx = ctx
        self.services = services
        self._keys: OrderedDict[str, asyncio.Future[Message | None]] = OrderedDict()
        self._commits = Tasks("deploys", ctx.log)  # each outlives its request's cancel

    def refused(self, name: str) -> ApiError | None:
        """Why `name` cannot be changed now (rule 4)."""
        return refusal(self.ctx.ledger.state(), name, self._pinned())

    def _pinned(self) -> str:
        """The ref the deployment is pinned to, or ""."""
        return self.ctx.ledger.ref if self.ctx.ledger.pinned else ""

    async def deploy(self, spec: Spec, key: str = "", check_index: int | None = None
                     ) -> Message:
        """Create the service, or deploy `spec` as its next version (the API checked it);
        with `check_index`, only while the service's version index is that (rule 5)."""
        done = self._keys.get(key) if key else None
        if done is None:
            done = self._commits.spawn(self._commit(spec.name, functools.partial(
                plan_deploy, spec=spec, check_index=check_index,
                keep=self._inputs(spec.name))), name=f"deploy {spec.name}")
            if key:  # a retry with this key is answered what this request is
                self._keys[key] = done
                while len(self._keys) > KEYS_KEPT:
                    self._keys.popitem(last=False)
        got = await asyncio.shield(done)
        if isinstance(got, ApiError) and self._keys.get(key) is done:
            del self._keys[key]  # nothing landed: a retry may try again
        return got if got is not None else ApiError(error="deploy failed")

    def _inputs(self, name: str) -> KeepInputs:
        """What a verb's plan on `name` reads besides its view (rule 7)."""
        recs = self.ctx.ledger.state().replicas_of(name)
        return self.services.inputs(name, recs, self.ctx.now())

    async def scale(self, name: str, count: int) -> Message | None:
        return await self._commit(name, functools.partial(
            plan_scale, name=name, count=count, keep=self._inputs(name)))

    async def stop_service(self, name: str) -> Message | None:
        return await self._commit(name, functools.partial(
            plan_stop, name=name, keep=self._inputs(name)))

    async def rollback(self, name: str, to_version: int) -> Message | None:
        return await self._commit(name, functools.partial(
            plan_rollback, name=name, to_version=to_version, keep=self._inputs(name)))

    async def _commit(self, name: str, plan: Callable[[View], Outcome]) -> Message | None:
        """Run a verb's plan on `name` in the group committer; its reply once the commit
        landed. The plan runs only while the service's file is readable (rule 4)."""
        done: asyncio.Future[Message | None] = asyncio.get_running_loop().create_future()
        self.ctx.committer.submit(Item(
            plan=functools.partial(plan_verb, name=name, plan=plan, pinned=self._pinned(),
                                   done=done),
            retry=False, gave_up=[Refuse(done)]))
        return await done


# -- the verbs' plans (rule 6) -------------------------------------------------------------
def plan_deploy(view: View, *, spec: Spec, check_index: int | None,
                keep: KeepInputs) -> Outcome:
    """Create the service, or deploy `spec` as its next version (rules 1 and 5)."""
    name = spec.name
    owned = refusal_in(view, spec)  # a deploy racing this one may have claimed it
    if owned:
        return None, ApiError(error=owned)
    cur = view.service(name)
    if check_index is not None and (index := version_index(cur)) != check_index:
        return None, ApiError(error=f"{Reason.STALE_INDEX} ({name}'s version index is "
                                    f"{index}, the plan's {check_index})")
    at = keep.stamp
    out = Planned(lines=[])
    if cur is None:
        rec = ServiceRecord(name=name, versions=[ServiceVersion(version=1, spec=spec, at=at)],
                            version=1, count=spec.count,
                            deployment=Deployment(to_version=1, started_at=at))
        out.lines.append(f"service {name}: deploy version 1 ({spec.count} replicas)")
    else:
        running = cur.spec_of(cur.version)
        if running is not None and _same(running, spec):
            if not cur.stopped and cur.count == spec.count:
                return None, DeployReply(name=name, version=cur.version, changed=False)
            rec = msgspec.structs.replace(cur, stopped=False, count=spec.count)
            out.lines.append(f"service {name}: version {cur.version} with {spec.count} "
                             "replicas" + (", started again" if cur.stopped else ""))
        else:
            v = max(x.version for x in cur.versions) + 1
            rec = msgspec.structs.replace(
                cur, versions=[*cur.versions, ServiceVersion(version=v, spec=spec, at=at)],
                version=v, count=spec.count, stopped=False,
                deployment=Deployment(to_version=v, from_version=cur.version,
                                      started_at=at))
            out.lines.append(f"service {name}: deploy version {v} over version "
                             f"{cur.version} ({spec.count} replicas, "
                             f"{spec.update.max_parallel} at a time)")
            _supersede(out, cur, at)
    view.put_service(rec)
    if rec.deployment is not None and rec.deployment.state == "running" and \
            (cur is None or rec.version != cur.version):
        out.effects.append(Emit(
            name, EventType.DEPLOYING,
            detail=f"version {rec.version}" + (f" (from {cur.version})" if cur else "")))
    _then_keep(view, name, out, keep)
    return out, DeployReply(name=name, version=rec.version)


def plan_scale(view: View, *, name: str, count: int, keep: KeepInputs) -> Outcome:
    cur = view.service(name)
    if cur is None:
        return None, _unknown(name)
    if cur.count == count:
        return None, None
    out = Planned(lines=[f"service {name}: scale from {cur.count} to {count} replicas"
                         + (" (stopped: none run until it is deployed again)"
                            if cur.stopped else "")])
    view.put_service(msgspec.structs.replace(cur, count=count))
    _then_keep(view, name, out, keep)
    return out, None


def plan_stop(view: View, *, name: str, keep: KeepInputs) -> Outcome:
    cur = view.service(name)
    if cur is None:
        return None, _unknown(name)
    if cur.stopped:
        return None, None
    out = Planned(lines=[f"service {name}: stop every replica"])
    dep = _supersede(out, cur, keep.stamp, Reason.SERVICE_STOPPED)
    view.put_service(msgspec.structs.replace(cur, stopped=True, deployment=dep))
    _then_keep(view, name, out, keep)
    return out, None


def plan_rollback(view: View, *, name: str, to_version: int, keep: KeepInputs) -> Outcome:
    cur = view.service(name)
    if cur is None:
        return None, _unknown(name)
    target = to_version or _back(cur)
    if not target:
        return None, ApiError(error=f"{name} has no version to go back to yet: name one "
                                    "(--to VERSION)")
    if cur.spec_of(target) is None:
        return None, ApiError(error=f"{name} has no version {target}")
    if target == cur.version:
        return None, ApiError(error=f"{name} runs version {target} already")
    at = keep.stamp
    out = Planned(lines=[f"service {name}: roll back from version {cur.version} to "
                         f"version {target}"])
    _supersede(out, cur, at)
    view.put_service(msgspec.structs.replace(cur, version=target, deployment=Deployment(
        to_version=target, from_version=cur.version, started_at=at,
        reason=str(Reason.ROLLED_BACK), detail="asked by the operator")))
    out.effects.append(Emit(name, EventType.DEPLOYING, reason=Reason.ROLLED_BACK,
                            detail=f"version {target} (from {cur.version})"))
    _then_keep(view, name, out, keep)
    return out, None


def _supersede(out: Planned, cur: ServiceRecord, at: str,
               reason: str = "") -> Deployment | None:
    """A running deployment `cur` had is cancelled by the change being planned."""
    dep = cur.deployment
    if dep is None or dep.state != "running":
        return dep
    ended = msgspec.structs.replace(dep, state="cancelled", ended_at=at, reason=reason)
    out.lines.append(f"service {cur.name}: the deployment of version {dep.to_version} "
                     "is cancelled")
    out.effects.append(DeployEnded("cancelled"))
    return ended


def _then_keep(view: View, name: str, out: Planned, keep: KeepInputs) -> None:
    """The keeper's first steps for the changed service, in the verb's own commit."""
    kept = plan_keep(view, name, keep)
    if kept is not None:
        out.lines += kept.lines
        out.effects += kept.effects


def refusal(state: State, name: str, pinned: str) -> ApiError | None:
    """Why `name` cannot be changed on `state`: the deployment is pinned to the ref
    `pinned` ("": it is not), or the service's file is not readable (rule 4)."""
    if pinned:
        return ApiError(error=f"{Reason.PINNED} ({pinned})")
    path = service_path(name)
    if path in state.unreadable:
        return ApiError(error=f"{Reason.UNREADABLE_FILE}: {path} "
                              f"({state.unreadable[path]})")
    return None


def plan_verb(view: View, *, name: str, plan: Callable[[View], Outcome], pinned: str,
              done: asyncio.Future[Message | None]) -> Planned:
    """Rule 6: a verb's `plan` on `name`, run only while the service may be changed (rule
    4): its change, then its answer and the broker's next pass; or only its answer."""
    refused = refusal(view.state, name, pinned)
    planned, reply = (None, refused) if refused is not None else plan(view)
    if planned is None:
        return Planned.only(Answer(done, reply))
    planned.effects += [Answer(done, reply), Wake()]
    return planned


def _same(a: Spec, b: Spec) -> bool:
    """The same version: equal but for the count (a count alone is a scale, not a deploy).
    `a` takes `b`'s count, which its kind admits (a system job's count is always 1: a count
    of 0 is refused by the spec's own check)."""
    return msgspec.structs.replace(a, count=b.count) == b


def _back(svc: ServiceRecord) -> int:
    """Where `rollback` goes unless told (rule 3): the last healthy version while the service
    runs another one; on its healthy version, the version that was healthy most recently
    before it; 0 for none. Never the version a rollback (an automatic revert) left: that is
    the broken one. A record written before versions kept when they were healthy goes to the
    version its last deploy came from, unless that deploy was such a revert."""
    if svc.healthy_version and svc.healthy_version != svc.version:
        return svc.healthy_version
    before = sorted((v.healthy_at, v.version) for v in svc.versions
                    if v.healthy_at and v.version != svc.version)
    if before:
        return before[-1][1]
    dep = svc.deployment
    if dep is None or dep.to_version != svc.version or dep.reason == Reason.ROLLED_BACK:
        return 0
    return dep.from_version


def _unknown(name: str) -> ApiError:
    return ApiError(error=f"{Reason.UNKNOWN_SERVICE}: {name}")
