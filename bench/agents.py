"""Bench agents: many live node agents in one process, each with its own NATS connection.

Rules: every agent subscribes to the broadcast RFB subject and its own directed subject,
answers through `shared.strategies.answer` exactly as `worker.agent.Agent` does (the same
function, the same messages, the same subjects), and takes awards with a no-op driver: the
instance "runs" at once and the node confirms it (its heartbeat lists it too; the node's
award). Decoders are built once per process; the RFB path creates no tasks.

With ``--lifetime-s L`` an instance "exits" with status 0 L seconds after it started (the
node reports it as a worker does), so a run has churn: ends, and the broker's retention.

Run as ``python -m bench.agents --url URL --first K --count N``; it prints ``ready`` once
every agent is subscribed, and a JSON line of counters when it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

import msgspec
import nats

from broker import eventloop
from shared import subjects
from shared.feasibility import NodeView
from shared.messages import (
    RFB,
    Award,
    BidReply,
    Capacity,
    Event,
    EventType,
    Heartbeat,
    InstanceReport,
)
from shared.strategies import Strategy, answer, make_strategy

__all__ = ["BenchAgent", "main"]

_rfb_dec = msgspec.msgpack.Decoder(RFB)
_award_dec = msgspec.msgpack.Decoder(Award)
_enc = msgspec.msgpack.Encoder()
STRATEGIES = ("least-loaded", "binpack", "spread", "headroom")


class BenchAgent:
    def __init__(self, node_id: str, strategy: Strategy, capacity: Capacity,
                 lifetime_s: float = 0.0) -> None:
        self.node_id = node_id
        self.lifetime_s = lifetime_s
        self.exited = 0
        self.strategy = strategy
        self.view = NodeView(node_id=node_id, capacity=capacity)
        self.held: dict[str, InstanceReport] = {}
        #: What each held instance takes: (cpu, memory_mb, ports).
        self.used: dict[str, tuple[float, int, int]] = {}
        self.bids_subject = subjects.BIDS.format(node=node_id)
        self.report_subject = subjects.REPORT.format(node=node_id)
        self.nc: Any = None
        self.replies = 0
        self.seq = 0

    async def start(self, url: str) -> None:
        self.nc = await nats.connect(url, name=f"bench-{self.node_id}",
                                     max_reconnect_attempts=-1, pending_size=8 * 2**20)
        await self.nc.subscribe(subjects.RFB, cb=self._on_rfb)
        await self.nc.subscribe(subjects.RFB_NODE.format(node=self.node_id), cb=self._on_rfb)
        await self.nc.subscribe(subjects.AWARD.format(node=self.node_id), cb=self._on_award)
        await self.nc.flush()

    async def _on_rfb(self, msg: Any) -> None:
        rfb = _rfb_dec.decode(msg.data)
        view, strategy = self.view, self.strategy
        reply = BidReply(auction_id=rfb.auction_id, node_id=self.node_id,
                         answers=[answer(strategy, s, view, i) for i, s in enumerate(rfb.shapes)])
        self.replies += 1
        await self.nc.publish(self.bids_subject, _enc.encode(reply))

    async def _on_award(self, msg: Any) -> None:
        award = _award_dec.decode(msg.data)
        if award.node_id != self.node_id or award.instance_id in self.held:
            return
        spec = award.spec
        self.used[award.instance_id] = (spec.cpu, spec.memory_mb, len(spec.ports))
        self._recount()
        self.held[award.instance_id] = InstanceReport(
            instance_id=award.instance_id, state="running", attempt=award.attempt,
            ports=award.ports)
        # The no-op driver starts at once: confirm like a real worker does.
        await self.nc.publish(self.report_subject, _enc.encode(Event(
            instance_id=award.instance_id, type=EventType.RUNNING, node_id=self.node_id,
            attempt=award.attempt)))
        if self.lifetime_s > 0:
            asyncio.get_running_loop().call_later(
                self.lifetime_s, lambda: asyncio.ensure_future(self._exit(award)))

    def _recount(self) -> None:
        """Committed capacity summed afresh from what the node holds: adding and subtracting
        0.01 cpu as instances come and go drifts below zero, and a negative load is a bid
        the broker refuses."""
        used = self.used.values()
        self.view = msgspec.structs.replace(self.view, committed=Capacity(
            cpu=sum(u[0] for u in used), memory_mb=sum(u[1] for u in used),
            ports=sum(u[2] for u in used)))

    async def _exit(self, award: Award) -> None:
        """The instance ends with status 0: give its room back and report it."""
        if self.held.pop(award.instance_id, None) is None:
            return
        del self.used[award.instance_id]
        self._recount()
        self.exited += 1
        await self.nc.publish(self.report_subject, _enc.encode(Event(
            instance_id=award.instance_id, type=EventType.EXITED, node_id=self.node_id,
            attempt=award.attempt, exit_code=0)))

    async def heartbeat(self) -> None:
        self.seq += 1
        hb = Heartbeat(node_id=self.node_id, seq=self.seq, strategy=self.strategy.name,
                       capacity=self.view.capacity, committed=self.view.committed,
                       instances=list(self.held.values()), port_range=[20000, 29999])
        await self.nc.publish(subjects.HEARTBEAT.format(node=self.node_id), _enc.encode(hb))


async def _serve(args: argparse.Namespace) -> None:
    cap = Capacity(cpu=args.cpu, memory_mb=args.memory_mb, ports=10_000)
    agents = [BenchAgent(f"n{k:05d}", make_strategy(STRATEGIES[k % len(STRATEGIES)]
                                                    if args.mix else args.strategy), cap,
                         args.lifetime_s)
              for k in range(args.first, args.first + args.count)]
    sem = asyncio.Semaphore(64)

    async def start(a: BenchAgent) -> None:
        async with sem:
            await a.start(args.url)

    await asyncio.gather(*(start(a) for a in agents))
    for a in agents:
        await a.heartbeat()
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    period = args.heartbeat_s / max(1, len(agents))
    while not stop.is_set():
        for a in agents:  # heartbeats spread evenly over the period
            await a.heartbeat()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):
                    await stop.wait()
            if stop.is_set():
                break
    print(json.dumps({"replies": sum(a.replies for a in agents),
                      "held": sum(len(a.held) for a in agents),
                      "exited": sum(a.exited for a in agents)}), flush=True)
    for a in agents:
        with contextlib.suppress(Exception):
            await a.nc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.agents")
    p.add_argument("--url", required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--strategy", default="least-loaded")
    p.add_argument("--mix", action="store_true", help="cycle through every strategy")
    p.add_argument("--cpu", type=float, default=64.0)
    p.add_argument("--memory-mb", type=int, default=262_144)
    p.add_argument("--heartbeat-s", type=float, default=10.0)
    p.add_argument("--lifetime-s", type=float, default=0.0)
    eventloop.run(_serve(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
