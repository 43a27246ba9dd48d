"""The bare auctioneer (`bench.bare`) in memory: whom a round asks, what it sends, how it
awards, and which reports count. Its connection is a stand-in without nats-py's internals,
so everything it sends waits in its own queue, in order, to be read here. (Against real
agents: tests/integration/test_bench_bare.py.)"""

from __future__ import annotations

import asyncio
import random

import msgspec

from gavel.bench import bare
from gavel.bench.agentprocs import node_id
from gavel.shared import subjects
from gavel.shared.messages import RFB, Award, Bid, BidReply, Decline, Event, EventType
from gavel.transport.wire import Inbound

_enc = msgspec.msgpack.Encoder()


def _rounds(nodes: int, *, batch: int, d: int, in_flight: int = 1) -> bare.Rounds:
    return bare.Rounds(object(), [node_id(k) for k in range(nodes)], batch=batch,
                       in_flight=in_flight, d=d, rng=random.Random(7))


def _reply(aid: str, node: str, *answers: Bid | Decline) -> Inbound:
    return Inbound(subjects.BIDS.format(node=node),
                   _enc.encode(BidReply(auction_id=aid, node_id=node, answers=list(answers))))


def _sent(r: bare.Rounds) -> list[tuple[str, bytes]]:
    out, r._later = r._later, []
    return out


async def test_a_round_asks_d_nodes_a_request_with_one_rfb_of_the_bench_s_shape() -> None:
    r = _rounds(100, batch=4, d=2)
    r.fill()
    sent = _sent(r)
    assert len(sent) == 8 and len({s for s, _ in sent}) == 8  # d x batch distinct nodes
    assert all(s.startswith("gavel.rfb.n") for s, _ in sent)
    assert len({p for _, p in sent}) == 1  # encoded once
    rfb = msgspec.msgpack.decode(sent[0][1], type=RFB)
    (shape,) = rfb.shapes
    assert (shape.cpu, shape.memory_mb) == (bare.SPEC.cpu, bare.SPEC.memory_mb)
    assert rfb.counts == [4]
    assert list(r.open) == [rfb.auction_id] and r.asked == 8


async def test_the_lowest_price_wins_each_request_rising_by_its_step_ties_on_node_id() -> None:
    r = _rounds(3, batch=4, d=2)  # 2 x 4 > 3: every node is asked
    r.fill()
    (aid,) = r.open
    assert {s for s, _ in _sent(r)} == {f"gavel.rfb.{node_id(k)}" for k in range(3)}
    r.on_bids(_reply(aid, node_id(0), Bid(shape=0, load=0.5, step=0.2)))
    r.on_bids(_reply(aid, node_id(1), Bid(shape=0, load=0.2, step=0.5)))
    assert aid in r.open  # one asked node has not answered
    r.on_bids(_reply(aid, node_id(2), Decline(shape=0, reason="no room")))
    sent = _sent(r)
    awards = [msgspec.msgpack.decode(p, type=Award) for s, p in sent if ".award." in s]
    # n1 at 0.2, n0 at 0.5, then n0 and n1 both at 0.7: n00000 first; then n1 at 0.7
    assert [a.node_id for a in awards] == [node_id(k) for k in (1, 0, 0, 1)]
    assert [s for s, _ in sent[:4]] == [subjects.AWARD.format(node=a.node_id) for a in awards]
    assert all(a.spec == bare.SPEC and a.auction_id == aid and len(a.commit) == 40
               for a in awards)
    assert len({a.instance_id for a in awards}) == 4
    assert all(a.instance_id.startswith(bare.PREFIX) for a in awards)
    assert r.awarded == 4 and r.last_winner == node_id(1)
    # and the next round opened at once, the last winner asked beside the drawn nodes
    assert len(r.open) == 1 and aid not in r.open and r.rounds == 2
    assert len(sent) == 4 + 3


async def test_an_infinite_step_takes_one_request_and_a_late_or_stranger_s_answer_none(
        ) -> None:
    r = _rounds(2, batch=3, d=1, in_flight=2)
    r.fill()
    first, second = r.open
    _sent(r)
    r.on_bids(_reply("bare-nonsense", node_id(0), Bid(shape=0, load=0.0, step=0.0)))
    r.on_bids(_reply(first, node_id(0), Bid(shape=0, load=0.1, step=float("inf"))))
    r.on_bids(_reply(first, node_id(0), Bid(shape=0, load=0.0, step=0.0)))  # a replay
    r.on_bids(_reply(first, node_id(1), Bid(shape=0, load=0.3, step=float("inf"))))
    awards = [msgspec.msgpack.decode(p, type=Award) for s, p in _sent(r) if ".award." in s]
    assert [a.node_id for a in awards] == [node_id(0), node_id(1)]  # 3 asked, 2 placeable
    assert r.awarded == 2 and second in r.open and len(r.open) == 2


async def test_a_round_closes_at_its_deadline_with_the_answers_it_has() -> None:
    r = bare.Rounds(object(), [node_id(k) for k in range(4)], batch=2, in_flight=1, d=2,
                    rng=random.Random(1), deadline_s=0.01)
    r.fill()
    (aid,) = r.open
    r.on_bids(_reply(aid, node_id(3), Bid(shape=0, load=0.1, step=0.0)))
    r.opening = False  # no next round: this one's close is all that is sent
    _sent(r)
    await asyncio.sleep(0.05)
    assert not r.open
    awards = [msgspec.msgpack.decode(p, type=Award) for s, p in _sent(r) if ".award." in s]
    assert [a.node_id for a in awards] == [node_id(3), node_id(3)]


async def test_each_round_is_timed_from_its_rfbs_to_its_close() -> None:
    r = bare.Rounds(object(), [node_id(k) for k in range(4)], batch=2, in_flight=2, d=1,
                    rng=random.Random(1), deadline_s=0.05)
    r.fill()
    r.opening = False  # no round opens after these two
    quick, _slow = r.open
    for node in r.open[quick].asked:  # every asked node answers: it closes at once
        r.on_bids(_reply(quick, node, Bid(shape=0, load=0.1, step=0.0)))
    assert len(r.round_s) == 1 and r.round_s[0] < 0.05
    await asyncio.sleep(0.1)  # the other waits for its deadline
    assert not r.open and len(r.round_s) == 2 and r.round_s[1] >= 0.05
    assert bare.p99(r.round_s) == max(r.round_s) and bare.p99([]) == 0.0
    assert bare.p99([float(v) for v in range(1, 201)]) == 198.0  # nearest rank


async def test_only_the_running_reports_of_its_own_awards_count() -> None:
    r = _rounds(2, batch=1, d=1)
    r.awarded = 2
    r.opening = False

    def report(iid: str, kind: EventType) -> Inbound:
        return Inbound(subjects.REPORT.format(node=node_id(0)), _enc.encode(
            Event(instance_id=iid, type=kind, node_id=node_id(0))))

    r.on_report(report("b0000001-1", EventType.RUNNING))  # a run's instance
    r.on_report(report(f"{bare.PREFIX}00000001-0", EventType.EXITED))
    r.on_report(Inbound("gavel.report.n00000", b"\xc1"))  # malformed: dropped
    assert r.confirmed == 0
    r.on_report(report(f"{bare.PREFIX}00000001-0", EventType.RUNNING))
    assert r.confirmed == 1 and not r.all_confirmed.is_set()
    r.on_report(report(f"{bare.PREFIX}00000001-1", EventType.RUNNING))
    assert r.confirmed == 2 and r.all_confirmed.is_set()
