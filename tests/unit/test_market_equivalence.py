"""One auctioneer, two clocks: the same arrivals through the broker's real shell (a real
`Broker` on a stand-in wire, its real ledger and committer) and through the simulator's
production driver (`sim.market`) get the same awards - the same winner per instance, the
same unschedulable reasons - with rounds in flight together racing for the same nodes.

Both sides price bids the same way (`shared.strategies.answer` on the node's committed
state as git has it when the RFB goes out); each auction's replies all arrive, and its
commit lands before the next auction closes, on both sides."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from gavel.broker.ledger.plan import View, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.auctioneer import Decided
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import RFB, BidReply, Capacity, Heartbeat
from gavel.shared.records import InstanceRecord
from gavel.shared.strategies import Strategy, answer, make_strategy
from gavel.shared.timing import Timing
from gavel.sim.cluster import Cluster
from gavel.sim.market import Market
from gavel.sim.metrics import Recorder
from gavel.sim.scenario import Scenario, parse_scenario
from gavel.sim.workload import Arrival, Catalogue
from gavel.transport import wire
from tests.unit.fuzzkit import Msg

SCENARIO = b"""
name = "equivalence"
duration_s = 5.0
[[nodes]]
count = 4
cpu = 4.0
memory_mb = 8192
[[nodes]]
count = 2
cpu = 8.0
memory_mb = 16384
labels = { disk = "ssd" }
[[gavel]]
name = "mixed"
mix = [{ strategy = "least-loaded", share = 0.5 }, { strategy = "binpack", share = 0.5 }]
auctioneer = "production"
[workload]
rate = 1.0
[[workload.classes]]
name = "small"
cpu = { values = [0.5, 1.0] }
memory_mb = 1024.0
[[workload.classes]]
name = "big"
cpu = 3.0
memory_mb = 4096.0
[[workload.classes]]
name = "ssd"
cpu = 2.0
memory_mb = 2048.0
labels = { disk = "ssd" }
[network]
latency_s = { dist = "constant", value = 0.005 }
[market]
batch_max = 3
max_auctions = 3
commit_lag_s = 0.0
staleness_s = 0.0
"""
STRATEGIES = ["least-loaded", "binpack", "least-loaded", "binpack", "binpack", "least-loaded"]
ARRIVALS = 30

Outcomes = dict[str, str]


def _outcome(d: Decision) -> str:
    return d.winner.node_id if isinstance(d, Awarded) else f"unschedulable: {d.reason}"


def _arrivals(catalogue: Catalogue) -> list[Arrival]:
    """Every shape in turn, all at once: more than the fleet holds, so rounds race."""
    return [Arrival(at=0.0, seq=k, shape=k % len(catalogue.shapes), duration=float("inf"),
                    cls=0) for k in range(ARRIVALS)]


def _scenario(mode: str) -> Scenario:
    s = parse_scenario(SCENARIO)
    return msgspec.structs.replace(s, gavel=[msgspec.structs.replace(s.gavel[0], mode=mode)])


def simulated(mode: str) -> Outcomes:
    s = _scenario(mode)
    cluster = Cluster(s)
    catalogue = Catalogue(s.workload.classes)
    strategies: list[Strategy] = [make_strategy(n) for n in STRATEGIES]
    rec = Recorder("gavel:mixed", "gavel", "", cluster, catalogue, STRATEGIES,
                   [c.name for c in s.workload.classes], s.window)
    market = Market(s, s.gavel[0], cluster, catalogue, iter(_arrivals(catalogue)), [],
                    strategies, rec, seed=1)
    first: Outcomes = {}
    submit_ = market._submit

    def seen(decided: Decided, now: float) -> None:
        for d in decided.decisions:
            first.setdefault(d.request.instance_id, _outcome(d))
        submit_(decided, now)

    market._submit = seen  # type: ignore[method-assign]
    market.run()
    return first


async def brokered(root: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> Outcomes:
    s = _scenario(mode)
    cluster = Cluster(s)
    catalogue = Catalogue(s.workload.classes)
    strategies = {n.node_id: make_strategy(STRATEGIES[n.idx]) for n in cluster.nodes}
    b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root,
                      timing=Timing(bid_deadline_s=600.0),
                      clock=lambda: 1000.0,
                      batch_max=s.market.batch_max, max_auctions=s.market.max_auctions,
                      sample_d=s.gavel[0].d if mode == "sample" else None))
    b.auctioneer.core.rng = random.Random("1/placer/gavel:mixed")  # the simulator's stream
    rfbs = msgspec.msgpack.Decoder(RFB)
    enc = msgspec.msgpack.Encoder()
    replies: dict[str, list[BidReply]] = {}  # per auction, oldest first
    by_id = {n.node_id: n for n in cluster.nodes}

    def write_now(nc: object, batch: list[tuple[str, bytes]]) -> bool:
        state = b.ledger.state()
        for subject, payload in batch:  # each node prices the RFB as it goes out
            if subject == subjects.RFB:
                asked = list(cluster.nodes)
            elif subject.startswith(subjects.RFB + "."):
                asked = [by_id[subject.rsplit(".", 1)[1]]]
            else:
                continue
            rfb = rfbs.decode(payload)
            for n in asked:
                used = state.committed.get(n.node_id) or Capacity()
                view = NodeView(node_id=n.node_id, capacity=n.capacity, stats=n.stats,
                                labels=n.labels, committed=used.copy())
                replies.setdefault(rfb.auction_id, []).append(BidReply(
                    auction_id=rfb.auction_id, node_id=n.node_id, answers=[
                        answer(strategies[n.node_id], shape, view, i)
                        for i, shape in enumerate(rfb.shapes)]))
        return True

    monkeypatch.setattr(wire, "write_now", write_now)
    first: Outcomes = {}
    decided = b.auctioneer._decided

    def seen(auction: Auction, decisions: list[Decision], round_s: float) -> None:
        for d in decisions:
            first.setdefault(d.request.instance_id, _outcome(d))
        decided(auction, decisions, round_s)

    b.auctioneer._decided = seen  # type: ignore[method-assign]
    committer = asyncio.get_running_loop().create_task(b.committer.run())
    try:
        for n in cluster.nodes:
            b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=n.node_id), enc.encode(
                Heartbeat(node_id=n.node_id, strategy=STRATEGIES[n.idx], labels=n.labels,
                          port_range=[20000, 20999], capacity=n.capacity))))
        specs = Market(s, s.gavel[0], cluster, catalogue, iter(()), [], [], Recorder(
            "x", "gavel", "", cluster, catalogue, STRATEGIES, ["small", "big", "ssd"],
            s.window), seed=1).specs
        for a in _arrivals(catalogue):  # one submission after another, each a pass
            view = View(b.ledger.state())
            submit(view, InstanceRecord(instance_id=f"i{a.seq}", spec=specs[a.shape]))
            b.ledger.apply(view.change, f"submit i{a.seq}", b.ledger.state().head)
            b.auctioneer.reconcile(b.now())
        while replies:  # oldest round first; its commit lands before the next one closes
            for reply in replies.pop(next(iter(replies))):
                b.auctioneer.on_bids(Msg(subjects.BIDS.format(node=reply.node_id),
                                         enc.encode(reply)))
            await asyncio.sleep(0)
            await asyncio.wait_for(b.committer.idle.wait(), 30)
            b.auctioneer.reconcile(b.now())
    finally:
        committer.cancel()
    return first


@pytest.mark.parametrize("mode", ["broadcast", "sample"])
async def test_the_broker_and_the_simulator_award_alike(tmp_path: Path, mode: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sim = simulated(mode)
    real = await brokered(tmp_path, monkeypatch, mode)
    assert len(sim) == ARRIVALS
    assert any(o.startswith("unschedulable") for o in sim.values())  # the fleet runs out
    assert len({o for o in sim.values()}) > 3  # and several nodes win
    assert real == sim
