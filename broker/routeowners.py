"""Who owns each route now, read from the state repository: the claims
`gavel.shared.routeclaims.conflict` checks a submission or a deploy against.

Rules:
1. A service owns the routes of the version it runs (stopped or not: `gavel stop` keeps the
   record, and a deploy starts it again); a job's spec name owns the routes of its live
   instances (placed or waiting), and so does a service whose replica of an older version
   still runs. Services come first, by name, then instances by id (`routeclaims` rule 4).
2. The API refuses a claim against the state it reads (`refusal`); a deploy checks again in
   its commit's plan, against the state as that commit changes it (`refusal_in`), so two
   deploys racing for one route cannot both land.
"""

from __future__ import annotations

import itertools
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
    out: list[tuple[str, Route]] = []
    for svc in sorted(services, key=lambda s: s.name):
        spec = svc.spec_of(svc.version)
        out += [(svc.name, r) for r in (spec.routes if spec else [])]
    for _, rec in sorted(instances, key=lambda pair: pair[0]):
        out += [(rec.service or rec.spec.name, r) for r in rec.spec.routes]
    return out


def claims(state: State) -> list[tuple[str, Route]]:
    """Rule 1, of `state`."""
    routed = [(iid, rec) for iid in itertools.chain(state.where, state.pending)
              if (rec := state.instances.get(iid)) is not None and rec.spec.routes]
    return _claims(state.services.values(), routed)


def _view_claims(view: View) -> list[tuple[str, Route]]:
    """Rule 1, of the state as `view`'s change leaves it."""
    state, change = view.state, view.change
    names = set(state.services) | set(change.services)
    services = [s for n in names if (s := view.service(n)) is not None]
    routed = [(iid, rec) for iid in itertools.chain(state.where, state.pending)
              if (rec := view.instance(iid)) is not None and rec.spec.routes
              and not rec.state.terminal]
    routed += [(iid, rec) for iid, rec in change.instances.items()
               if iid not in state.instances and rec is not None and rec.spec.routes
               and not rec.state.terminal]
    return _claims(services, routed)


def _sentence(owners: list[tuple[str, Route]], spec: Spec) -> str:
    why = conflict(owners, spec.name, spec.routes)
    return f"{Reason.ROUTE_OWNED}: {why}" if why else ""


def refusal(state: State, spec: Spec) -> str:
    """The sentence refusing `spec` for a route another workload owns ("" when none)."""
    return _sentence(claims(state), spec) if spec.routes else ""


def refusal_in(view: View, spec: Spec) -> str:
    """`refusal` against the state as `view` changes it (rule 2)."""
    return _sentence(_view_claims(view), spec) if spec.routes else ""
