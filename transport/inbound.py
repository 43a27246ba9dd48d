"""Inbound: every message from the wire goes through one guard, whichever role hears it.

Rules:
1. Each endpoint has one typed decoder, built once. A message that does not decode (or nests
   deeper than the decoder will follow) is handed to the sink as malformed - which says "of
   another protocol version" when that is why - and dropped.
2. Identity is the subject's: a message that names a node id other than the one its subject
   stands for (the broker's view: ``gavel.bids.<node>`` carries that node's bids) or other
   than this node (a worker's view: an award for someone else) is counted as
   "<what> for another node" and dropped. The server's permissions hold each node to its own
   subjects, so the subject is the one thing a node cannot forge.
3. The guard never logs per message and never raises: what it refuses it hands to its sink,
   which counts it and decides what reaches the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

__all__ = ["Guard", "Sink"]


class Sink(Protocol):
    """Where refused messages go: `transport.rejects.Rejects`, or a worker's counters."""

    def malformed(self, what: str, subject: str, exc: Exception) -> None: ...

    def count(self, kind: str, subject: str) -> None: ...


M = TypeVar("M")


class Guard(Generic[M]):
    """Decode `data` as `type_` and hold it to its subject's node (rules 1 and 2).

    `node` gives the node id a message on `subject` must carry in its ``node_id`` field:
    `gavel.shared.subjects.node_of` for a subject per node, a constant for a worker's own
    inbound subjects, or None for messages that name no node (the API's requests)."""

    __slots__ = ("_decode", "_foreign", "_node", "refused", "sink", "what")

    def __init__(self, what: str, type_: type[M], sink: Sink,
                 node: Callable[[str], str] | None = None, foreign: str = "") -> None:
        self.what = what
        self.sink = sink
        self._decode: Callable[[bytes], M] = msgspec.msgpack.Decoder(type_).decode
        self._node = node
        self._foreign = f"{foreign or what} for another node"
        #: Why the last message was refused ("" if it was admitted): for a handler that must
        #: answer the sender, read right after the call.
        self.refused = ""

    def __call__(self, subject: str, data: bytes) -> M | None:
        try:
            msg = self._decode(data)
        except (msgspec.DecodeError, RecursionError) as exc:  # depth guard: no DecodeError
            self.refused = f"malformed {self.what}"
            self.sink.malformed(self.what, subject, exc)
            return None
        node = self._node
        if node is not None and node(subject) != _node_id(msg):
            self.refused = self._foreign
            self.sink.count(self._foreign, subject)
            return None
        self.refused = ""
        return msg


def _node_id(msg: Any) -> str:
    return str(getattr(msg, "node_id", ""))
