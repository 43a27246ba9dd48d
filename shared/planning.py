"""`gavel plan`: what a spec would do, asked of the nodes and decided by the award rule, with
nothing committed or reserved - and the version index a later deploy checks.

Rules:
1. A plan is a dry run of the real thing: its RFB says so (`RFB.dry_run`), the nodes answer
   as for a real request, and the broker decides with the award rule of every auction
   (`shared.auction`); it writes nothing to git and reserves nothing, so the next real
   auction sees the cluster as if the plan had never been.
2. The version index of a service is a fingerprint of the operator's intent in its record:
   every version's number and spec, the version it runs, its count and whether it is
   stopped - not the keeper's progress (deployment state, health), so a rollout moving on
   does not make a plan stale, while any deploy, scale, stop or rollback does. It is a
   fingerprint rather than a counter because it needs nothing stored or walked: the same
   record always gives the same index. A service that does not exist has index 0, so
   ``--check-index 0`` deploys only a new service (as Nomad's).
3. The diff of a deploy lists every field of the spec that differs from the running
   version's, by dotted name (a nested table field by field), values as JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec

from gavel.shared.messages import Message, Spec
from gavel.shared.records import AuctionRecord, ServiceRecord

__all__ = ["FieldChange", "PlanReply", "PlanRequest", "spec_diff", "version_index"]

#: Placements a plan answer lists in full (the rest are counted): a plan of a thousand
#: replicas is still an answer the server's max payload lets through.
PLACEMENTS_SHOWN = 100


class PlanRequest(Message, tag="plan"):
    """Where would `spec` go, and what would it change? Nothing is committed."""

    spec: Spec


class FieldChange(msgspec.Struct, kw_only=True):
    """One field of a spec that a deploy would change (rule 3)."""

    field: str
    old: str
    new: str


class PlanReply(Message, tag="planned"):
    name: str
    #: ``job``, ``service`` or ``system``.
    type: str
    #: The service's version index now (rule 2; 0 for a job or a new service).
    index: Annotated[int, msgspec.Meta(ge=0)] = 0
    #: The version the service runs now (0: none) and the one a deploy would make.
    version: int = 0
    next_version: int = 0
    #: What a deploy would change: the spec's fields, and whether anything changes at all.
    changes: list[FieldChange] = msgspec.field(default_factory=list)
    changed: bool = True
    #: Replicas a deploy would stop (replaced by the new version, or scaled down).
    stops: list[str] = msgspec.field(default_factory=list)
    #: Each instance that would be placed: its auction as `gavel why` shows one (the bids,
    #: declines and silences of its shape), `winner` "" where none would take it.
    placements: list[AuctionRecord] = msgspec.field(default_factory=list)
    #: How many instances would be placed in all (more than `placements` lists).
    placements_total: int = 0
    #: A job's instances in all (an array's `count`: `placements_total` is its first wave).
    count: int = 0
    warnings: list[str] = msgspec.field(default_factory=list)


def version_index(svc: ServiceRecord | None) -> int:
    """Rule 2: the service's version index (0: no such service)."""
    if svc is None:
        return 0
    intent = (svc.name, [(v.version, v.spec) for v in svc.versions], svc.version, svc.count,
              svc.stopped)
    digest = hashlib.blake2b(msgspec.msgpack.encode(intent), digest_size=6).digest()
    return int.from_bytes(digest, "big") or 1  # 48 bits: exact in JSON's numbers too


def spec_diff(old: Spec, new: Spec) -> list[FieldChange]:
    """Rule 3: the fields of `new` that differ from `old`, in the spec's field order."""
    return list(_diff("", old, new))


def _diff(prefix: str, old: Any, new: Any) -> Iterator[FieldChange]:
    for name in old.__struct_fields__:
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if isinstance(a, msgspec.Struct) and type(a) is type(b):
            yield from _diff(f"{prefix}{name}.", a, b)
        else:
            yield FieldChange(field=f"{prefix}{name}", old=_json(a), new=_json(b))


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()
