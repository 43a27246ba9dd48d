"""Admission: how many instances the broker accepts, per service and in the whole cluster.

Rules:
1. Two operator-set caps (`Caps`): the replicas one service may ask for, and the live (not
   ended) instances the cluster may hold. A submit, deploy or scale beyond either is refused
   whole, with one sentence naming the cap, what was asked and the flag that raises it;
   nothing of it is written.
2. A service's own live replicas are replaced, not added, by its deploy or scale: the
   cluster count is the live instances of everything else plus what the service asks.
3. A cap of 0 is no cap.
4. Instances the broker makes on its own (a periodic job's run, a system job's instance on a
   node) are admitted one by one against the cluster cap, in the same words: one that would
   pass it is not made (`room`), and waits, or is skipped, as its kind says.
"""

from __future__ import annotations

from typing import NamedTuple

from gavel.shared.reasons import Reason

__all__ = ["DEFAULT_CAPS", "Caps", "refusal", "room"]


class Caps(NamedTuple):
    #: Replicas one service may ask for (its count).
    per_service: int
    #: Live instances in the whole cluster.
    instances: int


#: Enough for the bench's runs and ten thousand replicas of one service; an operator who
#: wants more raises them (`--max-service-count`, `--max-instances`).
DEFAULT_CAPS = Caps(per_service=10_000, instances=50_000)


def refusal(caps: Caps, *, live: int, adding: int, service_count: int | None = None) -> str:
    """Why `adding` more live instances (a service asking `service_count` replicas, its
    own live ones already taken out of `live`) are refused; "" when they are admitted."""
    if service_count is not None and 0 < caps.per_service < service_count:
        return (f"{Reason.OVER_SERVICE_CAP}: asks {service_count} replicas, the cap is "
                f"{caps.per_service} (the broker's --max-service-count raises it)")
    if 0 < caps.instances < live + adding:
        return (f"{Reason.OVER_CLUSTER_CAP}: {live} live and {adding} more would be "
                f"{live + adding}, the cap is {caps.instances} (the broker's --max-instances "
                "raises it)")
    return ""


def room(caps: Caps, *, live: int) -> int | None:
    """How many more live instances the cluster cap admits beside `live` (rule 4); None
    when there is no cap."""
    return max(0, caps.instances - live) if caps.instances > 0 else None
