"""gavel's simulator: the shared core's auctions in virtual time, against baselines.

`simulate` runs every policy of a `Scenario` on the same arrivals; `sim.cli` is the
``gavel sim`` command; `sim.replay` re-decides the auctions recorded in a state repository.
Names load lazily so the `gavel` command line does not import numpy for other verbs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gavel.sim.policies import SimResult, simulate
    from gavel.sim.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = ["Scenario", "ScenarioError", "SimResult", "load_scenario", "parse_scenario", "simulate"]

_HOME = {"SimResult": "gavel.sim.policies", "simulate": "gavel.sim.policies",
         "Scenario": "gavel.sim.scenario", "ScenarioError": "gavel.sim.scenario",
         "load_scenario": "gavel.sim.scenario", "parse_scenario": "gavel.sim.scenario"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
