"""The bare auctioneer: the most one Python process places a second with gavel's protocol,
on this machine, this hour, with these agents and this nats-server - the ceiling of
`gavel bench`'s `ratio_to_bare_rounds`.

Rules:
1. It runs bid rounds of the run's own shape and nothing else: rounds of `batch` requests of
   the bench's one spec (`SPEC`), `in_flight` of them at a time, each asking d nodes a request
   drawn at random among the agents and the last winner beside them (`shared.candidates`
   rule 3), or every node (d 0: the broadcast RFB); the RFB is encoded once and written to
   each asked node's subject as the round opens, as the broker's rounds go out
   (`transport.wire.write_now`). A round closes when
   every asked node has answered, or at the bid deadline with what it has; each request goes
   to the lowest price, the price rising by the bid's step after each (ties on node id), and
   each winner is sent the `Award` the broker sends for a placement. It keeps no state, no
   git, no events, no retention: the run's placements/s over this rate is what gavel keeps
   of what its protocol allows, and the rest is gavel's own work. Each round is timed from
   its RFBs to its close (`round_p99_ms`, as the broker times its own): the tail a round of
   that shape has with these agents this hour, nothing of gavel's in it. One still open as
   the measurement ends is not counted.
2. A placement counts when its winner confirms it: the agent's ``running`` report, heard on
   the report subjects as the broker hears them, through direct subscriptions as the
   broker's busiest are (`transport.wire` rule 4). Rounds open for `seconds`; the clock runs
   from the first RFB to the last confirmation. A ceiling that heard no confirmation is an
   error, never a rate a ratio would divide by.
3. Each award leaves its agent holding an instance no broker placed, listed in its
   heartbeats: a broker refuses a node's heartbeat that lists more than it could hold
   (`shared.bounds`: twice what git placed there, and 64), and the held instances move the
   agents' bids. So no broker runs while it does, and once measured it asks every agent
   process to forget them (`bench.agentprocs` rule 3: its ids, `bare-...`, are none of a
   run's) and waits until each has answered: the agents are as they were before it.
4. `python -m gavel.bench.bare` measures it against agents already up (``--url``), or
   standalone, its own nats-server and agent processes started as `gavel bench` starts them:
   the same instrument beside a commit whose bench has none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats.errors

from gavel.bench.agentprocs import BARE_PREFIX, FORGET, FORGET_S, node_id, start_agents, stop
from gavel.broker.service import tune_gc
from gavel.shared import subjects
from gavel.shared.messages import RFB, Award, Bid, BidReply, Event, EventType, Request, Spec
from gavel.shared.timing import Timing
from gavel.transport import eventloop, wire
from gavel.transport.inbound import Decode, Malformed, Received
from gavel.transport.natsserver import NatsServer

__all__ = ["PREFIX", "SPEC", "Bare", "Rounds", "beside", "main", "measure", "p99"]

#: What `gavel bench` places: one no-op process of the smallest shape.
SPEC = Spec(name="noop", command=["true"], cpu=0.01, memory_mb=16)
#: Rule 3: the ceiling's instance ids.
PREFIX = BARE_PREFIX
#: A commit id as the broker's awards carry one: the same bytes on the wire.
_COMMIT = "0" * 40
_TIMING = Timing()


class Bare(msgspec.Struct, kw_only=True):
    """One measurement: confirmed placements a second, and what it was made of."""

    placements_per_s: float
    confirmed: int
    awarded: int
    rounds: int
    seconds: float
    #: Nodes an RFB went to, on average a round (d a request, the last winner beside).
    asked_per_round: float
    #: Rule 3: the instances the agents dropped afterwards.
    forgotten: int
    batch: int
    in_flight: int
    d: int
    #: Rule 1: the p99 of its rounds' times, ms (nearest rank).
    round_p99_ms: float = 0.0


class _Round:
    __slots__ = ("aid", "answered", "asked", "bids", "opened", "timer")

    def __init__(self, aid: str, asked: set[str]) -> None:
        self.aid = aid
        self.opened = time.perf_counter()
        self.asked = asked
        self.bids: list[tuple[float, str, float]] = []
        self.answered: set[str] = set()
        self.timer: asyncio.TimerHandle | None = None


class Rounds:
    """Rule 1's auctioneer on connection `nc` (a `transport.wire.Client`), asking `nodes`."""

    def __init__(self, nc: Any, nodes: Sequence[str], *, batch: int, in_flight: int, d: int,
                 rng: random.Random, deadline_s: float = _TIMING.bid_deadline_s) -> None:
        self.nc, self.nodes = nc, list(nodes)
        self.batch, self.in_flight, self.d = batch, in_flight, d
        self.rng, self.deadline_s = rng, deadline_s
        self.shape = Request.of(PREFIX, SPEC).shape()
        self.open: dict[str, _Round] = {}
        self.last_winner = ""
        self.rounds = self.asked = self.awarded = self.confirmed = 0
        #: Rule 1: each closed round's seconds, in the order they closed.
        self.round_s: list[float] = []
        self.opening = True
        self.last_confirmed = 0.0
        self.all_confirmed = asyncio.Event()
        self._bids = Decode[BidReply](BidReply)
        self._events = Decode[Event](Event)
        self._enc = msgspec.msgpack.Encoder()
        self._later: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()

    def fill(self) -> None:
        """Open rounds up to `in_flight` while rounds still open."""
        while self.opening and len(self.open) < self.in_flight:
            self._open()

    def _open(self) -> None:
        self.rounds += 1
        aid = f"{PREFIX}{self.rounds:08d}"
        payload = self._enc.encode(RFB(auction_id=aid, shapes=[self.shape],
                                       deadline_s=self.deadline_s, counts=[self.batch]))
        if not self.d:  # broadcast: one RFB every node hears
            asked = set(self.nodes)
            self._send([(subjects.RFB, payload)])
        else:
            asked = set(self.rng.sample(self.nodes, min(len(self.nodes),
                                                        self.d * self.batch)))
            if self.last_winner:
                asked.add(self.last_winner)
            self._send([(subjects.RFB_NODE.format(node=n), payload) for n in sorted(asked)])
        r = _Round(aid, asked)
        self.open[aid] = r
        self.asked += len(asked)
        r.timer = asyncio.get_running_loop().call_later(self.deadline_s, self._close, aid)

    def on_bids(self, msg: Received) -> None:
        reply = self._bids(msg.data)
        if isinstance(reply, Malformed):
            return
        r = self.open.get(reply.auction_id)
        node = reply.node_id
        if r is None or node not in r.asked or node in r.answered:
            return  # late, or not ours: the ceiling counts only what it asked for
        r.answered.add(node)
        for a in reply.answers:
            if isinstance(a, Bid) and a.shape == 0:
                r.bids.append((a.load, node, a.step))
        if len(r.answered) == len(r.asked):
            self._close(r.aid)

    def _close(self, aid: str) -> None:
        r = self.open.pop(aid, None)
        if r is None:
            return
        if r.timer is not None:
            r.timer.cancel()
        self.round_s.append(time.perf_counter() - r.opened)
        prices = list(r.bids)
        heapq.heapify(prices)
        awards = []
        for k in range(self.batch):
            if not prices:
                break
            load, node, step = heapq.heappop(prices)
            if math.isfinite(step):
                heapq.heappush(prices, (load + step, node, step))
            self.awarded += 1
            self.last_winner = node
            awards.append((subjects.AWARD.format(node=node), self._enc.encode(Award(
                auction_id=aid, instance_id=f"{aid}-{k}", node_id=node, spec=SPEC,
                commit=_COMMIT))))
        self._send(awards)
        self.fill()

    def on_report(self, msg: Received) -> None:
        event = self._events(msg.data)
        if isinstance(event, Malformed) or event.type != EventType.RUNNING \
                or not event.instance_id.startswith(PREFIX):
            return
        self.confirmed += 1
        self.last_confirmed = time.perf_counter()
        if not self.opening and not self.open and self.confirmed >= self.awarded:
            self.all_confirmed.set()

    def _send(self, batch: list[tuple[str, bytes]]) -> None:
        """On the socket now; what the socket cannot take now goes by `pump`, in order."""
        if self._later or not wire.write_now(self.nc, batch):
            self._later += batch
            self._wake.set()

    async def pump(self) -> None:
        """Sends what `_send` could not write at once, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._later = self._later, []
            await wire.send(self.nc, batch, _failed)


def _failed(subject: str, exc: Exception) -> None:
    raise RuntimeError(f"the bare auctioneer could not publish on {subject}: {exc}")


async def measure(url: str, agents: int, processes: int, *, batch: int = 24,
                  in_flight: int = 1, d: int = 2, seconds: float = 2.5, seed: int = 0,
                  confirm_s: float = _TIMING.call_s) -> Bare:
    """Rules 1-3 against the `agents` bench agents (`bench.agents`' node ids) serving at
    `url` in `processes` processes; RuntimeError when no award was confirmed within
    `confirm_s` of the last round, or an agent process did not say it forgot them within
    `FORGET_S` (`bench.agentprocs` rule 3)."""
    nc = wire.Client()
    await nc.connect(url, name="bare-auctioneer", allow_reconnect=False,
                     pending_size=8 * 2**20)
    try:
        rounds = Rounds(nc, [node_id(k) for k in range(agents)], batch=batch,
                        in_flight=in_flight, d=d, rng=random.Random(seed))
        await nc.subscribe_direct(subjects.BIDS_ALL, rounds.on_bids)
        await nc.subscribe_direct(subjects.REPORT_ALL, rounds.on_report)
        forgot = await nc.subscribe(nc.new_inbox())
        await wire.subscribed(nc)
        pump = asyncio.create_task(rounds.pump(), name="bare-pump")
        try:
            started = time.perf_counter()
            rounds.fill()
            await asyncio.sleep(seconds)
            rounds.opening = False
            with contextlib.suppress(TimeoutError):  # what was confirmed counts (rule 2)
                await asyncio.wait_for(rounds.all_confirmed.wait(), confirm_s)
        finally:
            rounds.opening = False
            for r in rounds.open.values():  # rounds still waiting for answers end here
                if r.timer is not None:
                    r.timer.cancel()
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        await nc.publish(FORGET, forgot.subject.encode())  # rule 3
        forgotten = 0
        for _ in range(processes):
            try:
                answer = await forgot.next_msg(timeout=FORGET_S)
            except nats.errors.TimeoutError:
                raise RuntimeError(f"an agent process at {url} did not say it forgot the "
                                   "bare auctioneer's instances") from None
            forgotten += int(answer.data)
    finally:
        await nc.close()
    if not rounds.confirmed:
        raise RuntimeError(f"the bare auctioneer's {rounds.awarded} awards in {rounds.rounds} "
                           f"rounds to {agents} agents at {url} were never confirmed")
    elapsed = rounds.last_confirmed - started
    return Bare(placements_per_s=round(rounds.confirmed / elapsed, 1),
                confirmed=rounds.confirmed, awarded=rounds.awarded, rounds=rounds.rounds,
                seconds=round(elapsed, 3),
                asked_per_round=round(rounds.asked / max(1, rounds.rounds), 1),
                forgotten=forgotten, batch=batch, in_flight=in_flight, d=d,
                round_p99_ms=round(1000 * p99(rounds.round_s), 3))


def p99(values: Sequence[float]) -> float:
    """The 99th percentile, nearest rank (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


async def beside(url: str, agents: int, processes: int, *, batch: int, in_flight: int,
                 d: int, seconds: float, log: Path) -> Bare:
    """`measure` in a process of its own, as the broker runs in one (its stderr to `log`);
    RuntimeError saying where to look when it fails."""
    out = open(log, "ab")  # noqa: SIM115
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gavel.bench.bare", "--url", url, "--agents", str(agents),
            "--processes", str(processes), "--batch", str(batch), "--in-flight",
            str(in_flight), "--d", str(d), "--seconds", str(seconds),
            stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL)
        try:
            stdout, _ = await proc.communicate()
        except BaseException:  # the run stopped (a signal): its child goes with it
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
    finally:
        out.close()
    bare = _answer(stdout)
    if proc.returncode != 0 or isinstance(bare, Malformed):
        raise RuntimeError(f"the bare auctioneer failed (exit status {proc.returncode}); "
                           f"see {log}")
    return bare


_answer = Decode[Bare](Bare, json=True)


async def _standalone(args: argparse.Namespace) -> Bare:
    """Rule 4: a nats-server and agent processes of its own, stopped after."""
    root = Path(tempfile.mkdtemp(prefix="gavel-bare-"))
    server = NatsServer(store_dir=root / "nats", log=root / "nats.log", max_payload_mb=8)
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await start_agents(server.url, args.agents, args.processes, root / "logs",
                           started=procs)
        args.processes = len(procs)  # fewer when there are fewer agents
        return await _measured(server.url, args)
    finally:
        stop(procs)
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _measured(url: str, args: argparse.Namespace) -> Bare:
    return await measure(url, args.agents, args.processes, batch=args.batch,
                         in_flight=args.in_flight,
                         d=args.d, seconds=args.seconds, seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.bare",
                                description="the bare auctioneer's placements/s, as JSON")
    p.add_argument("--url", help="agents already serving there (else: its own, rule 4)")
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--in-flight", type=int, default=1)
    p.add_argument("--d", type=int, default=2, help="nodes a request (0: broadcast)")
    p.add_argument("--seconds", type=float, default=2.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    tune_gc()  # as the broker's process does
    bare = eventloop.run(_measured(args.url, args) if args.url else _standalone(args))
    sys.stdout.write(msgspec.json.encode(bare).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
