"""Bench agents: many live node agents in one process, each with its own NATS connection.

Rules: every agent subscribes to the broadcast RFB subject and its own directed subject,
answers through `shared.strategies.answer` exactly as `worker.agent.Agent` does (the same
function, the same messages, the same subjects), and takes awards with a no-op driver: the
instance "runs" at once and the node confirms it (its heartbeat lists it too; the node's
award). Decoders are built once per process; the RFB path creates no tasks. Each agent
talks through `bench.natslite` (``--client lite``, the default: the co-located agents take
less of the CPU the broker is measured on) or nats-py (``--client nats-py``, as the real
worker does).

With ``--lifetime-s L`` an instance "exits" with status 0 L seconds after it started (the
node reports it as a worker does), so a run has churn: ends, and the broker's retention.

Run as ``python -m gavel.bench.agents --url URL --first K --count N``; it prints ``ready`` once
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

from gavel.bench import natslite
from gavel.bench.agentprocs import BARE_PREFIX, BEAT, FORGET, FORGET_S, node_id
from gavel.shared import subjects
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import (
    RFB,
    Award,
    BidReply,
    Capacity,
    Event,
    EventType,
    Heartbeat,
    InstanceReport,
)
from gavel.shared.strategies import Strategy, answer, make_strategy
from gavel.transport import eventloop, wire

__all__ = ["CLIENTS", "BenchAgent", "LiteLink", "NatsPyLink", "main"]

_rfb_dec = msgspec.msgpack.Decoder(RFB)
_award_dec = msgspec.msgpack.Decoder(Award)
_enc = msgspec.msgpack.Encoder()
STRATEGIES = ("least-loaded", "binpack", "spread", "headroom")


class BenchAgent:
    """One node's answers, whatever carries them: each method takes a message's bytes and
    returns what the node sends back (its link publishes it)."""

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
        self.heartbeat_subject = subjects.HEARTBEAT.format(node=node_id)
        self.subscriptions = (subjects.RFB, subjects.RFB_NODE.format(node=node_id),
                              subjects.AWARD.format(node=node_id))
        self.replies = 0
        self.seq = 0

    def bids(self, data: bytes) -> bytes | None:
        """An RFB in, the node's bid reply out (None for a new leadership's hello: an RFB
        of no shapes asks for a heartbeat, which the agent sends on its own clock anyway)."""
        rfb = _rfb_dec.decode(data)
        if not rfb.shapes:
            return None
        view, strategy = self.view, self.strategy
        reply = BidReply(auction_id=rfb.auction_id, node_id=self.node_id,
                         answers=[answer(strategy, s, view, i) for i, s in enumerate(rfb.shapes)])
        self.replies += 1
        return _enc.encode(reply)

    def take(self, data: bytes) -> tuple[str, bytes] | None:
        """An award in: the no-op driver starts the instance at once and the node confirms
        it, like a real worker (its instance id and the report), or None if it is not ours
        or already held."""
        award = _award_dec.decode(data)
        if award.node_id != self.node_id or award.instance_id in self.held:
            return None
        spec = award.spec
        self.used[award.instance_id] = (spec.cpu, spec.memory_mb, len(spec.ports))
        self._recount()
        self.held[award.instance_id] = InstanceReport(
            instance_id=award.instance_id, state="running", attempt=award.attempt,
            ports=award.ports)
        return award.instance_id, _enc.encode(Event(
            instance_id=award.instance_id, type=EventType.RUNNING, node_id=self.node_id,
            attempt=award.attempt))

    def _recount(self) -> None:
        """Committed capacity summed afresh from what the node holds: adding and subtracting
        0.01 cpu as instances come and go drifts below zero, and a negative load is a bid
        the broker refuses."""
        used = self.used.values()
        self.view = msgspec.structs.replace(self.view, committed=Capacity(
            cpu=sum(u[0] for u in used), memory_mb=sum(u[1] for u in used),
            ports=sum(u[2] for u in used)))

    def forget(self, prefix: str) -> int:
        """`bench.agentprocs` rule 3: the instances whose id begins with `prefix` are dropped
        as if never awarded (no report: nobody placed them); how many."""
        gone = [iid for iid in self.held if iid.startswith(prefix)]
        for iid in gone:
            del self.held[iid], self.used[iid]
        if gone:
            self._recount()
        return len(gone)

    def exit(self, instance_id: str) -> bytes | None:
        """The instance ends with status 0: give its room back; the report to send."""
        held = self.held.pop(instance_id, None)
        if held is None:
            return None
        del self.used[instance_id]
        self._recount()
        self.exited += 1
        return _enc.encode(Event(instance_id=instance_id, type=EventType.EXITED,
                                 node_id=self.node_id, attempt=held.attempt, exit_code=0))

    def heartbeat(self) -> bytes:
        self.seq += 1
        return _enc.encode(Heartbeat(
            node_id=self.node_id, seq=self.seq, strategy=self.strategy.name,
            capacity=self.view.capacity, committed=self.view.committed,
            instances=list(self.held.values()), port_range=[20000, 29999]))


class LiteLink:
    """An agent on `bench.natslite`: handlers run as each frame is parsed, sends are one
    socket write."""

    def __init__(self, agent: BenchAgent) -> None:
        self.agent = agent
        self.client: natslite.LiteClient | None = None

    async def start(self, url: str) -> None:
        a = self.agent
        self.client = c = await natslite.connect(url, f"bench-{a.node_id}")
        rfb, node_rfb, award = a.subscriptions
        c.subscribe(rfb, self._on_rfb)
        c.subscribe(node_rfb, self._on_rfb)
        c.subscribe(award, self._on_award)
        await c.flush()

    def _on_rfb(self, data: bytes) -> None:
        assert self.client is not None
        reply = self.agent.bids(data)
        if reply is not None:
            self.client.publish(self.agent.bids_subject, reply)

    def _on_award(self, data: bytes) -> None:
        assert self.client is not None
        taken = self.agent.take(data)
        if taken is None:
            return
        iid, report = taken
        self.client.publish(self.agent.report_subject, report)
        if self.agent.lifetime_s > 0:
            asyncio.get_running_loop().call_later(self.agent.lifetime_s, self._exit, iid)

    def _exit(self, iid: str) -> None:
        report = self.agent.exit(iid)
        if report is not None and self.client is not None:
            self.client.publish(self.agent.report_subject, report)

    async def send(self, subject: str, payload: bytes) -> None:
        assert self.client is not None
        self.client.publish(subject, payload)

    async def settle(self) -> None:
        """Every message the server queued for this agent before now is handled (handlers
        run as frames are parsed, so the PONG behind them is enough)."""
        assert self.client is not None
        await self.client.flush(FORGET_S)

    async def failed(self) -> str:
        """Resolves with a sentence if the connection ends before `close`."""
        assert self.client is not None
        exc = await self.client.closed
        return f"{self.agent.node_id}: {exc}" if exc is not None else ""

    async def close(self) -> None:
        if self.client is not None:
            self.client.close()


class NatsPyLink:
    """An agent on nats-py, as the real worker talks (``--agent-client nats-py``)."""

    def __init__(self, agent: BenchAgent) -> None:
        self.agent = agent
        self.nc: Any = None
        self._subs: list[Any] = []

    async def start(self, url: str) -> None:
        a = self.agent
        self.nc = await nats.connect(url, name=f"bench-{a.node_id}",
                                     max_reconnect_attempts=-1, pending_size=8 * 2**20)
        rfb, node_rfb, award = a.subscriptions
        self._subs = [await self.nc.subscribe(rfb, cb=self._on_rfb),
                      await self.nc.subscribe(node_rfb, cb=self._on_rfb),
                      await self.nc.subscribe(award, cb=self._on_award)]
        await wire.subscribed(self.nc)  # the broker's first RFB must not pass it by

    async def _on_rfb(self, msg: Any) -> None:
        reply = self.agent.bids(msg.data)
        if reply is not None:
            await self.nc.publish(self.agent.bids_subject, reply)

    async def _on_award(self, msg: Any) -> None:
        taken = self.agent.take(msg.data)
        if taken is None:
            return
        iid, report = taken
        await self.nc.publish(self.agent.report_subject, report)
        if self.agent.lifetime_s > 0:
            asyncio.get_running_loop().call_later(
                self.agent.lifetime_s, lambda: asyncio.ensure_future(self._exit(iid)))

    async def _exit(self, iid: str) -> None:
        report = self.agent.exit(iid)
        if report is not None:
            await self.nc.publish(self.agent.report_subject, report)

    async def send(self, subject: str, payload: bytes) -> None:
        await self.nc.publish(subject, payload)

    async def settle(self) -> None:
        """Every message the server queued for this agent before now is handled: the PONG
        comes after them, and nats-py hands them to each subscription's own task, so its
        queue is waited out too."""
        await self.nc.flush(FORGET_S)
        while any(sub.pending_msgs for sub in self._subs):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the callback of the last one taken off a queue

    async def failed(self) -> str:
        await asyncio.Event().wait()  # nats-py reconnects on its own: never
        return ""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.close()


Link = LiteLink | NatsPyLink
CLIENTS: dict[str, type[LiteLink] | type[NatsPyLink]] = {"lite": LiteLink,
                                                         "nats-py": NatsPyLink}


async def _serve(args: argparse.Namespace) -> int:
    cap = Capacity(cpu=args.cpu, memory_mb=args.memory_mb, ports=10_000)
    agents = [BenchAgent(node_id(k), make_strategy(STRATEGIES[k % len(STRATEGIES)]
                                                    if args.mix else args.strategy), cap,
                         args.lifetime_s)
              for k in range(args.first, args.first + args.count)]
    links: list[Link] = [CLIENTS[args.client](a) for a in agents]
    sem = asyncio.Semaphore(64)

    async def start(link: Link) -> None:
        async with sem:
            await link.start(args.url)

    await asyncio.gather(*(start(link) for link in links))
    beat = asyncio.Event()
    control = await natslite.connect(args.url, f"bench-control-{args.first}")

    asked: set[asyncio.Task[None]] = set()

    async def settled_forget(reply_to: str) -> None:  # `bench.agentprocs` rule 3
        await asyncio.gather(*(link.settle() for link in links))
        control.publish(reply_to, b"%d" % sum(a.forget(BARE_PREFIX) for a in agents))

    def forget(reply_to: bytes) -> None:
        task = asyncio.ensure_future(settled_forget(reply_to.decode()))
        asked.add(task)
        task.add_done_callback(asked.discard)

    control.subscribe(FORGET, forget)
    control.subscribe(BEAT, lambda _: beat.set())
    await control.flush()
    for link in links:
        await link.send(link.agent.heartbeat_subject, link.agent.heartbeat())
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failures: list[str] = []

    async def watch(link: Link) -> None:
        why = await link.failed()
        if why and not stop.is_set():
            failures.append(why)
            stop.set()

    watchers = [asyncio.ensure_future(watch(link)) for link in links]
    period = args.heartbeat_s / max(1, len(links))
    while not stop.is_set():
        for link in links:  # heartbeats spread evenly over the period
            if beat.is_set():  # all at once, asked for (`bench.agentprocs` rule 3)
                beat.clear()
                for other in links:
                    await other.send(other.agent.heartbeat_subject, other.agent.heartbeat())
            await link.send(link.agent.heartbeat_subject, link.agent.heartbeat())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):
                    await stop.wait()
            if stop.is_set():
                break
    print(json.dumps({"replies": sum(a.replies for a in agents),
                      "held": sum(len(a.held) for a in agents),
                      "exited": sum(a.exited for a in agents),
                      "failed": failures[:3]}), flush=True)
    for w in watchers:
        w.cancel()
    for link in links:
        await link.close()
    control.close()
    if failures:
        print(f"an agent lost its connection: {failures[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.agents")
    p.add_argument("--url", required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--strategy", default="least-loaded")
    p.add_argument("--mix", action="store_true", help="cycle through every strategy")
    p.add_argument("--cpu", type=float, default=64.0)
    p.add_argument("--memory-mb", type=int, default=262_144)
    p.add_argument("--heartbeat-s", type=float, default=10.0)
    p.add_argument("--lifetime-s", type=float, default=0.0)
    p.add_argument("--client", choices=sorted(CLIENTS), default="lite")
    return eventloop.run(_serve(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
