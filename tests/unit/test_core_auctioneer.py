"""The auctioneer's rules in memory (`shared.auctioneer.Core`): batching, the pipelining
bound, reservations across rounds in flight, exclusion, retry timers, sampling only among
the nodes that could take a request, asking all of them when there are fewer than d."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import msgspec
import pytest

from gavel.shared.auction import Auction, Awarded, Unschedulable
from gavel.shared.auctioneer import Core, Decided, Open, Wake
from gavel.shared.messages import Bid, BidReply, Capacity, Decline
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec

WEB = Spec(name="web", command=["true"], cpu=0.6, memory_mb=64)
GPU = Spec(name="train", command=["true"], cpu=0.5, memory_mb=64, labels={"gpu": "yes"})
HUGE = Spec(name="huge", command=["true"], cpu=64.0, memory_mb=64)


class World:
    """Git and the heartbeats, in a few dictionaries."""

    def __init__(self, nodes: dict[str, float], labels: dict[str, dict[str, str]] | None = None
                 ) -> None:
        self.cpu = nodes
        self.node_labels = labels or {}
        self.queue: dict[str, InstanceRecord] = {}
        self.used: dict[str, float] = {}
        self.pinned = False

    def add(self, iid: str, spec: Spec = WEB, excluded: tuple[str, ...] = ()) -> None:
        self.queue[iid] = InstanceRecord(instance_id=iid, spec=spec, excluded=excluded)

    def pending(self) -> Iterable[str]:
        return list(self.queue)

    def record(self, iid: str) -> InstanceRecord:
        return self.queue[iid]

    def eligible(self, now: float) -> list[str]:
        return sorted(self.cpu)

    def draining(self) -> AbstractSet[str]:
        return frozenset()

    def free(self, nodes: Iterable[str], reserved: Mapping[str, Capacity]
             ) -> dict[str, Capacity]:
        return {n: Capacity(cpu=self.cpu[n] - self.used.get(n, 0.0)
                            - (reserved[n].cpu if n in reserved else 0.0),
                            memory_mb=4096, ports=10) for n in nodes if n in self.cpu}

    def held_by(self, group: str) -> dict[str, int]:
        return {}

    def placed(self, iid: str) -> bool:
        return iid not in self.queue

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        return self.node_labels


def core(world: World, **kw: object) -> Core:
    c = Core(world, deadline_s=2.0, heartbeat_s=10.0, tick_s=1.0, rng=random.Random(3),
             **kw)  # type: ignore[arg-type]
    for n, cpu in world.cpu.items():
        c.candidates.update(n, world.node_labels.get(n, {}), Capacity(cpu=cpu, memory_mb=4096,
                                                                       ports=10))
    return c


def opened(c: Core) -> list[Open]:
    return [a for a in c.take() if isinstance(a, Open)]


def bid_all(c: Core, auction: Auction, now: float, load: float = 0.1) -> list[Decided]:
    """Every asked node bids for every shape; what was decided."""
    for n in sorted(auction.eligible):
        c.receive(BidReply(auction_id=auction.auction_id, node_id=n, answers=[
            Bid(shape=i, load=load, step=0.0, strategy="x")
            for i in range(len(auction.shapes))]), now)
    return [a for a in c.take() if isinstance(a, Decided)]


def test_an_auction_opens_at_batch_max_or_once_the_oldest_waited_batch_wait() -> None:
    w = World({"n1": 4.0})
    c = core(w, batch_max=3, batch_wait_s=1.0)
    w.add("a")
    w.add("b")
    c.reconcile(0.0)
    assert opened(c) == [] and c.timer() == 1.0  # two wait for a third, or a second
    c.reconcile(0.5)
    assert opened(c) == []
    c.handle_timer(1.0)  # the oldest has waited batch_wait_s
    [o] = opened(c)
    assert [r.instance_id for r in o.auction.requests] == ["a", "b"]

    w2 = World({"n1": 4.0})
    c2 = core(w2, batch_max=3, batch_wait_s=1.0)
    for iid in "abc":
        w2.add(iid)
    c2.reconcile(0.0)  # batch_max wait: at once
    [o] = opened(c2)
    assert len(o.auction.requests) == 3


def test_no_more_than_max_auctions_are_in_flight_and_a_close_opens_the_next() -> None:
    w = World({"n1": 8.0, "n2": 8.0})
    c = core(w, batch_max=1, max_auctions=2)
    for k in range(5):
        w.add(f"i{k}")
    c.reconcile(0.0)
    first = opened(c)
    assert [o.auction.requests[0].instance_id for o in first] == ["i0", "i1"]
    c.reconcile(0.1)
    assert opened(c) == []  # the bound holds
    for n in ("n1", "n2"):
        c.receive(BidReply(auction_id=first[0].auction.auction_id, node_id=n,
                           answers=[Bid(shape=0, load=0.1, step=0.0, strategy="x")]), 0.2)
    out = c.take()
    assert [type(a) for a in out] == [Decided, Open]  # decided, and the next one went out
    nxt = out[1]
    assert isinstance(nxt, Open) and nxt.auction.requests[0].instance_id == "i2"
    assert len(c.auctions) == 2


def test_reservations_never_over_commit_a_node_across_rounds_in_flight() -> None:
    """Two rounds priced on the same empty node: the second is decided against what the
    first reserved, until the first's commit lands and git carries it."""
    w = World({"n1": 1.0})
    c = core(w, batch_max=1, max_auctions=2)
    w.add("a")
    w.add("b")
    c.reconcile(0.0)
    one, two = opened(c)
    [d1] = bid_all(c, one.auction, 0.1)
    [d2] = bid_all(c, two.auction, 0.1)
    assert isinstance(d1.decisions[0], Awarded) and d1.decisions[0].winner.node_id == "n1"
    assert isinstance(d2.decisions[0], Unschedulable)  # 0.6 + 0.6 > 1 cpu: not awarded
    assert d2.decisions[0].reason is Reason.NO_ROOM_CPU
    assert c.reserved["n1"].cpu == WEB.cpu
    won = d1.decisions[0]
    del w.queue["a"]
    w.used["n1"] = WEB.cpu  # the commit landed: git holds it now, the reservation goes
    c.released(won)
    assert c.reserved["n1"].cpu == 0.0 and "a" not in c.inflight
    assert c.free(["n1"])["n1"].cpu == 1.0 - WEB.cpu


def test_a_failed_commit_releases_its_reservations_and_retries_a_tick_later() -> None:
    w = World({"n1": 1.0})
    c = core(w, batch_max=1)
    w.add("a")
    c.reconcile(0.0)
    [o] = opened(c)
    [d] = bid_all(c, o.auction, 0.1)
    c.failed(d.decisions, 0.2)
    assert c.reserved["n1"].cpu == 0.0 and c.inflight == set()
    c.reconcile(1.1)
    assert opened(c) == []  # its retry is a tick away
    c.reconcile(1.2)
    assert len(opened(c)) == 1


def test_work_is_auctioned_without_the_nodes_it_failed_on_unless_none_is_left() -> None:
    w = World({"n1": 4.0, "n2": 4.0, "n3": 4.0})
    c = core(w, batch_max=8)
    w.add("a", excluded=("n1",))
    w.add("b")
    w.add("c", excluded=("n1", "n2", "n3"))
    c.reconcile(0.0)
    by_req = {o.auction.requests[0].instance_id: o.auction for o in opened(c)}
    assert by_req["a"].eligible == {"n2", "n3"}
    assert by_req["b"].eligible == {"n1", "n2", "n3"}
    assert by_req["c"].eligible == {"n1", "n2", "n3"}  # no other node: with them


def test_what_no_other_node_takes_is_asked_again_of_the_nodes_it_failed_on() -> None:
    """Rule 2: a replica bound to a volume only n1 holds failed there; n2 declines it, so it
    is asked again at once of n1 too, and placed there; declined again, it is unschedulable
    (no third round)."""
    w = World({"n1": 4.0, "n2": 4.0})
    c = core(w, batch_max=8)
    w.add("a", excluded=("n1",))
    c.reconcile(0.0)
    [o] = opened(c)
    assert o.auction.eligible == {"n2"}

    def answer(auction: Auction, node: str, now: float, bid: bool) -> None:
        c.receive(BidReply(auction_id=auction.auction_id, node_id=node, answers=[
            Bid(shape=0, load=0.1, step=0.0, strategy="x") if bid else
            Decline(shape=0, reason=Reason.MISSING_VOLUME, detail="data")]), now)

    answer(o.auction, "n2", 0.1, bid=False)
    out = c.take()
    assert [d.decisions for d in out if isinstance(d, Decided)] == [[]]
    [again] = [a for a in out if isinstance(a, Open)]
    assert again.auction.eligible == {"n1", "n2"} and "a" in c.inflight
    answer(again.auction, "n2", 0.2, bid=False)
    answer(again.auction, "n1", 0.2, bid=True)
    [d] = [a for a in c.take() if isinstance(a, Decided)]
    assert isinstance(d.decisions[0], Awarded) and d.decisions[0].winner.node_id == "n1"

    c.failed(d.decisions, 0.3)  # its commit failed: retried, n1 still excluded
    c.reconcile(1.4)
    [o] = opened(c)
    answer(o.auction, "n2", 1.5, bid=False)
    [again] = opened(c)
    for node in ("n1", "n2"):
        answer(again.auction, node, 1.6, bid=False)
    out = c.take()
    [d] = [a for a in out if isinstance(a, Decided)]
    assert isinstance(d.decisions[0], Unschedulable)
    assert not [a for a in out if isinstance(a, Open)]


def test_an_unschedulable_instance_waits_a_heartbeat_unless_capacity_frees() -> None:
    w = World({"n1": 4.0})
    c = core(w, batch_max=1)
    w.add("a")
    c.reconcile(0.0)
    [o] = opened(c)
    c.receive(BidReply(auction_id=o.auction.auction_id, node_id="n1", answers=[
        Decline(shape=0, reason=Reason.NO_ROOM_CPU)]), 0.1)
    [d] = [a for a in c.take() if isinstance(a, Decided)]
    assert isinstance(d.decisions[0], Unschedulable)
    c.unschedulable("a", 0.2)  # its commit landed
    c.reconcile(10.9)
    assert opened(c) == []
    c.reconcile(11.0)  # a heartbeat interval later, rounded up to a whole tick
    assert len(opened(c)) == 1
    c2 = core(w, batch_max=1)
    c2.unschedulable("a", 0.0)
    c2.capacity_freed()
    c2.reconcile(0.1)
    assert len(opened(c2)) == 1  # capacity freed: at once


def test_a_sampled_auction_asks_only_nodes_that_could_take_the_request() -> None:
    nodes = {f"n{i:02d}": 4.0 for i in range(40)}
    gpus = {"n07", "n23", "n31"}
    w = World(nodes, {n: {"gpu": "yes"} for n in gpus})
    c = core(w, batch_max=1, sample_d=2)
    for k in range(10):
        w.add(f"g{k}", GPU)
    c.reconcile(0.0)
    for o in opened(c):
        assert o.to is not None and set(o.to) <= gpus and len(o.to) == 2
        assert o.auction.eligible <= gpus


def test_fewer_eligible_nodes_than_d_are_all_asked_and_none_is_no_round() -> None:
    nodes = {f"n{i:02d}": 4.0 for i in range(40)}
    w = World(nodes, {"n07": {"gpu": "yes"}})
    c = core(w, batch_max=1, sample_d=2)
    w.add("g", GPU)
    c.reconcile(0.0)
    [o] = opened(c)
    assert o.to == ["n07"]  # the one node that could: asked alone
    w2 = World(nodes)
    c2 = core(w2, batch_max=1, sample_d=2)
    w2.add("h", HUGE)
    c2.reconcile(0.0)
    out = c2.take()
    assert not [a for a in out if isinstance(a, Open)]  # nothing is sent
    [d] = [a for a in out if isinstance(a, Decided)]
    assert isinstance(d.decisions[0], Unschedulable) and d.decisions[0].reason is Reason.NO_ROOM_CPU


@pytest.mark.parametrize(("fleet", "asked"), [(10, [2]), (40, [2, 16])])
def test_what_d_nodes_could_not_place_is_asked_of_more_then_of_every_candidate(
        fleet: int, asked: list[int]) -> None:
    """d, then RETRY_TIMES · d (when the fleet has more), then every candidate."""
    nodes = {f"n{i:02d}": 4.0 for i in range(fleet)}
    w = World(nodes)
    c = core(w, batch_max=1, sample_d=2)
    w.add("a")
    c.reconcile(0.0)
    out = c.take()
    got = []
    while True:
        [o] = [a for a in out if isinstance(a, Open)]
        if o.to is None:
            break
        got.append(len(o.to))
        for n in o.to:
            c.receive(BidReply(auction_id=o.auction.auction_id, node_id=n, answers=[
                Decline(shape=0, reason=Reason.NO_ROOM_CPU)]), 0.1)
        out = c.take()
        assert [d.decisions for d in out if isinstance(d, Decided)] == [[]]  # not yet decided
    assert got == asked
    assert o.auction.eligible == set(nodes)  # every candidate: a broadcast


def test_no_auction_opens_during_the_hold_while_no_node_is_eligible() -> None:
    w = World({})
    c = core(w, batch_max=1)
    c.hold_until = 5.0
    w.add("a")
    c.reconcile(0.0)
    assert c.take() == [] and c.timer() == 5.0
    c.handle_timer(5.0)  # the hold is over: "no nodes" it is
    out = c.take()
    assert [type(a) for a in out] == [Decided, Wake]


def test_a_reply_after_the_close_is_late_a_replay_or_stranger_is_rejected() -> None:
    w = World({"n1": 4.0, "n2": 4.0})
    c = core(w, batch_max=1)
    w.add("a")
    c.reconcile(0.0)
    [o] = opened(c)
    aid = o.auction.auction_id
    bid = [Bid(shape=0, load=0.1, step=0.0, strategy="x")]
    assert c.receive(BidReply(auction_id=aid, node_id="n1", answers=bid), 0.1) is None
    c.expire(aid, 2.0)
    assert c.receive(BidReply(auction_id=aid, node_id="n2", answers=bid), 2.1) is None
    assert c.late_total == 1
    assert c.receive(BidReply(auction_id=aid, node_id="n1", answers=bid), 2.1) is not None
    assert c.receive(BidReply(auction_id="nope", node_id="n1", answers=bid), 2.1) is not None


class Counting(World):
    """A world that counts how many pending ids a pass reads."""

    def __init__(self, nodes: dict[str, float]) -> None:
        super().__init__(nodes)
        self.read = 0

    def pending(self) -> Iterable[str]:
        world = self

        class Ids(list[str]):
            def __iter__(self):  # type: ignore[no-untyped-def]
                for iid in super().__iter__():
                    world.read += 1
                    yield iid

            def __reversed__(self):  # type: ignore[no-untyped-def]
                for k, iid in enumerate(super().__reversed__()):
                    world.read += k > 0  # the newest is the tail: what tells sets apart
                    yield iid

        return Ids(self.queue)


def test_a_pass_over_waiting_work_none_of_it_due_is_not_read_again() -> None:
    """Rule 1: a thousand unschedulable instances retried a heartbeat later are read once,
    not on every pass before then; new work, a release or the retry time reads them again."""
    w = Counting({})
    c = core(w)
    for k in range(1000):
        w.add(f"i{k}")
        c.unschedulable(f"i{k}", 0.0)  # retried at 10.0
    c.reconcile(1.0)
    assert w.read == 1000
    for t in (1.1, 2.0, 9.9):
        c.reconcile(t)
    assert w.read == 1000  # nothing due, nothing new: not read again
    w.add("new")
    c.reconcile(9.9)
    assert w.read == 1001  # new work: it alone is read, and found
    w.queue.pop("new")  # placed: the same waiting work as before, still not due
    c.reconcile(9.95)
    assert w.read == 1001
    c.reconcile(10.0)  # the retry time: read again
    assert w.read == 2001
    c.unschedulable("i0", 10.0)
    c.reconcile(10.1)  # past the time the idle pass knew of: read again
    assert w.read == 3001


def test_an_instance_bound_to_a_node_is_auctioned_among_that_node_alone() -> None:
    for sample in (None, 1):  # never sampled (rule 12)
        w = World({"n1": 4.0, "n2": 4.0, "n3": 4.0})
        c = core(w, batch_max=8, sample_d=sample)
        w.queue["a"] = InstanceRecord(instance_id="a", spec=WEB, only_node="n2")
        w.queue["b"] = InstanceRecord(instance_id="b", spec=WEB, only_node="gone")
        c.reconcile(0.0)
        got = c.take()
        by_req = {o.auction.requests[0].instance_id: o for o in got if isinstance(o, Open)}
        assert by_req["a"].auction.eligible == {"n2"}
        assert by_req["a"].to is None or by_req["a"].to == ["n2"]
        # Its node not eligible: no candidate, decided at once - never placed elsewhere.
        [d] = [a for a in got if isinstance(a, Decided)]
        assert isinstance(d.decisions[0], Unschedulable)
        assert d.decisions[0].request.instance_id == "b"


def test_higher_priority_work_is_auctioned_first_oldest_first_within_a_priority() -> None:
    """A later high-priority request goes before earlier low ones when a batch cannot take
    them all; equal priorities keep their age order; past the room nothing low is read in."""
    low = msgspec.structs.replace(WEB, name="batch", priority=20)
    high = msgspec.structs.replace(WEB, name="urgent", priority=90)
    w = World({"n1": 4.0})
    for iid, spec in [("old-low", low), ("mid", WEB), ("new-high", high), ("late", WEB),
                      ("last-high", high)]:
        w.add(iid, spec)
    c = core(w, batch_max=2, max_auctions=1)
    c.reconcile(0.0)
    [first] = opened(c)
    assert [r.instance_id for r in first.auction.requests] == ["new-high", "last-high"]
    for n in sorted(first.auction.eligible):
        c.receive(BidReply(auction_id=first.auction.auction_id, node_id=n, answers=[
            Bid(shape=0, load=0.1, step=0.0, strategy="x")]), 0.1)
    [second] = [a for a in c.take() if isinstance(a, Open)]  # the close opens the next
    assert [r.instance_id for r in second.auction.requests] == ["mid", "late"]


def test_with_one_priority_for_all_the_queue_stays_oldest_first() -> None:
    w = World({"n1": 4.0})
    for i in range(5):
        w.add(f"i{i}")
    c = core(w, batch_max=2, max_auctions=1)
    c.reconcile(0.0)
    [first] = opened(c)
    assert [r.instance_id for r in first.auction.requests] == ["i0", "i1"]


def test_urgent_work_that_arrives_behind_a_default_backlog_goes_next() -> None:
    """Past the work a pass can take, only the urgent is looked for (rule 1): what came
    since the last pass, or everything once the newest it saw has left the queue."""
    high = msgspec.structs.replace(WEB, name="urgent", priority=90)
    w = World({"n1": 4.0})
    for i in range(5):
        w.add(f"i{i}")
    c = core(w, batch_max=2, max_auctions=1)
    c.reconcile(0.0)
    [first] = opened(c)
    w.add("urgent", high)
    w.add("i5")
    c.reconcile(0.05)  # no room: it notes only what came since
    del w.queue["i5"]  # the newest it saw leaves: the next pass looks at all of it
    w.add("urgent-2", high)
    w.add("i6")
    for n in sorted(first.auction.eligible):
        c.receive(BidReply(auction_id=first.auction.auction_id, node_id=n, answers=[
            Bid(shape=0, load=0.1, step=0.0, strategy="x")]), 0.1)
    [second] = [a for a in c.take() if isinstance(a, Open)]
    assert [r.instance_id for r in second.auction.requests] == ["urgent", "urgent-2"]


def test_an_instance_found_unschedulable_after_an_idle_pass_does_not_read_the_rest_again(
        ) -> None:
    """Rule 1: an instance found unschedulable is parked a heartbeat; nothing became due,
    so the waiting work is not read again before the earliest retry time."""
    w = Counting({})
    c = core(w)
    for k in range(1000):
        w.add(f"i{k}")
        c.unschedulable(f"i{k}", 0.0)  # retried at 10.0
    w.add("late")
    c.reconcile(1.0)  # "late" is due: auctioned (no node: decided at once), in flight
    assert [a for a in c.take() if isinstance(a, Decided)]
    c.reconcile(1.1)
    assert w.read == 2002  # the pass that found nothing due
    c.unschedulable("late", 1.2)  # its commit landed: parked until 11.2
    c.reconcile(1.3)
    c.reconcile(9.9)
    assert w.read == 2002
    c.reconcile(10.0)  # the first retry time: read again
    assert w.read == 3003


def test_an_instance_unschedulable_again_and_again_waits_longer_until_capacity_frees() -> None:
    """Rule 7: one heartbeat, then two, four, eight, and no longer; `capacity_freed` retries
    at once and starts again from one heartbeat."""
    w = World({})
    c = core(w)
    w.add("a")
    now, waits = 0.0, []
    for _ in range(6):
        c.unschedulable("a", now)
        waits.append(c.retry_at["a"] - now)
        now = c.retry_at["a"]
    assert waits == [10.0, 20.0, 40.0, 80.0, 80.0, 80.0]
    c.capacity_freed()
    c.unschedulable("a", now)
    assert c.retry_at["a"] - now == 10.0


def test_after_a_pass_that_found_nothing_due_only_new_work_is_read() -> None:
    """Rule 1: a thousand parked instances and new work behind them: the pass reads the new
    work alone, and auctions it."""
    w = Counting({})
    c = core(w)
    for k in range(1000):
        w.add(f"i{k}")
        c.unschedulable(f"i{k}", 0.0)
    c.reconcile(1.0)
    assert w.read == 1000
    w.add("new")
    c.reconcile(2.0)
    assert w.read == 1001  # the one added
    assert [a for a in c.take() if isinstance(a, Decided)]  # auctioned (no node: decided)


def test_a_pass_counts_the_work_it_left_waiting() -> None:
    """Rule 13: the backlog is the pending work neither in a round nor parked."""
    w = World({"n1": 8.0})
    c = core(w, batch_max=2, max_auctions=1)
    for k in range(1000):
        w.add(f"i{k}")
    for k in range(10):
        c.unschedulable(f"i{k}", 0.0)  # parked until 10.0
    c.reconcile(1.0)
    assert [len(o.auction.requests) for o in opened(c)] == [2]
    assert c.backlog() == 1000 - 2 - 10
    c.reconcile(1.1)  # no room: nothing opens, the same work waits
    assert c.backlog() == 988 and opened(c) == []
    w.queue.clear()  # placed or cancelled: nothing waits (the round still in flight)
    c.reconcile(1.2)
    assert c.backlog() == 0
