"""Every clock gavel keeps, in one struct.

Rule: no module picks its own timeout; it takes a `Timing`. ``GAVEL_FAST_TIMERS=1`` divides
every value by ten so tests and demos run the same code at ten times the speed.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

__all__ = ["FAST_FACTOR", "Timing"]

FAST_FACTOR = 10.0


class Timing(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    heartbeat_s: float = 10.0
    unreachable_s: float = 30.0
    offline_s: float = 120.0
    provisioning_s: float = 15.0
    bid_deadline_s: float = 2.0
    lease_grace_s: float = 30.0
    cancel_grace_s: float = 60.0
    kill_grace_s: float = 30.0
    tick_s: float = 1.0

    def scaled(self, factor: float) -> Timing:
        """Every interval divided by `factor`."""
        fields = {f: getattr(self, f) / factor for f in self.__struct_fields__}
        return Timing(**fields)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Timing:
        """Defaults, shrunk tenfold when ``GAVEL_FAST_TIMERS=1`` is set in `env`."""
        base = cls()
        flag = env.get("GAVEL_FAST_TIMERS", "").strip().lower()
        if flag in ("1", "true", "yes", "on"):
            return base.scaled(FAST_FACTOR)
        return base
