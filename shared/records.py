"""The files in the state repository, as Structs.

Rule: ``instances/<id>.json`` is the operator's intent plus the instance's durable state;
``nodes/<node-id>/node.json`` holds what the broker placed on that node. Secret values never
appear here: a placement keeps the secret names only.
"""

from __future__ import annotations

import msgspec

from shared.award import NodeBid, NodeDecline
from shared.messages import InstanceState, Spec

__all__ = [
    "AuctionRecord",
    "InstanceRecord",
    "NodeFile",
    "Placement",
    "auction_trailer",
    "parse_trailers",
]


class Placement(msgspec.Struct, kw_only=True):
    instance_id: str
    spec: Spec
    auction_id: str
    attempt: int = 1
    ports: dict[str, int] = {}


class NodeFile(msgspec.Struct, kw_only=True):
    node_id: str
    instances: dict[str, Placement] = {}
    #: The operator drained the node: it declines every RFB (durable, survives restarts).
    draining: bool = False
    #: Ports in the node's range found taken by something outside gavel.
    blocked_ports: list[int] = []

    @property
    def empty(self) -> bool:
        return not (self.instances or self.draining or self.blocked_ports)


class InstanceRecord(msgspec.Struct, kw_only=True):
    instance_id: str
    spec: Spec
    state: InstanceState = InstanceState.QUEUED
    attempt: int = 0
    node_id: str = ""
    reason: str = ""
    detail: str = ""
    excluded: list[str] = []
    #: The operator asked to cancel; the node has `cancel_grace_s` to confirm.
    cancelling: bool = False


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


TRAILER = "Gavel-Auction: "
_record_decoder = msgspec.json.Decoder(AuctionRecord)


def auction_trailer(record: AuctionRecord) -> str:
    """One commit-message line carrying the whole auction, machine-readable."""
    return TRAILER + msgspec.json.encode(record).decode()


def parse_trailers(message: str) -> list[AuctionRecord]:
    """Every auction recorded in a commit message, in order; other lines are ignored.

    Lines split on newlines only, as git does: `str.splitlines` would also split on U+2028,
    U+0085 and friends, which JSON leaves unescaped inside a worker-supplied detail.
    """
    out: list[AuctionRecord] = []
    for raw in message.split("\n"):
        line = raw.removesuffix("\r")
        if line.startswith(TRAILER):
            out.append(_record_decoder.decode(line[len(TRAILER):]))
    return out
