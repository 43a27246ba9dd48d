"""gavel's simulator: the shared core's auctions in virtual time, against baselines.

`simulate` runs every policy of a `Scenario` on the same arrivals; `sim.cli` is the
``gavel sim`` command; `sim.replay` re-decides the auctions recorded in a state repository.
"""

from sim.policies import SimResult, simulate
from sim.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = ["Scenario", "ScenarioError", "SimResult", "load_scenario", "parse_scenario", "simulate"]
