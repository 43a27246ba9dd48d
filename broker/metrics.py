"""Prometheus metrics for the broker.

Rule: counters and histograms are observed where things happen (one call each, no
allocation beyond the label lookup); gauges that describe state (node health, instances by
state, who leads) are computed at scrape time from the broker's own view, so they can never
drift. Instances are counted by the state `gavel status` shows (`live_state`), not by the
record's state in git, which says ``queued`` for every placed instance (placement lives in
node.json). What instances measurably use (their cgroups, as each node's last heartbeat
said) is a gauge per node and one per instance for the `USAGE_SERIES_MAX` busiest (by cpu,
then memory, then id): a cluster of many thousand instances must not make as many series;
`gavel_instance_usage_omitted` counts those left out. One `Metrics` outlives the leaderships
of a broker that runs several (`broker.ha`): each leadership `attach`-es its view to the
same registry.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gavel.broker.ledger.repository import Ledger
    from gavel.broker.ledger.state import State
    from gavel.broker.mirror import Mirror
    from gavel.shared.health import Liveness
    from gavel.shared.records import InstanceRecord

__all__ = ["USAGE_SERIES_MAX", "LeaderView", "Metrics"]

#: Instances given usage series of their own, at most (the busiest).
USAGE_SERIES_MAX = 200

#: What the leadership gauges read: whether this broker leads now, the id of the broker that
#: leads (as far as it knows; "" for none), that leadership's epoch, since when (ISO 8601).
LeaderView = tuple[bool, str, int, str]

_MB = 1024 * 1024
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
        self.preemptions = Counter("gavel_preemptions_total",
                                   "Instances stopped to make room for higher-priority work",
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
        self.periodic_runs = Counter("gavel_periodic_runs_total",
                                     "Periodic jobs' fire times, by outcome: run (a run made),"
                                     " skipped (overlap), missed (collapsed into a later one "
                                     "while no broker led)", ["outcome"], registry=r)
        self._state: _StateCollector | None = None
        self._services: _ServiceCollector | None = None
        self._leader: _LeaderCollector | None = None
        self._pushes: Counter | None = None

    def attach(self, *, now: Callable[[], float], liveness: Liveness, ledger: Ledger,
               in_flight: Callable[[], int], mirror: Mirror,
               live_state: Callable[[InstanceRecord], str] | None = None,
               events_dropped: Callable[[], int] = lambda: 0) -> None:
        """Register the scrape-time view (node health, instances by state, open auctions,
        the KV mirror's puts); `live_state` is the state `gavel status` shows a record in. A
        later leadership's view replaces an earlier one's."""
        live = live_state or (lambda r: str(r.state))
        if self._state is None:
            self._state = _StateCollector(now, liveness, ledger, in_flight, mirror, live)
            self.registry.register(self._state)
        else:
            st = self._state
            st.now, st.liveness, st.ledger, st.in_flight, st.mirror, st.live_state = (
                now, liveness, ledger, in_flight, mirror, live)
        self._state.events_dropped = events_dropped

    def attach_services(self, counts: Callable[[], tuple[Mapping[str, int],
                                                         Mapping[str, int]]]) -> None:
        """Register the scrape-time view of services: by state, and their live replicas by
        health (`broker.services.Services.counts`); a later leadership's replaces it."""
        if self._services is None:
            self._services = _ServiceCollector(counts)
            self.registry.register(self._services)
        else:
            self._services.counts = counts

    def leadership(self, view: Callable[[], LeaderView],
                   extra: Callable[[], Iterator[Metric]] | None = None) -> None:
        """Register the leadership gauges (once), read from `view` at scrape time; `extra`:
        more metrics of the lease (`broker.ha`)."""
        if self._leader is None:
            self._leader = _LeaderCollector(view, extra)
            self.registry.register(self._leader)

    @property
    def pushes(self) -> Counter:
        """The pushes counter (`broker.ledger.remote`), made once for every pusher."""
        if self._pushes is None:
            from gavel.broker.ledger.remote import pushes_counter

            self._pushes = pushes_counter(self.registry)
        return self._pushes


class _LeaderCollector(Collector):
    def __init__(self, view: Callable[[], LeaderView],
                 extra: Callable[[], Iterator[Metric]] | None) -> None:
        self.view = view
        self.extra = extra

    def collect(self) -> Iterator[Metric]:
        leading, leader, epoch, since = self.view()
        g = GaugeMetricFamily("gavel_broker_leading", "1 while this broker leads, else 0")
        g.add_metric([], 1 if leading else 0)
        yield g
        who = GaugeMetricFamily("gavel_broker_leader", "The broker that leads, by id (1)",
                                labels=["leader"])
        if leader:
            who.add_metric([leader], 1)
        yield who
        e = GaugeMetricFamily("gavel_broker_leader_epoch",
                              "The epoch of the leadership now (0: no HA)")
        e.add_metric([], epoch)
        yield e
        at = GaugeMetricFamily("gavel_broker_leader_since_seconds",
                               "When the leadership now began (Unix time)")
        at.add_metric([], _unix(since))
        yield at
        if self.extra is not None:
            yield from self.extra()


def _unix(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


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


def _array_tasks(state: State) -> GaugeMetricFamily:
    """Batch arrays' task runs by where they are, all arrays summed, from the state's counts
    (`State.array_kinds`: no walk of every task); a run counts until retention forgets it."""
    g = GaugeMetricFamily("gavel_array_tasks", "Batch array task runs: pending (held for a "
                          "parallelism slot), running, succeeded, failed, cancelled",
                          labels=["state"])
    sums = dict.fromkeys(("pending", "running", "succeeded", "failed", "cancelled"), 0)
    names = {"held": "pending", "live": "running", "lost": "failed"}
    for kinds in state.array_kinds.values():
        for kind, n in kinds.items():
            sums[names.get(kind, kind)] += n
    for key, n in sums.items():
        g.add_metric([key], n)
    return g


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
        self.events_dropped: Callable[[], int] = lambda: 0

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
        yield _array_tasks(self.ledger.state())
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
        dropped = CounterMetricFamily("gavel_events_dropped",
                                      "Events dropped unstored: more waited for the event "
                                      "history than it keeps waiting (broker.events rule 3)")
        dropped.add_metric([], self.events_dropped())
        yield dropped
        yield from _usage(liveness)


def _usage(liveness: Liveness) -> Iterator[Metric]:
    """The module docstring's usage gauges, by node and for the busiest instances."""
    node_cpu = GaugeMetricFamily("gavel_node_cpu_used", "Cpus a node's instances use, "
                                 "measured in their cgroups", labels=["node"])
    node_mem = GaugeMetricFamily("gavel_node_memory_used_bytes", "Memory charged to a "
                                 "node's instances' cgroups", labels=["node"])
    rows: list[tuple[float, float, str, str]] = []
    for node_id in sorted(liveness.known()):
        reports = liveness.heartbeats[node_id].instances
        node_cpu.add_metric([node_id], sum(r.cpu_used for r in reports))
        node_mem.add_metric([node_id], sum(r.memory_used_mb for r in reports) * _MB)
        rows.extend((-r.cpu_used, -r.memory_used_mb, r.instance_id, node_id)
                    for r in reports if r.cpu_used or r.memory_used_mb)
    yield node_cpu
    yield node_mem
    rows.sort()
    cpu = GaugeMetricFamily("gavel_instance_cpu_used", "Cpus an instance uses, measured in "
                            "its cgroup (the busiest only)", labels=["instance", "node"])
    mem = GaugeMetricFamily("gavel_instance_memory_used_bytes", "Memory charged to an "
                            "instance's cgroup (the busiest only)", labels=["instance", "node"])
    for neg_cpu, neg_mem, iid, node_id in rows[:USAGE_SERIES_MAX]:
        cpu.add_metric([iid, node_id], -neg_cpu)
        mem.add_metric([iid, node_id], -neg_mem * _MB)
    yield cpu
    yield mem
    left = GaugeMetricFamily("gavel_instance_usage_omitted", "Instances measured but given "
                             f"no usage series (past the busiest {USAGE_SERIES_MAX})")
    left.add_metric([], max(0, len(rows) - USAGE_SERIES_MAX))
    yield left
