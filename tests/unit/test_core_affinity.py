"""Soft affinities in memory (`shared.affinity`, `shared.auction` rule 5): the award ranks
each bid at its load adjusted by the affinities its node's labels match, deterministically;
bad affinities are refused with a sentence naming the field; nodes never see them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.cli.specfile import SpecError, load_spec
from gavel.shared.affinity import Affinity, adjustment, unmatched
from gavel.shared.auction import Auction, Awarded
from gavel.shared.auctioneer import Decided, Open
from gavel.shared.messages import Bid, BidReply, Capacity, Request
from gavel.shared.spec import Spec
from tests.unit.test_core_auctioneer import World, core

LABELS = {"a": {"zone": "east"}, "b": {"zone": "west"}, "c": {}}
FREE = {n: Capacity(cpu=4.0, memory_mb=4096, ports=10) for n in LABELS}


def spec(*affinities: Affinity, name: str = "web") -> Spec:
    return Spec(name=name, command=["true"], affinities=list(affinities))


def decide(requests: list[Request], loads: dict[str, float], order: list[str] | None = None
           ) -> list[Awarded]:
    auction = Auction("x", requests, LABELS, 0.0, 1.0)
    for node in order or sorted(loads):
        auction.receive(BidReply(auction_id="x", node_id=node, answers=[
            Bid(shape=i, load=loads[node], step=0.1, strategy="s")
            for i in range(len(auction.shapes))]), 0.0)
    out = auction.decide(0.5, FREE, labels=LABELS)
    assert all(isinstance(d, Awarded) for d in out)
    return [d for d in out if isinstance(d, Awarded)]


def test_a_preferred_node_wins_over_a_lower_bid_and_says_what_was_added() -> None:
    loads = {"a": 0.2, "b": 0.5, "c": 0.3}
    plain = decide([Request.of("i", spec())], loads)[0]
    assert plain.winner.node_id == "a" and plain.winner.affinity == 0.0
    west = Affinity(label="zone", value="west", weight=50)
    got = decide([Request.of("i", spec(west))], loads)[0]
    assert got.winner.node_id == "b"
    assert got.winner.affinity == pytest.approx(-0.5)
    assert got.winner.load == pytest.approx(0.0)  # 0.5 bid - 0.5 affinity
    shown = {b.node_id: (b.load, b.affinity) for b in got.bids}
    assert shown["a"] == (0.2, 0.0) and shown["c"] == (0.3, 0.0)


def test_a_negative_weight_avoids_and_a_weak_preference_does_not_outweigh_a_big_gap() -> None:
    loads = {"a": 0.2, "b": 0.5, "c": 0.3}
    avoid = decide([Request.of("i", spec(Affinity(label="zone", value="east",
                                                  weight=-20)))], loads)[0]
    assert avoid.winner.node_id == "c"  # a at 0.4 now, c at 0.3
    weak = decide([Request.of("i", spec(Affinity(label="zone", value="west",
                                                 weight=10)))], loads)[0]
    assert weak.winner.node_id == "a"  # b at 0.4: a preference, not a constraint


def test_the_award_with_affinities_does_not_depend_on_the_order_bids_arrived_in() -> None:
    loads = {"a": 0.3, "b": 0.5, "c": 0.3}
    req = [Request.of("i", spec(Affinity(label="zone", value="west", weight=20)))]
    winners = set()
    rng = random.Random(7)
    for _ in range(20):
        order = sorted(loads)
        rng.shuffle(order)
        got = decide(req, loads, order)[0]
        winners.add((got.winner.node_id, got.tie_broken))
    assert winners == {("a", True)}  # a, b (0.3 adjusted) and c tie at 0.3: node id


def test_requests_with_and_without_affinities_share_no_shape_in_a_batch() -> None:
    west = Affinity(label="zone", value="west", weight=60)
    reqs = [Request.of("p", spec()), Request.of("q", spec(west)), Request.of("r", spec())]
    auction = Auction("x", reqs, LABELS, 0.0, 1.0)
    assert len(auction.shapes) == 2 and auction.shape_of == [0, 1, 0]
    got = decide(reqs, {"a": 0.2, "b": 0.5, "c": 0.3})
    assert [d.winner.node_id for d in got] == ["a", "b", "c"]  # a stepped to 0.3: c on id


def test_the_auctioneer_core_passes_the_labels_for_affinities_alone() -> None:
    w = World({"a": 4.0, "b": 4.0}, labels={"a": {}, "b": {"disk": "ssd"}})
    w.add("i1", spec(Affinity(label="disk", value="ssd", weight=100)))
    c = core(w)
    c.reconcile(0.0)
    [opened] = [a for a in c.take() if isinstance(a, Open)]
    assert "affinit" not in repr(opened.auction.rfb())  # the nodes never see them
    for node, load in (("a", 0.0), ("b", 0.9)):
        c.receive(BidReply(auction_id=opened.auction.auction_id, node_id=node,
                           answers=[Bid(shape=0, load=load, strategy="s")]), 0.1)
    [decided] = [a for a in c.take() if isinstance(a, Decided)]
    [d] = decided.decisions
    assert isinstance(d, Awarded) and d.winner.node_id == "b"


def test_adjustment_sums_the_matching_affinities() -> None:
    affs = [Affinity(label="zone", value="west", weight=40),
            Affinity(label="disk", value="ssd", weight=-10)]
    assert adjustment(affs, {"zone": "west", "disk": "ssd"}) == pytest.approx(-0.3)
    assert adjustment(affs, {"zone": "east"}) == 0.0
    assert unmatched(affs, [{"zone": "east"}, {}]) == [affs[1]]


@pytest.mark.parametrize(("body", "says"), [
    ('label = "zone"\nvalue = "west"\nweight = 101', "field 'affinities[0].weight'"),
    ('label = "zone"\nvalue = "west"\nweight = -101', "field 'affinities[0].weight'"),
    ('value = "west"\nweight = 10', "missing required field `label`"),
    ('label = "zone"\nvalue = "west"\nweight = 0', "weight 0 prefers nothing"),
    ('label = "zone"\nvalue = "west"\nweight = 10\nhard = true', "unknown field `hard`"),
])
def test_bad_affinities_are_refused_with_a_sentence_naming_the_field(
        tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(f'name = "web"\ncommand = ["true"]\n[[affinities]]\n{body}\n')
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_two_affinities_on_one_label_and_value_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    one = '[[affinities]]\nlabel = "zone"\nvalue = "west"\nweight = 10\n'
    path.write_text(f'name = "web"\ncommand = ["true"]\n{one}{one}')
    with pytest.raises(SpecError, match="distinct label and value"):
        load_spec(path)


NODE_IDS = [f"n{i}" for i in range(6)]


@given(loads=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
       zones=st.lists(st.sampled_from(["east", "west", ""]), min_size=6, max_size=6),
       weights=st.lists(st.integers(-100, 100).filter(bool), min_size=1, max_size=2),
       seed=st.integers(0, 1000))
def test_the_winner_is_the_lowest_adjusted_load_then_node_id_in_any_order(
        loads: list[float], zones: list[str], weights: list[int], seed: int) -> None:
    labels = {n: ({"zone": z} if z else {}) for n, z in zip(NODE_IDS, zones, strict=True)}
    affs = [Affinity(label="zone", value=v, weight=w)
            for v, w in zip(["east", "west"], weights, strict=False)]
    req = Request.of("i", spec(*affs))
    order = list(NODE_IDS)
    random.Random(seed).shuffle(order)
    auction = Auction("x", [req], NODE_IDS, 0.0, 1.0)
    for node in order:
        auction.receive(BidReply(auction_id="x", node_id=node, answers=[
            Bid(shape=0, load=loads[NODE_IDS.index(node)], strategy="s")]), 0.0)
    [got] = auction.decide(0.5, {}, labels=labels)
    assert isinstance(got, Awarded)
    want = min(NODE_IDS, key=lambda n: (loads[NODE_IDS.index(n)]
                                        + adjustment(affs, labels[n]), n))
    assert got.winner.node_id == want
