"""What this host offers and how busy it is, from psutil; and the address it is reached at.

Rules: capacity is what the operator configured (``--cpu``, ``--memory-mb``) and otherwise
what the host has (the CPUs this process may run on, total memory); ports are the size of the
node's port range. Host stats are sampled on a timer by the agent, never per request for
bids, so answering an RFB costs no system calls. The address a gateway reaches this node's
instances at is what the operator configured (``--advertise``), otherwise the host's primary
address: the source address of its default route, found without sending a packet.
"""

from __future__ import annotations

import os
import socket

import psutil

from gavel.shared.messages import Capacity, HostStats

__all__ = ["Sampler", "detect_capacity", "detected_cpus", "detected_memory_mb",
           "primary_address"]


def detected_cpus() -> int:
    """CPUs this process may use: the affinity mask where the OS has one, else all of them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, psutil.cpu_count() or 1)


def detected_memory_mb() -> int:
    return int(psutil.virtual_memory().total // (1024 * 1024))


def primary_address() -> str:
    """The host's primary IPv4 address: the one its default route leaves from (a UDP socket
    "connected" to a public address sends nothing, but the kernel picks the source address
    it would use), else its hostname's address, else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): never routed anywhere real
            address = str(s.getsockname()[0])
            if address and address != "0.0.0.0":
                return address
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def detect_capacity(
    cpu: float | None, memory_mb: int | None, port_range: tuple[int, int]
) -> Capacity:
    """Configured values win; anything left unset is detected."""
    first, last = port_range
    if not 0 < first <= last <= 65535:
        raise ValueError(f"port range must be 1..65535 with first <= last, got {port_range}")
    if cpu is not None and cpu <= 0:
        raise ValueError(f"cpu must be positive, got {cpu}")
    if memory_mb is not None and memory_mb <= 0:
        raise ValueError(f"memory_mb must be positive, got {memory_mb}")
    return Capacity(
        cpu=float(cpu) if cpu is not None else float(detected_cpus()),
        memory_mb=memory_mb if memory_mb is not None else detected_memory_mb(),
        ports=last - first + 1,
    )


class Sampler:
    """Host utilisation since the previous sample (cpu) and now (memory)."""

    def __init__(self) -> None:
        self.cpu_count = detected_cpus()
        self.memory_total_mb = detected_memory_mb()
        psutil.cpu_percent(interval=None)  # primes the counter: the first reading is 0.0

    def sample(self) -> HostStats:
        memory = psutil.virtual_memory()
        return HostStats(
            cpu_ratio=min(1.0, psutil.cpu_percent(interval=None) / 100.0),
            memory_ratio=min(1.0, memory.percent / 100.0),
            cpu_count=self.cpu_count,
            memory_total_mb=self.memory_total_mb,
        )
