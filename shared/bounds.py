"""How big a heartbeat a node can truthfully send, from what git places on it.

Rules:
1. A node lists the instances it holds. It holds what git places on it, what it is still
   stopping after git moved it away (at most as many again) and survivors it adopted from
   before (a few): so at most twice the most git has placed on it, plus `SPARE_INSTANCES`.
   A heartbeat listing more is refused after decoding.
2. Before decoding, a heartbeat is refused by its size alone: what it may carry besides
   its instances (`FIXED_BYTES`: labels, strategy, host stats, capacity), plus the most
   an instance report can take (`INSTANCE_BYTES`) for each instance rule 1 allows and
   `PORT_BYTES` for each port, plus a few bytes for each blocked port it may report free.
   The check costs a length and a lookup, so a node's lie costs the broker almost nothing.
3. No heartbeat is larger than `HEARTBEAT_MAX_BYTES` (NATS's default `max_payload`): the
   heartbeat stream stores none above it, so a node whose heartbeat grows past it is not
   heard at all.
4. A heartbeat carries at most `ENDED_MAX` recent ends (`Heartbeat.ended`), each at most
   `ENDED_BYTES`; a node keeps an end's detail under `ENDED_DETAIL` characters there.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "ENDED_BYTES",
    "ENDED_DETAIL",
    "ENDED_MAX",
    "FIXED_BYTES",
    "HEARTBEAT_MAX_BYTES",
    "INSTANCE_BYTES",
    "PORT_BYTES",
    "SPARE_INSTANCES",
    "SPARE_PORTS",
    "HeartbeatBound",
    "heartbeat_bound",
]

#: Rule 3: 1 MiB, the payload limit of a nats-server left at its defaults.
HEARTBEAT_MAX_BYTES = 1 << 20
#: Rule 2: a heartbeat without instances (labels and all), generously.
FIXED_BYTES = 64 << 10
#: Rule 2: one instance report without its ports: an id (an operator's is at most 128
#: characters, with ``-N`` for a batch), its state, pid, attempt, health, restarts, usage and the
#: field names.
INSTANCE_BYTES = 320
#: Rule 2: one port of an instance report: its name (at most 32 characters) and number.
PORT_BYTES = 40
#: Rule 1: instances (and ports) a node may list beyond twice its most.
SPARE_INSTANCES = 64
SPARE_PORTS = 64
#: Rule 2: a port number in the list of blocked ports found free again.
_FREED_PORT_BYTES = 5
#: Rule 4: recent ends a heartbeat carries, the characters of each one's detail, and the
#: most one takes (its id, type, reason, detail, ports and the field names).
ENDED_MAX = 16
ENDED_DETAIL = 2048
ENDED_BYTES = 4096


class HeartbeatBound(NamedTuple):
    """The most a node's heartbeat may be (bytes) and list (instances)."""

    size: int
    instances: int


def heartbeat_bound(placed: int, ports: int, blocked: int) -> HeartbeatBound:
    """Rules 1 and 2 for a node git has placed at most `placed` instances holding `ports`
    ports on, and whose node.json blocks `blocked` ports."""
    instances = 2 * placed + SPARE_INSTANCES
    size = (FIXED_BYTES + ENDED_MAX * ENDED_BYTES + instances * INSTANCE_BYTES
            + (2 * ports + SPARE_PORTS) * PORT_BYTES + blocked * _FREED_PORT_BYTES)
    return HeartbeatBound(size=size, instances=instances)
