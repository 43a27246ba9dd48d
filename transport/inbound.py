"""Inbound: every message from the wire goes through one guard, whichever role hears it.

Rules:
1. Each endpoint has one typed decoder, built once. A message that does not decode (or nests
   deeper than the decoder will follow) is handed to the sink as malformed - which says "of
   another protocol version" when that is why - and dropped. What comes off the wire without
   a subscription's message around it - a KV entry, a message a stream stored, the answer to
   a request - is decoded by a `Decode`, which hands back a `Malformed` instead of raising:
   this module is the one place that catches a decoder's errors, and its caller decides
   what a refusal means there (count it, skip it, or tell an operator in one sentence).
2. Identity is the subject's: a message that names a node id other than the one its subject
   stands for (the broker's view: ``gavel.bids.<node>`` carries that node's bids) or other
   than this node (a worker's view: an award for someone else) is counted as
   "<what> for another node" and dropped. The server's permissions hold each node to its own
   subjects, so the subject is the one thing a node cannot forge.
3. The guard never logs per message and never raises: what it refuses it hands to its sink,
   which counts it and decides what reaches the log.
4. Before decoding, a `Door` holds a message to its subscription (`stray`): gavel's protocol
   has no headers and no JetStream replies, and a message is heard on a subject its
   subscription's pattern matches. What fails is no message of gavel's: a JetStream push
   delivery (a node may create consumers, and a consumer delivers wherever its creator
   said, with the subject its stream stored the message under and a ``$JS.ACK`` reply), a
   JetStream flow-control request or idle heartbeat (headers with a status line), or
   anything else with headers. It is counted under one of three fixed kinds and dropped.
5. A request is answered only under its requester's own inbox prefix (`answerable`): the
   broker publishes with an identity that may write where its requesters may not, so an
   answer sent wherever the request asked would let a node overwrite another's KV key,
   purge the bucket through the JetStream API, or have its own secrets broadcast as an
   event. A request without a reply subject, or with one outside the inbox, is counted
   (`OUTSIDE_INBOX`, or "<what> without a reply subject"), never served and never answered.
   The handler answers only on `Door.reply`, which is empty unless the rule holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from gavel.shared import subjects

__all__ = [
    "CONTROL",
    "HEADERS",
    "JETSTREAM",
    "OUTSIDE_INBOX",
    "Decode",
    "Door",
    "Guard",
    "Malformed",
    "Received",
    "Sink",
    "answerable",
    "js_answer",
    "stray",
]

#: Rule 4's kinds: what is no message of gavel's protocol at all.
JETSTREAM = "JetStream delivery"
CONTROL = "JetStream flow control or heartbeat"
HEADERS = "message with headers"
#: Rule 5's kind for a reply subject outside the requester's inbox.
OUTSIDE_INBOX = "request with a reply subject outside the requester's inbox"


class Received(Protocol):
    """What a guard reads of a message: nats-py's `Msg` and `transport.wire.Inbound` have it
    (headers: nats-py's parsed dict, or the raw header block of a direct subscription)."""

    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def reply(self) -> str: ...

    @property
    def headers(self) -> Any: ...


class Sink(Protocol):
    """Where refused messages go: `transport.rejects.Rejects`, or a worker's counters. `peer`
    is who sent it, when the guard knows better than the subject says ("" otherwise)."""

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None: ...

    def count(self, kind: str, subject: str, peer: str = "") -> None: ...


def _status(headers: Any) -> bool:
    """A status line in the header block: ``NATS/1.0 100 Idle Heartbeat`` (nats-py parses it
    into a ``Status`` entry; a direct subscription sees the raw block)."""
    if isinstance(headers, bytes | bytearray | memoryview):
        return bytes(headers[8:9]) == b" "
    return isinstance(headers, dict) and "Status" in headers


def stray(serves: Callable[[str], bool], msg: Received) -> str:
    """Rule 4: why `msg`, heard on a subscription whose pattern `serves` matches, is no message
    of gavel's ("" when it may be one)."""
    reply = msg.reply or ""
    headers = msg.headers
    if reply.startswith("$JS.FC.") or (headers and _status(headers)):
        return CONTROL
    if reply.startswith("$JS.ACK.") or not serves(msg.subject):
        return JETSTREAM
    if headers:
        return HEADERS
    return ""


def answerable(reply: str, inbox: str) -> bool:
    """Rule 5: `reply` lies under the prefix `inbox` - ``<inbox>.`` then one or more tokens,
    none of them empty or a wildcard, no whitespace or control character anywhere."""
    if not reply.startswith(inbox) or reply[len(inbox):len(inbox) + 1] != ".":
        return False
    rest = reply[len(inbox) + 1:]
    return (rest.isprintable() and " " not in rest
            and all(t and t != "*" and t != ">" for t in rest.split(".")))


class Door:
    """Rules 4 and 5 for one subscription to `serves` (a pattern, or several handled alike).

    For a request endpoint, `inbox` gives the inbox prefix the requester of a message on a
    subject answers under, and `owner` who that is (the peer a refusal is logged against).
    After a call, `refused` says why the message was refused ("" if admitted) and `reply`
    where it may be answered ("" nowhere): read them right after the call."""

    __slots__ = ("_inbox", "_no_reply", "_owner", "_pattern", "_serves", "refused", "reply",
                 "sink")

    def __init__(self, sink: Sink, serves: str | Sequence[str], *, what: str = "request",
                 inbox: Callable[[str], str] | None = None,
                 owner: Callable[[str], str] | None = None) -> None:
        self.sink = sink
        patterns = [serves] if isinstance(serves, str) else list(serves)
        matchers = [subjects.matcher(p) for p in patterns]
        self._serves: Callable[[str], bool] = matchers[0] if len(matchers) == 1 else \
            (lambda s: any(m(s) for m in matchers))
        self._pattern = " or ".join(patterns)
        self._inbox = inbox
        self._owner = owner
        self._no_reply = f"{what} without a reply subject"
        self.refused = ""
        self.reply = ""

    def __call__(self, msg: Received) -> bool:
        kind = stray(self._serves, msg)
        if kind:
            subject = msg.subject
            self._refuse(kind, subject if self._serves(subject) else
                         f"{subject} (heard on {self._pattern})", "")
            return False
        if self._inbox is None:
            self.refused = self.reply = ""
            return True
        reply = msg.reply or ""
        subject = msg.subject
        owner = self._owner(subject) if self._owner is not None else ""
        if not reply:
            self._refuse(self._no_reply, subject, owner)
            return False
        if not answerable(reply, self._inbox(subject)):
            self._refuse(OUTSIDE_INBOX, f"{subject} (reply to {reply!r})", owner)
            return False
        self.refused, self.reply = "", reply
        return True

    def _refuse(self, kind: str, subject: str, peer: str) -> None:
        self.refused, self.reply = kind, ""
        self.sink.count(kind, subject, peer)


M = TypeVar("M")

#: What decoding raises: msgspec's error, or the depth guard's (no DecodeError).
_UNDECODABLE = (msgspec.DecodeError, RecursionError)


@dataclass(frozen=True, slots=True)
class Malformed:
    """What a `Decode` refused, and the decoder's sentence saying why."""

    why: str


class Decode(Generic[M]):
    """Rule 1's typed decoder for data with no subscription's message around it: msgpack,
    or JSON (``json=True``: a KV value, a stored record). ``Decode[A | B](A | B)`` for a
    union of answers."""

    __slots__ = ("_decode",)

    def __init__(self, type_: Any, *, json: bool = False) -> None:
        decoder = msgspec.json.Decoder(type_) if json else msgspec.msgpack.Decoder(type_)
        self._decode: Callable[[bytes], M] = decoder.decode

    def __call__(self, data: bytes) -> M | Malformed:
        try:
            return self._decode(data)
        except _UNDECODABLE as exc:
            return Malformed(str(exc) or type(exc).__name__)


#: The answer to a JetStream API request (a put, a consumer made, a message read): the JSON
#: object the server said, or `Malformed` (rule 1).
js_answer: Decode[dict[str, Any]] = Decode(dict[str, Any], json=True)


class Guard(Generic[M]):
    """Decode `data` as `type_` and hold it to its subject's node (rules 1 and 2), behind
    `door` (rules 4 and 5) when given.

    `node` gives the node id a message on `subject` must carry in its ``node_id`` field:
    `gavel.shared.subjects.node_of` for a subject per node, a constant for a worker's own
    inbound subjects, or None for messages that name no node (the API's requests)."""

    __slots__ = ("_decode", "_foreign", "_node", "door", "refused", "sink", "what")

    def __init__(self, what: str, type_: type[M], sink: Sink,
                 node: Callable[[str], str] | None = None, foreign: str = "",
                 door: Door | None = None) -> None:
        self.what = what
        self.sink = sink
        self.door = door
        self._decode: Callable[[bytes], M] = msgspec.msgpack.Decoder(type_).decode
        self._node = node
        self._foreign = f"{foreign or what} for another node"
        #: Why the last message was refused ("" if it was admitted): for a handler that must
        #: answer the sender, read right after the call.
        self.refused = ""

    @property
    def reply(self) -> str:
        """Where the last message may be answered ("" nowhere; rule 5): read right after the
        call, like `refused`."""
        return self.door.reply if self.door is not None else ""

    def __call__(self, msg: Received) -> M | None:
        door = self.door
        if door is not None and not door(msg):
            self.refused = door.refused
            return None
        subject = msg.subject
        try:
            decoded = self._decode(msg.data)
        except _UNDECODABLE as exc:
            self.refused = f"malformed {self.what}: {exc}"
            self.sink.malformed(self.what, subject, exc)
            return None
        node = self._node
        if node is not None and node(subject) != _node_id(decoded):
            self.refused = self._foreign
            self.sink.count(self._foreign, subject)
            return None
        self.refused = ""
        return decoded


def _node_id(msg: Any) -> str:
    return str(getattr(msg, "node_id", ""))
