"""The node agent: bids through its own strategy, runs awarded instances, reports them.

`Agent` is the whole worker (the NATS shell); `Supervisor` runs the instances through the
exec driver (`Process`), `Converger` makes them match node.json, `Sampler` measures the
host, `AgentFile` is the local state.
"""

from worker.agent import Agent
from worker.converge import Converger
from worker.driver import Process, instance_env, terminate
from worker.hoststats import Sampler, detect_capacity
from worker.localstate import AgentFile, LocalInstance
from worker.supervisor import Supervisor

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
