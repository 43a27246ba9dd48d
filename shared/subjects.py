"""NATS subject names, in one place.

Rule: every subject a node publishes on carries its own node id as a token, so per-node
credentials can allow exactly that node's subjects (identity is a transport property), and
the broker checks the token against the message's ``node_id``.
"""

from __future__ import annotations

import re

__all__ = [
    "API",
    "ASSIGN",
    "ASSIGN_ALL",
    "AWARD",
    "BIDS",
    "BIDS_ALL",
    "CANCEL",
    "EVENTS",
    "EVENTS_ALL",
    "HEARTBEAT",
    "HEARTBEAT_ALL",
    "HEARTBEAT_PROBE",
    "HEARTBEAT_PROBE_ALL",
    "HEARTBEAT_STREAM",
    "NODES_BUCKET",
    "NODE_INBOX",
    "REPORT",
    "REPORT_ALL",
    "RFB",
    "RFB_NODE",
    "is_node_id",
    "node_of",
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
API = f"{PREFIX}.api.{{verb}}"  # request/reply, see broker.api
ASSIGN = f"{PREFIX}.assign.{{node}}"  # worker -> broker request: AssignmentRequest -> Award
ASSIGN_ALL = f"{PREFIX}.assign.*"
#: JetStream KV bucket: key <node-id> -> that node's node.json at the active ref.
NODES_BUCKET = "gavel-nodes"
#: A worker's inbox prefix (nats-py's ``inbox_prefix``): replies to its own requests, above
#: all the broker's answers to its assignment requests (which carry secrets), land under
#: ``_INBOX_<node>.>``, a prefix per-node credentials let no other node subscribe to.
NODE_INBOX = "_INBOX_{node}"


def node_of(subject: str) -> str:
    """The node token of a per-node subject (its last token)."""
    return subject.rsplit(".", 1)[-1]


#: What a node id may be: one subject token and one path component in git.
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_node_id(token: str) -> bool:
    """True for a usable node id (letters, digits, ``-`` and ``_``; 1 to 64 of them)."""
    return _NODE_ID.fullmatch(token) is not None
