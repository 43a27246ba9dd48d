"""Who owns each route now, read from the state repository: the claims
`gavel.shared.routeclaims.conflict` checks a submission or a deploy against.

Rule: a service owns the routes of the version it runs (stopped or not: `gavel stop` keeps
the record, and a deploy starts it again), and of every version a live replica still runs;
a job's spec name owns the routes of its live instances (placed or waiting). Services come
first, by name, then jobs by instance id (`routeclaims` rule 4).
"""

from __future__ import annotations

import itertools

from gavel.broker.ledger.state import State
from gavel.shared.reasons import Reason
from gavel.shared.routeclaims import conflict
from gavel.shared.spec import Route, Spec

__all__ = ["claims", "refusal"]


def claims(state: State) -> list[tuple[str, Route]]:
    out: list[tuple[str, Route]] = []
    for name in sorted(state.services):
        spec = state.services[name].spec_of(state.services[name].version)
        out += [(name, r) for r in (spec.routes if spec else [])]
    routed = [(iid, rec) for iid in itertools.chain(state.where, state.pending)
              if (rec := state.instances.get(iid)) is not None and rec.spec.routes]
    for _, rec in sorted(routed, key=lambda pair: pair[0]):
        out += [(rec.service or rec.spec.name, r) for r in rec.spec.routes]
    return out


def refusal(state: State, spec: Spec) -> str:
    """The sentence refusing `spec` for a route another workload owns ("" when none)."""
    if not spec.routes:
        return ""
    why = conflict(claims(state), spec.name, spec.routes)
    return f"{Reason.ROUTE_OWNED}: {why}" if why else ""
