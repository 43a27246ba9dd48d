"""NATS subject names, in one place.

Rules:
1. Every subject a node publishes on carries its own node id as a token, so per-node
   credentials can allow exactly that node's subjects (identity is a transport property),
   and the broker checks the token against the message's ``node_id``.
2. Every requester has an inbox prefix of its own: operators ``_INBOX``, node N
   ``_INBOX_N``, the broker ``_INBOX_broker`` (`broker` is no node id: `gavel auth init`
   reserves it). The broker answers a request only under its requester's prefix.
3. `matches` is NATS's own rule (``*`` one token, ``>`` one or more trailing ones): a message
   a subscription hears on a subject its pattern does not match is no message published there
   (a JetStream push delivery keeps the subject its stream stored it under).
4. Operators have names (one identity each, `transport.identity`): a subject an operator
   publishes on that must say who asks ends in the operator's name, and each named operator's
   inbox prefix is ``_GAVEL_OP.<name>``, a token no node's ``_INBOX_<node>`` can be, so no
   operator subscribes to another's answers, nor to a node's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "API",
    "API_ALL",
    "API_AS",
    "API_AS_ALL",
    "ASSIGN",
    "ASSIGN_ALL",
    "AWARD",
    "BIDS",
    "BIDS_ALL",
    "BROKER_INBOX",
    "CANCEL",
    "EVENTS",
    "EVENTS_ALL",
    "EVENTS_GET",
    "EVENTS_INFO",
    "EVENTS_STREAM",
    "EXEC",
    "EXEC_ALL",
    "EXEC_NODE",
    "HEARTBEAT",
    "HEARTBEAT_ALL",
    "HEARTBEAT_PROBE",
    "HEARTBEAT_PROBE_ALL",
    "HEARTBEAT_STREAM",
    "LEADER_BUCKET",
    "LEADER_GET",
    "LEADER_KEY",
    "LEADER_STREAM",
    "LEADER_WATCH",
    "LOGS",
    "LOGS_ALL",
    "LOGS_AS",
    "NODES_BUCKET",
    "NODES_STREAM",
    "NODE_INBOX",
    "NODE_KEY",
    "NODE_WATCH",
    "NODE_WATCH_DELETE",
    "OPERATOR",
    "OPERATOR_INBOX",
    "REPORT",
    "REPORT_ALL",
    "RFB",
    "RFB_NODE",
    "WATCH",
    "WATCH_ALL",
    "asker",
    "inbox_of",
    "is_node_id",
    "matcher",
    "matches",
    "node_of",
    "operator_inbox",
    "operator_of",
    "operator_of_inbox",
    "peer_of",
]

PREFIX = "gavel"
RFB = f"{PREFIX}.rfb"  # broadcast request for bids
RFB_NODE = f"{PREFIX}.rfb.{{node}}"  # a sampled or directed request for bids
BIDS = f"{PREFIX}.bids.{{node}}"  # worker -> broker: BidReply
BIDS_ALL = f"{PREFIX}.bids.*"
HEARTBEAT = f"{PREFIX}.hb.{{node}}"
HEARTBEAT_ALL = f"{PREFIX}.hb.*"
#: JetStream stream: the newest heartbeat of each node, kept between brokers
#: (`broker.heartbeat_stream`).
HEARTBEAT_STREAM = "gavel-heartbeats"
#: A broker's probe of its own heartbeat feed, one subject per running broker: stored in the
#: heartbeat stream beside the heartbeats, never on a heartbeat subject (whoever listens to
#: those hears nodes only), and never in another broker's way.
HEARTBEAT_PROBE = f"{PREFIX}.hbprobe.{{broker}}"
HEARTBEAT_PROBE_ALL = f"{PREFIX}.hbprobe.*"
REPORT = f"{PREFIX}.report.{{node}}"  # worker -> broker: Event about its instances
REPORT_ALL = f"{PREFIX}.report.*"
AWARD = f"{PREFIX}.award.{{node}}"  # broker -> winner: Award
CANCEL = f"{PREFIX}.cancel.{{node}}"  # broker -> node: Cancel
EVENTS = f"{PREFIX}.events.{{instance}}"  # broker -> anyone: Event
EVENTS_ALL = f"{PREFIX}.events.>"
#: JetStream stream: every event the broker publishes, bounded by age and size
#: (`transport.eventstream`); operators read it by sequence, nobody writes it but the broker.
EVENTS_STREAM = "gavel-events"
#: Reading one stored event by sequence, and the stream's bounds (operators' read calls).
EVENTS_GET = f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}"
EVENTS_INFO = f"$JS.API.STREAM.INFO.{EVENTS_STREAM}"
API = f"{PREFIX}.api.{{verb}}"  # request/reply, see broker.api
API_ALL = f"{PREFIX}.api.*"
#: A named operator's request (rule 4): the verb, then who asks.
API_AS = f"{PREFIX}.api.{{verb}}.{{operator}}"
API_AS_ALL = f"{PREFIX}.api.*.*"
ASSIGN = f"{PREFIX}.assign.{{node}}"  # worker -> broker request: AssignmentRequest -> Award
ASSIGN_ALL = f"{PREFIX}.assign.*"
#: worker -> broker request: WatchRequest -> WatchGrant (`broker.watches`): a consumer of the
#: node's own key, made by the broker, delivering into the node's own inbox.
WATCH = f"{PREFIX}.watch.{{node}}"
WATCH_ALL = f"{PREFIX}.watch.*"
#: operator -> node request: LogsRequest -> LogChunk..., LogsDone (`shared.logstream`). The
#: node answers on the asker's inbox, only as the server's response permission allows.
LOGS = f"{PREFIX}.logs.{{node}}"
LOGS_ALL = f"{PREFIX}.logs.*"
#: A named operator's log request (rule 4).
LOGS_AS = f"{PREFIX}.logs.{{node}}.{{operator}}"
#: operator -> node: ExecStart, ExecInput -> ExecOutput..., ExecExit (`shared.execstream`). The
#: last token is the operator asking (rule 4); the node answers as it answers a log request.
EXEC = f"{PREFIX}.exec.{{node}}.{{operator}}"
EXEC_NODE = f"{PREFIX}.exec.{{node}}.*"
EXEC_ALL = f"{PREFIX}.exec.*.*"
#: JetStream KV bucket: key <node-id> -> that node's node.json at the active ref.
NODES_BUCKET = "gavel-nodes"
#: The bucket's stream, and the subject a node's key is stored under.
NODES_STREAM = f"KV_{NODES_BUCKET}"
NODE_KEY = f"$KV.{NODES_BUCKET}.{{node}}"
#: Creating a consumer of one node's key, the filter in the subject (nats-server checks the
#: request's filter against it), and deleting one: the broker's calls (`broker.watches`).
NODE_WATCH = f"$JS.API.CONSUMER.CREATE.{NODES_STREAM}.{{name}}.{NODE_KEY}"
NODE_WATCH_DELETE = f"$JS.API.CONSUMER.DELETE.{NODES_STREAM}.{{name}}"
#: JetStream KV bucket of the brokers' leadership lease (`broker.lease`): one key, `leader`.
LEADER_BUCKET = "gavel-leader"
LEADER_STREAM = f"KV_{LEADER_BUCKET}"
LEADER_KEY = f"$KV.{LEADER_BUCKET}.leader"
#: Creating a consumer of the lease key, the filter in the subject (as `NODE_WATCH`).
LEADER_WATCH = f"$JS.API.CONSUMER.CREATE.{LEADER_STREAM}.{{name}}.{LEADER_KEY}"
#: Reading the lease key's last message (`broker.lease` rule 2: did a refused retry land?).
LEADER_GET = f"$JS.API.STREAM.MSG.GET.{LEADER_STREAM}"
#: A worker's inbox prefix (nats-py's ``inbox_prefix``): replies to its own requests, above
#: all the broker's answers to its assignment requests (which carry secrets), land under
#: ``_INBOX_<node>.>``, a prefix per-node credentials let no other node subscribe to.
NODE_INBOX = "_INBOX_{node}"
#: Operators' inbox prefix (nats-py's default) and the broker's own (rule 2).
OPERATOR_INBOX = "_INBOX"
BROKER_INBOX = "_INBOX_broker"
#: The operator identity every cluster has (`gavel auth init`'s ``operator.nk``): its inbox is
#: `OPERATOR_INBOX`. A named operator's is ``_GAVEL_OP.<name>`` (rule 4).
OPERATOR = "operator"
_NAMED_INBOX = "_GAVEL_OP"


def operator_inbox(name: str) -> str:
    """The inbox prefix of operator `name` (rule 4)."""
    return OPERATOR_INBOX if name == OPERATOR else f"{_NAMED_INBOX}.{name}"


def operator_of_inbox(inbox: str) -> str:
    """The operator whose inbox `inbox` lies in (rule 4): ``operator`` for `OPERATOR_INBOX`,
    "" for an inbox of no operator's."""
    head, _, rest = inbox.partition(".")
    if head == OPERATOR_INBOX:
        return OPERATOR
    name = rest.partition(".")[0]
    return name if head == _NAMED_INBOX and is_node_id(name) else ""


def operator_of(subject: str) -> str:
    """The operator a subject that ends in one names (its last token), "" when that token is
    no operator name."""
    name = subject.rsplit(".", 1)[-1]
    return name if is_node_id(name) else ""


def asker(subject: str, tokens: int) -> str:
    """Who asks on an operator's subject of a kind with `tokens` tokens when unnamed
    (``gavel.api.<verb>``: 3): `OPERATOR` when it has that many, the name in its last token
    when it has one more, "" otherwise."""
    n = subject.count(".") + 1
    if n == tokens:
        return OPERATOR
    return operator_of(subject) if n == tokens + 1 else ""


def inbox_of(name: str) -> str:
    """`operator_inbox` of an `asker` ("" no one: an inbox nothing lies under)."""
    return operator_inbox(name) if name else "\0"


def node_of(subject: str) -> str:
    """The node token of a per-node subject (its last token)."""
    return subject.rsplit(".", 1)[-1]


#: What a node id may be: one subject token and one path component in git.
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_node_id(token: str) -> bool:
    """True for a usable node id (letters, digits, ``-`` and ``_``; 1 to 64 of them)."""
    return _NODE_ID.fullmatch(token) is not None


#: The subjects whose last token is the node that sent the message.
_FROM_NODE = tuple(f"{PREFIX}.{kind}." for kind in ("bids", "hb", "report", "assign"))


def peer_of(subject: str) -> str:
    """The node a message on `subject` came from, when the subject names it ("" otherwise):
    bids, heartbeats, reports and assignment requests carry their sender's id."""
    if subject.startswith(_FROM_NODE):
        node = subject.rsplit(".", 1)[-1]
        if subject.count(".") == 2 and is_node_id(node):
            return node
    return ""


def matcher(pattern: str) -> Callable[[str], bool]:
    """`matches` for one pattern, with the common shapes (a literal subject, a prefix and
    ``*``, a prefix and ``>``) checked without splitting the subject."""
    head, _, last = pattern.rpartition(".")
    if head and "*" not in head and ">" not in head:
        if last == "*":
            n = len(head) + 1
            return lambda s: s.startswith(pattern[:n]) and len(s) > n and "." not in s[n:]
        if last == ">":
            n = len(head) + 1
            return lambda s: (s.startswith(pattern[:n]) and len(s) > n and ".." not in s
                              and not s.endswith("."))
        return pattern.__eq__  # a literal subject (a wildcard is a whole token, never part)
    return lambda s: matches(pattern, s)


def matches(pattern: str, subject: str) -> bool:
    """NATS's wildcard rule (module rule 3)."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i and all(s[i:])
        if i >= len(s) or not s[i] or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)
