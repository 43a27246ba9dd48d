"""The broker's auctioneer feeds its tuner (`broker.auctioneer` rule 12): with nothing
given, a backlog many times what the level holds as a pass begins moves the batch size and
rounds in flight to the throughput end for that pass; a short queue behind every round holds
the latency end; a value given stays where it was put."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.ledger.plan import View, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import StatsReply, StatsRequest
from gavel.shared.messages import Bid, BidReply, Capacity, Heartbeat, Spec
from gavel.shared.records import InstanceRecord
from gavel.shared.timing import Timing
from gavel.shared.tuning import BACKLOG, IDLE_S, LADDER, WINDOW
from tests.unit.fuzzkit import Msg

SPEC = Spec(name="web", command=["true"], cpu=0.001, memory_mb=1)
NODES = ("n1", "n2", "n3")
_enc = msgspec.msgpack.Encoder()


def _broker(root: Path, queued: int, **kw: int) -> Broker:
    b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing(), **kw))
    view = View(b.ledger.state())
    for k in range(queued):
        submit(view, InstanceRecord(instance_id=f"web-{k:05d}", spec=SPEC))
    b.ledger.apply(view.change, "seed", None)
    for n in NODES:
        b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=n), _enc.encode(Heartbeat(
            node_id=n, strategy="least-loaded", port_range=[20000, 20999],
            capacity=Capacity(cpu=64.0, memory_mb=65536, ports=1000)))))
    return b


def _answer_rounds(a: Auctioneer, rounds: int) -> list[int]:
    """Every node bids on every open round, `rounds` times; the batch size after each."""
    sizes = []
    for _ in range(rounds):
        _answer(a, next(iter(a.auctions)))
        sizes.append(a.batch_max)
    return sizes


def _answer(a: Auctioneer, aid: str) -> None:
    """Every node bids on the round `aid`, if it is still open."""
    auction = a.auctions.get(aid)
    if auction is None:
        return
    for n in NODES:
        a.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=aid, node_id=n,
            answers=[Bid(shape=i, load=0.1, step=0.01, strategy="x")
                     for i in range(len(auction.shapes))]))))


#: Work that saturates more than a window of the latency end's rounds, yet waits less than
#: `BACKLOG` times what the throughput end holds.
QUEUED = 600
TOP = len(LADDER) - 1


async def test_a_short_queue_behind_every_round_holds_the_latency_end(tmp_path: Path
                                                                      ) -> None:
    b = _broker(tmp_path, queued=QUEUED)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert a.core.backlog() == QUEUED - LADDER[0].batch_max
        assert BACKLOG * LADDER[TOP].max_auctions * LADDER[TOP].batch_max > QUEUED
        assert (a.batch_max, a.max_auctions) == (LADDER[0].batch_max, LADDER[0].max_auctions)
        assert b.committer.gap_s == LADDER[0].gap_cap_s
        sizes = _answer_rounds(a, WINDOW + 1)
        # a window of saturated rounds, judged: it holds
        assert sizes == [LADDER[0].batch_max] * (WINDOW + 1)
        assert len(next(iter(a.auctions.values())).requests) == LADDER[0].batch_max
        stats = await b.api.stats(StatsRequest())  # what `gavel bench` reports of it
        assert isinstance(stats, StatsReply)
        assert (stats.tuned_level, stats.tuned_changes) == (0, 0)
        # what it judged by: closes saturated, the most waiting beyond the rounds in flight
        assert stats.tuned_trace == [
            f"level 0: {WINDOW}/{WINDOW} saturated, peak 0, backlog {QUEUED}, round "
            f"{1000 * a.tuner.trace[0].round_s:.1f} ms, step +0"]
    finally:
        b.committer.close()


async def test_a_backlog_jumps_to_the_throughput_end_for_the_pass_it_begins(
        tmp_path: Path) -> None:
    # A closed loop's submissions: 5,000 queued before the pass, which opens the throughput
    # end's rounds, not one of 24.
    b = _broker(tmp_path, queued=5000)
    a = b.auctioneer
    try:
        assert a.core.backlog() == 5000
        a.reconcile(b.now())
        assert (a.batch_max, a.max_auctions) == (LADDER[TOP].batch_max,
                                                 LADDER[TOP].max_auctions)
        assert b.committer.gap_s == LADDER[TOP].gap_cap_s
        holds = LADDER[TOP].max_auctions * LADDER[TOP].batch_max
        assert [len(x.requests) for x in a.auctions.values()] == \
            [LADDER[TOP].batch_max] * LADDER[TOP].max_auctions
        assert a.core.backlog() == 5000 - holds and a.tuner.changes == 1
    finally:
        b.committer.close()


async def test_a_backlog_heard_as_a_round_closes_jumps_and_runs_a_pass_at_once(
        tmp_path: Path) -> None:
    # A pass found little waiting and opened a round of 24; a closed loop's submissions
    # land while it is in flight. The round's close hears the backlog: the level jumps then,
    # and a pass is asked for at once (before, the jump waited for the next tick).
    b = _broker(tmp_path, queued=30)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert a.tuner.level == 0 and a.core.backlog() == 30 - LADDER[0].batch_max
        view = View(b.ledger.state())
        for k in range(5000):
            submit(view, InstanceRecord(instance_id=f"more-{k:05d}", spec=SPEC))
        b.ledger.apply(view.change, "a closed loop's submissions", b.ledger.state().head)
        assert a.core.backlog() >= BACKLOG * LADDER[TOP].max_auctions * LADDER[TOP].batch_max
        b._wake.clear()
        _answer_rounds(a, 1)
        assert a.tuner.level == TOP and a.tuner.changes == 1
        assert (a.core.batch_max, a.core.max_auctions) == (LADDER[TOP].batch_max,
                                                           LADDER[TOP].max_auctions)
        assert b._wake.is_set()  # the pass that opens the throughput end's rounds
    finally:
        b.committer.close()


async def test_submissions_still_landing_count_as_waiting(tmp_path: Path) -> None:
    # The bench's closed loop keeps 8,000 asked for: on a busy broker half of them are in
    # submissions still on their way to git, the rest pending. The pending alone are less
    # than the throughput end holds; with those landing they are more (rule 12).
    holds = BACKLOG * LADDER[TOP].max_auctions * LADDER[TOP].batch_max
    pending = holds - 100
    b = _broker(tmp_path, queued=pending + LADDER[0].batch_max)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert a.tuner.level == 0 and a.core.backlog() == pending == a.backlog()
        _answer_rounds(a, 2)
        assert a.tuner.level == 0  # the pending alone hold the latency end
        landing = 4000
        a.incoming = lambda: landing
        assert a.backlog() == a.core.backlog() + landing >= holds
        b._wake.clear()
        _answer_rounds(a, 1)
        assert a.tuner.level == TOP and a.tuner.changes == 1
        assert b._wake.is_set()
    finally:
        b.committer.close()


async def test_work_landing_is_not_a_quiet_spell(tmp_path: Path) -> None:
    # Nothing in flight and nothing closed or landed for long, but the committer holds work
    # (a commit being written, awards being carried out) or submissions are landing: the
    # level holds; once neither is, the spell is quiet.
    b = _broker(tmp_path, queued=5000)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        _answer_rounds(a, 1)  # a close: the spell counts from here
        assert a.tuner.level == TOP
        a.auctions.clear()
        b.committer.idle.clear()  # as `Committer.submit` leaves it until all has landed
        a.reconcile(b.now() + 2 * IDLE_S)
        assert a.tuner.level == TOP
        b.committer.idle.set()
        b.api.submissions.incoming = 1000
        a.auctions.clear()
        a.reconcile(b.now() + 4 * IDLE_S)
        assert a.tuner.level == TOP
        b.api.submissions.incoming = 0
        a.auctions.clear()
        a.reconcile(b.now() + 6 * IDLE_S)
        assert a.tuner.level == 0
    finally:
        b.committer.close()


async def test_released_to_the_defaults_with_the_throughput_ends_rounds_full_it_jumps(
        tmp_path: Path) -> None:
    # `gavel tune` pinned the throughput end and a closed loop filled its rounds, with less
    # than they hold left waiting; released to a fresh tuner, the first close hears what
    # the latency end would have had waiting (rule 12) and goes back up at once.
    holds = LADDER[TOP].max_auctions * LADDER[TOP].batch_max
    b = _broker(tmp_path, queued=holds + 3900)
    a = b.auctioneer
    try:
        a.retune(batch_max=LADDER[TOP].batch_max, max_auctions=LADDER[TOP].max_auctions,
                 commit_gap_s=0.0)
        a.reconcile(b.now())
        assert len(a.auctions) == LADDER[TOP].max_auctions and a.core.backlog() == 3900
        a.retune(batch_max=None, max_auctions=None, commit_gap_s=None)
        assert a.tuner.level == 0 and a.max_auctions == LADDER[0].max_auctions
        _answer_rounds(a, 1)
        assert a.tuner.level == TOP and a.tuner.changes == 1
        assert (a.core.batch_max, a.core.max_auctions) == (LADDER[TOP].batch_max,
                                                           LADDER[TOP].max_auctions)
    finally:
        b.committer.close()


async def test_the_broker_counts_its_submissions_landing(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=0)
    try:
        assert b.auctioneer.backlog() == 0
        b.api.submissions.incoming = 700  # as `Submissions._submit` keeps it
        assert b.auctioneer.backlog() == 700
    finally:
        b.committer.close()


async def test_values_given_are_pinned(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=2000, batch_max=10, max_auctions=1)
    a = b.auctioneer
    try:
        a.reconcile(b.now())  # 1,990 waiting: the backlog jumps (the level, not what it pins)
        assert _answer_rounds(a, 2 * WINDOW) == [10] * (2 * WINDOW)
        assert a.max_auctions == 1 and a.tuner.level == TOP  # the level moved; nothing it pins
        assert b.committer.gap_s == LADDER[TOP].gap_cap_s  # the gap, not given, is tuned
    finally:
        b.committer.close()


async def test_with_every_value_given_the_level_reported_stays_put(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=2000, batch_max=10, max_auctions=1, commit_gap_s=0.005)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert _answer_rounds(a, 2 * WINDOW) == [10] * (2 * WINDOW)
        stats = await b.api.stats(StatsRequest())
        assert isinstance(stats, StatsReply)
        assert (stats.tuned_level, stats.tuned_changes) == (0, 0)  # nothing was tuned
        assert b.committer.gap_s == 0.005
    finally:
        b.committer.close()


async def test_a_commit_that_just_landed_is_not_a_quiet_spell(tmp_path: Path) -> None:
    # The awards of the rounds that climbed are committed by the real committer; a pass
    # IDLE_S after the last close, but just as that commit lands, keeps the level (a closed
    # loop's next submissions wait on such commits).
    b = _broker(tmp_path, queued=5000)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        _answer_rounds(a, 1)
        assert a.tuner.level == TOP
        seen = b.committer.commits
        committing = asyncio.create_task(b.committer.run())
        for _ in range(6000):  # the committer lands the awards (a bound, not a timing)
            if b.committer.commits != seen and b.committer.idle.is_set():
                break
            await asyncio.sleep(0.01)
        assert b.committer.commits != seen and b.committer.idle.is_set()
        committing.cancel()  # no later commit (a loaded machine's) lands between the passes
        with contextlib.suppress(asyncio.CancelledError):
            await committing
        a.auctions.clear()  # nothing in flight: only the commit says the work goes on
        a.reconcile(b.now() + 2 * IDLE_S)
        assert a.tuner.level == TOP
        a.auctions.clear()  # (the pass opened the next round)
        a.reconcile(b.now() + 4 * IDLE_S)
        assert a.tuner.level == 0  # nothing since: quiet
    finally:
        committing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await committing
        b.committer.close()
