"""What the dashboard's page is sent (`gavel.cli.ui.views`): auctions ranked by the award rule
with the winner flagged, ties and declines said, and an overview that stays a summary."""

from __future__ import annotations

import msgspec

from gavel.cli.ui import views
from gavel.shared.api import ArrayStatus, InstanceStatus, NodeStatus, PeriodicStatus, WhyReply
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import Event, Victim
from gavel.shared.preemption import Offer
from gavel.shared.reasons import Reason, preempted_by
from gavel.shared.records import AuctionRecord


def test_bids_are_ranked_by_the_award_rule_and_the_winner_is_flagged() -> None:
    a = AuctionRecord(auction_id="a1", instance_id="i", winner="n2", load=0.2, bids=[
        NodeBid(node_id="n3", load=0.9, strategy="binpack"),
        NodeBid(node_id="n2", load=0.2, strategy="spread"),
        NodeBid(node_id="n1", load=0.45, strategy="least-loaded")],
        declines=[NodeDecline(node_id="n5", reason=Reason.NO_ROOM_CPU, detail="6.0"),
                  NodeDecline(node_id="n4", reason=Reason.DRAINING)],
        silent=["n7", "n6"])
    v = views.auction(a)
    assert [b["node_id"] for b in v["bids"]] == ["n2", "n1", "n3"]
    assert [b["winner"] for b in v["bids"]] == [True, False, False]
    assert not any(b["tied"] for b in v["bids"])
    assert v["bids"][2]["share"] == 1.0 and 0 < v["bids"][0]["share"] < 1
    assert v["decided_by"] == "lowest load"
    assert [(d["node_id"], d["text"]) for d in v["declines"]] == [
        ("n4", "draining"), ("n5", "no room for 6.0 cpu")]
    assert v["silent"] == ["n6", "n7"]


def test_a_tie_says_the_node_id_decided_and_marks_who_tied() -> None:
    a = AuctionRecord(auction_id="a1", instance_id="i", winner="a", load=0.5, tie_broken=True,
                      bids=[NodeBid(node_id="b", load=0.5), NodeBid(node_id="a", load=0.5),
                            NodeBid(node_id="c", load=0.7)])
    v = views.auction(a)
    assert [(b["node_id"], b["winner"], b["tied"]) for b in v["bids"]] == [
        ("a", True, False), ("b", False, True), ("c", False, False)]
    assert "tie broken on node id" in v["decided_by"]


def test_an_auction_nobody_won_has_no_winner_and_says_why() -> None:
    a = AuctionRecord(auction_id="a1", instance_id="i", reason=Reason.ALL_FULL,
                      summary="0/2 nodes bid: 2 no room for 9.0 cpu", declines=[
                          NodeDecline(node_id="x", reason=Reason.NO_ROOM_CPU, detail="9.0")])
    v = views.auction(a)
    assert v["winner"] == "" and v["decided_by"] == "" and v["bids"] == []
    assert v["summary"].startswith("0/2 nodes bid")


def test_the_overview_lists_running_work_first_and_counts_everything() -> None:
    ended = [InstanceStatus(instance_id=f"old-{k}", name="old", state="succeeded")
             for k in range(views.INSTANCES_SHOWN)]
    live = [InstanceStatus(instance_id="new", name="new", state="running", node_id="n1")]
    o = views.overview(nodes=[NodeStatus(node_id="n2", health="healthy"),
                              NodeStatus(node_id="n1", health="healthy")],
                       instances=ended + live, services=None)
    assert [n["node_id"] for n in o["nodes"]] == ["n1", "n2"]
    assert o["instances"][0]["instance_id"] == "new"
    assert len(o["instances"]) == views.INSTANCES_SHOWN
    assert o["instances_total"] == views.INSTANCES_SHOWN + 1
    assert o["counts"] == {"running": 1, "succeeded": views.INSTANCES_SHOWN}
    assert o["services"] is None  # no service verbs: the page says nothing of services
    assert views.overview(nodes=[], instances=[], services=[])["services"] == []
    # From the broker's summary: its counts and total, of which `instances` are a few.
    o = views.overview(nodes=[], instances=live, services=[], total=100_000,
                       counts={"running": 1, "waiting": 99_999})
    assert o["instances_total"] == 100_000 and o["counts"]["waiting"] == 99_999
    assert [i["instance_id"] for i in o["instances"]] == ["new"]


def test_an_event_reads_as_one_line() -> None:
    summary = "0/3 nodes bid: 3 missing label gpu=true"
    e = views.event(Event(instance_id="i", type="unschedulable", reason=Reason.MISSING_LABEL,
                          detail=summary, at=1.0))
    assert e["text"] == summary and "kind" not in e and e["instance_id"] == "i"
    e = views.event(Event(instance_id="i", type="failed", reason=Reason.EXITED_NONZERO,
                          detail="exit 3"))
    assert e["text"] == f"{Reason.EXITED_NONZERO}: exit 3"
    assert views.event(Event(instance_id="i", type="running", detail="pid 7"))["text"] == \
        "pid 7"


def test_auctions_that_came_out_the_same_in_a_row_are_one_entry_with_a_count() -> None:
    """An instance waiting for room is asked again and again: one entry, how many times and
    since when, not a page of identical auctions; a different outcome starts a new entry."""
    def waiting(aid: str, at: float, silent: list[str]) -> AuctionRecord:
        return AuctionRecord(auction_id=aid, instance_id="i", reason=Reason.ALL_FULL,
                             summary="0/2 nodes bid: 2 no room for cpu", at=at, silent=silent,
                             declines=[NodeDecline(node_id=n, reason=Reason.NO_ROOM_CPU)
                                       for n in ("n1", "n2")])
    won = AuctionRecord(auction_id="a9", instance_id="i", winner="n1", load=0.4, at=900.0,
                        bids=[NodeBid(node_id="n1", load=0.4)])
    newest_first = [won, waiting("a8", 800.0, []), waiting("a7", 700.0, []),
                    waiting("a6", 600.0, []), waiting("a5", 500.0, ["n3"]),
                    waiting("a4", 400.0, [])]
    got = views.collapsed(newest_first)
    assert [(a["auction_id"], a["repeat"], a["first_at"], a["at"]) for a in got] == [
        ("a9", 1, 900.0, 900.0), ("a8", 3, 600.0, 800.0), ("a5", 1, 500.0, 500.0),
        ("a4", 1, 400.0, 400.0)]


def test_a_bid_moved_by_an_affinity_says_by_how_much_and_draws_no_negative_bar() -> None:
    a = AuctionRecord(auction_id="a1", instance_id="i", winner="n2", load=-0.5, bids=[
        NodeBid(node_id="n1", load=0.3, strategy="least-loaded"),
        NodeBid(node_id="n2", load=-0.5, strategy="least-loaded", affinity=-1.0)])
    v = views.auction(a)
    assert [(b["node_id"], b["affinity"]) for b in v["bids"]] == [("n2", -1.0), ("n1", 0.0)]
    assert v["bids"][0]["winner"] and v["bids"][0]["share"] == 0.0


def test_preempting_offers_come_in_the_brokers_order_and_the_displaced_are_listed() -> None:
    """The page shows the offers as `shared.preemption.offer_key` ranks them (fewest
    evictions, then lowest evicted priority, ...), the one taken flagged, and whom the award
    displaced; two rounds that differ only in their offers are not collapsed into one."""
    lo, mid = Victim(instance_id="lo", priority=10), Victim(instance_id="mid", priority=20)
    extra = Victim(instance_id="x", priority=5)
    offers = [Offer(node_id="n1", load=0.1, victims=(lo, extra)),
              Offer(node_id="n3", load=0.5, victims=(mid,)),
              Offer(node_id="n2", load=0.9, victims=(lo,))]
    a = AuctionRecord(auction_id="a1", instance_id="u", winner="n2", load=0.9,
                      offers=offers, displaced=[lo])
    v = views.auction(a)
    assert [(o["node_id"], o["taken"]) for o in v["offers"]] == [
        ("n2", True), ("n3", False), ("n1", False)]
    assert v["offers"][2]["victims"] == [{"instance_id": "x", "priority": 5},
                                         {"instance_id": "lo", "priority": 10}]
    assert v["displaced"] == [{"instance_id": "lo", "priority": 10}]
    assert v["decided_by"].startswith("preempting offer")
    waiting = AuctionRecord(auction_id="a0", instance_id="u", reason=Reason.ALL_FULL,
                            summary="0/3 nodes bid")
    assert [o["taken"] for o in views.auction(msgspec.structs.replace(
        waiting, offers=offers))["offers"]] == [False, False, False]
    assert len(views.collapsed([waiting, msgspec.structs.replace(waiting, offers=offers)])) == 2


def test_an_instance_page_names_each_preemptor_from_its_events() -> None:
    why = WhyReply(instance=InstanceStatus(instance_id="low", name="low", state="queued"),
                   auctions=[])
    events = [Event(instance_id="low", type="preempted", node_id="n1",
                    reason=Reason.PREEMPTED, detail=preempted_by("u-1", 80), at=10.0),
              Event(instance_id="low", type="running", node_id="n1", at=5.0),
              Event(instance_id="low", type="preempted", node_id="n2",
                    reason=Reason.PREEMPTED, detail=preempted_by("u-2", 90), at=20.0)]
    page = views.instance_page(why, events)
    assert [(p["instance_id"], p["node_id"], p["text"]) for p in page["preempted_by"]] == [
        ("u-2", "n2", "preempted by u-2 (priority 90)"),
        ("u-1", "n1", "preempted by u-1 (priority 80)")]
    assert views.instance_page(why)["preempted_by"] == []


def test_arrays_are_tallied_the_live_ones_first_and_at_most_so_many() -> None:
    def task(array: str, k: int, state: str) -> InstanceStatus:
        return InstanceStatus(instance_id=f"{array}-{k}", name=array, state=state,
                              array=array)
    instances = [task("b", 1, "succeeded"), task("a", 1, "succeeded"), task("c", 1,
                 "succeeded"), task("c", 2, "running"), InstanceStatus(
                     instance_id="lone", name="lone", state="running")]
    assert views.arrays_shown(instances) == ["c", "a", "b"]
    many = [task(f"z{k:03}", 1, "running") for k in range(views.ARRAYS_SHOWN + 5)]
    assert views.arrays_shown(many) == [f"z{k:03}" for k in range(views.ARRAYS_SHOWN)]
    tallies = [ArrayStatus(array_id="a", count=1, parallelism=1, max_failures=0,
                           succeeded=1, ended=True, ok=True),
               ArrayStatus(array_id="c", count=2, parallelism=1, max_failures=0,
                           succeeded=1, running=1)]
    o = views.overview(nodes=[], instances=instances, services=None, arrays=tallies)
    assert [(a["array_id"], a["succeeded"], a["running"], a["pending"]) for a in
            o["arrays"]] == [("c", 1, 1, 0), ("a", 1, 0, 0)]


def test_a_periodic_jobs_fire_times_are_also_given_in_its_zone() -> None:
    p = PeriodicStatus(name="nightly", schedule="0 2 * * *", time_zone="Europe/Riga",
                       last_run="2026-12-02T00:00:00Z", next_run="2026-12-03T00:00:00Z")
    (shown,) = views.overview(nodes=[], instances=[], services=None, periodic=[p])["periodic"]
    assert shown["last_run"] == "2026-12-02T00:00:00Z"
    assert shown["last_run_local"] == "2026-12-02 02:00:00 EET"
    assert shown["next_run_local"] == "2026-12-03 02:00:00 EET"
    stopped = PeriodicStatus(name="t", schedule="@daily", stopped=True)
    (shown,) = views.overview(nodes=[], instances=[], services=None,
                              periodic=[stopped])["periodic"]
    assert shown["last_run_local"] == shown["next_run_local"] == ""
