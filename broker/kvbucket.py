"""Making the KV mirror's bucket (`broker.mirror`) as a broker or a leadership starts.

Rules (`transport.asklater`'s, which decides and loops, applied to the bucket):
1. JetStream that is off (nobody answers its API) is final: the broker runs without the
   mirror and workers converge from awards alone. So is a bucket that exists with other
   settings, except for a leadership of several brokers, which uses it as it is (the
   bucket is shared by every leadership).
2. JetStream that is there but cannot answer yet - "temporarily unavailable" while its
   meta leader is elected (after a server restart, or a partition's heal), or no answer in
   time - is asked again every `retry_s` until it answers. Giving up there would leave the
   whole run (a leadership's whole term) without a mirror: its workers would keep what an
   earlier broker put, and miss every award they did not hear.
3. With several brokers (`ha`) JetStream is known to be on (the lease lives there), so
   every failure but rule 1's other settings is rule 2's.
"""

from __future__ import annotations

import logging
from typing import Any

from gavel.shared import subjects
from gavel.transport.asklater import Made, again, verdict, why

__all__ = ["Made", "make_bucket", "until_made"]


async def make_bucket(nc: Any, replicas: int, ha: bool, log: logging.Logger
                      ) -> tuple[Made, str]:
    """One attempt: the verdict and, unless made, why."""
    try:
        await nc.jetstream().create_key_value(bucket=subjects.NODES_BUCKET, history=1,
                                              replicas=replicas)
    except Exception as exc:
        reason = why(exc)
        if "already in use" in reason:
            if not ha:
                return Made.NEVER, reason
            log.warning("the KV bucket %s exists with other settings than %d replicas (%s); "
                        "using it as it is", subjects.NODES_BUCKET, replicas, reason)
            return Made.MADE, ""
        return verdict(exc, ha), reason
    return Made.MADE, ""


async def until_made(nc: Any, replicas: int, ha: bool, log: logging.Logger,
                     retry_s: float) -> bool:
    """Rule 2's loop: True once made, False if rule 1 ends it."""
    made, reason = await again(lambda: make_bucket(nc, replicas, ha, log), retry_s)
    if made:
        log.info("the KV bucket %s is made now", subjects.NODES_BUCKET)
    else:
        log.warning("no JetStream KV (%s); workers converge from awards only", reason)
    return made
