"""The ports an instance really gets on this node.

Rules:
1. A port is usable when no local instance holds it and it binds, right now, on both
   127.0.0.1 and 0.0.0.0 (TCP, the probe closed at once). ``SO_REUSEADDR`` is set on the
   probe as servers set it, so a port lingering in TIME_WAIT counts as free while one that
   something listens on does not.
2. Each named port keeps the broker's choice when that port is usable. Otherwise it gets the
   *highest* usable port of the node's range that no other name of this instance has and that
   node.json does not give to another instance (nor lists as blocked). Highest, not lowest:
   the broker hands out the lowest free ports first, so the lowest free port is exactly what
   the next award (often already on its way, in the same batch commit, before node.json shows
   it) carries; taking it would push that instance onto the next one, and so on down the
   whole batch. From the top of the range a replacement collides only when the range is
   almost full, and then rule 1 resolves it once more. Names the broker sent no port for
   (an older broker) get the lowest usable ports, as the broker would have given them.
3. Only a broker-assigned port that failed the bind check while no local instance held it is
   reported as `taken` (something outside gavel has it); a clash with a local instance is
   just replaced — that port belongs to gavel and must not be blocked.
4. When the range has too few usable ports left the instance cannot run here (`short`), and
   the awarded ports found taken are still reported: the broker blocks them, or the next
   award to this node would carry them again and fail the same way.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Assigned", "assign", "bindable"]

#: Loopback and the wildcard: a server on either would clash with the instance.
_HOSTS = ("127.0.0.1", "0.0.0.0")


def bindable(port: int) -> bool:
    """True when `port` binds on every host address we check (then closed again)."""
    for host in _HOSTS:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                return False
    return True


@dataclass
class Assigned:
    """The real mapping, and the broker's ports found taken by something outside gavel."""

    ports: dict[str, int] = field(default_factory=dict)
    taken: list[int] = field(default_factory=list)
    #: Too few usable ports: the instance cannot run here (`ports` is incomplete).
    short: bool = False


def assign(names: Sequence[str], wanted: Mapping[str, int], port_range: Sequence[int], *,
           held: Collection[int], reserved: Collection[int],
           free: Callable[[int], bool] = bindable) -> Assigned:
    """One usable port per name, the broker's `wanted` ones where possible; `short` when
    the range has too few usable ports left (rule 4). `held` are the ports local instances
    hold, `reserved` those node.json gives to other instances or blocks."""
    out = Assigned()
    chosen: set[int] = set()
    rejected: set[int] = set()
    # Names the broker did not send (an old broker) come after the ones it did, in order.
    order = [n for n in names if n in wanted] + [n for n in names if n not in wanted]
    order += [n for n in wanted if n not in names]
    for name in order:
        port = wanted.get(name)
        if port is not None and port not in chosen and port not in held:
            if free(port):
                out.ports[name] = port
                chosen.add(port)
                continue
            out.taken.append(port)
        if port is not None:
            rejected.add(port)
    first, last = (port_range[0], port_range[1]) if len(port_range) == 2 else (1, 0)
    # Replacements from the top (rule 2); names the broker left out from the bottom, as the
    # broker itself would have given them.
    replace = [n for n in order if n not in out.ports and n in wanted]
    missing = [n for n in order if n not in out.ports and n not in wanted]
    for group, ports in ((replace, range(last, first - 1, -1)),
                          (missing, range(first, last + 1))):
        candidates = iter(ports)
        for name in group:
            for port in candidates:
                if port in chosen or port in held or port in reserved or port in rejected:
                    continue
                if free(port):
                    out.ports[name] = port
                    chosen.add(port)
                    break
            else:
                out.short = True
                out.taken.sort()
                return out
    out.ports = {name: out.ports[name] for name in [*names, *(n for n in order
                                                            if n not in names)]}
    out.taken.sort()
    return out
