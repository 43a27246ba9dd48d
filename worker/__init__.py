"""The node agent: bids through its own strategy, runs awarded instances, reports them.

`Agent` is the whole worker (the NATS shell); `Supervisor` runs the instances through the
exec driver (`Process`), `Converger` makes them match node.json, `Sampler` measures the
host, `AgentFile` is the local state.
"""

from gavel.worker.agent import Agent
from gavel.worker.converge import Converger
from gavel.worker.driver import Process, instance_env, terminate
from gavel.worker.hoststats import Sampler, detect_capacity
from gavel.worker.localstate import AgentFile, LocalInstance
from gavel.worker.supervisor import Supervisor

__all__ = [
    "Agent",
    "AgentFile",
    "Converger",
    "LocalInstance",
    "Process",
    "Sampler",
    "Supervisor",
    "detect_capacity",
    "instance_env",
    "terminate",
]
