"""The placement policy contract: one object per policy run decides where each request goes.

Rules: a placer reads node state only through the `Cluster` it is handed and is told of
every change with `changed` (``why`` says what happened, for placers that see the world
late); it returns an `Outcome` and never changes node state itself — the engine applies the
award. All of its randomness comes from the `random.Random` it is constructed with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from gavel.shared.auction import Unschedulable
from gavel.shared.strategies import Strategy, make_strategy
from gavel.sim.book import Books
from gavel.sim.cluster import Cluster
from gavel.sim.rounds import reduced_declines, run_round
from gavel.sim.workload import Catalogue

__all__ = ["Outcome", "Placer", "Why"]


class Why:
    COMMIT = "commit"
    RELEASE = "release"
    DRAIN = "drain"
    JOIN = "join"
    FAIL = "fail"
    UNREACHABLE = "unreachable"


class Outcome(NamedTuple):
    node: int  # index of the winner, -1 when unschedulable
    reason: str = ""
    latency: float = 0.0
    tie_broken: bool = False
    rejections: int = 0


class Placer:
    """Base: per-node strategies and fresh order books; subclasses choose the winner."""

    #: a tick interval when the placer wants `tick` calls (heartbeats), else None
    period: float | None = None

    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 strategies: list[Strategy] | None = None,
                 labels: list[str] | None = None) -> None:
        size = len(cluster)
        self.name = name
        self.cluster = cluster
        self.catalogue = catalogue
        if strategies is None:
            seed_rule = make_strategy("least-loaded")
            strategies = [seed_rule] * size
        self.strategies = strategies
        self.labels = labels or [s.name for s in strategies]
        self.books = Books(catalogue.requests, size)
        self.rounds = 0

    def start(self) -> None:
        for idx in self.cluster.alive.items:
            self.changed(idx, Why.JOIN)

    def changed(self, idx: int, why: str) -> None:
        node = self.cluster.nodes[idx]
        self.books.update(idx, self.strategies[idx], node.view() if node.alive else None)

    def may_fit(self, shape: int) -> bool:
        """Cheap test before a retry: could a round for `shape` succeed now?"""
        return bool(self.books[shape].ranked)

    def tick(self, now: float) -> None:
        del now

    def place(self, shape: int, now: float) -> Outcome:
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------------
    def next_round(self) -> int:
        self.rounds += 1
        return self.rounds

    def unschedulable(self, shape: int, now: float, silent: bool, deadline_s: float = 1.0,
                      declines: Mapping[str, int] | None = None) -> Outcome:
        """Ask the real auction why nothing could be placed (see `sim.rounds`, rule 4)."""
        book = self.books[shape]
        counts = book.declines if declines is None else declines
        replies = reduced_declines(counts, book.request)
        decision = run_round(f"{self.name}-{self.rounds}", book.request, replies,
                             ["~silent"] if silent else [], now, deadline_s, now)
        assert isinstance(decision, Unschedulable), "a round with no bids cannot award"
        return Outcome(-1, decision.reason)
