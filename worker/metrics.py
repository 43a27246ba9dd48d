"""Prometheus metrics for a worker, kept off the agent's hot path.

Rules:
1. What the node *sends* (bid replies, heartbeats, instance reports) is counted where it
   leaves: `ObservedAgent` wraps the agent's one outbound path, `_send`, and adds one counter
   increment per answer; the RFB path itself is untouched.
2. What the node *is* (instances by state, committed and total capacity, draining, messages
   refused, the cgroup hierarchy that enforces its awards or "none") is read at scrape time
   from the agent, on the agent's own event loop, so a scrape from the HTTP thread never
   races the loop that changes that state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gavel.shared.messages import BidReply, Decline, Event, Heartbeat, Message
from gavel.worker.agent import Agent

__all__ = ["ObservedAgent", "WorkerMetrics"]


class WorkerMetrics:
    """The worker's registry: counters observed on send, gauges read at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rfbs = Counter("gavel_worker_rfbs_answered_total",
                            "Requests for bids this node answered", registry=r)
        self.bids = Counter("gavel_worker_bids_total", "Bids this node sent", registry=r)
        self.declines = Counter("gavel_worker_declines_total",
                                "Declines this node sent, by reason", ["reason"], registry=r)
        self.heartbeats = Counter("gavel_worker_heartbeats_total", "Heartbeats sent",
                                  registry=r)
        self.reports = Counter("gavel_worker_reports_total",
                               "Instance events reported to the broker, by type", ["type"],
                               registry=r)

    def observe(self, message: Message) -> None:
        """Count one outbound message."""
        match message:
            case BidReply(answers=answers):
                self.rfbs.inc()
                n_bids = 0
                for a in answers:
                    if isinstance(a, Decline):
                        self.declines.labels(reason=a.reason).inc()
                    else:
                        n_bids += 1
                if n_bids:
                    self.bids.inc(n_bids)
            case Heartbeat():
                self.heartbeats.inc()
            case Event(type=type_):
                self.reports.labels(type=str(type_)).inc()
            case _:
                pass

    def attach(self, agent: Agent, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Register the scrape-time view of `agent`, read on `loop` (the agent's loop)."""
        self.registry.register(_AgentCollector(agent, loop))


class ObservedAgent(Agent):
    """An `Agent` whose outbound messages are counted in `metrics`."""

    def __init__(self, *, metrics: WorkerMetrics | None = None, **kw: Any) -> None:
        self.metrics = metrics or WorkerMetrics()
        super().__init__(**kw)

    async def _send(self, subject: str, message: Message) -> None:
        self.metrics.observe(message)
        await super()._send(subject, message)


@dataclass
class _Snapshot:
    states: Tally[str] = field(default_factory=Tally)
    capacity: tuple[float, int] = (0.0, 0)
    committed: tuple[float, int] = (0.0, 0)
    draining: bool = False
    malformed: dict[str, int] = field(default_factory=dict)
    ignored: dict[str, int] = field(default_factory=dict)
    cgroups: str = "none"
    escapes: int = 0


class _AgentCollector(Collector):
    def __init__(self, agent: Agent, loop: asyncio.AbstractEventLoop | None) -> None:
        self.agent = agent
        self.loop = loop

    def _read(self) -> _Snapshot:
        a = self.agent
        cap, com = a.capacity, a.committed
        return _Snapshot(states=Tally(str(r.state) for r in a.instances()),
                         capacity=(cap.cpu, cap.memory_mb),
                         committed=(com.cpu, com.memory_mb), draining=a.draining,
                         malformed=dict(a.malformed), ignored=dict(a.ignored),
                         cgroups=a.enforcement.version, escapes=a.escapes)

    def _snapshot(self) -> _Snapshot:
        loop = self.loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or here is loop or loop.is_closed() or not loop.is_running():
            return self._read()
        done: concurrent.futures.Future[_Snapshot] = concurrent.futures.Future()

        def read() -> None:
            try:
                done.set_result(self._read())
            except Exception as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(read)
        return done.result(timeout=self.agent.timing.scrape_s)

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        inst = GaugeMetricFamily("gavel_worker_instances", "Instances on this node, by state",
                                 labels=["state"])
        for state, n in sorted(s.states.items()):
            inst.add_metric([state], n)
        yield inst
        for what, (cpu, mem) in (("capacity", s.capacity), ("committed", s.committed)):
            g = GaugeMetricFamily(f"gavel_worker_{what}_cpu", f"CPU {what} on this node")
            g.add_metric([], cpu)
            yield g
            g = GaugeMetricFamily(f"gavel_worker_{what}_memory_mb",
                                  f"Memory (MB) {what} on this node")
            g.add_metric([], mem)
            yield g
        d = GaugeMetricFamily("gavel_worker_draining", "1 while the node declines all work")
        d.add_metric([], 1 if s.draining else 0)
        yield d
        cg = GaugeMetricFamily("gavel_worker_cgroups",
                               "1 for the cgroup hierarchy enforcing each instance's cpu and "
                               "memory (version v1, v2; none: reservations are bookkeeping "
                               "only)", labels=["version"])
        cg.add_metric([s.cgroups], 1)
        yield cg
        esc = CounterMetricFamily("gavel_worker_cgroup_escapes",
                                  "Instances killed because a process of theirs was found "
                                  "outside their cgroup")
        esc.add_metric([], s.escapes)
        yield esc
        bad = CounterMetricFamily("gavel_worker_messages_malformed",
                                  "Undecodable messages, by endpoint", labels=["endpoint"])
        for k, n in sorted(s.malformed.items()):
            bad.add_metric([k], n)
        yield bad
        ign = CounterMetricFamily("gavel_worker_messages_ignored",
                                  "Well-formed messages dropped on purpose, by reason",
                                  labels=["reason"])
        for k, n in sorted(s.ignored.items()):
            ign.add_metric([k], n)
        yield ign
