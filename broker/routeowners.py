"""Who owns each route now, read from the state repository: the claims
`gavel.shared.routeclaims.conflict` checks a submission or a deploy against.

Rules:
1. A service owns the routes of the version it runs (stopped or not: `gavel stop` keeps the
   record, and a deploy starts it again) and, while a deployment is recorded, of the
   version it rolls from (whose replicas may still run); a job's spec name owns the routes
   of its live instances (placed or waiting). Services come first, by name, then jobs by
   their lowest instance id (`routeclaims` rule 4).
2. The API refuses a claim against the state it reads (`refusal`); a deploy or a submit
   checks again in its commit's plan, against the state as that commit changes it
   (`refusal_in`), so two deploys or submits racing for one route cannot both land.
3. Each (owner, route) is one claim however many instances make it, and the claims of a
   state are read once per commit (its `head`): a submit with routes scans the live
   instances only after the state changed, never on every call.
"""

from __future__ import annotations

from collections.abc import Iterable

from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import State
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, ServiceRecord
from gavel.shared.routeclaims import conflict
from gavel.shared.spec import Route, Spec

__all__ = ["claims", "refusal", "refusal_in"]


def _claims(services: Iterable[ServiceRecord],
            instances: Iterable[tuple[str, InstanceRecord]]) -> list[tuple[str, Route]]:
    out: dict[tuple[str, Route], None] = {}  # rule 3: an ordered set
    for svc in sorted(services, key=lambda s: s.name):
        was = svc.deployment.from_version if svc.deployment is not None else 0
        for v in (svc.version, was):
            spec = svc.spec_of(v) if v else None
            out.update(((svc.name, r), None) for r in (spec.routes if spec else []))
    # The instances of one submission share one Spec: each spec read once, with the lowest
    # id of its instances.
    specs: dict[int, tuple[str, Spec]] = {}
    for iid, rec in instances:
        seen = specs.get(id(rec.spec))
        if seen is None or iid < seen[0]:
            specs[id(rec.spec)] = (iid, rec.spec)
    first: dict[tuple[str, Route], str] = {}  # each claim, by the lowest id making it
    for iid, spec in specs.values():
        for r in spec.routes:
            claim = (spec.name, r)
            if claim not in first or iid < first[claim]:
                first[claim] = iid
    out.update((claim, None) for claim in sorted(first, key=first.__getitem__))
    return list(out)


def _job_claim(rec: InstanceRecord) -> bool:
    """A job's live instance with routes: every record not ended is live, placed or pending
    (`State`'s rule); a replica's routes are its service's claims."""
    return not rec.service and bool(rec.spec.routes) and not rec.state.terminal


#: The claims of the last state read, with that state and its head (rule 3). The state
#: itself, not its id(): a freed state's id is given to the next one made.
_last: tuple[State, str, list[tuple[str, Route]]] | None = None


def claims(state: State) -> list[tuple[str, Route]]:
    """Rule 1, of `state` (rule 3: once per head)."""
    global _last
    if _last is not None and state.head is not None and _last[0] is state \
            and _last[1] == state.head:
        return _last[2]
    jobs = [(rec.instance_id, rec) for rec in state.instances.values() if _job_claim(rec)]
    got = _claims(state.services.values(), jobs)
    if state.head is not None:
        _last = (state, state.head, got)
    return got


def _view_claims(view: View) -> list[tuple[str, Route]]:
    """Rule 1, of the state as `view`'s change leaves it."""
    state, change = view.state, view.change
    names = set(state.services) | set(change.services)
    services = [s for n in names if (s := view.service(n)) is not None]
    jobs = {rec.instance_id: rec for rec in state.instances.values() if _job_claim(rec)}
    for iid, rec in change.instances.items():  # the change overrides the state's records
        jobs.pop(iid, None)
        if rec is not None and _job_claim(rec):
            jobs[iid] = rec
    return _claims(services, list(jobs.items()))


def _sentence(owners: list[tuple[str, Route]], spec: Spec) -> str:
    why = conflict(owners, spec.name, spec.routes)
    return f"{Reason.ROUTE_OWNED}: {why}" if why else ""


def refusal(state: State, spec: Spec) -> str:
    """The sentence refusing `spec` for a route another workload owns ("" when none)."""
    return _sentence(claims(state), spec) if spec.routes else ""


def refusal_in(view: View, spec: Spec) -> str:
    """`refusal` against the state as `view` changes it (rule 2)."""
    return _sentence(_view_claims(view), spec) if spec.routes else ""
