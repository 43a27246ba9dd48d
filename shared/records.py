"""The files in the state repository, as Structs.

Rule: ``instances/<shard>/<id>.json`` is the operator's intent plus the instance's durable
state; ``nodes/<node-id>/node.json`` holds what the broker placed on that node. Secret
values never appear here: a placement keeps the secret names only.

Why shards: a git tree is rewritten whole whenever one entry changes, and records are kept
after an instance ends, so a flat ``instances/`` directory would make every submit commit
cost as much as every instance ever submitted: one tree listing every record, built,
compressed and stored again by each commit (docs/performance.md). The shard is the first
two hex digits of the SHA-1 of the id (256 shards): a commit rewrites only the shards it
touches. An operator may still add ``instances/<id>.json`` by hand (GitOps): it is read
like any record, and the broker moves it into its shard the first time it writes that
instance.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec

from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import Capacity, InstanceState, Shape, Spec, Victim
from gavel.shared.preemption import Offer

__all__ = [
    "RAISED",
    "STAMP_PATTERN",
    "Assignment",
    "AuctionRecord",
    "BatchRecord",
    "Deployment",
    "InstanceRecord",
    "NodeEntry",
    "NodeFile",
    "Outcome",
    "PeriodicRecord",
    "PeriodicRun",
    "Placement",
    "ServiceRecord",
    "ServiceVersion",
    "ShapeRecord",
    "auction_trailer",
    "flat_instance_path",
    "instance_path",
    "node_path",
    "parse_trailers",
    "periodic_path",
    "service_path",
]


def instance_path(instance_id: str) -> str:
    """Where the broker writes an instance's record: ``instances/<shard>/<id>.json``."""
    shard = hashlib.sha1(instance_id.encode()).hexdigest()[:2]
    return f"instances/{shard}/{instance_id}.json"


def flat_instance_path(instance_id: str) -> str:
    """Where an operator may put a record by hand (read, then moved into its shard)."""
    return f"instances/{instance_id}.json"


def node_path(node_id: str) -> str:
    return f"nodes/{node_id}/node.json"


def service_path(name: str) -> str:
    """Where a service's intent lives: ``services/<name>.json``."""
    return f"services/{name}.json"


class Placement(msgspec.Struct, kw_only=True):
    instance_id: str
    spec: Spec
    auction_id: str
    attempt: int = 1
    ports: dict[str, int] = {}

    def reserves(self) -> Capacity:
        """What this instance holds on the node that runs it."""
        return Capacity(cpu=self.spec.cpu, memory_mb=self.spec.memory_mb, ports=len(self.ports))


class Assignment(msgspec.Struct, kw_only=True, gc=False):
    """One instance in a node.json: what the node holds and what it reserves there. The
    spec itself lives once, in the instance's record; a node fetches it with its award.
    Untracked by the garbage collector, as `InstanceRecord` is (scalars and a dict of port
    numbers: no cycle possible)."""

    instance_id: str
    auction_id: str
    attempt: int = 1
    cpu: float = 0.0
    memory_mb: int = 0
    ports: dict[str, int] = {}

    def reserves(self) -> Capacity:
        """What this placement holds on its node."""
        return Capacity(cpu=self.cpu, memory_mb=self.memory_mb, ports=len(self.ports))


class NodeFile(msgspec.Struct, kw_only=True):
    node_id: str
    instances: dict[str, Assignment] = {}
    #: The operator drained the node: it declines every RFB (durable, survives restarts).
    draining: bool = False
    #: Ports in the node's range found taken by something outside gavel.
    blocked_ports: list[int] = []

    @property
    def empty(self) -> bool:
        return not (self.instances or self.draining or self.blocked_ports)


class NodeEntry(NodeFile, kw_only=True):
    """A node.json as the KV mirror holds it: the file, and the leadership that put it
    (`gavel.shared.messages.Award.epoch`; 0 for a broker without HA). Git's node.json never
    carries an epoch: a new leadership changes no file."""

    epoch: int = 0


#: An end stamp: ``2026-11-29T23:59:01.123Z`` (UTC, optional fraction), or "" for none.
STAMP_PATTERN = r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z)?$"


class InstanceRecord(msgspec.Struct, kw_only=True, gc=False):
    """Never tracked by the garbage collector (`gc=False`: strings, numbers, a `Spec`, a
    tuple - no reference cycle can run through one). A broker holds one for every instance
    it keeps, and if tracked they would be most of what its young collections scan: each
    collection a pause of the event loop, spent scanning records that live on
    (docs/performance.md)."""

    instance_id: str
    spec: Spec
    state: InstanceState = InstanceState.QUEUED
    attempt: int = 0
    node_id: str = ""
    reason: str = ""
    detail: str = ""
    excluded: tuple[str, ...] = ()
    #: The operator asked to cancel; the node has `cancel_grace_s` to confirm.
    cancelling: bool = False
    #: When the commit that recorded the end (a terminal state) was written, RFC 3339 in UTC
    #: ("" until then); `timing.retention_s` later the record leaves the tree (git history
    #: keeps it). A string, not a datetime: the core never touches clock types.
    ended_at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: The idempotency key of the submission that made it (`SubmitRequest.key`), "" for
    #: none: every record of one submission carries it, so a retried request finds what its
    #: first try made - across broker restarts - until retention forgets the records.
    key: str = ""
    #: A service's replica: the service's name and the version of it this replica runs
    #: ("" and 0 for a job).
    service: str = ""
    version: int = 0
    #: A batch array's task: the array's id (its tasks are ``array-1`` .. ``array-N``); ""
    #: for a lone job or a replica.
    array: str = ""
    #: A batch array's task not yet released (its array's `parallelism` holds it): queued,
    #: but never auctioned until the broker releases it (`gavel.shared.arrays`).
    held: bool = False
    #: A system job's instance: the one node whose auction it is (`shared.auctioneer` rule
    #: 12); "" for any node.
    only_node: str = ""


class ServiceVersion(msgspec.Struct, kw_only=True, gc=False):
    """One version of a service, as `gavel deploy` made it."""

    version: Annotated[int, msgspec.Meta(ge=1)]
    spec: Spec
    #: When its commit was written (an end stamp's format: RFC 3339, UTC).
    at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: When it last became the service's healthy version ("" for never): `rollback` goes to
    #: the version healthy most recently before the one running.
    healthy_at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""


class Deployment(msgspec.Struct, kw_only=True, gc=False):
    """A rolling replacement of a service's replicas by another version."""

    #: The version replicas move to, and the one they come from.
    to_version: int
    from_version: int = 0
    #: ``running``, ``succeeded``, ``failed`` (not healthy in time: the service stays on
    #: `from_version` when `auto_revert`), ``rolled-back``, ``cancelled`` (superseded).
    state: Literal["running", "succeeded", "failed", "rolled-back", "cancelled"] = "running"
    started_at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    ended_at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: Why it ended as it did (a fixed reason, and its detail).
    reason: str = ""
    detail: str = ""


class ServiceRecord(msgspec.Struct, kw_only=True, gc=False):
    """``services/<name>.json``: a service's intent. Its replicas are ordinary instances
    (`InstanceRecord.service`); the broker keeps `count` of them running `version`."""

    name: str
    #: Every version deployed, oldest first.
    versions: list[ServiceVersion]
    #: The version replicas should run now (the newest, or the one a rollback chose).
    version: int
    count: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1
    #: `gavel stop NAME`: no replica is kept; the record stays (deploy starts it again).
    stopped: bool = False
    #: The last version whose replicas were all healthy at once (0: none yet).
    healthy_version: int = 0
    deployment: Deployment | None = None

    def spec_of(self, version: int) -> Spec | None:
        for v in self.versions:
            if v.version == version:
                return v.spec
        return None


def periodic_path(name: str) -> str:
    """Where a periodic job's intent lives: ``periodic/<name>.json``."""
    return f"periodic/{name}.json"


class PeriodicRun(msgspec.Struct, kw_only=True, gc=False):
    """One fire time of a periodic job, as its history keeps it (`gavel.shared.periodic`)."""

    #: The fire time (RFC 3339, UTC).
    at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)]
    #: The run made for it; "" when it was skipped.
    instance_id: str = ""
    #: Why no run was made (a fixed reason), "" for a run.
    skipped: str = ""
    #: Earlier fire times that passed while no broker led, collapsed into this one.
    missed: int = 0
    #: How the run ended (its terminal state), once the broker saw it end; "" until then.
    outcome: str = ""


class PeriodicRecord(msgspec.Struct, kw_only=True, gc=False):
    """``periodic/<name>.json``: a periodic job's intent - its spec (with a `schedule`), where
    its schedule stands (`last_run`) and its latest runs. Each run is an ordinary job
    instance whose record the same commit writes (`gavel.shared.periodic` rule 1)."""

    name: str
    spec: Spec
    #: When it was submitted: no fire time before it is due.
    since: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: The fire time of the latest run made or skipped ("" for none yet).
    last_run: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: `gavel cancel NAME`: no run is made; the record and its history stay until
    #: `timing.retention_s` after `stopped_at` (`gavel.broker.periodic` rule 7).
    stopped: bool = False
    stopped_at: Annotated[str, msgspec.Meta(pattern=STAMP_PATTERN)] = ""
    #: The latest fire times, oldest first (`gavel.shared.periodic.HISTORY` of them).
    history: list[PeriodicRun] = []


#: What `AuctionRecord.raised` means, said beside such a bid.
RAISED = "ranked above its bid: it won earlier in the same round"


class AuctionRecord(msgspec.Struct, kw_only=True):
    """Every bid, decline and silence of one round, and why the winner won."""

    auction_id: str
    instance_id: str
    winner: str = ""
    load: float | None = None
    tie_broken: bool = False
    bids: list[NodeBid] = []
    declines: list[NodeDecline] = []
    silent: list[str] = []
    reason: str = ""
    summary: str = ""
    #: When it was committed (Unix seconds, from its commit: never written in the trailer);
    #: 0 when not known (an auction not committed yet).
    at: float = 0.0
    #: The preempting offers of a round no bid could win, best first (`shared.preemption`).
    offers: list[Offer] = []
    #: The instances the winner stopped to make room (empty: an ordinary award).
    displaced: list[Victim] = []

    def raised(self) -> list[str]:
        """The bidders that lost with a bid ranking before the load the winner won at: a
        batch ranks each node at its bid plus what it already won in the same round
        (`shared.award` rule 2), so `bids`, as the nodes sent them, can read lower than the
        winner's load. Empty for a round of one instance, and for any round that raised no
        loser's load above the winner's."""
        if not self.winner or self.load is None or self.displaced:
            return []
        won_at = (self.load, self.winner)
        return [b.node_id for b in self.bids
                if b.node_id != self.winner and (b.load, b.node_id) < won_at]


class ShapeRecord(msgspec.Struct, kw_only=True):
    """One shape of a batch auction: every bid, decline and silence for it."""

    shape: Shape
    bids: list[NodeBid] = []
    declines: list[NodeDecline] = []
    silent: list[str] = []
    offers: list[Offer] = []


class Outcome(msgspec.Struct, kw_only=True):
    """What one instance of a batch got: a winner (and the effective load it won at) or
    the reason nobody could take it."""

    instance_id: str
    shape: int = 0
    winner: str = ""
    load: float | None = None
    tie_broken: bool = False
    reason: str = ""
    summary: str = ""
    displaced: list[Victim] = []


class BatchRecord(msgspec.Struct, kw_only=True):
    """A whole auction as one trailer: bids are per shape, outcomes per instance."""

    auction_id: str
    shapes: list[ShapeRecord]
    outcomes: list[Outcome]

    def expand(self) -> list[AuctionRecord]:
        out = []
        for o in self.outcomes:
            sr = self.shapes[o.shape]
            out.append(AuctionRecord(auction_id=self.auction_id, instance_id=o.instance_id,
                                     winner=o.winner, load=o.load, tie_broken=o.tie_broken,
                                     bids=sr.bids, declines=sr.declines, silent=sr.silent,
                                     reason=o.reason, summary=o.summary,
                                     offers=sr.offers if o.displaced else [],
                                     displaced=o.displaced))
        return out


TRAILER = "Gavel-Auction: "
_batch_decoder = msgspec.json.Decoder(BatchRecord)
_record_decoder = msgspec.json.Decoder(AuctionRecord)


def auction_trailer(record: AuctionRecord | BatchRecord) -> str:
    """One commit-message line carrying a whole auction, machine-readable."""
    return TRAILER + msgspec.json.encode(record).decode()


def parse_trailers(message: str) -> list[AuctionRecord]:
    """Every auction recorded in a commit message, one record per instance, in order; other
    lines are ignored. Batch records are expanded per instance.

    Lines split on newlines only, as git does: `str.splitlines` would also split on U+2028,
    U+0085 and friends, which JSON leaves unescaped inside a worker-supplied detail.
    """
    out: list[AuctionRecord] = []
    for raw in message.split("\n"):
        line = raw.removesuffix("\r")
        if line.startswith(TRAILER):
            body = line[len(TRAILER):]
            if '"outcomes":' in body:
                out.extend(_batch_decoder.decode(body).expand())
            else:  # one instance per line, as the first releases wrote it
                out.append(_record_decoder.decode(body))
    return out
