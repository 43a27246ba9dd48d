"""The cluster's own book of where each node is: the address the gateway reaches a node's
instances at, and the port range its instances' ports come from, as an operator set them
for the node's identity (`gavel auth init --node NAME=ADDR:FIRST-LAST`), never as the node
reports itself in its heartbeats.

Rules:
1. An entry is ``NAME=ADDRESS:FIRST-LAST[:/WORKDIR]``: a node id, an IP address (IPv6 in
   brackets) or a DNS name, a port range 1 <= FIRST <= LAST <= 65535, and optionally the
   absolute directory the node keeps its instances' directories in (what a files route of
   one of its instances serves from; without it, the directory the node reports). Anything
   else is one `BadInput` sentence.
2. The book is JSON, ``{"node": {"address": "...", "ports": [first, last]}}``; a book that is
   not is refused whole (a gateway must not guess which nodes to trust).
"""

from __future__ import annotations

import ipaddress
import re

import msgspec

from gavel.shared import subjects
from gavel.shared.errors import BadInput

__all__ = ["KnownNode", "decode", "encode", "entry", "usable_address"]

_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def usable_address(address: str) -> bool:
    """An IP address, or a DNS name."""
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        pass
    return 0 < len(address) <= 253 and all(_LABEL.match(x) for x in address.split("."))


class KnownNode(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Where the cluster knows a node to be."""

    address: str
    ports: tuple[int, int]
    workdir: str = ""

    def holds(self, port: int) -> bool:
        return self.ports[0] <= port <= self.ports[1]


def _checked(name: str, node: KnownNode) -> KnownNode:
    first, last = node.ports
    if not subjects.is_node_id(name):
        raise BadInput(f"node id {name!r} must be 1-64 letters, digits, '-' or '_'")
    if not usable_address(node.address):
        raise BadInput(f"node {name}'s address {node.address!r} is neither an IP address "
                       "nor a DNS name")
    if not 1 <= first <= last <= 65535:
        raise BadInput(f"node {name}'s port range {first}-{last} is not 1 <= first <= last "
                       "<= 65535")
    if node.workdir and (not node.workdir.startswith("/") or "\0" in node.workdir
                         or ".." in node.workdir.split("/")):
        raise BadInput(f"node {name}'s directory {node.workdir!r} is not an absolute path "
                       "without '..'")
    try:
        return msgspec.structs.replace(node, address=str(ipaddress.ip_address(node.address)))
    except ValueError:
        return node


def entry(text: str) -> tuple[str, KnownNode]:
    """Rule 1: ``NAME=ADDRESS:FIRST-LAST``."""
    name, eq, where = text.partition("=")
    where, slash, workdir = where.partition(":/")
    address, colon, span = where.rpartition(":")
    first, dash, last = span.partition("-")
    if not (eq and colon and dash and first.isdigit() and last.isdigit()):
        raise BadInput(f"node {text!r} is not of the form NAME=ADDRESS:FIRST-LAST[:/WORKDIR] "
                       "(node-1=10.0.0.5:21000-21099)")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return name, _checked(name, KnownNode(address=address, ports=(int(first), int(last)),
                                          workdir=f"/{workdir}".rstrip("/") if slash else ""))


def decode(data: bytes, where: str) -> dict[str, KnownNode]:
    """Rule 2; `where` names the book in the refusal."""
    try:
        book = msgspec.json.decode(data, type=dict[str, KnownNode])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadInput(f"{where} is not a node book ({exc})") from None
    try:
        return {name: _checked(name, node) for name, node in book.items()}
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def encode(book: dict[str, KnownNode]) -> bytes:
    return msgspec.json.format(msgspec.json.encode(dict(sorted(book.items()))), indent=2)
