"""Prometheus metrics for the gateway, read from the `Keeper` at scrape time.

Rule: the keeper only counts and replaces its lists (never changes one in place), so a scrape
from the HTTP thread reads a whole step's numbers, never half of one.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gavel.gateway.keeper import Keeper

__all__ = ["GatewayMetrics"]


class GatewayMetrics:
    """The gateway's registry."""

    def __init__(self, keeper: Keeper) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_KeeperCollector(keeper))


class _KeeperCollector(Collector):
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper

    def collect(self) -> Iterator[Metric]:
        k = self.keeper
        applied = k.applied
        yield GaugeMetricFamily("gavel_gateway_routes",
                                "Routes registered in Caddy (leading to a replica or a root)",
                                value=len(applied))
        upstreams = GaugeMetricFamily("gavel_gateway_route_upstreams",
                                      "Replicas each registered route balances across",
                                      labels=["route", "name", "match"])
        for e in applied:
            upstreams.add_metric([e.id, e.name, f"{e.host}{e.path}"],
                                 len(e.upstreams) if e.port else 1)
        yield upstreams
        yield CounterMetricFamily("gavel_gateway_admin_errors",
                                  "Caddy admin API requests that failed (down, or refused)",
                                  value=k.admin_errors)
        yield CounterMetricFamily("gavel_gateway_broker_errors",
                                  "Endpoint requests the broker did not answer",
                                  value=k.broker_errors)
        yield CounterMetricFamily("gavel_gateway_admin_writes",
                                  "Changes written to Caddy through its admin API",
                                  value=k.writes)
        yield CounterMetricFamily("gavel_gateway_steps",
                                  "Derivations of the route table", value=k.steps)
