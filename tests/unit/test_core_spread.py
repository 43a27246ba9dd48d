"""The spread rule in the pure auction: a service's replicas land on distinct nodes when the
fleet allows it, spread evenly over a label's values, wait with `Reason.SPREAD` when a hard
spread cannot be kept and take the best available when it is soft; a batch without replicas
is decided exactly as before."""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Request, Spec
from gavel.shared.reasons import Reason

ZONES = {"a1": {"zone": "a"}, "a2": {"zone": "a"}, "b1": {"zone": "b"}, "b2": {"zone": "b"}}
ROOM = Capacity(cpu=8.0, memory_mb=8192, ports=10)


def replica(k: int, group: str = "web", spread: str = "", soft: bool = False,
            cpu: float = 1.0) -> Request:
    return Request(instance_id=f"{group}-{k}", cpu=cpu, memory_mb=64, group=group,
                   spread=spread, spread_soft=soft)


def job(k: int, cpu: float = 1.0) -> Request:
    return Request(instance_id=f"job-{k}", cpu=cpu, memory_mb=64)


def run(requests: list[Request], loads: dict[str, float], *,
        held: dict[str, dict[str, int]] | None = None,
        labels: dict[str, dict[str, str]] | None = None,
        free: dict[str, Capacity] | None = None, full: frozenset[str] = frozenset(),
        silent: frozenset[str] = frozenset(), step: float = 0.0,
        order: list[str] | None = None) -> list[Decision]:
    """One auction: every node in `loads` bids its load on every shape (a node in `full`
    declines for want of cpu, one in `silent` never answers)."""
    nodes = order or sorted(loads)
    auction = Auction("a", requests, nodes, opened_at=0.0, deadline_s=1.0)
    shapes = auction.rfb().shapes
    for n in nodes:
        if n in silent:
            continue
        answers: list[Bid | Decline] = [
            Decline(shape=i, reason=Reason.NO_ROOM_CPU, detail="1") if n in full
            else Bid(shape=i, load=loads[n], step=step, strategy="t")
            for i in range(len(shapes))]
        auction.receive(BidReply(auction_id="a", node_id=n, answers=answers), 0.5)
    room = free if free is not None else {n: ROOM.copy() for n in nodes}
    return auction.decide(1.0, room, held=held, labels=labels)


def winners(decisions: list[Decision]) -> list[str | None]:
    return [d.winner.node_id if isinstance(d, Awarded) else None for d in decisions]


def test_replicas_land_on_distinct_nodes_however_low_one_node_bids() -> None:
    loads = {"n1": 0.0, "n2": 0.5, "n3": 0.9}
    jobs = run([job(k) for k in range(3)], loads)
    assert winners(jobs) == ["n1", "n1", "n1"]  # a job's award rule is the lowest load
    replicas = run([replica(k) for k in range(3)], loads)
    assert winners(replicas) == ["n1", "n2", "n3"]


def test_distinct_nodes_are_preferred_never_required() -> None:
    got = run([replica(k) for k in range(5)], {"n1": 0.0, "n2": 0.1})
    assert winners(got) == ["n1", "n2", "n1", "n2", "n1"]


def test_the_replicas_a_node_already_holds_count() -> None:
    got = run([replica(0)], {"n1": 0.0, "n2": 0.5, "n3": 0.9},
              held={"web": {"n1": 1, "n2": 1}, "other": {"n3": 4}})
    assert winners(got) == ["n3"]  # another service's replicas are not this one's


def test_spread_over_a_label_puts_half_in_each_zone_on_distinct_nodes() -> None:
    loads = {"a1": 0.0, "a2": 0.1, "b1": 0.8, "b2": 0.9}
    got = run([replica(k, spread="zone") for k in range(4)], loads, labels=ZONES)
    assert winners(got) == ["a1", "b1", "a2", "b2"]


def test_spread_counts_what_each_zone_holds_now() -> None:
    loads = {"a1": 0.0, "a2": 0.1, "b1": 0.8, "b2": 0.9}
    got = run([replica(k, spread="zone") for k in range(2)], loads, labels=ZONES,
              held={"web": {"a1": 1, "a2": 1}})
    assert winners(got) == ["b1", "b2"]


def test_a_hard_spread_the_fleet_cannot_keep_waits_naming_the_label() -> None:
    loads = {"a1": 0.0, "a2": 0.1, "b1": 0.8, "b2": 0.9}
    got = run([replica(k, spread="zone") for k in range(2)], loads, labels=ZONES,
              held={"web": {"a1": 1}}, full=frozenset({"b1", "b2"}))
    assert winners(got) == [None, None]
    d = got[0]
    assert isinstance(d, Unschedulable) and d.reason is Reason.SPREAD
    assert d.summary == ("2/4 nodes bid: 2 no room for 1 cpu; "
                         f"{Reason.SPREAD} (zone: a 1, b 0)")


def test_a_soft_spread_places_on_the_best_available() -> None:
    loads = {"a1": 0.0, "a2": 0.1, "b1": 0.8, "b2": 0.9}
    got = run([replica(k, spread="zone", soft=True) for k in range(2)], loads,
              labels=ZONES, held={"web": {"a1": 1}}, full=frozenset({"b1", "b2"}))
    assert winners(got) == ["a2", "a1"]  # distinct nodes first, then the lower load


def test_a_zone_that_ran_out_of_room_in_the_batch_blocks_a_hard_spread() -> None:
    loads = {"a1": 0.0, "b1": 0.9}
    free = {"a1": ROOM.copy(), "b1": Capacity(cpu=1.0, memory_mb=8192, ports=10)}
    got = run([replica(k, spread="zone") for k in range(4)], loads, free=free,
              labels={"a1": {"zone": "a"}, "b1": {"zone": "b"}})
    assert winners(got) == ["a1", "b1", "a1", None]  # one more than b, never two
    assert isinstance(got[3], Unschedulable) and got[3].reason is Reason.SPREAD


def test_silent_nodes_and_nodes_without_the_label_are_not_part_of_the_spread() -> None:
    loads = {"a1": 0.0, "a2": 0.1, "b1": 0.8, "x": 0.0}
    labels = {**ZONES, "x": {}}
    got = run([replica(k, spread="zone") for k in range(3)], loads, labels=labels,
              silent=frozenset({"b1"}))
    # b1 said nothing: zone b is not part of this round's spread, and x has no zone.
    assert winners(got) == ["a1", "a2", "a1"]


def test_a_node_without_the_label_is_the_last_resort_of_a_soft_spread() -> None:
    labels = {"a1": {"zone": "a"}, "x": {}}
    hard = run([replica(k, spread="zone") for k in range(2)], {"a1": 0.5, "x": 0.0},
               labels=labels)
    soft = run([replica(k, spread="zone", soft=True) for k in range(2)],
               {"a1": 0.5, "x": 0.0}, labels=labels)
    assert winners(hard) == ["a1", "a1"]
    assert winners(soft) == ["a1", "a1"]
    alone = run([replica(0, spread="zone")], {"x": 0.0}, labels=labels)
    assert isinstance(alone[0], Unschedulable) and alone[0].reason is Reason.SPREAD
    assert alone[0].summary.endswith(f"{Reason.SPREAD} (zone: no node has it)")
    assert winners(run([replica(0, spread="zone", soft=True)], {"x": 0.0},
                       labels=labels)) == ["x"]


def test_replicas_charge_capacity_against_the_jobs_of_the_same_batch() -> None:
    free = {"n1": Capacity(cpu=2.0, memory_mb=8192, ports=10),
            "n2": Capacity(cpu=1.0, memory_mb=8192, ports=10)}
    got = run([replica(0), job(0), job(1), job(2)], {"n1": 0.0, "n2": 0.5}, free=free)
    assert winners(got) == ["n1", "n1", "n2", None]


def test_a_full_node_leaves_the_running_with_its_decline() -> None:
    free = {"n1": Capacity(cpu=1.0, memory_mb=8192, ports=10), "n2": ROOM.copy()}
    got = run([replica(k) for k in range(3)], {"n1": 0.0, "n2": 0.5}, free=free)
    assert winners(got) == ["n1", "n2", "n2"]
    last = got[2]
    assert isinstance(last, Awarded)
    assert [(d.node_id, d.reason) for d in last.declines] == [("n1", Reason.NO_ROOM_CPU)]


def test_a_strategy_that_refuses_a_second_one_is_honoured() -> None:
    got = run([replica(k) for k in range(3)], {"n1": 0.0, "n2": 0.5}, step=float("inf"))
    assert winners(got) == ["n1", "n2", None]


def test_a_tie_is_broken_on_the_node_id_and_said_so() -> None:
    got = run([replica(0), replica(1)], {"n1": 0.3, "n2": 0.3})
    assert winners(got) == ["n1", "n2"]
    first, second = got
    assert isinstance(first, Awarded) and first.tie_broken
    assert isinstance(second, Awarded) and not second.tie_broken  # n1 holds one now


def test_groups_never_share_a_shape_and_jobs_still_do() -> None:
    auction = Auction("a", [replica(0, "web"), replica(0, "api"), replica(1, "web"), job(0),
                            job(1)], ["n1"], opened_at=0.0, deadline_s=1.0)
    assert auction.shape_of == [0, 1, 0, 2, 2]
    assert len(auction.rfb().shapes) == 3


def test_the_award_does_not_depend_on_the_order_bids_arrived() -> None:
    loads = {"a1": 0.2, "a2": 0.2, "b1": 0.2, "b2": 0.2}
    reqs = [replica(k, spread="zone") for k in range(6)]
    seen = {tuple(winners(run(reqs, loads, labels=ZONES, order=list(p))))
            for p in itertools.permutations(sorted(loads))}
    assert seen == {("a1", "b1", "a2", "b2", "a1", "b1")}


def test_request_of_takes_the_group_and_its_spread_from_the_spec() -> None:
    spec = Spec(name="web", command=["x"], type="service", spread="zone", spread_soft=True)
    r = Request.of("web-1", spec, group="web")
    assert (r.group, r.spread, r.spread_soft) == ("web", "zone", True)
    plain = Request.of("web-1", spec)  # not a replica: the spread is not its business
    assert (plain.group, plain.spread, plain.spread_soft) == ("", "", False)
    assert plain.shape() == r.shape()


# -- properties ----------------------------------------------------------------------------

_loads = st.dictionaries(st.sampled_from(["n1", "n2", "n3", "n4", "n5"]),
                         st.sampled_from([0.0, 0.25, 0.5, 0.75]), min_size=1)


@settings(max_examples=60, deadline=None)
@given(loads=_loads, cpus=st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1, max_size=12),
       caps=st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=5, max_size=5),
       step=st.sampled_from([0.0, 0.125, float("inf")]))
def test_jobs_decide_the_same_whatever_decide_is_told_of_replicas(
        loads: dict[str, float], cpus: list[float], caps: list[float], step: float) -> None:
    """A batch without replicas keeps the award rule exactly (held and labels change
    nothing)."""
    nodes = sorted(loads)
    free = {n: Capacity(cpu=c, memory_mb=8192, ports=10) for n, c in zip(nodes, caps,
                                                                          strict=False)}
    reqs = [job(k, cpu) for k, cpu in enumerate(cpus)]
    plain = run(reqs, loads, free=copy.deepcopy(free), step=step)
    told = run(reqs, loads, free=copy.deepcopy(free), step=step,
               held={"web": dict.fromkeys(nodes, 3)},
               labels={n: {"zone": n[-1]} for n in nodes})
    assert plain == told


@settings(max_examples=60, deadline=None)
@given(loads=_loads, n=st.integers(1, 10), spread=st.sampled_from(["", "zone"]),
       soft=st.booleans(), held=st.dictionaries(st.sampled_from(["n1", "n2", "n3"]),
                                                st.integers(0, 3)))
def test_a_batch_of_replicas_spreads_as_one_placement_after_another(
        loads: dict[str, float], n: int, spread: str, soft: bool,
        held: dict[str, int]) -> None:
    """`shared.spread` rule 2: the batch counts its own awards, so it decides as single
    auctions would, each told the replicas the ones before it placed."""
    labels = {node: {"zone": "ab"[int(node[1]) % 2]} for node in loads}
    reqs = [replica(k, spread=spread, soft=soft, cpu=0.5) for k in range(n)]
    batch = winners(run(reqs, loads, held={"web": dict(held)}, labels=labels))
    now = dict(held)
    one_by_one: list[str | None] = []
    for r in reqs:
        [w] = winners(run([r], loads, held={"web": dict(now)}, labels=labels))
        one_by_one.append(w)
        if w is not None:
            now[w] = now.get(w, 0) + 1
    assert batch == one_by_one


@settings(max_examples=60, deadline=None)
@given(loads=_loads, n=st.integers(1, 12))
def test_a_hard_spread_never_unbalances_the_label(loads: dict[str, float], n: int) -> None:
    """After every batch the label's values that could take replicas differ by at most one,
    and the replicas on any one node by at most one more than the fleet forces."""
    labels = {node: {"zone": "ab"[int(node[1]) % 2]} for node in loads}
    got = winners(run([replica(k, spread="zone", cpu=0.5) for k in range(n)], loads,
                      labels=labels))
    assert all(w is not None for w in got)  # room everywhere: a spread is always possible
    by_zone = {z: sum(1 for w in got if w is not None and labels[w]["zone"] == z)
               for z in {lab["zone"] for lab in labels.values()}}
    assert max(by_zone.values()) - min(by_zone.values()) <= 1
    per_node = {node: got.count(node) for node in loads}
    for zone in by_zone:
        counts = [c for node, c in per_node.items() if labels[node]["zone"] == zone]
        assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("soft", [False, True])
def test_decide_copes_without_labels_or_held(soft: bool) -> None:
    got = run([replica(0, spread="zone", soft=soft), replica(1)], {"n1": 0.0})
    assert winners(got) == ([None, "n1"] if not soft else ["n1", "n1"])
