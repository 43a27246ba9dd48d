"""Prometheus metrics for the broker.

Rule: counters and histograms are observed where things happen (one call each, no
allocation beyond the label lookup); gauges that describe state (node health, instances by
state) are computed at scrape time from the broker's own view, so they can never drift.
Instances are counted by the state `gavel status` shows (`live_state`), not by the record's
state in git, which says ``queued`` for every placed instance (placement lives in node.json).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gavel.broker.ledger.repository import Ledger
    from gavel.broker.mirror import Mirror
    from gavel.shared.health import Liveness
    from gavel.shared.records import InstanceRecord

__all__ = ["Metrics"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.auctions = Counter("gavel_auctions_total", "Auction outcomes per request",
                                ["outcome"], registry=r)
        self.bids = Counter("gavel_bids_total", "Bids received, by strategy", ["strategy"],
                            registry=r)
        self.declines = Counter("gavel_declines_total", "Declines received, by reason",
                                ["reason"], registry=r)
        self.placements = Counter("gavel_placements_total", "Placements committed to git",
                                  registry=r)
        self.round_seconds = Histogram("gavel_bid_round_seconds",
                                       "From RFB to the auction's close", buckets=_LATENCY,
                                       registry=r)
        self.commit_seconds = Histogram("gavel_commit_seconds",
                                        "Writing one (group) commit and moving the ref",
                                        buckets=_LATENCY, registry=r)
        self.commit_items = Histogram("gavel_commit_batch_items",
                                      "Changes carried by one group commit",
                                      buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
                                      registry=r)
        self.forgotten = Counter("gavel_instances_forgotten_total",
                                 "Ended instance records removed from the tree after "
                                 "timing.retention_s", registry=r)
        self.rejected = Counter("gavel_messages_rejected_total",
                                "Messages from the wire refused, by kind", ["kind"],
                                registry=r)
        self.deploys = Counter("gavel_deploys_total",
                               "Service deployments ended, by outcome (succeeded, failed, "
                               "rolled-back, cancelled)", ["outcome"], registry=r)

    def attach(self, *, now: Callable[[], float], liveness: Liveness, ledger: Ledger,
               in_flight: Callable[[], int], mirror: Mirror,
               live_state: Callable[[InstanceRecord], str] | None = None) -> None:
        """Register the scrape-time view (node health, instances by state, open auctions,
        the KV mirror's puts); `live_state` is the state `gavel status` shows a record in."""
        self.registry.register(_StateCollector(now, liveness, ledger, in_flight, mirror,
                                               live_state or (lambda r: str(r.state))))


    def attach_services(self, counts: Callable[[], tuple[Mapping[str, int],
                                                         Mapping[str, int]]]) -> None:
        """Register the scrape-time view of services: by state, and their live replicas by
        health (`broker.services.Services.counts`)."""
        self.registry.register(_ServiceCollector(counts))


class _ServiceCollector(Collector):
    def __init__(self, counts: Callable[[], tuple[Mapping[str, int],
                                                  Mapping[str, int]]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        by_state, by_health = self.counts()
        services = GaugeMetricFamily("gavel_services", "Services by state", labels=["state"])
        for state, n in by_state.items():
            services.add_metric([state], n)
        yield services
        replicas = GaugeMetricFamily("gavel_service_replicas",
                                     "Live service replicas by health", labels=["health"])
        for health, n in by_health.items():
            replicas.add_metric([health], n)
        yield replicas


class _StateCollector(Collector):
    def __init__(self, now: Callable[[], float], liveness: Liveness, ledger: Ledger,
                 in_flight: Callable[[], int], mirror: Mirror,
                 live_state: Callable[[InstanceRecord], str]) -> None:
        self.now = now
        self.liveness = liveness
        self.ledger = ledger
        self.in_flight = in_flight
        self.mirror = mirror
        self.live_state = live_state

    def collect(self) -> Iterator[Metric]:
        now = self.now()
        liveness = self.liveness
        health = GaugeMetricFamily("gavel_nodes", "Nodes by health", labels=["health"])
        counts = Tally(str(liveness.health(n, now)) for n in liveness.known())
        for h in ("healthy", "unreachable", "offline"):
            health.add_metric([h], counts.get(h, 0))
        yield health
        states = GaugeMetricFamily("gavel_instances", "Instances by state, as gavel status "
                                   "shows them", labels=["state"])
        live = self.live_state
        by_state = Tally(live(r) for r in self.ledger.state().instances.values())
        for state, n in sorted(by_state.items()):
            states.add_metric([state], n)
        yield states
        inflight = GaugeMetricFamily("gavel_auctions_in_flight", "Open auctions")
        inflight.add_metric([], self.in_flight())
        yield inflight
        puts = CounterMetricFamily("gavel_kv_puts", "node.json puts into the KV mirror")
        puts.add_metric([], self.mirror.puts)
        yield puts
        folded = CounterMetricFamily("gavel_kv_puts_coalesced",
                                     "node.json changes folded into a later put of the "
                                     "same node (timing.mirror_s)")
        folded.add_metric([], self.mirror.coalesced)
        yield folded
