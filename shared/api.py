"""The request/reply API the CLI speaks to the broker over NATS (``gavel.api.<verb>``).

Rule: one request Struct and one reply Struct per verb; any verb may instead answer
`ApiError` with a sentence. Replies are plain data so ``--json`` prints them as they are.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gavel.shared.ids import (
    INSTANCE_ID,
    INSTANCE_ID_MAX,
    SUBMIT_KEY,
    InstanceId,
    SubmitKey,
    counted_id_problem,
    counted_ids,
    key_problem,
    kind_naming_problem,
)
from gavel.shared.messages import Capacity, Event, HostStats, Message, Spec
from gavel.shared.records import AuctionRecord, Deployment, PeriodicRun
from gavel.shared.retuning import TuneReply, TuneRequest
from gavel.shared.spec import Route

__all__ = [
    "INSTANCE_ID",
    "INSTANCE_ID_MAX",
    "SUBMIT_KEY",
    "ArrayStatus",
    "CancelReply",
    "CancelRequest",
    "DeployReply",
    "DeployRequest",
    "DrainReply",
    "DrainRequest",
    "Endpoint",
    "EndpointsReply",
    "EndpointsRequest",
    "EventsReply",
    "EventsRequest",
    "InstanceStatus",
    "NodeAddress",
    "NodeDetail",
    "NodeStatus",
    "NodesReply",
    "NodesRequest",
    "PeriodicJobsReply",
    "PeriodicJobsRequest",
    "PeriodicStatus",
    "RecentDecline",
    "RollbackRequest",
    "ScaleRequest",
    "ServiceReply",
    "ServiceRequest",
    "ServiceStatus",
    "ServicesReply",
    "ServicesRequest",
    "StatsReply",
    "StatsRequest",
    "StatusReply",
    "StatusRequest",
    "StopServiceRequest",
    "SubmitReply",
    "SubmitRequest",
    "TuneReply",
    "TuneRequest",
    "VersionStatus",
    "WhyReply",
    "WhyRequest",
    "counted_id_problem",
    "counted_ids",
    "key_problem",
    "kind_naming_problem",
]

class SubmitRequest(Message, tag="submit"):
    spec: Spec
    #: Empty: the broker names it. It becomes a NATS subject token and a file name in git.
    instance_id: InstanceId = ""
    #: Submit this many instances of the spec in one commit (ids get a -N suffix).
    count: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1
    #: Idempotency key: a request retried with the same key makes nothing new and gets the
    #: first try's answer (the same instance ids) once that landed; "" for none.
    key: SubmitKey = ""

    def __post_init__(self) -> None:
        if problem := counted_id_problem(self.instance_id, self.count):
            raise ValueError(problem)


#: A submit's answer lists its ids up to this many; beyond, it gives the first and the count
#: (``base-1 .. base-N``, `counted_ids`): a hundred thousand ids exceed the max payload.
REPLY_IDS_MAX = 1000


class SubmitReply(Message, tag="submitted"):
    instance_id: str
    instance_ids: list[str] = msgspec.field(default_factory=list)
    #: Instances made when `instance_ids` is left out (more than `REPLY_IDS_MAX`): they are
    #: `instance_id`'s base, ``-1`` .. ``-count``.
    count: int = 0
    #: What the submission may not do as meant, though it was taken (an affinity on a label
    #: no node carries), one sentence each.
    warnings: list[str] = msgspec.field(default_factory=list)

    def ids(self) -> list[str]:
        """Every instance id the submission made."""
        if self.instance_ids:
            return list(self.instance_ids)
        if self.count > 1:
            return counted_ids(self.instance_id.rpartition("-")[0], self.count)
        return [self.instance_id]

    @classmethod
    def of(cls, ids: list[str]) -> SubmitReply:
        """The answer for a submission that made `ids` (`counted_ids`' order)."""
        if len(ids) > REPLY_IDS_MAX:
            return cls(instance_id=ids[0], count=len(ids))
        return cls(instance_id=ids[0], instance_ids=ids if len(ids) > 1 else [])


class StatsRequest(Message, tag="stats"):
    pass


class StatsReply(Message, tag="stats-reply", kw_only=True):
    """The broker's own measurements, for `gavel bench` and operators."""

    placed_total: int
    instances: int
    nodes_healthy: int = 0
    #: Instances a node.json holds right now (placed_total also counts re-placements).
    placed_now: int = 0
    auctions: int
    bids_received: int
    commits: int
    round_p50_ms: float
    round_p99_ms: float
    commit_p50_ms: float
    commit_p99_ms: float
    rss_mb: float
    #: node.json puts into the KV mirror since the broker started (`broker.mirror`).
    kv_puts: int = 0
    #: The auctioneer's tuning (`shared.tuning`): its level now and how often it changed.
    tuned_level: int = 0
    tuned_changes: int = 0
    #: The last windows it judged, oldest first (`shared.tuning` rule 8).
    tuned_trace: list[str] = msgspec.field(default_factory=list)


class StatusRequest(Message, tag="status"):
    #: One instance, or a batch array's id (its tasks and their tally).
    instance_id: str = ""
    #: Every instance: the page that starts after this instance id ("" from the first). A
    #: reply holds as many as fit in half the server's max payload; its `next` says where
    #: the following page starts.
    after: str = ""
    #: For an array: the tally alone, without its tasks (what `submit --wait` polls). With
    #: no `instance_id`: the cluster's summary (what the dashboard draws) - every instance
    #: counted by state and by name, and at most `SUMMARY_SHOWN` of them, live ones first.
    summary: bool = False


class InstanceStatus(msgspec.Struct, kw_only=True):
    instance_id: str
    name: str
    state: str
    node_id: str = ""
    attempt: int = 0
    reason: str = ""
    detail: str = ""
    ports: dict[str, int] = {}
    #: A running instance's `Health` ("" when none is known yet) and the failing check.
    health: str = ""
    check: str = ""
    #: In-place restarts of the attempt running now (its node's restart policy).
    restarts: int = 0
    #: A service's replica: the service and the version it runs.
    service: str = ""
    version: int = 0
    #: What it measurably uses, as its node last reported (`InstanceReport`): cpus busy on
    #: average, memory charged to its cgroup. 0 where its node measures nothing.
    cpu_used: float = 0.0
    memory_used_mb: float = 0.0
    #: A batch array's task: the array's id ("" for a lone job or a replica).
    array: str = ""


class ArrayStatus(msgspec.Struct, kw_only=True):
    """A batch array as `gavel status ID` shows it (`gavel.shared.arrays.Tally`)."""

    array_id: str
    count: int
    parallelism: int
    max_failures: int
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0
    #: Tasks held for a parallelism slot (not yet released).
    pending: int = 0
    first_failure: str = ""
    #: No task held or running; `ok`: every task succeeded.
    ended: bool = False
    ok: bool = False
    #: The whole story in one sentence.
    outcome: str = ""


class PeriodicStatus(msgspec.Struct, kw_only=True):
    """A periodic job as `gavel status NAME` shows it (`gavel.shared.periodic`)."""

    name: str
    schedule: str
    time_zone: str = "UTC"
    overlap: str = "skip"
    #: Cancelled: no run is made.
    stopped: bool = False
    #: The latest fire time acted on, and the next one (RFC 3339, UTC; "" for none).
    last_run: str = ""
    next_run: str = ""
    #: The latest fire times, oldest first: each run (its outcome as known) or skip.
    history: list[PeriodicRun] = []


#: Instances a summary lists (`StatusRequest.summary`): the rest are only counted.
SUMMARY_SHOWN = 500


class StatusReply(Message, tag="statuses"):
    instances: list[InstanceStatus]
    #: More instances follow: ask again with ``after=next`` ("" when this page is the last).
    next: str = ""
    #: Instance records in the state tree (every page counts them all).
    total: int = 0
    #: The summary (`StatusRequest.summary`, no instance id): every instance by the state
    #: `status` shows it in, and by its spec's name.
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    by_name: dict[str, int] = msgspec.field(default_factory=dict)
    #: `StatusRequest.instance_id` named a batch array: its tally (its tasks in `instances`,
    #: unless the request asked for the summary alone).
    array: ArrayStatus | None = None
    #: `StatusRequest.instance_id` named a periodic job: its schedule and history (its runs
    #: the state still holds in `instances`).
    periodic: PeriodicStatus | None = None
    #: Who answered: the leading broker's id, its leadership's epoch (0 without HA) and
    #: since when it leads (UTC, ISO 8601).
    leader: str = ""
    epoch: int = 0
    leader_since: str = ""


class NodesRequest(Message, tag="nodes"):
    #: One node in detail (`NodesReply.detail`); "": every node, in brief.
    node_id: str = ""


class NodeStatus(msgspec.Struct, kw_only=True):
    node_id: str
    health: str
    strategy: str = ""
    labels: dict[str, str] = {}
    capacity: Capacity = msgspec.field(default_factory=Capacity)
    committed: Capacity = msgspec.field(default_factory=Capacity)
    #: How busy the host is, as its last heartbeat measured it (the dashboard's load bars).
    stats: HostStats = msgspec.field(default_factory=HostStats)
    draining: bool = False
    instances: int = 0
    last_seen_s: float = 0.0
    #: The address the node's instances are reached at (its heartbeat's `advertise`).
    advertise: str = ""
    #: What its instances measurably use together (their cgroups), beside what it holds
    #: (`committed`): the node's own load, not the host's.
    cpu_used: float = 0.0
    memory_used_mb: float = 0.0


class RecentDecline(msgspec.Struct, kw_only=True):
    """A node's answer "no" to one of the last auctions the broker remembers."""

    instance_id: str
    auction_id: str
    reason: str
    detail: str = ""


class NodeDetail(msgspec.Struct, kw_only=True):
    """`gavel nodes NODE`: what runs there, what it has committed, what it declined."""

    node_id: str
    instances: list[InstanceStatus] = msgspec.field(default_factory=list)
    port_range: list[int] = msgspec.field(default_factory=list)
    #: Ports in its range taken by something outside gavel.
    blocked_ports: list[int] = msgspec.field(default_factory=list)
    #: Newest first.
    declines: list[RecentDecline] = msgspec.field(default_factory=list)
    #: A drain's deadline: Unix time after which what still runs there is moved (0: none).
    drain_deadline: float = 0.0


class NodesReply(Message, tag="node-list"):
    nodes: list[NodeStatus]
    rejected: dict[str, int] = msgspec.field(default_factory=dict)
    #: As `StatusReply`: the broker that leads, its epoch, since when.
    leader: str = ""
    epoch: int = 0
    leader_since: str = ""
    detail: NodeDetail | None = None


class WhyRequest(Message, tag="why"):
    instance_id: str


class WhyReply(Message, tag="because"):
    instance: InstanceStatus
    auctions: list[AuctionRecord]


class EventsRequest(Message, tag="events"):
    instance_id: str = ""
    #: The newest this many of those that match (0: every one kept).
    limit: int = 100
    #: Only events at or after this time (Unix seconds; 0: from the oldest kept).
    since: float = 0.0


class EventsReply(Message, tag="event-list"):
    events: list[Event]


class CancelRequest(Message, tag="cancel-request"):
    instance_id: str


class CancelReply(Message, tag="cancel-accepted"):
    instance_id: str
    state: str


class DrainRequest(Message, tag="drain"):
    node_id: str
    undo: bool = False
    migrate: bool = False
    #: Move what still runs there this many seconds from now (0: never, unless `migrate`).
    deadline_s: Annotated[float, msgspec.Meta(ge=0, le=10 * 365 * 86400)] = 0.0


class DrainReply(Message, tag="drained"):
    node_id: str
    draining: bool
    migrating: int = 0
    #: Unix time of the drain's deadline (0: none).
    deadline: float = 0.0


# -- services --------------------------------------------------------------------------------
class DeployRequest(Message, tag="deploy"):
    """Create the service `spec` names, or deploy `spec` as its next version."""

    spec: Spec
    #: An idempotency key: a retried request with the same key is answered with the first
    #: request's outcome.
    key: Annotated[str, msgspec.Meta(max_length=128)] = ""
    #: Apply only if the service's version index (`gavel.shared.planning.version_index`)
    #: is still this one, as `gavel plan` printed it (0: only if there is no such service);
    #: None applies whatever changed.
    check_index: Annotated[int, msgspec.Meta(ge=0)] | None = None


class DeployReply(Message, tag="deployed"):
    name: str
    version: int
    #: False when the spec equals the version already deployed (nothing changed).
    changed: bool = True
    #: As `SubmitReply.warnings`.
    warnings: list[str] = msgspec.field(default_factory=list)


class VersionStatus(msgspec.Struct, kw_only=True):
    version: int
    replicas: int = 0
    healthy: int = 0


class ServiceStatus(msgspec.Struct, kw_only=True):
    name: str
    version: int
    count: int
    stopped: bool = False
    healthy_version: int = 0
    #: The deployment in progress or the last one (state, versions, reason).
    deployment: Deployment | None = None
    versions: list[VersionStatus] = msgspec.field(default_factory=list)
    #: Its live replicas, the first `broker.serviceapi.REPLICAS_SHOWN` of them by version and
    #: id (an answer must fit the server's max payload); `replicas_total` counts them all.
    replicas: list[InstanceStatus] = msgspec.field(default_factory=list)
    replicas_total: int = 0
    #: A system job (``type = "system"``): `count` is the nodes it has an instance on.
    system: bool = False
    #: A system job's nodes now (healthy, not draining, carrying its labels), and those of
    #: them where no instance of its version runs healthy yet (the first 100 of each):
    #: `gavel submit --wait` on a system job waits for `waiting` to empty.
    nodes: list[str] = msgspec.field(default_factory=list)
    waiting: list[str] = msgspec.field(default_factory=list)
    #: A system job's nodes that get no instance yet because the broker's cluster cap
    #: (`--max-instances`) is reached, each with the submit's refusal (first 100 of them):
    #: each gets its instance once room appears.
    capped: dict[str, str] = msgspec.field(default_factory=dict)


class ServiceRequest(Message, tag="service"):
    """A service's status (`gavel status NAME`, `gavel deploy status NAME`)."""

    name: str


class ServiceReply(Message, tag="service-status"):
    service: ServiceStatus


class ServicesRequest(Message, tag="services"):
    pass


class ServicesReply(Message, tag="service-list"):
    services: list[ServiceStatus]


class PeriodicJobsRequest(Message, tag="periodic-jobs"):
    """Every periodic job (`gavel.shared.periodic`): the dashboard's list."""


class PeriodicJobsReply(Message, tag="periodic-list"):
    #: Each job's schedule, position and history, by name (their runs: `status NAME`).
    jobs: list[PeriodicStatus]


class ScaleRequest(Message, tag="scale"):
    name: str
    count: Annotated[int, msgspec.Meta(ge=0, le=100_000)]


class StopServiceRequest(Message, tag="stop-service"):
    name: str


class RollbackRequest(Message, tag="rollback"):
    name: str
    #: The version to go back to (0: the last version that was healthy).
    to_version: Annotated[int, msgspec.Meta(ge=0)] = 0


# -- the gateway -----------------------------------------------------------------------------
class EndpointsRequest(Message, tag="endpoints"):
    """Every live instance whose spec declares routes, and where each node is reached: what
    a gateway derives its route table from (`gavel.shared.routes`)."""


class Endpoint(msgspec.Struct, kw_only=True):
    """One instance a route may lead to: where it runs, on which ports, how healthy."""

    instance_id: str
    name: str
    #: `InstanceStatus.state` (queued, placed, provisioning, running, ...).
    state: str
    node_id: str = ""
    ports: dict[str, int] = {}
    #: A running instance's `Health` ("" when none is known).
    health: str = ""
    #: A service's replica: the service and the version it runs ("" and 0 for a job).
    service: str = ""
    version: int = 0
    routes: list[Route] = []
    #: Whether its spec declares checks: then only ``healthy`` lets it be routed to.
    checked: bool = False


class NodeAddress(msgspec.Struct, kw_only=True):
    """How a gateway reaches a node's instances: its advertised address and its instances'
    directory (a heartbeat's `advertise` and `workdir`), and whether it is heard from."""

    node_id: str
    address: str = ""
    workdir: str = ""
    health: str = ""


class EndpointsReply(Message, tag="endpoint-list"):
    endpoints: list[Endpoint]
    nodes: list[NodeAddress] = msgspec.field(default_factory=list)
