"""Which policies a scenario runs, and running them: gavel mixes first, then the baselines.

Rules: every policy gets a fresh cluster, the same arrival stream and the same failure
script (same seed); its own randomness comes from streams named after it, so adding or
removing one policy never changes another's numbers. A mix is dealt to nodes by largest
remainder (40% of 10 nodes is exactly 4), shuffled by the policy's own stream; nodes that
join later draw their strategy by the shares. With several seeds, each policy runs once
per seed (seed, seed+1, ...); its result is the first seed's run with every steady-state
figure's interval over all of them, and is handed to ``done`` as soon as it is complete.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from gavel.shared.strategies import Strategy, make_strategy
from gavel.shared.strategies.reserve import reserve
from gavel.sim.baselines import NomadPlacer, RandomPlacer, StalePlacer
from gavel.sim.cluster import Cluster, script
from gavel.sim.distributions import pick_weighted
from gavel.sim.engine import Engine, Progress
from gavel.sim.gavel import GavelPlacer
from gavel.sim.market import Market
from gavel.sim.metrics import PolicyResult, Recorder
from gavel.sim.network import NetworkModel
from gavel.sim.placer import Placer
from gavel.sim.rebalance import Rebalancer
from gavel.sim.scenario import GavelPolicy, Rebalance, Scenario
from gavel.sim.stats import interval
from gavel.sim.steady import flatten
from gavel.sim.verdicts import Verdict, judge, questions
from gavel.sim.workload import Catalogue, stream

__all__ = ["PolicySpec", "SimResult", "assign_mix", "plan", "run_policy", "simulate"]

Build = Callable[[Cluster, Catalogue], Placer]
#: (policy, seed) -> where that run reports how far it is
Progresses = Callable[[str, int], Progress | None]


class PolicySpec(NamedTuple):
    name: str
    kind: str  # "gavel" | "baseline"
    description: str
    build: Build
    #: re-auction of running work (`sim.rebalance`), for a gavel policy that asks for it
    rebalance: Rebalance | None = None


class SimResult(msgspec.Struct, kw_only=True):
    scenario: str
    description: str
    seed: int
    nodes: int
    total_nodes: int
    duration_s: float
    shapes: list[str]
    policies: list[PolicyResult]
    #: every seed run, the first of them `seed`
    seeds: list[int] = []
    #: the steady-state window the steady figures and verdicts use
    window_s: tuple[float, float] = (0.0, 0.0)
    verdicts: list[Verdict] = []


def assign_mix(policy: GavelPolicy, initial: int, total: int,
               rng: random.Random) -> tuple[list[Strategy], list[str]]:
    """(strategy, label) per node: exact shares over the initial nodes, drawn for joiners."""
    made = [make_strategy(e.strategy, e.params or None) for e in policy.mix]
    shares = [e.share for e in policy.mix]
    whole = sum(shares)
    exact = [s / whole * initial for s in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: initial - sum(counts)]:
        counts[i] += 1
    dealt = [i for i, c in enumerate(counts) for _ in range(c)]
    rng.shuffle(dealt)
    cumulative = [sum(shares[: i + 1]) for i in range(len(shares))]
    dealt += [pick_weighted(rng, cumulative) for _ in range(total - initial)]
    return [made[i] for i in dealt], [policy.mix[i].label for i in dealt]


class Production(Placer):
    """A policy run by `sim.market` (``auctioneer = "production"``): it never places."""

    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 strategies: list[Strategy], labels: list[str], policy: GavelPolicy) -> None:
        super().__init__(name, cluster, catalogue, strategies, labels)
        self.policy = policy


def _describe(policy: GavelPolicy) -> str:
    whole = sum(e.share for e in policy.mix)
    parts = ", ".join(f"{e.share / whole:.0%} {e.label}" for e in policy.mix)
    how = "broadcast" if policy.mode == "broadcast" else f"sample d={policy.d}"
    if policy.reserve_for:
        how += f"; nodes reserved for {', '.join(policy.reserve_for)}"
    if policy.auctioneer == "production":
        how += "; the production auctioneer"
    if policy.rebalance is not None:
        r = policy.rebalance
        how += (f"; re-auction every {r.every_s:g} s ({r.sample} looked at, margin "
                f"{r.margin:g}, {r.budget} moves a minute)")
    return f"gavel bidding ({parts}); {how}"


def reserved(strategies: list[Strategy], cluster: Cluster, keys: list[str]) -> list[Strategy]:
    """Each node's strategy reserved for the `keys` it carries; one wrapper per strategy
    and key set, so nodes alike stay alike to the order book's memo (`sim.book` rule 1)."""
    made: dict[tuple[int, frozenset[str]], Strategy] = {}
    out: list[Strategy] = []
    for strategy, node in zip(strategies, cluster.nodes, strict=True):
        kept = frozenset(k for k in keys if k in node.labels)
        if not kept:
            out.append(strategy)
            continue
        key = (id(strategy), kept)
        if key not in made:
            made[key] = reserve(strategy, kept)
        out.append(made[key])
    return out


def plan(s: Scenario, seed: int, naive: bool = False) -> list[PolicySpec]:
    specs: list[PolicySpec] = []
    deadline = s.deadline_s
    for p in s.gavel:
        name = f"gavel:{p.name}"

        def gavel(cluster: Cluster, catalogue: Catalogue, p: GavelPolicy = p,
                  name: str = name) -> Placer:
            strategies, labels = assign_mix(p, cluster.initial, len(cluster),
                                            random.Random(f"{seed}/mix/{name}"))
            if p.reserve_for:
                strategies = reserved(strategies, cluster, p.reserve_for)
            if p.auctioneer == "production":
                return Production(name, cluster, catalogue, strategies, labels, p)
            net = NetworkModel(s.network.latency_s, s.network.loss, deadline,
                               random.Random(f"{seed}/network/{name}"))
            return GavelPlacer(name, cluster, catalogue, strategies, labels, network=net,
                               rng=random.Random(f"{seed}/placer/{name}"), mode=p.mode,
                               d=p.d, naive=naive)

        specs.append(PolicySpec(name, "gavel", _describe(p), gavel, p.rebalance))
    d = s.baselines.d

    def fresh(name: str, mode: str) -> Build:
        def build(cluster: Cluster, catalogue: Catalogue) -> Placer:
            ll = make_strategy("least-loaded")
            return GavelPlacer(name, cluster, catalogue, [ll] * len(cluster),
                               [ll.name] * len(cluster), network=NetworkModel.perfect(),
                               rng=random.Random(f"{seed}/placer/{name}"), mode=mode, d=d,
                               omniscient=True, naive=naive)
        return build

    baselines: dict[str, tuple[str, Build]] = {
        "central-fresh": ("central least-loaded on perfectly fresh state",
                          fresh("central-fresh", "broadcast")),
        "central-stale": (f"central least-loaded on heartbeat state "
                          f"(up to {s.timing.heartbeat_s:g} s old)",
                          lambda c, cat: StalePlacer("central-stale", c, cat,
                                                     s.timing.heartbeat_s)),
        "random": ("a random node that fits",
                   lambda c, cat: RandomPlacer("random", c, cat,
                                               random.Random(f"{seed}/placer/random"))),
        "power-of-d": (f"least-loaded of {d} random nodes", fresh("power-of-d", "sample")),
        "nomad-binpack": ("Nomad's binpack score over log2(n) random feasible nodes",
                          lambda c, cat: NomadPlacer("nomad-binpack", c, cat,
                                                     random.Random(f"{seed}/placer/nomad"))),
    }
    for key in s.baselines.run:
        description, build = baselines[key]
        specs.append(PolicySpec(key, "baseline", description, build))
    return specs


def run_policy(s: Scenario, seed: int, spec: PolicySpec,
               progress: Progress | None = None) -> PolicyResult:
    cluster = Cluster(s)
    catalogue, arrivals = stream(s, seed)
    placer = spec.build(cluster, catalogue)
    recorder = Recorder(spec.name, spec.kind, spec.description, cluster, catalogue,
                        placer.labels, [c.name for c in s.workload.classes], s.window)
    if isinstance(placer, Production):  # the broker's auctioneer in virtual time
        return Market(s, placer.policy, cluster, catalogue, arrivals, script(s, seed),
                      placer.strategies, recorder, seed, progress).run()
    rebalancer = None if spec.rebalance is None else Rebalancer(
        spec.rebalance, [c.name for c in s.workload.classes], cluster, catalogue, placer,
        random.Random(f"{seed}/rebalance/{spec.name}"))
    engine = Engine(s, cluster, catalogue, arrivals, script(s, seed), placer, recorder,
                    progress, rebalancer)
    return engine.run()


def simulate(s: Scenario, seed: int, only: set[str] | None = None,
             progress: Progresses | None = None, naive: bool = False, seeds: int = 1,
             done: Callable[[SimResult], None] | None = None) -> SimResult:
    """Every policy of `s` on the same arrivals, for `seeds` seeds from `seed`; `only`
    keeps the named policies; `done` sees the result after each policy completes."""
    catalogue = Catalogue(s.workload.classes)
    result = SimResult(scenario=s.name, description=s.description, seed=seed,
                       nodes=s.initial_nodes(), total_nodes=s.total_nodes(),
                       duration_s=s.duration_s,
                       shapes=[shape.describe() for shape in catalogue.shapes],
                       policies=[], seeds=[seed + k for k in range(seeds)],
                       window_s=s.window)
    plans = [plan(s, k, naive) for k in result.seeds]
    asked = questions([c.name for c in s.workload.classes])
    for i, spec in enumerate(plans[0]):
        if only is not None and spec.name not in only:
            continue
        runs = [run_policy(s, k, specs[i], progress(spec.name, k) if progress else None)
                for k, specs in zip(result.seeds, plans, strict=True)]
        figures = [flatten(r.steady) for r in runs]
        first = runs[0]
        first.intervals = {key: interval([f[key] for f in figures]) for key in figures[0]}
        result.policies.append(first)
        result.verdicts = [judge(q, result.policies, seeds) for q in asked]
        if done is not None:
            done(result)
    return result
