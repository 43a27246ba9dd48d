"""Admission at the broker: the operator's caps (`gavel.shared.admission`) held against the
live instances git holds now, or a plan's view leaves (`live_instances`)."""

from __future__ import annotations

from gavel.broker.context import Context
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import State
from gavel.shared.admission import Caps, refusal
from gavel.shared.messages import ApiError
from gavel.shared.spec import Spec

__all__ = ["Admission", "live_instances"]


class Admission:
    def __init__(self, ctx: Context, caps: Caps) -> None:
        self.ctx = ctx
        self.caps = caps

    def over_cap(self, service: str | None, count: int) -> ApiError | None:
        """Why `count` more live instances, or `service` at `count` replicas (its own live
        ones replaced, `shared.admission` rule 2), are refused; None when admitted."""
        state = self.ctx.ledger.state()
        live = live_instances(state)  # kept by the state: no walk over every record a submit
        if service is not None:
            live -= sum(1 for r in state.replicas_of(service) if not r.state.terminal)
        why = refusal(self.caps, live=live, adding=count,
                      service_count=count if service is not None else None)
        return ApiError(error=why) if why else None

    def submitted(self, spec: Spec, count: int) -> ApiError | None:
        """A submit of `count` instances of `spec`: a service's spec asks its own count."""
        return self.over_cap(spec.name, spec.count) if spec.service else \
            self.over_cap(None, count)


def live_instances(view: View | State) -> int:
    """The live (not ended) instances of `view`: the state's, as this change leaves them."""
    state = view if isinstance(view, State) else view.state
    live = len(state.instances) - len(state.ended)
    if isinstance(view, State):
        return live
    for iid, rec in view.change.instances.items():
        old = state.instances.get(iid)
        live += (rec is not None and not rec.state.terminal) - \
            (old is not None and not old.state.terminal)
    return live
