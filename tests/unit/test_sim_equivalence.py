"""The simulator awards exactly what the broker's `Auction.decide` would, fast path or not.

The simulator has no award rule of its own: every round, fast or naive, is decided by the
broker's `shared.auction.Auction` (`sim.rounds.run_round`), whose `decide` is
`shared.award`'s rule. What the fast path adds is a choice of which replies that `Auction`
hears: `sim.rounds.leaders` walks the order book's ranking and keeps the best bid and the
next one with the same load. That walk is the one copy, and it may differ from the award
rule's own walk in exactly these things (`test_same_bids_same_winner_as_auction_decide`):
1. it ranks ``(load, index)`` rows of the book, not `NodeBid`s (index order is id order);
2. it never passes a bid over for want of room: the book priced each bid on its node's own
   free room, and neither round is given `free`;
3. it passes over the replies the network lost, which the full round hears as silence;
4. the `Awarded` it yields lists only the replies it was fed (`bids`, `declines`,
   `silent`): the simulator reads of a decision only its winner, its tie and, unawarded,
   its reason (`GavelPlacer._outcome`, which also checks the winner is the book's).
Winners, ties and unschedulable reasons may not differ: the fast path is held equal to the
naive one (every eligible node asked through `shared.strategies.answer`, every reply fed to
the `Auction`) over thousands of placements below. The walk must exist because the rule's
own walk needs every bid as a `NodeBid`, sorted - a thousand a round on a thousand nodes,
where two decide it: the fast path with `leaders` replaced by every bid of the book fed to
the `Auction` takes about forty times its CPU for the same placements (docs/simulator.md,
"Speed", gives the run and its figures).
"""

from __future__ import annotations

import random
from collections import Counter

import msgspec
import pytest

from gavel.shared.auction import Auction, Awarded, Unschedulable
from gavel.shared.messages import Bid, BidReply, Decline, Request
from gavel.shared.reasons import Reason
from gavel.shared.strategies import answer
from gavel.sim.book import Books
from gavel.sim.cluster import Cluster
from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import plan, run_policy, simulate
from gavel.sim.rounds import leaders, reduced_declines, run_round
from gavel.sim.scenario import Scenario, parse_scenario
from gavel.sim.workload import Catalogue

MIXED = """
name = "equivalence"
duration_s = {duration}
sample_s = 20.0
[timing]
offline_s = 40.0
[[nodes]]
count = 24
cpu = 4.0
memory_mb = 8192
[[nodes]]
count = 12
cpu = 8.0
memory_mb = 16384
labels = {{ zone = "b" }}
background_cpu = 0.3
[[gavel]]
name = "broadcast"
mix = [
  {{ strategy = "least-loaded", share = 3 }},
  {{ strategy = "binpack", share = 3 }},
  {{ strategy = "headroom", share = 2, params = {{ ceiling = 0.7 }} }},
  {{ strategy = "spread", share = 2 }},
]
[[gavel]]
name = "sampled"
mode = "sample"
d = 3
mix = [{{ strategy = "binpack", share = 1 }}, {{ strategy = "least-loaded", share = 1 }}]
[workload]
rate = 6.0
[[workload.classes]]
name = "small"
weight = 5
cpu = {{ values = [0.25, 0.5, 1.0] }}
memory_mb = {{ values = [256.0, 1024.0] }}
duration_s = {{ dist = "exponential", mean = 40.0 }}
[[workload.classes]]
name = "zoned"
weight = 1
cpu = 2.0
memory_mb = 2048.0
labels = {{ zone = "b" }}
duration_s = {{ dist = "forever" }}
[network]
latency_s = {{ dist = "lognormal", median = 0.05, sigma = 1.0 }}
loss = 0.02
deadline_s = 0.5
[[events]]
kind = "fail"
at_s = 150.0
count = 3
over_s = 30.0
[[events]]
kind = "drain"
at_s = 300.0
count = 2
[[events]]
kind = "join"
at_s = 350.0
group = {{ count = 4, cpu = 16.0, memory_mb = 32768 }}
"""


# Three zones, gpu nodes, a draining node, zone-pinned and gpu classes, a class with soft
# affinities (`sim.rounds` rule 3): 38 request shapes, so
# the memo of node states (`sim.book` rule 1), the fixed missing-label declines (rule 3) and
# the fixed no-room declines (rule 4) all decide answers here.
LABELLED = """
name = "labelled"
duration_s = {duration}
sample_s = 20.0
[timing]
offline_s = 40.0
[[nodes]]
count = 8
cpu = 4.0
memory_mb = 8192
labels = {{ zone = "a" }}
[[nodes]]
count = 8
cpu = 8.0
memory_mb = 16384
labels = {{ zone = "b" }}
[[nodes]]
count = 6
cpu = 16.0
memory_mb = 32768
labels = {{ zone = "c" }}
[[nodes]]
count = 4
cpu = 16.0
memory_mb = 65536
labels = {{ zone = "c", gpu = "yes" }}
background_cpu = 0.2
[[gavel]]
name = "mixed"
mix = [
  {{ strategy = "least-loaded", share = 4 }},
  {{ strategy = "binpack", share = 3 }},
  {{ strategy = "spread", share = 2 }},
  {{ strategy = "headroom", share = 1, params = {{ ceiling = 0.8 }} }},
]
[[gavel]]
name = "sampled"
mode = "sample"
d = 4
mix = [{{ strategy = "binpack", share = 1 }}, {{ strategy = "spread", share = 1 }}]
[[gavel]]
name = "reserved"
reserve_for = ["gpu"]
mix = [{{ strategy = "binpack", share = 1 }}, {{ strategy = "least-loaded", share = 1 }}]
[baselines]
run = ["central-fresh", "random", "nomad-binpack"]
[workload]
rate = 5.0
patience_s = 60.0
[[workload.classes]]
name = "service"
weight = 6
cpu = {{ values = [0.25, 0.5, 1.0, 2.0] }}
memory_mb = {{ values = [512.0, 1024.0, 2048.0] }}
duration_s = {{ dist = "exponential", mean = 60.0 }}
[[workload.classes]]
name = "big"
weight = 1
cpu = {{ values = [8.0, 12.0, 16.0] }}
memory_mb = {{ values = [16384.0, 32768.0] }}
duration_s = {{ dist = "exponential", mean = 80.0 }}
[[workload.classes]]
name = "gpu"
weight = 1
cpu = {{ values = [2.0, 4.0] }}
memory_mb = {{ values = [8192.0, 16384.0] }}
labels = {{ gpu = "yes" }}
duration_s = {{ dist = "exponential", mean = 80.0 }}
[[workload.classes]]
name = "pinned-a"
weight = 2
cpu = {{ values = [0.5, 1.0] }}
memory_mb = {{ values = [1024.0, 4096.0] }}
labels = {{ zone = "a" }}
duration_s = {{ dist = "exponential", mean = 60.0 }}
[[workload.classes]]
name = "pinned-b"
weight = 2
cpu = {{ values = [0.5, 1.0] }}
memory_mb = {{ values = [1024.0, 4096.0] }}
labels = {{ zone = "b" }}
duration_s = {{ dist = "exponential", mean = 60.0 }}
[[workload.classes]]
name = "pinned-c"
weight = 2
cpu = {{ values = [0.5, 1.0] }}
memory_mb = {{ values = [1024.0, 4096.0] }}
labels = {{ zone = "c" }}
duration_s = {{ dist = "exponential", mean = 60.0 }}
[[workload.classes]]
name = "near-b"
weight = 2
cpu = {{ values = [0.5, 1.0] }}
memory_mb = 1024.0
duration_s = {{ dist = "exponential", mean = 60.0 }}
[[workload.classes.affinities]]
label = "zone"
value = "b"
weight = 60
[[workload.classes.affinities]]
label = "gpu"
value = "yes"
weight = -100
[network]
latency_s = {{ dist = "lognormal", median = 0.05, sigma = 1.0 }}
loss = 0.02
deadline_s = 0.5
[[events]]
kind = "fail"
at_s = 100.0
count = 2
[[events]]
kind = "drain"
at_s = 200.0
count = 2
"""


def scenario(duration: float = 700.0, text: str = MIXED) -> Scenario:
    return parse_scenario(text.format(duration=duration).encode())


def _timeless(data: object) -> object:
    if isinstance(data, dict):
        return {k: _timeless(v) for k, v in data.items()
                if not k.rsplit(".", 1)[-1].startswith(("latency", "wait_"))}
    if isinstance(data, list):
        return [_timeless(v) for v in data]
    return data


def _comparable(p: PolicyResult) -> dict[str, object]:
    """Everything but latency and waits (which include it): the two paths draw the length
    of a round from the network differently."""
    data = _timeless(msgspec.to_builtins(p))
    assert isinstance(data, dict)
    return data


# (seconds, placements at least): past every event of the scenario either way; the slow
# suite runs the longer one.
@pytest.mark.parametrize(("duration", "least"), [
    pytest.param(400.0, 5_000, id="400s"),
    pytest.param(700.0, 10_000, id="700s", marks=pytest.mark.slow)])
def test_fast_path_equals_naive_path_over_thousands_of_placements(duration: float,
                                                                  least: int) -> None:
    s = scenario(duration)
    fast = simulate(s, 11)
    naive = simulate(s, 11, naive=True)
    placed = sum(p.placements for p in fast.policies)
    assert placed > least
    assert any(p.unschedulable for p in fast.policies)
    assert any(p.replacements for p in fast.policies)
    for a, b in zip(fast.policies, naive.policies, strict=True):
        assert _comparable(a) == _comparable(b), a.policy


@pytest.mark.parametrize(("duration", "least"), [
    pytest.param(250.0, 2_500, id="250s"),
    pytest.param(500.0, 5_000, id="500s", marks=pytest.mark.slow)])
def test_fast_path_equals_naive_path_with_labels_and_many_shapes(duration: float,
                                                                 least: int) -> None:
    s = scenario(duration, LABELLED)
    assert len(Catalogue(s.workload.classes)) >= 30
    fast = simulate(s, 4)
    naive = simulate(s, 4, naive=True)
    assert sum(p.placements for p in fast.policies) > least
    reasons = {r for p in fast.policies for r in p.reasons}
    assert {Reason.MISSING_LABEL, Reason.NO_ROOM_CPU} <= reasons
    assert any(p.unschedulable_by_class.get("big") for p in fast.policies)
    for a, b in zip(fast.policies, naive.policies, strict=True):
        assert _comparable(a) == _comparable(b), a.policy


@pytest.mark.parametrize("text", [MIXED, LABELLED], ids=["mixed", "labelled"])
def test_books_hold_exactly_what_answer_returns(text: str) -> None:
    s = scenario(text=text)
    cluster = Cluster(s)
    catalogue = Catalogue(s.workload.classes)
    spec = plan(s, 3)[0]
    placer = spec.build(cluster, catalogue)
    placer.start()
    rng = random.Random(5)
    for _ in range(2000):
        idx = rng.randrange(cluster.initial)
        node = cluster.nodes[idx]
        shape = catalogue.shapes[rng.randrange(len(catalogue))]
        if node.instances and rng.random() < 0.4:
            node.charge(shape, -1)
            node.instances.pop()
        elif node.used_milli + shape.cpu_milli <= node.cap_milli:
            node.charge(shape, +1)
            node.instances.add(rng.randrange(10**9))
        placer.changed(idx, "commit")
    for k, book in enumerate(placer.books.books):
        fresh = [answer(placer.strategies[i], book.request, cluster.nodes[i].view())
                 for i in range(cluster.initial)]
        assert [book.answers[i] for i in range(cluster.initial)] == fresh, k
        expected = sorted((a.load, i) for i, a in enumerate(fresh) if isinstance(a, Bid))
        assert list(book.ranked) == expected
        assert book.decline_counts() == dict(Counter(a.reason for a in fresh
                                                     if isinstance(a, Decline)))


def _decide_all(request: Request, replies: list[tuple[str, Bid | Decline]],
                silent: list[str]) -> Awarded | Unschedulable:
    auction = Auction("full", [request], [n for n, _ in replies] + silent, 0.0, 1.0)
    for node, ans in replies:
        assert auction.receive(BidReply(auction_id="full", node_id=node, answers=[ans]),
                               0.0).value == "accepted"
    return auction.decide(0.5)[0]


@pytest.mark.parametrize(("seed", "loss"), [(s, 0.0) for s in range(40)]
                         + [(s, 0.3) for s in range(40, 80)])
def test_same_bids_same_winner_as_auction_decide(seed: int, loss: float) -> None:
    """The book's best bid through `leaders` and `run_round` == `Auction.decide` over every
    bid heard. This is the whole of what the fast path's walk may differ in from the award
    rule's own (`sim.rounds` rule 2): it ranks ``(load, index)`` rows, not `NodeBid`s; it
    feeds the `Auction` only the winner and the bid that ties it; it passes over the replies
    the network lost, which the full round hears as silence; it never applies room (the
    book priced each bid on its node's own free room, and neither round is given `free`)."""
    rng = random.Random(seed)
    request = Request(instance_id="i", cpu=1.0, memory_mb=512)
    n = rng.randrange(1, 60)
    replies: list[tuple[str, Bid | Decline]] = []
    for i in range(n):
        node = f"n{i:04d}"
        if rng.random() < 0.3:
            reason = rng.choice([Reason.NO_ROOM_CPU, Reason.MISSING_LABEL, Reason.DRAINING])
            replies.append((node, Decline(shape=0, reason=reason)))
        else:  # coarse loads, so ties happen
            replies.append((node, Bid(shape=0, load=rng.randrange(8) / 8, strategy="s")))
    lost = {i for i in range(n) if rng.random() < loss}
    heard = [r for i, r in enumerate(replies) if i not in lost]
    full = _decide_all(request, heard, [replies[i][0] for i in sorted(lost)])
    ranked = sorted((a.load, i) for i, (_, a) in enumerate(replies) if isinstance(a, Bid))
    winner, tie, walked, lost_any = leaders(iter(ranked), (lambda no, i: i in lost)
                                            if lost else None, 0)
    assert walked <= len(ranked) and lost_any == any(i in lost for _, i in ranked[:walked])
    if winner >= 0:
        fast = run_round("fast", request, [replies[i] for i in (winner, tie) if i >= 0],
                         [], 0.0, 1.0, 0.5)
        assert isinstance(fast, Awarded) and isinstance(full, Awarded)
        assert fast.winner == full.winner
        assert fast.tie_broken == full.tie_broken
    elif not lost:
        counts = Counter(a.reason for _, a in replies if isinstance(a, Decline))
        fast = run_round("fast", request, reduced_declines(counts, request), [], 0.0, 1.0, 0.5)
        assert isinstance(fast, Unschedulable) and isinstance(full, Unschedulable)
        assert fast.reason == full.reason
    else:
        assert isinstance(full, Unschedulable)


@pytest.mark.parametrize("seed", range(60))
def test_reduced_declines_keep_the_unschedulable_reason(seed: int) -> None:
    rng = random.Random(seed)
    reasons = [Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.OVER_CEILING,
               Reason.MISSING_LABEL, Reason.DRAINING, Reason.NO_ROOM_PORTS]
    counts: dict[str, int] = {r: rng.randrange(0, 6)
                              for r in rng.sample(reasons, rng.randrange(0, 5))}
    request = Request(instance_id="i", cpu=1.0, memory_mb=1)
    replies: list[tuple[str, Bid | Decline]] = [
        (f"n{r}{k}", Decline(shape=0, reason=r)) for r, c in counts.items()
        for k in range(c)]
    silent = ["quiet"] if rng.random() < 0.3 else []
    full = _decide_all(request, replies, silent)
    fast = run_round("fast", request, reduced_declines(counts, request), silent, 0.0, 1.0, 0.5)
    assert isinstance(full, Unschedulable) and isinstance(fast, Unschedulable)
    assert fast.reason == full.reason


def test_gavel_all_least_loaded_on_a_perfect_network_is_the_central_scheduler() -> None:
    text = MIXED.format(duration=400.0)
    start = text.index("[[gavel]]")
    end = text.index("[workload]")
    text = (text[:start] + '[[gavel]]\nname = "seed"\nmix = [{ strategy = "least-loaded", '
            'share = 1 }]\n' + text[end:])
    text = text.replace("loss = 0.02", "loss = 0.0").replace("deadline_s = 0.5",
                                                            "deadline_s = 100.0")
    s = parse_scenario(text.encode())
    gavel, central = (run_policy(s, 2, spec) for spec in plan(s, 2)[:2])
    assert central.policy == "central-fresh"
    a, b = _comparable(gavel), _comparable(central)
    for key in ("policy", "kind", "description"):
        a.pop(key), b.pop(key)
    # the failed nodes stay eligible (silent) for gavel until liveness notices; that only
    # stretches rounds to the deadline, it never changes a winner
    assert a == b


def test_books_track_every_shape() -> None:
    s = scenario()
    catalogue = Catalogue(s.workload.classes)
    books = Books(catalogue.requests, 3)
    assert len(books.books) == len(catalogue) == 7
