"""Every clock gavel keeps, in one struct.

Rules:
1. No module picks its own timeout, nor a floor or cap around one (`answer_within`); it
   takes a `Timing` (or, where it is built without one, defaults to `Timing()`'s value).
   ``GAVEL_FAST_TIMERS=1`` divides every clock of the protocol by ten so tests and demos
   run the same code at ten times the speed (`tests/unit/test_timeouts.py` finds a module
   that sets its own).
2. Every clock is a finite number of seconds above zero (`retention_s` may be 0: keep ended
   instances for ever), and a node is heard from before it counts as unreachable, and is
   unreachable before it is offline: heartbeat_s < unreachable_s <= offline_s. Decoding
   refuses a value at or below zero; `problem` names the rest in one sentence.
3. The machine's waits (`MACHINE`: how long an answer from another process, a git push,
   a part's shutdown or a child's start may take before it counts as failed, and how often
   a wait on another process looks again; the operator's commands, `gavel up` and the
   dashboard wait on the cluster, on Caddy and on Docker so) are not shrunk by fast timers:
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
                     "jetstream_s", "connect_s", "lapse_s", "stale_lock_s", "orphan_s",
                     "engine_call_s", "engine_ask_s", "confine_s", "scrape_s", "explain_s",
                     "follow_s", "goodbye_s", "wait_s", "failover_s", "watch_s", "glance_s",
                     "ask_pause_s", "up_s", "respawn_s", "stop_grace_s", "refresh_s",
                     "settle_s", "head_s", "keepalive_s", "caddy_s", "caddy_ask_s",
                     "caddy_start_s", "reconnect_s", "demo_s", "demo_pause_s",
                     "answer_least_s", "landed_least_s", "put_least_s", "retake_s",
                     "fetch_least_s", "logs_look_s", "exec_look_s", "loops_close_s",
                     "endpoints_least_s"})


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
    #: The longest pause of a retry that backs off from `retry_s`, doubling: a push to the
    #: state remote that keeps failing.
    retry_max_s: Seconds = 60.0
    #: The longest pause before a lease's bucket or watch that could not be made is tried
    #: again (`renew_s` if shorter).
    rewatch_s: Seconds = 1.0
    #: How long the nats-server keeps a lease watch's consumer that nobody listens to (its
    #: broker gone, or reconnecting) before it deletes it (ten lease TTLs if longer).
    idle_watch_s: Seconds = 60.0
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
    #: How long a broker built without a NATS server to hand keeps trying its first
    #: connection before it gives up (`broker.config.Config.first_connect_s`; the daemon waits
    #: for ever).
    connect_s: Seconds = 30.0
    #: How long past the moment a leader's lease should have lapsed a standby keeps trying to
    #: take it closely: the nats-server expires the key a moment after the standby's guess.
    lapse_s: Seconds = 2.0
    #: How long a lock file of the state repository must stay unchanged at a broker's start
    #: to count as a dead writer's (git's pace of one write).
    stale_lock_s: Seconds = 1.0
    #: How often the git writer process looks whether the broker that started it is there.
    orphan_s: Seconds = 1.0
    #: A call through the Docker SDK (create, start, stop, exec, inspect, a pull's read)
    #: unanswered this long has failed.
    engine_call_s: Seconds = 60.0
    #: One short question to the Docker Engine API (its version, its images) unanswered this
    #: long has failed.
    engine_ask_s: Seconds = 10.0
    #: How long the worker's one try at start whether a child can be confined (its own uid,
    #: a private /tmp) may take.
    confine_s: Seconds = 30.0
    #: How long a metrics scrape of the worker waits for its event loop to read the numbers.
    scrape_s: Seconds = 10.0
    #: How long a failed HTTP check reads the body that says why, past the check's own
    #: timeout (the spec's).
    explain_s: Seconds = 0.5
    #: How often a follower of events looks again when its doorbell is silent: a follower of
    #: the event history for the next stored event, a wait for an instance's start for its
    #: status.
    follow_s: Seconds = 1.0
    #: The least a question to another process waits for its answer where a protocol clock
    #: bounds it (`answer_within`: a heartbeat, a lease's renewal): a fast clock does not
    #: make a loaded machine answer sooner.
    answer_least_s: Seconds = 1.0
    #: The least a leader waits for the lease's last message when it checks whether a put of
    #: its own that was refused had landed (`renew_s` if longer).
    landed_least_s: Seconds = 0.5
    #: The least a lease renewal sent just before the lease runs out by the leader's clock
    #: waits for its answer: it may still land.
    put_least_s: Seconds = 0.1
    #: How often a standby tries to take the lease while it should just have lapsed or was
    #: just let go (`lapse_s`): the server refuses each try until the key is gone.
    retake_s: Seconds = 0.1
    #: The least pause between a standby's fetches of the state remote (`renew_s` if
    #: longer): each is a git process.
    fetch_least_s: Seconds = 1.0
    #: How often a follow of an instance's logs looks at its files again (a tick if
    #: shorter), and how often an exec session looks at its command and its limits.
    logs_look_s: Seconds = 0.25
    exec_look_s: Seconds = 0.2
    #: How long a worker's loops get to end once told to stop (a tick if longer); a loop
    #: stuck past it is logged, not waited for.
    loops_close_s: Seconds = 5.0
    #: The least the gateway waits for the broker's endpoints each step (its `ASK_TICKS`
    #: ticks if longer).
    endpoints_least_s: Seconds = 2.0
    #: How long an operator's command that is told to stop (Ctrl-C) may take to tell its
    #: peer before it goes anyway: an exec session's hangup.
    goodbye_s: Seconds = 1.0
    # -- the operator's commands and the programs beside the cluster (rule 3) -------------
    #: How long a client's wait (an instance's end, a system job running, a count of healthy
    #: nodes) waits unless its caller gives its own.
    wait_s: Seconds = 30.0
    #: The pause of an operator's request while no broker answers (one starting, or one
    #: taking over) before it asks again (`client.aio` rule 2).
    failover_s: Seconds = 1.0
    #: How often a wait looks again at another process's state besides what it hears: a
    #: wait for a job's end, `gavel up` at its children.
    watch_s: Seconds = 0.5
    #: How long a request whose answer is shown at once (the dashboard's, `gavel up`'s line
    #: of who leads) waits for the broker's answer.
    glance_s: Seconds = 5.0
    #: The pause between the questions (`ask_s`) of a wait for a process to be up:
    #: `gavel up`'s broker with its workers, the route through its demo's gateway.
    ask_pause_s: Seconds = 0.2
    #: How long `gavel up` waits for its cluster to answer with every worker healthy.
    up_s: Seconds = 60.0
    #: How long `gavel up --restart-workers` waits before it starts an exited worker again.
    respawn_s: Seconds = 1.0
    #: How long `gavel up` gives its children, and the instances its workers left, to stop
    #: once told to before it kills them.
    stop_grace_s: Seconds = 15.0
    #: How often the dashboard asks the broker for its overview again (heartbeats change
    #: loads without an event).
    refresh_s: Seconds = 2.0
    #: How long the dashboard waits after an event before it asks again, so a burst of events
    #: is one refresh.
    settle_s: Seconds = 0.1
    #: How long the dashboard's and the HTTP API's server wait for a request's head and its
    #: body before they drop the connection.
    head_s: Seconds = 10.0
    #: How often an HTTP event stream (the dashboard's, the API's) says something while
    #: nothing happens, so a proxy keeps it open.
    keepalive_s: Seconds = 15.0
    #: A request to Caddy's admin API unanswered this long has failed; while Caddy starts,
    #: it is asked with `caddy_ask_s` instead, and may take `caddy_start_s` to answer.
    caddy_s: Seconds = 5.0
    caddy_ask_s: Seconds = 0.5
    caddy_start_s: Seconds = 15.0
    #: How long a gateway started before NATS waits before it tries to connect again.
    reconnect_s: Seconds = 1.0
    #: How long `gavel up --demo` waits for what it shows: its workloads placed, the route
    #: through its gateway.
    demo_s: Seconds = 20.0
    #: How long `gavel up --demo` gives its workloads to run and report before it shows what
    #: the workers reported.
    demo_pause_s: Seconds = 2.5

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

    def answer_within(self, pace_s: float) -> float:
        """How long a question to another process paced by the clock `pace_s` waits for its
        answer: that clock, or `answer_least_s` if longer (rule 3)."""
        return max(self.answer_least_s, pace_s)

    @property
    def heartbeat_answer_s(self) -> float:
        """How long a question a heartbeat paces (a watch of a node's key, an assignment, the
        subscription barrier) waits for its answer: `answer_within` a heartbeat."""
        return self.answer_within(self.heartbeat_s)

    @property
    def link_s(self) -> float:
        """How long a worker's look at its link to NATS (a flush, every half heartbeat) waits
        for the server's answer: the half heartbeat and `answer_least_s` beside it."""
        return self.heartbeat_s / 2 + self.answer_least_s

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
