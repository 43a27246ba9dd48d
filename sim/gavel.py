"""gavel's own placement: every node bids through its strategy, the real auction awards.

Rules:
1. Broadcast asks every eligible node; sample asks d random eligible nodes among those that
   could ever take the request, through the broker's own index (`shared.candidates`): a
   shape no node could take is unschedulable without a round. Failed nodes stay eligible
   until liveness marks them unreachable, and say nothing meanwhile. The central baselines
   (``omniscient=True``) sample blind: power-of-d is d of all live nodes.
2. The fast broadcast path reads the order book (`sim.book`): `sim.rounds.leaders` walks
   the ranked bids from the best, skipping replies the network lost (`sim.network`, rule
   1), until it has the winner and knows whether the next bid ties it; then it runs the
   real `Auction` on those replies (`sim.rounds`, rule 2). When nothing bids, it checks
   which declines the network lost, so the unschedulable reason is exact too (`sim.rounds`,
   rule 4). A shape with soft affinities is walked at each bid's load plus its node's
   adjustment and decided by the `Auction` given the nodes' labels (`sim.rounds` rule 3).
   The naive path (``naive=True``) calls `shared.strategies.answer` for every
   eligible node and feeds them all to the `Auction`: same winners, ties and reasons — a
   test holds the two to that.
3. ``omniscient=True`` is the central scheduler on fresh state: only live nodes are asked,
   nothing is lost, no time passes.
4. The broker's two refinements of power-of-d, on by default and switched off to measure
   plain sampling: ``retry_all`` asks `RETRY_TIMES`·d nodes when the d sampled nodes place
   nothing, then every candidate (more rounds, their time added; `shared.candidates` rule 9),
   ``sticky`` asks the last winner of the shape beside the d drawn nodes (rule 3).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from gavel.shared.affinity import adjustment
from gavel.shared.auction import Awarded, Decision
from gavel.shared.candidates import RETRY_TIMES, Candidates
from gavel.shared.strategies import Strategy, answer
from gavel.sim.book import REASONS, Ranked
from gavel.sim.cluster import Cluster
from gavel.sim.network import NetworkModel
from gavel.sim.placer import Outcome, Placer, Why
from gavel.sim.rounds import Answer, leaders, run_round
from gavel.sim.workload import Catalogue

__all__ = ["GavelPlacer"]


class GavelPlacer(Placer):
    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 strategies: list[Strategy], labels: list[str], *, network: NetworkModel,
                 rng: random.Random, mode: str = "broadcast", d: int = 2,
                 omniscient: bool = False, naive: bool = False, retry_all: bool = True,
                 sticky: bool = True) -> None:
        super().__init__(name, cluster, catalogue, strategies, labels)
        self.net = network
        self.rng = rng
        self.mode = mode
        self.d = d
        self.omniscient = omniscient
        self.naive = naive
        #: The nodes that could ever take each shape (rule 1), None when sampling blind.
        self.index = Candidates() if mode == "sample" and not omniscient else None
        self.retry_all = retry_all
        self.sticky = sticky
        #: The last winner of a sampled round per shape key (rule 4).
        self.last_winner: dict[object, str] = {}
        #: Per shape with affinities: what they add to each node's bid (`sim.rounds` rule 3).
        self._adjust: dict[int, npt.NDArray[np.float64]] = {}

    def _ranked(self, shape: int) -> Ranked:
        """The shape's bids in award order: at their loads, plus what its affinities add."""
        book = self.books[shape]
        affinities = book.request.affinities
        if not affinities:
            return book.ranked
        adj = self._adjust.get(shape)
        nodes = self.cluster.nodes
        if adj is None or len(adj) != len(nodes):  # a node's labels never change; joins do
            adj = self._adjust[shape] = np.array(
                [adjustment(affinities, n.labels) for n in nodes], dtype=np.float64)
        return Ranked(book.ranked.row + adj)

    def _labels(self, shape: int, nodes: Iterable[str]) -> dict[str, dict[str, str]] | None:
        """The labels a round of `shape` is decided with: its nodes', if it has affinities."""
        if not self.books[shape].request.affinities:
            return None
        by_id, all_nodes = self.cluster.by_id, self.cluster.nodes
        return {n: all_nodes[by_id[n]].labels for n in nodes if n in by_id}

    def changed(self, idx: int, why: str) -> None:
        super().changed(idx, why)
        index = self.index
        if index is None:
            return
        node = self.cluster.nodes[idx]
        if why in (Why.JOIN, Why.DRAIN):
            index.update(node.node_id, node.labels, node.capacity, node.draining)
        elif why == Why.UNREACHABLE:
            index.remove(node.node_id)

    def place(self, shape: int, now: float) -> Outcome:
        no = self.next_round()
        if self.mode == "sample":
            return self._sample(no, shape, now)
        if self.naive:
            return self._naive(no, shape, now)
        return self._broadcast(no, shape, now)

    # -- rule 2, fast ------------------------------------------------------------------------
    def _broadcast(self, no: int, shape: int, now: float) -> Outcome:
        book = self.books[shape]
        net = self.net
        lossy = net.lossy and not self.omniscient
        winner, tie, walked, lost_any = leaders(self._ranked(shape),
                                                net.lost if lossy else None, no)
        latency = 0.0
        silent = False
        if not self.omniscient:
            answering = len(self.cluster.alive)
            silent = (lost_any or self.cluster.silent_eligible > 0
                      or (lossy and net.draw() >= net.p_all_answer(answering - walked)))
            latency = net.round_s(answering, silent)
        if winner < 0:
            counts: Mapping[str, int] = book.declines
            if lossy:  # which declines were lost too: exact, and only when nothing bid
                decliners = np.flatnonzero(book.codes >= 0)
                lost = net.lost_among(no, decliners)
                silent = silent or bool(lost.any())
                kept = np.bincount(book.codes[decliners[~lost]], minlength=len(REASONS))
                counts = {REASONS[c]: int(n) for c, n in enumerate(kept) if n}
            return self.unschedulable(shape, now, silent, net.deadline, counts)._replace(
                latency=latency)
        ids = self.cluster.ids
        replies: list[tuple[str, Answer]] = []
        for idx in (winner, tie):
            if idx >= 0:
                ans = book.answers[idx]
                assert ans is not None
                replies.append((ids[idx], ans))
        decision = run_round(f"{self.name}-{no}", book.request, replies, [], now,
                             net.deadline, now + latency,
                             self._labels(shape, (n for n, _ in replies)))
        return self._outcome(decision, latency, winner)

    # -- rule 2, naive -----------------------------------------------------------------------
    def _naive(self, no: int, shape: int, now: float) -> Outcome:
        request = self.books[shape].request
        nodes = self.cluster.nodes
        lossy = self.net.lossy and not self.omniscient
        replies: list[tuple[str, Answer]] = []
        silent: list[str] = []
        asked = self.cluster.alive if self.omniscient else self.cluster.eligible
        for idx in sorted(asked.items):
            node = nodes[idx]
            if not node.alive or (lossy and self.net.lost(no, idx)):
                silent.append(node.node_id)
            else:
                replies.append((node.node_id, answer(self.strategies[idx], request, node.view())))
        latency = 0.0 if self.omniscient else self.net.round_s(len(self.cluster.alive),
                                                                bool(silent))
        decision = run_round(f"{self.name}-{no}", request, replies, silent, now,
                             self.net.deadline, now + latency,
                             self._labels(shape, (n for n, _ in replies)))
        return self._outcome(decision, latency, None)

    # -- rule 1, sampling --------------------------------------------------------------------
    def _sample(self, no: int, shape: int, now: float, stage: int = 0) -> Outcome:
        """One sampled round; `stage` 1 is the retry of `RETRY_TIMES`·d (rule 4)."""
        book = self.books[shape]
        d = self.d * RETRY_TIMES if stage else self.d
        index = self.index
        if index is None:
            asked = self.cluster.alive if self.omniscient else self.cluster.eligible
            picks = asked.sample(self.rng, d)
        else:
            draw = index.draw([book.request], [1], d, self.rng,
                              last=self.last_winner if self.sticky else None)
            if draw.hopeless:  # no node could ever take it: no round (rule 1)
                return self.unschedulable(shape, now, False, self.net.deadline)
            by_id = self.cluster.by_id
            picks = [by_id[n] for n in draw.asked]
        nodes = self.cluster.nodes
        lossy = self.net.lossy and not self.omniscient
        replies: list[tuple[str, Answer]] = []
        silent: list[str] = []
        for idx in picks:
            node = nodes[idx]
            if not node.alive or (lossy and self.net.lost(no, idx)):
                silent.append(node.node_id)
                continue
            if self.naive:
                ans: Answer | None = answer(self.strategies[idx], book.request, node.view())
            else:
                ans = book.answers[idx]
            assert ans is not None
            replies.append((node.node_id, ans))
        answering = sum(1 for idx in picks if nodes[idx].alive)
        latency = 0.0 if self.omniscient else self.net.round_s(answering, bool(silent))
        decision = run_round(f"{self.name}-{no}", book.request, replies, silent, now,
                             self.net.deadline, now + latency,
                             self._labels(shape, (n for n, _ in replies)))
        if isinstance(decision, Awarded):
            self.last_winner[book.request.key()] = decision.winner.node_id
        elif self.retry_all and index is not None and not draw.whole[0]:
            # rule 4: more nodes, then every candidate (those that cannot fit decline)
            if stage == 0:
                second = self._sample(self.next_round(), shape, now + latency, 1)
            elif self.naive:
                second = self._naive(self.next_round(), shape, now + latency)
            else:
                second = self._broadcast(self.next_round(), shape, now + latency)
            return second._replace(latency=latency + second.latency)
        return self._outcome(decision, latency, None)

    def _outcome(self, decision: Decision, latency: float, expected: int | None) -> Outcome:
        if isinstance(decision, Awarded):
            idx = self.cluster.by_id[decision.winner.node_id]
            assert expected is None or idx == expected, "the auction disagrees with the book"
            return Outcome(idx, "", latency, decision.tie_broken)
        return Outcome(-1, decision.reason, latency)
