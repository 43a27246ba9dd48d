"""The wire contracts: tagged msgspec Structs, msgpack-encoded.

Rules: every wire message derives from `Message` (tag field ``kind``); every field added after
the first release has a default, and wire structs never forbid unknown fields, so workers of
two versions interoperate. User-facing input (`Spec`) does forbid unknown fields: a typo in a
spec is an error, not a silently ignored key.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Protocol

import msgspec

from gavel.shared.affinity import Affinity
from gavel.shared.spec import Spec

__all__ = [
    "NODE_ENDS",
    "RFB",
    "Amounts",
    "Answer",
    "ApiError",
    "AssignmentRequest",
    "Award",
    "Bid",
    "BidReply",
    "Cancel",
    "Capacity",
    "Decline",
    "Event",
    "EventType",
    "Health",
    "Heartbeat",
    "HostStats",
    "InstanceReport",
    "InstanceState",
    "Message",
    "Request",
    "Shape",
    "Spec",
    "Victim",
    "WatchGrant",
    "WatchRequest",
]
# `Spec` lives in `gavel.shared.spec` (a workload as the operator writes it); it is named here
# too, beside the wire messages that carry one (`Award`, the API's submit).

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]


class InstanceState(StrEnum):
    QUEUED = "queued"
    UNSCHEDULABLE = "unschedulable"
    SCHEDULED = "scheduled"
    PLACED = "placed"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.LOST, InstanceState.CANCELLED}
)


class EventType(StrEnum):
    SCHEDULED = "scheduled"
    PLACED = "placed"
    UNSCHEDULABLE = "unschedulable"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"
    ERROR = "error"
    #: A running instance's health checks all pass / one failed past its threshold.
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    #: The worker restarted the process in place (`Spec.restart`).
    RESTARTED = "restarted"
    #: An operator ran a command inside the instance (`shared.execstream` rule 5): who and
    #: what in `detail`, its exit status, why it ended early in `reason`.
    EXEC = "exec"
    #: An operator asked for a change to the instance or service (`broker.api` rule 9): the
    #: verb and who asked in `detail`.
    REQUESTED = "requested"
    #: A service's own story, on the service's name (`instance_id` is the service): a new
    #: version is being rolled out (or back), it is deployed, its deploy failed; a replica
    #: that ended was replaced (detail: which, by which); a replica is being stopped.
    DEPLOYING = "deploying"
    DEPLOYED = "deployed"
    DEPLOY_FAILED = "deploy-failed"
    REPLACED = "replaced"
    STOPPING = "stopping"
    #: A batch array's own story, on the array's id: held tasks released (detail: which),
    #: and its end (detail: the outcome, `gavel.shared.arrays.Tally.outcome`).
    RELEASED = "released"
    ARRAY_ENDED = "array-ended"
    #: A periodic job's own story, on its name: a run made for a fire time (detail: the run's
    #: id and time), a fire time skipped (reason: why), the schedule cancelled.
    PERIODIC_RUN = "periodic-run"
    PERIODIC_SKIPPED = "periodic-skipped"
    #: Stopped and queued again to make room for higher-priority work (detail: which,
    #: `gavel.shared.reasons.preempted_by`).
    PREEMPTED = "preempted"


class Health(StrEnum):
    """A running instance's health, from the checks its worker runs next to it. An instance
    with no checks is healthy once it runs."""

    UNKNOWN = ""
    CHECKING = "checking"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


#: The wire protocol's version, carried by every message. 1 was the first release (one
#: request per RFB); 2 asks per shape. A message of another version fails to decode, with a
#: sentence that says so, and is refused like any malformed message.
PROTOCOL = 2
#: How the decode error of a message of another version begins (see `Message`).
OTHER_PROTOCOL = "protocol version"


class Message(msgspec.Struct, tag_field="kind", kw_only=True):
    """Base of every message that crosses NATS."""

    v: int = PROTOCOL

    def __post_init__(self) -> None:
        if self.v != PROTOCOL:
            raise ValueError(f"{OTHER_PROTOCOL} {self.v}; this gavel speaks {PROTOCOL}")


class Shape(msgspec.Struct, kw_only=True, frozen=True):
    """What an instance needs from a node — all a bidder sees. Bids depend only on the
    shape, so one RFB asks once per distinct shape however many instances share it.
    A shape asking for a negative or NaN amount does not decode: no bid could answer it."""

    cpu: Annotated[float, msgspec.Meta(ge=0.0)]
    memory_mb: NonNegInt
    ports: NonNegInt = 0
    labels: dict[str, str] = {}
    #: The OCI image it runs ("" for a process): only a node with an engine bids.
    image: Annotated[str, msgspec.Meta(max_length=512)] = ""
    #: The host volumes it needs, by name: only a node holding every one bids.
    volumes: list[str] = []
    #: It asks to run as root (`Spec.root`): only a node whose config allows it bids.
    root: bool = False
    #: The work's priority (`Spec.priority`): a node that has no room may offer to stop
    #: instances far enough below it (`gavel.shared.preemption`).
    priority: Annotated[int, msgspec.Meta(ge=1, le=100)] = 50

    def key(self) -> tuple[float, int, int, tuple[tuple[str, str], ...], str,
                           tuple[str, ...], bool, int]:
        return (self.cpu, self.memory_mb, self.ports, tuple(sorted(self.labels.items())),
                self.image, tuple(sorted(self.volumes)), self.root, self.priority)


class Request(Shape, kw_only=True, frozen=True):
    """One instance to place: its shape plus its id (the id never leaves the broker).

    A service's replica also names its `group` (the service) and how the group spreads
    (`shared.spread`): the broker's award order, not the bidders', so none of it is asked
    on the wire. Requests of different groups never share a shape in an auction."""

    instance_id: str
    #: The service this request is a replica of ("" for a job: today's award rule exactly).
    group: str = ""
    #: The node label the group spreads evenly over ("" for distinct nodes only).
    spread: str = ""
    #: Place anyway when no bidder keeps the spread (best available) instead of waiting.
    spread_soft: bool = False
    #: The spec's soft preferences (`shared.affinity`): the broker's award order, never
    #: asked on the wire either.
    affinities: tuple[Affinity, ...] = ()

    @classmethod
    def of(cls, instance_id: str, spec: Spec, group: str = "") -> Request:
        """The request for an instance of `spec`; `group`: the service it is a replica of
        (`InstanceRecord.service`), whose spread it then follows."""
        return cls(
            instance_id=instance_id,
            cpu=spec.cpu,
            memory_mb=spec.memory_mb,
            ports=len(spec.ports),
            labels=dict(spec.labels),
            image=spec.image or "",
            volumes=sorted(v.name for v in spec.volumes),
            root=spec.root,
            group=group,
            spread=(spec.spread or "") if group else "",
            spread_soft=spec.spread_soft if group else False,
            affinities=tuple(spec.affinities),
            priority=spec.priority,
        )

    def shape(self) -> Shape:
        return Shape(cpu=self.cpu, memory_mb=self.memory_mb, ports=self.ports,
                     labels=self.labels, image=self.image, volumes=self.volumes,
                     root=self.root, priority=self.priority)


class RFB(Message, tag="rfb"):
    """Request for bids: one auction over one or many instances, asked per shape. One that
    asks for nothing (no shapes) is a hello: a new leadership (`broker.ha`) asks every node
    for a heartbeat now, so it knows who is there without waiting a heartbeat interval;
    nobody bids."""

    auction_id: str
    shapes: list[Shape]
    deadline_s: float
    #: How many instances of each shape the auction places (informational).
    counts: list[int] = []
    #: A dry run (`gavel plan`, `gavel.shared.planning`): answer as for a real request;
    #: nothing will be awarded, and a bid holds nothing on its node in any case (no
    #: reservation, no offer kept), so a node answers it the same.
    dry_run: bool = False
    #: A re-auction's holder (`shared.reauction` rule 3): the node that runs the instance
    #: already answers on its view without it, so its bid is what keeping it costs.
    keep: Annotated[str, msgspec.Meta(max_length=253)] = ""


class Bid(Message, tag="bid"):
    """A price for one shape. `step` is how much `load` rises for each instance of this
    shape the node wins (its strategy's marginal price), so a batch can award several
    instances to one node without asking again; ``inf`` means the strategy would refuse a
    second one. Room is not the step's business: the broker charges every award against
    the node's free capacity."""

    shape: int
    load: float
    step: float = 0.0
    strategy: Annotated[str, msgspec.Meta(max_length=64)] = ""
    #: The node already holds the shape's image: no pull before it starts (a cold node's
    #: `load` is raised by `shared.strategies.WARM_BONUS`).
    warm: bool = False


class Victim(msgspec.Struct, kw_only=True, frozen=True):
    """An instance a node runs, as a preempting offer names it: its id, its priority and
    what it reserves (so the broker can check the room it would free without asking)."""

    instance_id: Annotated[str, msgspec.Meta(max_length=256)]
    priority: Annotated[int, msgspec.Meta(ge=1, le=100)]
    cpu: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    memory_mb: NonNegInt = 0
    ports: NonNegInt = 0


class Decline(Message, tag="decline"):
    """No bid for one shape, and why. A node with no room may add a preempting offer
    (`gavel.shared.preemption`): the lower-priority instances it would stop to make room
    (`evict`) and its price once they are gone (`evict_load`). It stays a decline on the
    wire, so a broker that knows nothing of preemption reads it as one."""

    shape: int
    reason: str
    detail: Annotated[str, msgspec.Meta(max_length=256)] = ""
    evict: Annotated[list[Victim], msgspec.Meta(max_length=64)] = []
    evict_load: float = 0.0


Answer = Bid | Decline


class BidReply(Message, tag="bids"):
    """A node's answers to one RFB: a bid or a decline per shape."""

    auction_id: str
    node_id: str
    answers: list[Bid | Decline]


class Award(Message, tag="award"):
    """Sent to the winner after the placement commit is durable."""

    auction_id: str
    instance_id: str
    node_id: str
    spec: Spec
    ports: dict[str, int] = {}
    attempt: int = 1
    commit: str = ""
    secret_env: dict[str, str] = {}
    #: The leadership that awarded it (`broker.ha`: it only grows); 0 for a broker without
    #: HA. A worker ignores an award of an epoch below the newest it has seen.
    epoch: NonNegInt = 0


class Cancel(Message, tag="cancel"):
    instance_id: str
    node_id: str
    #: As `Award.epoch`: a worker ignores a cancel of an older leadership.
    epoch: NonNegInt = 0
    #: The attempt to stop (0: whichever the node holds). A stop sent as the broker gives an
    #: attempt up can arrive after the instance was placed on that node again.
    attempt: NonNegInt = 0


class Amounts(Protocol):
    """Anything that asks for or holds cpu, memory and a number of ports: a `Shape`, a
    `Request`, a `Capacity`."""

    @property
    def cpu(self) -> float: ...

    @property
    def memory_mb(self) -> int: ...

    @property
    def ports(self) -> int: ...


class Capacity(msgspec.Struct, kw_only=True):
    """Cpu, memory and ports: what a node has, commits, has free, or an award reserves.

    Rule: the arithmetic is here and only here. `+` and `-` make a new value; `charge` changes
    this one in place (the hot paths: an auction charges every award against the winner's
    room, the broker reserves undelivered awards), adding `times` of `other` (-1 gives back)."""

    cpu: float = 0.0
    memory_mb: int = 0
    ports: int = 0

    def copy(self) -> Capacity:
        return Capacity(cpu=self.cpu, memory_mb=self.memory_mb, ports=self.ports)

    def __add__(self, other: Amounts) -> Capacity:
        return Capacity(cpu=self.cpu + other.cpu, memory_mb=self.memory_mb + other.memory_mb,
                        ports=self.ports + other.ports)

    def __sub__(self, other: Amounts) -> Capacity:
        return Capacity(cpu=self.cpu - other.cpu, memory_mb=self.memory_mb - other.memory_mb,
                        ports=self.ports - other.ports)

    def charge(self, other: Amounts, times: int = 1) -> None:
        self.cpu += times * other.cpu
        self.memory_mb += times * other.memory_mb
        self.ports += times * other.ports


class HostStats(msgspec.Struct, kw_only=True):
    cpu_ratio: float = 0.0
    memory_ratio: float = 0.0
    cpu_count: int = 0
    memory_total_mb: int = 0


#: The events a node ends an instance's attempt with (`Heartbeat.ended` carries them again).
NODE_ENDS = frozenset({EventType.EXITED, EventType.FAILED, EventType.CANCELLED})


class InstanceReport(msgspec.Struct, kw_only=True, gc=False):
    """Untracked by the garbage collector, like the records (`shared.records`): scalars and
    a dict of port numbers, no cycle possible; a broker holds every node's last list."""

    instance_id: str
    state: str
    pid: int = 0
    attempt: int = 1
    ports: dict[str, int] = {}
    #: `Health` of a running instance ("" when the worker runs no checks for it yet).
    health: str = ""
    #: In-place restarts of this attempt on this node.
    restarts: int = 0
    #: What it measurably uses, from its cgroup (`worker.usage`; 0 where the node enforces
    #: nothing): cpus busy on average since the node's previous reading, memory charged now.
    cpu_used: float = 0.0
    memory_used_mb: float = 0.0


class Heartbeat(Message, tag="heartbeat"):
    node_id: str
    seq: int = 0
    strategy: str = ""
    labels: dict[str, str] = {}
    capacity: Capacity = msgspec.field(default_factory=Capacity)
    committed: Capacity = msgspec.field(default_factory=Capacity)
    stats: HostStats = msgspec.field(default_factory=HostStats)
    draining: bool = False
    instances: list[InstanceReport] = []
    #: [first, last] of the port range the broker may assign from on this node.
    port_range: list[int] = []
    #: Ports node.json blocks (found taken outside gavel) that bind again now: the broker
    #: unblocks them, so a port someone borrowed is not lost to gavel for ever.
    freed_ports: list[int] = []
    #: The address the gateway reaches this node's instances at (`WorkerConfig.advertise`).
    advertise: Annotated[str, msgspec.Meta(max_length=253)] = ""
    #: The absolute directory holding each instance's own directory on this node (a
    #: gateway on a host that sees it serves files an instance writes there).
    workdir: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    #: How many events this node had reported (`Event.seq`) when it took this heartbeat:
    #: the two travel apart (heartbeats through the broker's heartbeat stream), so a
    #: heartbeat older than an event the broker has heard says nothing of health.
    reported: NonNegInt = 0
    #: The node's most recent ends (``exited``, ``failed``, ``cancelled`` events, at most
    #: `gavel.shared.bounds.ENDED_MAX`, each for `Timing.unreachable_s`), sent again with
    #: every heartbeat: an end whose event was lost (written as its NATS server went away)
    #: is still heard (`gavel.broker.promises` rule 8).
    ended: list[Event] = []


class Event(Message, tag="event"):
    instance_id: str
    type: str
    node_id: str = ""
    reason: str = ""
    detail: str = ""
    exit_code: int | None = None
    attempt: int = 0
    at: float = 0.0
    #: The ports the instance really got (differs from the award when one was taken).
    ports: dict[str, int] = {}
    #: Ports of the award found taken by something outside gavel (bind check failed).
    taken: list[int] = []
    #: With ``healthy``/``unhealthy``: the check that decided and its last output.
    check: str = ""
    #: In-place restarts of this attempt so far (``restarted`` and every later event).
    restarts: int = 0
    #: This event's number among the events its node has reported since it started (1 for
    #: the first; 0 from a node that does not count them).
    seq: NonNegInt = 0


class AssignmentRequest(Message, tag="assignment"):
    """Worker → broker (on ``gavel.assign.<node>``): send me the award for an instance my
    node.json lists but I do not hold (convergence after a restart or a missed award)."""

    instance_id: str
    node_id: str


class WatchRequest(Message, tag="watch"):
    """Worker → broker (on ``gavel.watch.<node>``): make me a consumer of my own key in the
    KV bucket named `consumer` (``<node>_<16 hex digits>``: named by the node, so it knows the
    first delivery, which may beat the answer), delivering to `deliver` (an inbox of mine,
    ``_INBOX_<node>.<token>``, already subscribed). The node makes no JetStream call itself
    (`broker.watches`)."""

    node_id: str
    deliver: str
    consumer: str = ""


class WatchGrant(Message, tag="watch-grant"):
    """Broker → worker: the consumer made for a `WatchRequest`; its deliveries name it."""

    consumer: str
    epoch: NonNegInt = 0


class ApiError(Message, tag="error"):
    error: str
    #: The leadership that answered (`Award.epoch`): a worker told "not placed here" by a
    #: broker of an older leadership than it has seen takes it for no answer.
    epoch: NonNegInt = 0
