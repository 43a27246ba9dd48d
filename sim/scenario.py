"""The scenario file: what cluster, what workload, what network, which policies.

Rules: a scenario is decoded from TOML into Structs that forbid unknown fields, so a typo is
an error and never a silently ignored key; every problem becomes a `ScenarioError` whose
message is one sentence naming the field and what was expected (the CLI exits 2 with it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gavel.shared.affinity import Affinity
from gavel.shared.reauction import Settings
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.sim.distributions import Choice, Constant, DurationDist, LatencyDist

__all__ = [
    "BASELINES",
    "Baselines",
    "Burst",
    "Drain",
    "Fail",
    "GavelPolicy",
    "Join",
    "Market",
    "MixEntry",
    "Network",
    "NodeGroup",
    "Rebalance",
    "Scenario",
    "ScenarioError",
    "Workload",
    "WorkloadClass",
    "load_scenario",
    "parse_scenario",
]

PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9_.-]*$")]

#: Baseline policies, each run on the same arrivals as the gavel policies.
BaselineName = Literal["central-fresh", "central-stale", "random", "power-of-d", "nomad-binpack"]
BASELINES: tuple[BaselineName, ...] = (
    "central-fresh", "central-stale", "random", "power-of-d", "nomad-binpack")


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class NodeGroup(_Config, kw_only=True):
    count: PosInt
    cpu: PosFloat
    memory_mb: PosInt
    ports: NonNegInt = 1000
    labels: dict[str, str] = {}
    #: host-measured load from outside gavel (a constant ratio): least-loaded sees it,
    #: spread does not.
    background_cpu: Ratio = 0.0
    background_memory: Ratio = 0.0


class MixEntry(_Config, kw_only=True):
    strategy: str
    share: PosFloat
    params: dict[str, float] = {}
    #: how reports name this entry (default: the strategy name)
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.strategy


class Rebalance(Settings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Re-auction of running work (`shared.reauction`'s settings, and what the simulator
    must be told of the workload): a ``rebalance = { ... }`` on a ``[[gavel]]`` policy."""

    #: the workload classes whose instances are service replicas (they may move); the
    #: others are jobs, which stay (`shared.reauction` rule 1)
    classes: list[Label] = msgspec.field(default_factory=lambda: ["service"])
    #: how long a move holds room on both nodes: the new copy starts, must be healthy this
    #: long, then the old one stops (a service's ``update.min_healthy_s``)
    settle_s: NonNegFloat = 10.0


class GavelPolicy(_Config, kw_only=True):
    name: Label
    mix: Annotated[list[MixEntry], msgspec.Meta(min_length=1)]
    #: broadcast asks every eligible node; sample asks d random eligible nodes
    mode: Literal["broadcast", "sample"] = "broadcast"
    d: PosInt = 2
    #: Label keys the nodes carrying them keep themselves for (`shared.strategies.reserve`):
    #: each such node runs its strategy reserved for the keys it carries, as a worker with
    #: ``reserve_for`` does.
    reserve_for: list[Label] = []
    #: fast: one request per round on the order book, awards at once (`sim.gavel`);
    #: production: the broker's own auctioneer in virtual time (`sim.market`, `market`)
    auctioneer: Literal["fast", "production"] = "fast"
    #: re-auction running work that may move (`sim.rebalance`; the fast auctioneer only)
    rebalance: Rebalance | None = None


class Market(_Config, kw_only=True):
    """What the production auctioneer (`auctioneer = "production"`) is run with: the
    broker's knobs and the world the fast path leaves out, each at production's default."""

    batch_max: PosInt = 256
    batch_wait_s: NonNegFloat = 0.0
    max_auctions: PosInt = 16
    #: the auctioneer tunes batch_max, max_auctions and the commit gap to the load itself
    #: (`shared.tuning`, as the broker does when they are not given); the two above are
    #: then unused
    tune: bool = False
    #: how long a round's commit takes to land; its awards stay reserved until then
    commit_lag_s: NonNegFloat = 0.02
    #: how long a node's view of its own state lags its awards (default: timing.mirror_s)
    staleness_s: NonNegFloat | None = None
    #: the chance each RFB, bid, award and acknowledgement is lost (default: network.loss)
    loss: Ratio | None = None
    #: node restarts over the run, at random times: each node is silent for restart_s and
    #: rejoins under its own id, keeping its instances
    restarts: NonNegInt = 0
    restart_s: PosFloat = 10.0
    #: the chance a node fails to start an instance it was awarded
    provisioning_failure: Ratio = 0.0


class Baselines(_Config, kw_only=True):
    run: list[BaselineName] = msgspec.field(default_factory=lambda: list(BASELINES))
    #: how many nodes power-of-d asks
    d: PosInt = 2


class WorkloadClass(_Config, kw_only=True):
    name: Label
    weight: PosFloat = 1.0
    cpu: PosFloat | Choice = 0.5
    memory_mb: PosFloat | Choice = 512.0
    ports: NonNegInt = 0
    labels: dict[str, str] = {}
    #: soft preferences for nodes by label (``[[workload.classes.affinities]]``, as a spec's
    #: ``[[affinities]]``): the award ranks bids with them (`shared.affinity`) in gavel's
    #: policies; the baselines place without them
    affinities: list[Affinity] = []
    duration_s: DurationDist = Constant(value=300.0)


class Burst(_Config, kw_only=True):
    at_s: NonNegFloat
    count: PosInt
    #: the burst's arrivals are spread evenly over this window (0: all at once)
    over_s: NonNegFloat = 0.0
    #: which class the burst is made of (default: drawn like Poisson arrivals)
    workload_class: str = ""


class Workload(_Config, kw_only=True):
    #: Poisson arrivals per second of virtual time
    rate: NonNegFloat
    classes: Annotated[list[WorkloadClass], msgspec.Meta(min_length=1)]
    bursts: list[Burst] = []
    max_arrivals: PosInt | None = None
    #: placement attempts per instance (a failure-driven re-placement uses one)
    attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3
    #: an instance still queued after this long is abandoned (default: it waits forever)
    patience_s: PosFloat | None = None


class Network(_Config, kw_only=True):
    latency_s: LatencyDist = Constant(value=0.005)
    #: probability that a reply is lost
    loss: Ratio = 0.0
    #: the bid deadline (default: timing.bid_deadline_s)
    deadline_s: PosFloat | None = None


class _Event(_Config, tag_field="kind", kw_only=True):
    at_s: NonNegFloat


class Fail(_Event, tag="fail", kw_only=True):
    """Nodes crash: silent at once, offline (leases expire) after timing.offline_s."""

    count: PosInt = 1
    #: failures spread evenly over this window (a storm); 0: all at once
    over_s: NonNegFloat = 0.0
    #: fail these nodes by id instead of random ones
    nodes: list[str] = []


class Drain(_Event, tag="drain", kw_only=True):
    count: PosInt = 1
    nodes: list[str] = []
    #: re-place the drained nodes' instances at once (else they finish where they are)
    migrate: bool = True


class Join(_Event, tag="join", kw_only=True):
    group: NodeGroup


Event = Fail | Drain | Join


class Scenario(_Config, kw_only=True):
    name: Label
    description: str = ""
    seed: int = 1
    #: virtual seconds simulated; arrivals stop here
    duration_s: PosFloat
    #: metrics sampling interval (default: duration_s / 200)
    sample_s: PosFloat | None = None
    #: the warm-up the steady-state metrics leave out (default: a fifth of duration_s)
    warmup_s: NonNegFloat | None = None
    timing: Timing = Timing()
    nodes: Annotated[list[NodeGroup], msgspec.Meta(min_length=1)]
    gavel: Annotated[list[GavelPolicy], msgspec.Meta(min_length=1)]
    baselines: Baselines = msgspec.field(default_factory=Baselines)
    workload: Workload
    network: Network = msgspec.field(default_factory=Network)
    market: Market = msgspec.field(default_factory=Market)
    events: list[Event] = []

    @property
    def deadline_s(self) -> float:
        return self.network.deadline_s or self.timing.bid_deadline_s

    @property
    def interval_s(self) -> float:
        return self.sample_s or self.duration_s / 200.0

    @property
    def window(self) -> tuple[float, float]:
        """The steady-state window: from the end of the warm-up to the end of the run."""
        warmup = self.duration_s / 5.0 if self.warmup_s is None else self.warmup_s
        return warmup, self.duration_s

    def initial_nodes(self) -> int:
        return sum(g.count for g in self.nodes)

    def total_nodes(self) -> int:
        return self.initial_nodes() + sum(e.group.count for e in self.events
                                          if isinstance(e, Join))


class ScenarioError(ValueError):
    """A scenario that cannot run; the message is the one sentence the operator reads."""


def load_scenario(path: Path) -> Scenario:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file ({exc.strerror}).") from None
    return parse_scenario(raw, str(path))


def parse_scenario(raw: bytes, origin: str = "scenario") -> Scenario:
    try:
        scenario = msgspec.toml.decode(raw, type=Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"{origin}: {_sentence(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise ScenarioError(f"{origin}: not valid TOML ({exc}).") from None
    problem = _check(scenario)
    if problem:
        raise ScenarioError(f"{origin}: {problem}")
    return scenario


def _sentence(message: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.nodes[0].count`" as one sentence."""
    text, _, where = message.partition(" - at `")
    field = where.rstrip("`").removeprefix("$").lstrip(".") or "the top level"
    if text.startswith("Object contains unknown field"):
        name = text.split("`")[1]
        path = f"{field}.{name}" if where else name
        return f"field {path} is not a known field (check its spelling)."
    if text.startswith("Object missing required field"):
        name = text.split("`")[1]
        path = f"{field}.{name}" if where else name
        return f"field {path} is required but missing."
    return f"field {field}: {text[0].lower()}{text[1:]}."


def _check(s: Scenario) -> str | None:
    """Rules the types cannot say; the first broken one, as a sentence."""
    timing = s.timing.problem()
    if timing:
        return timing
    names = [g.name for g in s.gavel]
    if len(set(names)) != len(names):
        return "field gavel.name must be unique across [[gavel]] policies."
    for i, policy in enumerate(s.gavel):
        for j, entry in enumerate(policy.mix):
            try:
                make_strategy(entry.strategy, entry.params or None)
            except ValueError as exc:
                return f"field gavel[{i}].mix[{j}]: {exc}."
    classes = {c.name for c in s.workload.classes}
    for i, policy in enumerate(s.gavel):
        if policy.rebalance is None:
            continue
        if policy.auctioneer == "production":
            return (f"field gavel[{i}].rebalance: re-auction runs on the fast auctioneer "
                    "only (auctioneer = \"fast\").")
        unknown = sorted(set(policy.rebalance.classes) - classes)
        if unknown:
            return (f"field gavel[{i}].rebalance.classes: expected workload classes "
                    f"({', '.join(sorted(classes))}), got {unknown[0]!r}.")
    for i, cls in enumerate(s.workload.classes):
        for field in ("cpu", "memory_mb"):
            size = getattr(cls, field)
            if isinstance(size, Choice) and (problem := size.problem()):
                return f"field workload.classes[{i}].{field}: {problem}."
    for i, burst in enumerate(s.workload.bursts):
        if burst.workload_class and burst.workload_class not in classes:
            return (f"field workload.bursts[{i}].workload_class: expected one of "
                    f"{', '.join(sorted(classes))}, got {burst.workload_class!r}.")
    if s.sample_s is not None and s.sample_s > s.duration_s:
        return "field sample_s: expected at most duration_s."
    if s.warmup_s is not None and s.warmup_s >= s.duration_s:
        return "field warmup_s: expected less than duration_s (the steady state must last)."
    if not math.isfinite(s.duration_s):
        return "field duration_s: expected a finite number of seconds."
    return None
