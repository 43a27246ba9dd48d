"""What the state repository holds, in memory: the `State` at a head (with the indexes the
hot path needs), a `Change` to write, and the file encodings both sides agree on.

Rules:
1. Files are JSON: pretty with sorted keys in git (readable in `git show`, stable across
   runs), compact in the KV mirror (machines read it); each node.json is encoded once per
   commit however many readers want it.
2. An instance is *placed* exactly when some node.json holds it - the record in
   ``instances/`` keeps intent and durable outcomes (queued, unschedulable, terminal), the
   placement is the broker's decision and lives only in ``nodes/``.
3. End stamps (`InstanceRecord.ended_at`) are RFC 3339 in UTC; `shared/` keeps them as
   strings (the core touches no clock types), this module reads and writes them.
4. A `State` read from a tree someone else wrote may differ from that tree where it listed
   an instance on a node the broker did not place it on (`broker.ledger.integrity`): the
   State then holds the broker's placements, and each `Dispute` says which node files the
   correction rewrites.
5. A service's intent is ``services/<name>.json`` (`ServiceRecord`); its replicas are ordinary
   instance records naming it (`InstanceRecord.service`), indexed by service so what reads
   one service's replicas (its keeper, the spread of its awards) never walks every instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec

from gavel.broker.ledger.disputes import Dispute
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import Capacity, InstanceState
from gavel.shared.records import (
    Assignment,
    InstanceRecord,
    NodeFile,
    PeriodicRecord,
    ServiceRecord,
    instance_path,
    node_path,
    periodic_path,
    service_path,
)

__all__ = [
    "Change",
    "Ready",
    "State",
    "array_kind",
    "committed_by",
    "compact",
    "encode",
    "parse_stamp",
    "pretty",
    "ready",
    "stamp",
]

_enc = msgspec.json.Encoder()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def stamp(at: datetime) -> str:
    """An end stamp for a record: RFC 3339, UTC, milliseconds (`InstanceRecord.ended_at`)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_stamp(text: str) -> datetime | None:
    """The time an end stamp names; None for no stamp or one that names no real time (a
    record written by hand: 2026-02-30 passes the pattern, not the calendar)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def encode(obj: object) -> bytes:
    """Pretty JSON with sorted keys: readable in `git show`, stable across runs."""
    return pretty(compact(obj))


def compact(obj: object) -> bytes:
    """The same JSON without whitespace (the KV mirror: machines read it)."""
    return _enc.encode(obj)


def pretty(compact_json: bytes) -> bytes:
    return msgspec.json.format(compact_json, indent=2) + b"\n"


#: An instance record with its path and compact JSON, worked out before its commit.
Ready = tuple[InstanceRecord, str, bytes]


def ready(rec: InstanceRecord) -> Ready:
    """`rec` encoded ahead of its commit (`Change.ready`)."""
    return rec, instance_path(rec.instance_id), compact(rec)


@dataclass
class State:
    """The tree at `head`, plus indexes kept in step with it so the hot path never scans
    every instance: where each placed instance is, the pending instances (queued or
    unschedulable and in no node.json), and what each node's placements commit.

    Rule: an instance is *placed* exactly when some node.json holds it — the record in
    ``instances/`` keeps intent and durable outcomes (queued, unschedulable, terminal),
    the placement is the broker's decision and lives only in ``nodes/``."""

    head: str | None = None
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    nodes: dict[str, NodeFile] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    pending: dict[str, None] = field(default_factory=dict)  # an ordered set, oldest first
    committed: dict[str, Capacity] = field(default_factory=dict)
    #: Records read where an operator put them by hand (``instances/<id>.json``), by id:
    #: the broker's next write of each moves it into its shard.
    flat: dict[str, str] = field(default_factory=dict)
    #: Ended instances (terminal records), in the order they ended: an ordered set, what
    #: `broker.retention` walks from the front.
    ended: dict[str, None] = field(default_factory=dict)
    #: Files in the tree that are not what their path says (put there by hand): path ->
    #: why. They are left untouched and ignored; nodes whose node.json is one of them win
    #: nothing (their real placements are unknown, and an award would overwrite the file).
    unreadable: dict[str, str] = field(default_factory=dict)
    unusable_nodes: set[str] = field(default_factory=set)
    #: Nodes whose node.json says draining: the broker takes their bids as declines and
    #: awards them nothing, whether or not they have heard of the drain yet.
    draining: set[str] = field(default_factory=set)
    #: Compact JSON of node files as our own commits wrote them, by node: the next change
    #: that only adds placements to one appends them to these bytes (`Change`).
    encoded: dict[str, tuple[NodeFile, bytes]] = field(default_factory=dict, repr=False)
    #: Instances the tree listed where the broker had not placed them, by id (rule 4): the
    #: State already holds the kept placement; the correction is still to be committed.
    disputes: dict[str, Dispute] = field(default_factory=dict)
    #: Submissions by idempotency key (`InstanceRecord.key`): their instance ids, an ordered
    #: set in the order they were recorded.
    keys: dict[str, dict[str, None]] = field(default_factory=dict)
    #: Services by name (rule 5), and the ids of every replica record naming each (live or
    #: ended: an ordered set, in the order they were read or written). A record rewritten to
    #: name another service moves to its list (`put_instance`); readers still check
    #: `InstanceRecord.service` (`replicas_of`).
    services: dict[str, ServiceRecord] = field(default_factory=dict)
    replicas: dict[str, dict[str, None]] = field(default_factory=dict)
    #: `held_by`'s answers, by service, until a record or a node file changes: every
    #: auction of a service's replicas asks it, and a count over every replica for each
    #: of them made a service of a hundred thousand queued replicas hold the loop.
    held: dict[str, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)
    #: Batch arrays by id: the ids of every task record naming each (`InstanceRecord.array`),
    #: an ordered set, as `replicas` is for services.
    arrays: dict[str, dict[str, None]] = field(default_factory=dict)
    #: Per array: its task records by kind (`array_kind`), and its held tasks in the order
    #: they were recorded - what a release needs without walking every task.
    array_kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    array_held: dict[str, dict[str, None]] = field(default_factory=dict)
    #: Periodic jobs by name (``periodic/<name>.json``, `gavel.shared.periodic`).
    periodic: dict[str, PeriodicRecord] = field(default_factory=dict)

    def put_instance(self, iid: str, rec: InstanceRecord | None) -> None:
        old = self.instances.get(iid)
        for named in (old, rec):
            if named is not None and named.service:
                self.held.pop(named.service, None)
        if old is not None and old.key and (rec is None or rec.key != old.key):
            _unindex(self.keys, old.key, iid)
        if old is not None and old.service and (rec is None or rec.service != old.service):
            _unindex(self.replicas, old.service, iid)
        if old is not None and old.array and (rec is None or rec.array != old.array):
            _unindex(self.arrays, old.array, iid)
        if old is not None and old.array:
            kinds = self.array_kinds[old.array]
            kinds[array_kind(old)] -= 1
            if old.held:
                _unindex(self.array_held, old.array, iid)
        if rec is not None and rec.array:
            kinds = self.array_kinds.setdefault(rec.array, {})
            kind = array_kind(rec)
            kinds[kind] = kinds.get(kind, 0) + 1
            if rec.held:
                self.array_held.setdefault(rec.array, {})[iid] = None
        if rec is None:
            self.instances.pop(iid, None)
            self.pending.pop(iid, None)
            self.ended.pop(iid, None)
            return
        if rec.key:
            self.keys.setdefault(rec.key, {})[iid] = None
        if rec.service:
            self.replicas.setdefault(rec.service, {})[iid] = None
        if rec.array:
            self.arrays.setdefault(rec.array, {})[iid] = None
        self.instances[iid] = rec
        if rec.state in PENDING and not rec.held and iid not in self.where:
            self.pending.setdefault(iid, None)
        else:
            self.pending.pop(iid, None)
        if rec.state.terminal:
            self.ended.setdefault(iid, None)
        else:
            self.ended.pop(iid, None)

    def order_ended(self) -> None:
        """Put `ended` in end order after a full read (read order is path order): stamped
        records oldest first, then those without a (readable) stamp; and each array's held
        tasks in index order."""
        def key(iid: str) -> tuple[bool, datetime]:
            at = parse_stamp(self.instances[iid].ended_at)
            return (at is None, at or _EPOCH)
        self.ended = dict.fromkeys(sorted(self.ended, key=key))
        for array, ids in self.array_held.items():  # a release goes lowest index first
            self.array_held[array] = dict.fromkeys(sorted(ids, key=_submission_order))

    def put_node(self, nid: str, nf: NodeFile | None, committed: Capacity | None = None,
                 grown: tuple[NodeFile, list[str]] | None = None) -> None:
        """`committed`: what `nf`'s placements add up to, when the caller knows it (a plan
        that added one placement: the old total plus that one, the same float sum in the same
        order); otherwise it is summed here, O(placements on the node). `grown`: `nf` is
        the node's present record plus these placements (`Change.grown`), so only they move;
        otherwise the two files are compared, O(placements on the node)."""
        old = self.nodes.get(nid)
        self.held.clear()  # placements move (`held_by`)
        if grown is not None and nf is not None and grown[0] is old:
            for iid in grown[1]:
                self.where[iid] = nid
                self.pending.pop(iid, None)
        else:
            before = old.instances.keys() if old is not None else set()
            after = nf.instances.keys() if nf is not None else set()
            for iid in before - after:
                if self.where.get(iid) == nid:
                    del self.where[iid]
                    rec = self.instances.get(iid)
                    if rec is not None and rec.state in PENDING and not rec.held:
                        self.pending.setdefault(iid, None)
            for iid in after - before:
                self.where[iid] = nid
                self.pending.pop(iid, None)
        if nf is None:
            self.nodes.pop(nid, None)
            self.committed.pop(nid, None)
            self.encoded.pop(nid, None)
            self.draining.discard(nid)
            return
        self.nodes[nid] = nf
        if nf.draining:
            self.draining.add(nid)
        else:
            self.draining.discard(nid)
        self.committed[nid] = committed if committed is not None else committed_by(nf)

    def submitted(self, key: str) -> list[str]:
        """The instance ids the submission with idempotency `key` made, in the order the
        broker named them (`broker.api`: ``base`` or ``base-1 .. base-N``); [] if none."""
        ids = self.keys.get(key)
        return sorted(ids, key=_submission_order) if ids else []

    def replicas_of(self, name: str) -> list[InstanceRecord]:
        """Every replica record of the service `name` (live or ended)."""
        out = []
        for iid in self.replicas.get(name, ()):
            rec = self.instances.get(iid)
            if rec is not None and rec.service == name:
                out.append(rec)
        return out

    def tasks_of(self, array: str) -> list[InstanceRecord]:
        """Every task record of the batch array `array` the state holds (live or ended)."""
        out = []
        for iid in self.arrays.get(array, ()):
            rec = self.instances.get(iid)
            if rec is not None and rec.array == array:
                out.append(rec)
        return out

    def held_by(self, name: str) -> dict[str, int]:
        """How many live replicas of the service `name` each node's node.json holds (a
        fresh dict: the caller may change it)."""
        known = self.held.get(name)
        if known is not None:
            return dict(known)
        out: dict[str, int] = {}
        where = self.where
        for rec in self.replicas_of(name):
            node = where.get(rec.instance_id)
            if node is not None and not rec.state.terminal:
                out[node] = out.get(node, 0) + 1
        self.held[name] = out
        return dict(out)

    def put_service(self, name: str, rec: ServiceRecord | None) -> None:
        if rec is None:
            self.services.pop(name, None)
        else:
            self.services[name] = rec

    def put_periodic(self, name: str, rec: PeriodicRecord | None) -> None:
        if rec is None:
            self.periodic.pop(name, None)
        else:
            self.periodic[name] = rec

    def placement_of(self, instance_id: str) -> str | None:
        """The node whose node.json holds the instance, if any."""
        return self.where.get(instance_id)

    def placement(self, instance_id: str) -> Assignment | None:
        node = self.where.get(instance_id)
        return None if node is None else self.nodes[node].instances.get(instance_id)

    def effective(self, instance_id: str) -> InstanceState | None:
        """The instance's state: its record's, or ``placed`` while a node.json holds it."""
        rec = self.instances.get(instance_id)
        if rec is None:
            return None
        if rec.state in PENDING and instance_id in self.where:
            return InstanceState.PLACED
        return rec.state


def array_kind(rec: InstanceRecord) -> str:
    """A batch array's task record as its array counts it: ``held``, ``live`` or its end."""
    if not rec.state.terminal:
        return "held" if rec.held else "live"
    return str(rec.state)


def _submission_order(iid: str) -> tuple[str, int]:
    """``web-7`` before ``web-10``: a submission of many names them base-1 .. base-N."""
    base, _, n = iid.rpartition("-")
    return (base, int(n)) if base and n.isdigit() else (iid, 0)


def _unindex(index: dict[str, dict[str, None]], key: str, iid: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.pop(iid, None)
        if not ids:
            del index[key]


def committed_by(nf: NodeFile) -> Capacity:
    """What a node's placements reserve there, summed in the node file's order."""
    total = Capacity()
    for pl in nf.instances.values():
        total.charge(pl.reserves())
    return total


@dataclass
class Change:
    """Files to write (a record) or delete (None), keyed by id."""

    instances: dict[str, InstanceRecord | None] = field(default_factory=dict)
    nodes: dict[str, NodeFile | None] = field(default_factory=dict)
    services: dict[str, ServiceRecord | None] = field(default_factory=dict)
    periodic: dict[str, PeriodicRecord | None] = field(default_factory=dict)
    #: What each changed node's placements add up to, where a plan worked it out without
    #: a sum over the node (`State.put_node`'s `committed`).
    committed: dict[str, Capacity] = field(default_factory=dict, repr=False, compare=False)
    #: Nodes whose file here is the state's record of it plus these placements, last and in
    #: this order (`View.add`): their JSON is the record's plus theirs (`bases`), and
    #: adopting them moves only these.
    grown: dict[str, tuple[NodeFile, list[str]]] = field(default_factory=dict, repr=False,
                                                         compare=False)
    #: Records encoded before their commit, by id (`ready`): a submission of thousands
    #: encodes its records in slices as it comes in, not all in the commit's one stretch of
    #: the event loop. Used only while the change still holds that very record.
    ready: dict[str, Ready] = field(default_factory=dict, repr=False, compare=False)
    #: The state's compact encodings of its node files (`State.encoded`).
    bases: Mapping[str, tuple[NodeFile, bytes]] = field(default_factory=dict, repr=False,
                                                         compare=False)

    def __bool__(self) -> bool:
        return bool(self.instances or self.nodes or self.services or self.periodic)

    #: node.json bytes by node - (record, compact JSON, pretty JSON or None until asked) -
    #: for git (pretty, for people) and the KV mirror (compact: machines read it, and it is
    #: far smaller than pretty; docs/performance.md): the largest thing a commit encodes,
    #: encoded once.
    _encoded: dict[str, tuple[NodeFile, bytes, bytes | None]] = field(
        default_factory=dict, repr=False, compare=False)

    def files(self, flat: Mapping[str, str] | None = None) -> dict[str, bytes | None]:
        """Paths to write (bytes) or delete (None); `flat`: records the state read at a
        hand-made flat path, removed there as they are written to their shard."""
        out, raw = self.files_compact(flat)
        out.update((path, pretty(data)) for path, data in raw.items())
        return out

    def files_compact(self, flat: Mapping[str, str] | None = None
                      ) -> tuple[dict[str, bytes | None], dict[str, bytes]]:
        """`files` with the JSON left compact: (paths to delete or write as they are, paths
        whose compact JSON is to be written pretty - `Ledger.write_files` formats them, in
        the writer, off the broker's event loop: formatting is most of encoding)."""
        out: dict[str, bytes | None] = {}
        raw: dict[str, bytes] = {}
        for iid, rec in self.instances.items():
            if rec is None:
                out[instance_path(iid)] = None
            elif (done := self.ready.get(iid)) is not None and done[0] is rec:
                raw[done[1]] = done[2]
            else:
                raw[instance_path(iid)] = compact(rec)
            if flat and iid in flat:
                out[flat[iid]] = None
        for nid, nf in self.nodes.items():
            if nf is None:
                out[node_path(nid)] = None
            else:
                raw[node_path(nid)] = self.node_compact(nid, nf)
        for name, svc in self.services.items():
            if svc is None:
                out[service_path(name)] = None
            else:
                raw[service_path(name)] = compact(svc)
        for name, job in self.periodic.items():
            if job is None:
                out[periodic_path(name)] = None
            else:
                raw[periodic_path(name)] = compact(job)
        return out, raw

    def forget_encoding(self, nid: str) -> None:
        """The node's file changed in place (`broker.plan` rule 4): encode it afresh."""
        self._encoded.pop(nid, None)

    def node_bytes(self, nid: str, nf: NodeFile) -> bytes:
        """`encode(nf)`: the node.json git holds."""
        _, data, nice = self._node(nid, nf)
        if nice is None:
            nice = pretty(data)
            self._encoded[nid] = (nf, data, nice)
        return nice

    def node_compact(self, nid: str, nf: NodeFile) -> bytes:
        """The same JSON without the whitespace: what the KV mirror holds."""
        return self._node(nid, nf)[1]

    def encoded_of(self, nid: str, nf: NodeFile) -> bytes | None:
        """The compact JSON of `nf` if this change encoded it."""
        got = self._encoded.get(nid)
        return got[1] if got is not None and got[0] is nf else None

    def _node(self, nid: str, nf: NodeFile) -> tuple[NodeFile, bytes, bytes | None]:
        # Once per record object: records are never changed in place, bar a view's own
        # copy, which drops its encoding when it grows (`forget_encoding`).
        got = self._encoded.get(nid)
        if got is None or got[0] is not nf:
            got = self._encoded[nid] = (nf, self._grown_json(nid, nf) or compact(nf), None)
        return got

    def _grown_json(self, nid: str, nf: NodeFile) -> bytes | None:
        """`compact(nf)` for a node that only gained placements, from its record's JSON and
        theirs: msgspec writes a dict in insertion order, and the new ones are last. Encoding
        every placement a node holds, once per commit that touched it, would be most of the
        cost of planning a commit on nodes holding dozens."""
        grown = self.grown.get(nid)
        if grown is None:
            return None
        base, added = grown
        known = self.bases.get(nid)
        if known is None or known[0] is not base or len(nf.instances) != \
                len(base.instances) + len(added) or nf.draining != base.draining or \
                nf.blocked_ports != base.blocked_ports:
            return None
        data = known[1]
        cut = len(data) - len(_tail(nf))  # where the instances' closing brace is
        parts = [data[:cut]]
        sep = b"," if base.instances else b""
        for iid in added:
            parts += (sep, _enc.encode(iid), b":", _enc.encode(nf.instances[iid]))
            sep = b","
        parts.append(data[cut:])
        return b"".join(parts)


#: `compact(NodeFile(...))` up to the opening brace of its instances.
_HEAD = len(b'{"node_id":"","instances":{')


def _tail(nf: NodeFile) -> bytes:
    """The JSON of `nf` from its instances' closing brace on."""
    return compact(NodeFile(node_id="", draining=nf.draining,
                            blocked_ports=nf.blocked_ports))[_HEAD:]
