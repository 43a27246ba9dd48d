"""The fixed sentences an operator reads.

Rule: every reason a node, the broker or the CLI shows is a member of `Reason`; the value is
the sentence. Details (which label, how much cpu) travel beside the reason, never inside it,
so reasons aggregate cleanly: ``0/5 nodes bid: 3 no room for cpu, 2 draining``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import StrEnum

__all__ = ["DECLINES", "Reason", "preempted_by", "render", "summarize_declines"]


class Reason(StrEnum):
    # Declines a worker gives in answer to an RFB.
    NO_ROOM_CPU = "no room for cpu"
    NO_ROOM_MEMORY = "no room for memory"
    NO_ROOM_PORTS = "no free ports"
    MISSING_LABEL = "missing label"
    DRAINING = "draining"
    OVER_CEILING = "utilisation above ceiling"
    NO_ENGINE = "no container engine on this node"
    MISSING_VOLUME = "missing host volume"
    # Why an instance is queued or unschedulable.
    NO_NODES = "no nodes connected"
    NO_BIDS = "no node answered before the bid deadline"
    ALL_FULL = "all nodes full"
    NEVER_FITS = "no node could ever offer the requested resources"
    # Why an instance failed, was lost or was re-placed.
    NOT_ACCEPTED = "node did not accept assignment"
    TIMEOUT = "timeout"
    NO_LEASE = "lease expired: node offline"
    ATTEMPTS_EXHAUSTED = "attempts exhausted"
    DRIVER_FAILED = "driver failed to start"
    EXITED_NONZERO = "process exited with a non-zero status"
    #: Why a process restarted in place that ended with status 0 (a service's must not).
    EXITED_ZERO = "process exited"
    CANCELLED = "cancelled by operator"
    CANCEL_UNANSWERED = "node did not confirm cancel within the grace period"
    MIGRATED = "moved off a draining node"
    #: Stopped to make room for higher-priority work (`gavel.shared.preemption`); the detail
    #: names it: ``preempted by web-3 (priority 80)``.
    PREEMPTED = "preempted by higher-priority work"
    PORT_TAKEN = "port taken by a process outside gavel"
    WORKER_STOPPED = "stopped: the worker shut down"
    FENCED = "instance was moved to another node while this node was offline"
    RESTARTS_EXHAUSTED = "restarted on its node as often as its restart policy allows"
    MEMORY_EXCEEDED = "exceeded its memory reservation"
    UNHEALTHY = "health check failing"
    ESCAPED_CGROUP = "a process of the instance was found outside its cgroup: killed"
    ROOT_REFUSED = "the spec asks to run as root and this node does not allow it"
    # Why `status` cannot say how an instance is.
    NODE_NOT_HEARD = "its node is not heard from: what runs there is unknown"
    # Why a service's replica stopped or was replaced.
    SCALED_DOWN = "stopped: the service was scaled down"
    #: A system job's instance whose node left the job's nodes: it is not placed elsewhere.
    SYSTEM_NODE_LEFT = "stopped: its node is drained, offline or no longer matches"
    #: A batch array's task waiting for one of its array's `parallelism` slots.
    ARRAY_HELD = "waiting for a slot of its array's parallelism"
    #: A batch array's held task, never run: more tasks failed than `max_failures` allows.
    ARRAY_FAILED = "cancelled: the array's failure budget is spent"
    #: A batch array ended with tasks that did not succeed.
    ARRAY_TASKS_FAILED = "tasks of the array did not succeed"
    SERVICE_STOPPED = "stopped: the service was stopped"
    # A periodic job's fire time that made no run (`gavel.shared.periodic` rules 3-5).
    PERIODIC_OVERLAP = "skipped: the previous run is still running (overlap = \"skip\")"
    PERIODIC_MISSED = "missed while no broker led: only the latest missed run is made"
    PERIODIC_STOPPED = "cancelled: the periodic job was cancelled"
    NAME_TAKEN = "a workload of another kind already has that name"
    SUPERSEDED = "stopped: replaced by a replica of another version"
    #: A replica a re-auction moved (`shared.reauction`): its new copy is healthy elsewhere.
    REBALANCED = "stopped: moved by a re-auction to a node that bid better"
    #: A re-auction's new copy that did not become healthy in time: the old one stays.
    MOVE_ABANDONED = "stopped: the re-auction's new copy was not healthy in time"
    SPREAD = "no node that bid keeps the service spread over its label"
    DEPLOY_UNHEALTHY = "a new replica was not healthy within the deploy's deadline"
    ROLLED_BACK = "rolled back to the last version that was healthy"
    UNKNOWN_SERVICE = "no such service"
    NOT_A_SERVICE = "the spec is a job, not a service"
    ROUTE_OWNED = "a route of the spec overlaps a route another workload owns"
    #: A warning, not a refusal: the affinity prefers nothing until a node carries its label.
    AFFINITY_UNMATCHED = "no node carries the label an affinity names"
    #: `gavel deploy --check-index N`: the service changed since `gavel plan` printed N.
    STALE_INDEX = "the service changed since the plan: plan again"
    # Errors the broker reports.
    PINNED = "deployment is pinned: the active ref is a tag or a commit, nothing was written"
    LEDGER_UNWRITABLE = "state repository is locked or unwritable; will retry"
    UNKNOWN_INSTANCE = "no such instance"
    UNKNOWN_NODE = "no such node"
    BAD_SPEC = "the spec is invalid"
    DUPLICATE = "an instance with that id already exists"
    KEY_REUSED = "that submission key was already used for a different submission"
    UNREADABLE_FILE = "a file in the state repository is not a usable gavel file; fix it in git"
    # Admission (`shared.admission`): a count beyond what the operator allows.
    OVER_SERVICE_CAP = "more replicas than the broker admits for one service"
    OVER_CLUSTER_CAP = "more live instances than the broker admits in the cluster"
    # Why the broker made no KV watch for a node (`broker.watches`).
    WATCH_DELIVER = "a node's watch delivers only into that node's own inbox"
    WATCH_NAME = "a node's watch is named after that node and 16 hex digits"
    WATCH_TOO_SOON = "a new watch was asked for too soon after the last one; ask again later"
    WATCH_FAILED = "JetStream did not make the watch; ask again later"
    # Housekeeping the broker commits.
    RETAINED = "ended longer ago than the retention time; git history keeps the record"
    RETAINED_MAX = "more ended instances than the broker keeps; git history keeps the record"


#: The reasons a node may give when it declines an RFB; anything else on the wire is rejected.
DECLINES = frozenset(
    {
        Reason.NO_ROOM_CPU,
        Reason.NO_ROOM_MEMORY,
        Reason.NO_ROOM_PORTS,
        Reason.MISSING_LABEL,
        Reason.DRAINING,
        Reason.OVER_CEILING,
        Reason.NO_ENGINE,
        Reason.MISSING_VOLUME,
        Reason.ROOT_REFUSED,
    }
)

_TEMPLATES: dict[str, str] = {
    Reason.NO_ROOM_CPU: "no room for {detail} cpu",
    Reason.NO_ROOM_MEMORY: "no room for {detail} MB memory",
    Reason.MISSING_LABEL: "missing label {detail}",
    Reason.MISSING_VOLUME: "missing host volume {detail}",
    Reason.OVER_CEILING: "utilisation above ceiling {detail}",
    Reason.PREEMPTED: "preempted by {detail}",
}


def preempted_by(instance_id: str, priority: int) -> str:
    """The detail of `Reason.PREEMPTED`: ``render`` makes it ``preempted by <instance>
    (priority N)``."""
    return f"{instance_id} (priority {priority})"


def render(reason: str, detail: str = "") -> str:
    """The reason with its detail folded in: ``no room for 2.0 cpu``, ``missing label a=b``."""
    if not detail:
        return reason
    template = _TEMPLATES.get(reason)
    return template.format(detail=detail) if template else f"{reason} ({detail})"


def summarize_declines(total_nodes: int, bids: int, reasons: Iterable[str]) -> str:
    """kube-scheduler style: ``0/5 nodes bid: 3 no room for cpu, 2 missing label region=eu``.

    `reasons` holds one rendered reason per declining or silent node; equal ones are counted,
    the most frequent first, ties in alphabetical order so the sentence is deterministic.
    """
    counts = Counter(reasons)
    parts = [f"{n} {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    head = f"{bids}/{total_nodes} nodes bid"
    return f"{head}: {', '.join(parts)}" if parts else head
