"""What the gateway trusts a node's routes to lead to: the node book an operator wrote
(`gavel.shared.nodebook`) and the ports that belong to the cluster itself, which no route
may lead to (`gavel.shared.routes` rule 8).

Rule: the cluster's own ports are every port the gateway can see the cluster use - Caddy's
listeners and a TCP admin API, the NATS servers it connects to, its own metrics - and those
an operator names (``reserved_ports``: the dashboard, the broker's metrics, anything else a
node's port range could reach on a shared host).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from gavel.shared.nodebook import KnownNode
from gavel.transport import nodebook

__all__ = ["cluster_ports", "load_book"]


def _port_of(url: str, default: int) -> int | None:
    try:
        return urlsplit(url).port or default
    except ValueError:
        return None


def cluster_ports(*, nats: Iterable[str], admin: str, listen: Iterable[str],
                  metrics_port: int | None, reserved: Iterable[int]) -> frozenset[int]:
    ports = set(reserved)
    ports.update(p for u in nats if (p := _port_of(u, 4222)) is not None)
    if not admin.startswith("unix://"):
        port = _port_of(admin, 2019)
        if port is not None:
            ports.add(port)
    ports.update(int(a.rpartition(":")[2]) for a in listen if a.rpartition(":")[2].isdigit())
    if metrics_port:
        ports.add(metrics_port)
    return frozenset(ports)


def load_book(path: str) -> dict[str, KnownNode] | None:
    """The node book at `path` (None for ""): `BadInput` when it cannot be read or is none."""
    return nodebook.load(Path(path)) if path else None
