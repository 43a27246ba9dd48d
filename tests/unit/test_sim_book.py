"""The order book prices a new node state by the strategies' own bids (`sim.book` rule 5)
and builds an answer object only when one is wanted, with `shared.strategies.answer`."""

from __future__ import annotations

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Bid, Capacity, Request, Shape
from gavel.shared.strategies import answer, make_strategy
from gavel.shared.strategies.base import Strategy
from gavel.sim.book import Books

REQUESTS = [Request(instance_id=f"r{cpu}-{mem}", cpu=cpu, memory_mb=mem)
            for cpu in (0.5, 1.0, 2.0, 8.0) for mem in (512, 4096)]
REQUESTS.append(Request(instance_id="zoned", cpu=0.5, memory_mb=512, labels={"zone": "b"}))


class Counting:
    """A registered strategy, counting how often it is asked to bid."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner
        self.name = inner.name
        self.depends_on_request = inner.depends_on_request
        self.bids = 0

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        self.bids += 1
        return self.inner.bid(request, node)


def _view(cpu: float = 1.5, memory: int = 2048) -> NodeView:
    return NodeView(node_id="n0000", capacity=Capacity(cpu=4.0, memory_mb=8192),
                    committed=Capacity(cpu=cpu, memory_mb=memory), labels={"zone": "a"})


def test_a_request_blind_strategy_bids_once_for_a_new_state() -> None:
    strategy = Counting(make_strategy("least-loaded"))
    books = Books(REQUESTS, 1)
    books.update(0, strategy, _view())
    assert strategy.bids == 1
    books.update(0, strategy, _view())  # a known state: nothing priced
    assert strategy.bids == 1


def test_a_request_priced_strategy_bids_once_per_fitting_shape() -> None:
    strategy = Counting(make_strategy("binpack"))
    books = Books(REQUESTS, 1)
    view = _view()
    books.update(0, strategy, view)
    fitting = [r for r in REQUESTS if isinstance(answer(strategy.inner, r, view), Bid)]
    assert strategy.bids == len(fitting) == 6


def test_answer_objects_are_answers_own_and_built_when_asked() -> None:
    for name in ("least-loaded", "binpack", "spread", "headroom"):
        strategy = Counting(make_strategy(name, {"ceiling": 0.5} if name == "headroom" else None))
        books = Books(REQUESTS, 2)
        books.update(0, strategy, _view())
        books.update(1, strategy, _view(cpu=0.0, memory=0))
        priced = strategy.bids
        for k, request in enumerate(REQUESTS):
            for idx, view in ((0, _view()), (1, _view(cpu=0.0, memory=0))):
                got = books[k].answers[idx]
                assert got == answer(strategy.inner, request, view), (name, k, idx)
                load = books.loads[k, idx]
                assert load == (got.load if isinstance(got, Bid) else float("inf"))
        assert strategy.bids > priced  # the objects came from `answer`, asked afterwards
