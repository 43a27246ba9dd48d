"""Free loopback ports for the servers gavel starts (nats-server, Caddy, the gateway).

Rules:
1. A port is chosen from 10000-19999: below the kernel's ephemeral range
   (`ip_local_port_range`), never inside it - a port chosen there and listened on seconds
   later may meanwhile have become any outgoing connection's local port, and then the server
   cannot bind it; below the range only another listener can take it - and below the ports
   workers assign to instances (20000 and up by default, `gavel up` from 21000).
2. Each process walks that range from a random start, one port after the other, so two
   processes choosing at once (test workers, a broker and its bench) rarely meet, and one
   process never hands the same port out twice before the walk wraps.
3. A port is handed out only if a socket can bind it on loopback right now.
4. Where the range below the ephemeral ports is too small to walk (a host that widened its
   ephemeral range), the kernel chooses: binding port 0.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

__all__ = ["free_port", "walk_range"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Below this the ports are the well-known and registered services' (rule 1).
_LOWEST = 10000
#: From here up the ports are the instances' (rule 1).
_INSTANCES = 20000
#: A range narrower than this is not walked (rule 4).
_NARROWEST = 4096


def walk_range(ephemeral: tuple[int, int] | None) -> range | None:
    """The ports rule 1 walks, given the kernel's ephemeral range; None for rule 4."""
    if ephemeral is None:
        return None
    top = min(ephemeral[0], _INSTANCES)
    if top - _LOWEST < _NARROWEST:
        return None
    return range(_LOWEST, top)


def _ephemeral() -> tuple[int, int] | None:
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


class _Walk:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ports = walk_range(_ephemeral())
        self.at = random.randrange(len(self.ports)) if self.ports else 0

    def next(self) -> int:
        if self.ports is None:
            return _kernel_port()
        with self.lock:
            for _ in range(len(self.ports)):
                port = self.ports[self.at]
                self.at = (self.at + 1) % len(self.ports)
                if _bindable(port):
                    return port
        return _kernel_port()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_WALK: _Walk | None = None


def _forget() -> None:
    """A forked child walks from a start of its own (rule 2), not its parent's."""
    global _WALK
    _WALK = None


os.register_at_fork(after_in_child=_forget)


def free_port() -> int:
    """A loopback port nothing listens on, chosen by the rules above."""
    global _WALK
    if _WALK is None:
        _WALK = _Walk()
    return _WALK.next()
