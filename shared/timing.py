"""Every clock gavel keeps, in one struct.

Rules:
1. No module picks its own timeout; it takes a `Timing` (or, where it is built without one,
   defaults to `Timing()`'s value). ``GAVEL_FAST_TIMERS=1`` divides every clock of the
   protocol by ten so tests and demos run the same code at ten times the speed
   (`tests/unit/test_timeouts.py` finds a module that sets its own).
2. Every clock is a finite number of seconds above zero (`retention_s` may be 0: keep ended
   instances for ever), and a node is heard from before it counts as unreachable, and is
   unreachable before it is offline: heartbeat_s < unreachable_s <= offline_s. Decoding
   refuses a value at or below zero; `problem` names the rest in one sentence.
3. The machine's waits (`MACHINE`: how long an answer from another process, a git push,
   a part's shutdown or a child's start may take before it counts as failed, and how often
   a wait on another process looks again) are not shrunk by fast timers:
   they measure the machine, not the protocol, and a loaded machine answers no faster
   because the protocol's clocks run ten times faster; shrunk, they would only fail what
   works.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated

import msgspec

__all__ = ["FAST_FACTOR", "MACHINE", "Timing", "fast_banner"]

FAST_FACTOR = 10.0

Seconds = Annotated[float, msgspec.Meta(gt=0)]

#: Rule 3: the fields fast timers leave as they are.
MACHINE = frozenset({"call_s", "ack_s", "push_s", "close_s", "flush_s", "answer_s",
                     "node_answer_s", "interest_s", "ask_s", "poll_s", "poll_max_s", "start_s",
                     "jetstream_s"})


class Timing(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    heartbeat_s: Seconds = 10.0
    unreachable_s: Seconds = 30.0
    offline_s: Seconds = 120.0
    provisioning_s: Seconds = 15.0
    bid_deadline_s: Seconds = 2.0
    lease_grace_s: Seconds = 30.0
    cancel_grace_s: Seconds = 60.0
    kill_grace_s: Seconds = 30.0
    tick_s: Seconds = 1.0
    #: How long the KV mirror of node.json may lag its commit: a node's node.json is put at
    #: most once in this window, the newest (`broker.mirror`). A tick, the grain workers
    #: converge at anyway (a node waits a tick for the award message before fetching).
    mirror_s: Seconds = 1.0
    #: How long the record of an ended instance (succeeded, failed, lost, cancelled) stays
    #: in the state repository after it ended; git history keeps it after that. 0: for ever.
    retention_s: Annotated[float, msgspec.Meta(ge=0)] = 86_400.0
    #: How long a part waits before trying again what failed for now: a first connection
    #: to NATS, storing an event, a checked KV put.
    retry_s: Seconds = 0.5
    # -- the machine's waits (rule 3) ---------------------------------------------------
    #: A JetStream API call (make a stream or a consumer, a pull) or the subscription
    #: barrier unanswered this long has failed.
    call_s: Seconds = 5.0
    #: A store unacknowledged this long has failed: an event into the event history, a
    #: checked KV put, a lease put or its release.
    ack_s: Seconds = 2.0
    #: One `git push` to the state remote taking longer than this has failed.
    push_s: Seconds = 60.0
    #: How long the broker's `close` waits for each of its steps, and a worker's parts for
    #: their tasks once told to stop; a part stuck past it is logged, not waited for.
    close_s: Seconds = 10.0
    #: How long the commits in hand get to reach the remote when a broker stops cleanly.
    flush_s: Seconds = 5.0
    #: How long an operator's request waits for the broker's answer, unless its command
    #: gives its own (`transport.client.call`).
    answer_s: Seconds = 10.0
    #: How long an operator's request to a node (an instance's logs, the start of an exec
    #: session) waits for the node's first answer before the node counts as unreachable.
    node_answer_s: Seconds = 5.0
    #: How long a request NATS delivered to nobody is asked again, backing off: long enough
    #: for a new subscription's interest to cross a cluster's routes (a broker that just
    #: started or took over), short enough that a cluster with no broker is told so promptly.
    interest_s: Seconds = 2.0
    #: One question to a process that answers at once when it is up, asked again and again
    #: while waiting for it (the broker's count of healthy nodes, a nats-server's port or
    #: its JetStream): unanswered this long, it is asked again.
    ask_s: Seconds = 2.0
    #: The first pause before looking again at what another process does (a request nobody
    #: took yet, a refusal of the server's, a child that is not listening yet); a pause that
    #: backs off doubles, up to `poll_max_s`.
    poll_s: Seconds = 0.05
    poll_max_s: Seconds = 0.5
    #: How long a nats-server child (`gavel up`, dev, tests) may take to listen.
    start_s: Seconds = 10.0
    #: How long a cluster of nats-servers may take until JetStream answers (its leader
    #: elected).
    jetstream_s: Seconds = 30.0

    def problem(self) -> str | None:
        """What makes these clocks unusable, as a sentence naming the field; None if none."""
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (value == 0 and name != "retention_s"):
                least = "0 or more" if name == "retention_s" else "above 0"
                return f"field `timing.{name}` expected a finite number of seconds {least}, " \
                       f"got {value}."
        if not self.heartbeat_s < self.unreachable_s <= self.offline_s:
            return ("fields `timing.heartbeat_s` < `timing.unreachable_s` <= "
                    "`timing.offline_s` expected (a node is heard from before it counts as "
                    "unreachable, and unreachable before offline), got "
                    f"{self.heartbeat_s}, {self.unreachable_s}, {self.offline_s}.")
        return None

    def scaled(self, factor: float) -> Timing:
        """Every clock of the protocol divided by `factor`; the machine's waits kept."""
        fields = {f: getattr(self, f) / (1.0 if f in MACHINE else factor)
                  for f in self.__struct_fields__}
        return Timing(**fields)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Timing:
        """Defaults, shrunk tenfold when ``GAVEL_FAST_TIMERS=1`` is set in `env`."""
        base = cls()
        flag = env.get("GAVEL_FAST_TIMERS", "").strip().lower()
        if flag in ("1", "true", "yes", "on"):
            return base.scaled(FAST_FACTOR)
        return base


def fast_banner(env: Mapping[str, str]) -> str:
    """The line a cluster started under ``GAVEL_FAST_TIMERS`` prints, so nobody takes its
    clocks for production's (`make run` sets it); "" under production timers."""
    fast = Timing.from_env(env)
    if fast == Timing():
        return ""
    return (f"timers: fast, every clock {FAST_FACTOR:g}x shorter than production "
            f"(GAVEL_FAST_TIMERS=1: heartbeat {fast.heartbeat_s:g}s, node offline after "
            f"{fast.offline_s:g}s); unset it for production timers")
