"""What a re-auction round costs the broker beside an ordinary auction of the same size.

``python -m gavel.bench.reauction [--nodes N] [--waiting W] [--pairs K]``

Rules:
1. Both rounds place one service replica among `nodes` nodes that all answer: the broker's
   work for each is the same RFB out and `nodes` replies in, so what is timed is what
   differs — the `Auction` fed every reply and decided with the replicas per node and the
   nodes' labels (the spread rule), and, for the re-auction, its RFB naming the holder,
   the holder's room given back, the group's count without the candidate and the judgement
   (`shared.reauction.judge`) against `waiting` unschedulable shapes. Both build the
   round's free room and replica counts afresh, as the broker does from its state.
2. The two are timed in alternating pairs in one process (A, B, A, B, ...), so the
   machine's drift hits both alike; it prints each one's median and their ratio, and
   judges nothing (no test asserts a timing).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import msgspec

from gavel.shared.auction import Auction
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import BidReply, Capacity, Request, Shape
from gavel.shared.reauction import Room, judge, keep_view
from gavel.shared.spread import Tally
from gavel.shared.strategies import answer, make_strategy

__all__ = ["Fixture", "main", "measure"]


class Fixture:
    """A fleet of `nodes` answering one replica's request, and `waiting` shapes queued."""

    def __init__(self, nodes: int, waiting: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        strategy = make_strategy("least-loaded")
        self.ids = [f"n{i:05d}" for i in range(nodes)]
        cap = Capacity(cpu=16.0, memory_mb=65536, ports=1000)
        self.request = Request(instance_id="web-1", cpu=1.0, memory_mb=1024, group="web")
        self.views = {n: NodeView(node_id=n, capacity=cap, labels={"zone": f"z{i % 3}"},
                                  committed=Capacity(cpu=rng.uniform(1, 12),
                                                     memory_mb=rng.randrange(2048, 49152)))
                      for i, n in enumerate(self.ids)}
        self.holder = self.ids[0]
        self.free = {n: v.capacity - v.committed for n, v in self.views.items()}
        self.labels = {n: dict(v.labels) for n, v in self.views.items()}
        self.held = {"web": {n: 1 for n in self.ids[: nodes // 10]}}
        self.waiting = [Shape(cpu=float(rng.choice((8, 12, 16))), memory_mb=32768)
                        for _ in range(waiting)]

        def reply(aid: str, node: str, keep: bool) -> BidReply:
            view = self.views[node]
            if keep:
                view = keep_view(view, self.request)
            return BidReply(auction_id=aid, node_id=node,
                            answers=[answer(strategy, self.request, view)])
        self.ordinary = [reply("a", n, False) for n in self.ids]
        self.again = [reply("r", n, n == self.holder) for n in self.ids]

    def auction(self) -> None:
        """An ordinary replica auction (rule 1): its free room and the group's replicas per
        node are built for the round, as the broker builds them from its state."""
        a = Auction("a", [self.request], self.ids, 0.0, 2.0)
        a.rfb()
        for r in self.ordinary:
            a.receive(r, 0.0)
        free = dict(self.free)
        held = {"web": dict(self.held["web"])}
        a.decide(0.0, free, held=held, labels=self.labels)

    def reauction(self) -> None:
        """The same, as `broker.reauction` runs it (rule 1)."""
        a = Auction("r", [self.request], self.ids, 0.0, 2.0)
        msgspec.structs.replace(a.rfb(), keep=self.holder)
        for r in self.again:
            a.receive(r, 0.0)
        free = dict(self.free)
        free[self.holder] = free[self.holder] + self.request
        held = {"web": dict(self.held["web"])}
        held["web"][self.holder] = held["web"].get(self.holder, 1) - 1
        decision = a.decide(0.0, free, held=held, labels=self.labels)[0]
        view = self.views[self.holder]
        judge(self.request, self.holder, decision, margin=0.05,
              holder_room=Room(view.capacity, view.committed, view.labels),
              waiting=self.waiting, tally=Tally(held, self.labels))


def _time(fn: Callable[[], None], rounds: int) -> float:
    began = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - began) / rounds


def measure(nodes: int, waiting: int, pairs: int, rounds: int = 20) -> tuple[float, float]:
    """Rule 2: the median cpu seconds of an ordinary round and of a re-auction round."""
    f = Fixture(nodes, waiting)
    ordinary: list[float] = []
    again: list[float] = []
    for _ in range(pairs):
        ordinary.append(_time(f.auction, rounds))
        again.append(_time(f.reauction, rounds))
    return statistics.median(ordinary), statistics.median(again)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.reauction",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--waiting", type=int, default=100)
    p.add_argument("--pairs", type=int, default=9)
    args = p.parse_args(argv)
    ordinary, again = measure(args.nodes, args.waiting, args.pairs)
    print(f"{args.nodes} nodes answering, {args.waiting} shapes waiting, median of "
          f"{args.pairs} alternating pairs (cpu time):")
    print(f"  ordinary replica auction  {ordinary * 1e3:8.3f} ms a round")
    print(f"  re-auction                {again * 1e3:8.3f} ms a round")
    print(f"  ratio                     {again / ordinary:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
