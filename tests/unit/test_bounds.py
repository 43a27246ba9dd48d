"""The heartbeat bound is never below what a node may truthfully send: the largest
heartbeat a node with a given placement can list (every id at its longest, every state at
its longest, every port name at 32 characters, twice its placements and the spare) fits."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.bounds import (
    FIXED_BYTES,
    SPARE_INSTANCES,
    SPARE_PORTS,
    HeartbeatBound,
    heartbeat_bound,
)
from gavel.shared.messages import Capacity, Heartbeat, HostStats, InstanceReport

_enc = msgspec.msgpack.Encoder()


def test_a_node_with_nothing_placed_may_send_a_small_heartbeat_only() -> None:
    b = heartbeat_bound(0, 0, 0)
    assert b.instances == SPARE_INSTANCES
    assert FIXED_BYTES < b.size < 4 * FIXED_BYTES
    assert heartbeat_bound(10, 0, 0) == HeartbeatBound(size=b.size + 20 * 320,
                                                       instances=20 + SPARE_INSTANCES)


@given(placed=st.integers(0, 300), ports_each=st.integers(0, 4), blocked=st.integers(0, 50))
def test_the_largest_truthful_heartbeat_fits(placed: int, ports_each: int,
                                             blocked: int) -> None:
    bound = heartbeat_bound(placed, placed * ports_each, blocked)
    listed = bound.instances
    ports = 2 * placed * ports_each + SPARE_PORTS  # every port it may list, spread over them
    reports = [InstanceReport(
        instance_id=("i" * 128 + f"-{k:06d}"), state="provisioning", pid=2**31 - 1,
        attempt=100, health="unhealthy", restarts=2**31, ports={f"{p:05d}".rjust(32, "p"): 65535
                            for p in range(k, ports, listed)})
        for k in range(listed)]
    hb = Heartbeat(node_id="n" * 64, seq=2**62, strategy="s" * 64,
                   labels={f"label-{k:02d}" * 4: "v" * 200 for k in range(64)},
                   capacity=Capacity(cpu=1e308, memory_mb=2**62, ports=65535),
                   committed=Capacity(cpu=1e308, memory_mb=2**62, ports=65535),
                   stats=HostStats(cpu_ratio=1.0, memory_ratio=1.0, cpu_count=2**31,
                                   memory_total_mb=2**62),
                   draining=True, instances=reports, port_range=[1, 65535],
                   freed_ports=[65535] * blocked, advertise="a" * 253, workdir="w" * 4096)
    assert len(_enc.encode(hb)) <= bound.size
