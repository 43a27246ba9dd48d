"""Re-auction: ask the market again whether running work should move, and when a move pays.

Rules:
1. Candidates. A running instance may be re-auctioned when its kind may move: a service's
   replica does by default; a job, a system job's instance, an instance that uses host
   volumes and one whose spec pins it (``move = false``) never do — a job, a system
   instance or a volume-bound one only when its spec opts in (``move = true``), a pinned
   one never. It must have stayed where it is `cooldown_s` since it was last placed (its
   arrival or its last move), its node must not be draining (a drain moves work away on
   its own), and its service must have fewer than its ``max_parallel`` moves in flight
   (a move is in flight from its start on the new node until the old copy stops).
2. Bounds. A round looks at no more than `sample` candidates and makes no more moves than
   the cluster-wide budget has left (`budget` moves in any 60 s, `Budget`). Candidates on
   the nodes the shell names as near fitting waiting work come first, in the order given;
   the rest are drawn at random from the round's own `random.Random`.
3. The bids. Every other node bids for the instance as for a new request
   (`shared.strategies.answer` on its own view); the holder bids to keep it: the same
   answer on its view without the instance (`keep_view`), so what keeping costs is its
   own strategy's price. The award rule picks the winner among them all through the one
   award path (`decide`: an `Auction` and its `Round`); a replica by the spread rule, with
   the instance itself left out of its holder's count.
4. Hysteresis. The holder keeps the instance when it wins. A challenger takes it only
   with a bid at least `margin` below the keep-bid, or, for a replica, a strictly better
   place in its service's spread (fewer of its group in the winner's label value, then on
   the winner, than the holder keeps without it), or when the holder declines to keep it
   (its strategy or its labels refuse it now).
5. A move pays when it (a) spreads its service better (rule 4's second case), (b) relieves
   a holder that declines to keep it, (c) frees room waiting work can use — a waiting
   shape the holder's labels allow fits the holder's free room with the instance gone and
   does not fit it now — or (d) packs tighter: the winner's committed share (the mean of
   its cpu and memory fractions) is larger than the share the holder keeps without the
   instance, so work gathers and the emptier node drains toward empty. A move that pays
   none of these is not made, however low the winner bid: moving costs a restart.
6. Every judgement is a pure function of the decision and the rooms it is handed; the
   shell charges each move it makes before the next is judged, so a round decides as a
   sequence of single re-auctions would.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, NamedTuple

import msgspec

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.feasibility import NodeView, shortfall
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Request, Shape
from gavel.shared.spec import SERVICE
from gavel.shared.spread import Tally, rank

__all__ = ["WINDOW_S", "Budget", "Holding", "Judgement", "Not", "Outcome", "Room",
           "Settings", "choose", "decide", "judge", "keep_view", "refusal", "share"]

#: Rule 2: the budget's window, seconds.
WINDOW_S = 60.0

PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The knobs of re-auction, as a scenario's ``rebalance = {...}`` or the broker's flags
    set them."""

    #: seconds between rounds
    every_s: PosFloat = 60.0
    #: candidates one round looks at (rule 2)
    sample: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 32
    #: how far below the keep-bid a challenger must bid (rule 4), in the strategies' units
    margin: NonNegFloat = 0.05
    #: moves in any 60 s, cluster-wide (rule 2)
    budget: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 30
    #: seconds an instance stays put after it was placed or moved (rule 1)
    cooldown_s: NonNegFloat = 600.0


class Holding(NamedTuple):
    """A running instance as re-auction sees it."""

    instance_id: str
    node_id: str
    #: `shared.spec`'s type: service, job or system
    kind: str = SERVICE
    #: the service it is a replica of ("" for a job)
    group: str = ""
    #: the spec's ``move`` (None: its kind decides, rule 1)
    move: bool | None = None
    volumes: bool = False
    #: when it was last placed (its award, or its last move)
    placed_at: float = 0.0
    #: its service's ``update.max_parallel``
    max_parallel: int = 1


class Not(StrEnum):
    """Why a running instance is not a candidate (rule 1)."""

    PINNED = "its spec pins it where it runs (move = false)"
    KIND = "a job or a system instance stays unless its spec opts in (move = true)"
    VOLUMES = "it uses host volumes, so it stays unless its spec opts in (move = true)"
    COOLING = "it was placed or moved too recently (cool-down)"
    DRAINING = "its node is draining"
    PARALLEL = "its service has max_parallel moves in flight"


def refusal(h: Holding, now: float, settings: Settings, *, draining: bool = False,
            in_flight: int = 0) -> Not | None:
    """Rule 1: why `h` may not be re-auctioned now (None: it may)."""
    if h.move is False:
        return Not.PINNED
    if h.move is None:
        if h.kind != SERVICE:  # a job, a system instance (JOB, SYSTEM)
            return Not.KIND
        if h.volumes:
            return Not.VOLUMES
    if now - h.placed_at < settings.cooldown_s:
        return Not.COOLING
    if draining:
        return Not.DRAINING
    if in_flight >= max(1, h.max_parallel):
        return Not.PARALLEL
    return None


class Budget:
    """Rule 2: the moves made in the last `WINDOW_S` seconds, against `per_window`."""

    __slots__ = ("_made", "per_window")

    def __init__(self, per_window: int) -> None:
        self.per_window = per_window
        self._made: deque[float] = deque()

    def left(self, now: float) -> int:
        made = self._made
        while made and made[0] <= now - WINDOW_S:
            made.popleft()
        return max(0, self.per_window - len(made))

    def spend(self, now: float) -> None:
        self._made.append(now)


def choose(holdings: Sequence[Holding], now: float, settings: Settings, budget: Budget,
           rng: random.Random, *, in_flight: Mapping[str, int] | None = None,
           draining: Collection[str] = (), prefer: Sequence[int] = ()) -> list[Holding]:
    """Rules 1 and 2: the candidates of one round, at most `sample` (and none when the budget
    is spent). `prefer` indexes into `holdings` come first; the rest are drawn at random.
    A service's candidates count toward its ``max_parallel`` as if each moved."""
    if not holdings or budget.left(now) == 0:
        return []
    flying = dict(in_flight or {})
    out: list[Holding] = []
    seen: set[int] = set()

    def take(i: int) -> bool:
        if i in seen:
            return False
        seen.add(i)
        h = holdings[i]
        key = h.group or h.instance_id
        if refusal(h, now, settings, draining=h.node_id in draining,
                   in_flight=flying.get(key, 0)) is None:
            out.append(h)
            flying[key] = flying.get(key, 0) + 1
        return len(out) >= settings.sample

    for i in prefer:
        if take(i):
            return out
    # a draw a few times the sample leaves room for the candidates rule 1 refuses
    draws = min(len(holdings), 4 * settings.sample + len(seen))
    for i in rng.sample(range(len(holdings)), draws):
        if take(i):
            break
    return out


def keep_view(view: NodeView, shape: Shape) -> NodeView:
    """The holder's view with the instance gone: what it prices keeping on (rule 3)."""
    left = view.committed - shape
    left = Capacity(cpu=max(0.0, left.cpu), memory_mb=max(0, left.memory_mb),
                    ports=max(0, left.ports))
    return msgspec.structs.replace(view, committed=left)


def decide(auction_id: str, request: Request, answers: Sequence[tuple[str, Bid | Decline]],
           now: float, *, free: Mapping[str, Capacity] | None = None,
           held: Mapping[str, Mapping[str, int]] | None = None,
           labels: Mapping[str, Mapping[str, str]] | None = None) -> Decision:
    """Rule 3: the award among the holder's keep answer and the challengers' answers,
    through the auction every placement goes through. `held` counts the group's replicas
    per node without the instance itself."""
    auction = Auction(auction_id, [request], [node for node, _ in answers], now, 1.0)
    for node, ans in answers:
        auction.receive(BidReply(auction_id=auction_id, node_id=node, answers=[ans]), now)
    return auction.decide(now, free, held=held, labels=labels)[0]


class Room(NamedTuple):
    """What the pay rule reads of a node (rule 5)."""

    capacity: Capacity
    committed: Capacity
    labels: Mapping[str, str] = {}


def share(room: Room) -> float:
    """A node's committed share: the mean of its committed cpu and memory fractions."""
    cap, used = room.capacity, room.committed
    cpu = used.cpu / cap.cpu if cap.cpu > 0 else 1.0
    mem = used.memory_mb / cap.memory_mb if cap.memory_mb > 0 else 1.0
    return (cpu + mem) / 2.0


class Outcome(StrEnum):
    """How one re-auction ended; the value is the sentence ``why`` shows."""

    KEPT = "the holder bid lowest to keep it"
    NO_BIDS = "no node bid for it"
    MARGIN = "no node beat the holder's keep-bid by the margin"
    NO_GAIN = "a move would neither spread its service, free room for waiting work nor pack tighter"
    SPREAD = "its service spreads better on the winner"
    RELIEVED = "its holder would no longer take it"
    FREES = "the room it leaves fits waiting work"
    PACKS = "the winner is fuller than its holder is without it"


_MOVES = frozenset({Outcome.SPREAD, Outcome.RELIEVED, Outcome.FREES, Outcome.PACKS})


class Judgement(NamedTuple):
    outcome: Outcome
    #: the node that won the re-auction ("" when none bid)
    winner: str = ""
    #: the winner's effective load and the holder's keep-bid (inf: it declined to keep)
    load: float = math.inf
    keep: float = math.inf

    @property
    def moves(self) -> bool:
        return self.outcome in _MOVES

    def sentence(self, holder: str) -> str:
        """The line a move's commit carries (``why`` reads it)."""
        keep = "declined to keep it" if math.isinf(self.keep) else f"keep-bid {self.keep:.4f}"
        return (f"re-auction: {self.winner or 'no node'} bid {self.load:.4f}, holder {holder} "
                f"{keep}: {self.outcome}")


def judge(request: Request, holder: str, decision: Decision, *, margin: float,
          holder_room: Room, winner_room: Room | None = None,
          waiting: Sequence[Shape] = (), tally: Tally | None = None) -> Judgement:
    """Rules 4 and 5 for one re-auction's `decision` (from `decide`). `holder_room` is the
    holder with the instance still on it; `winner_room` the winner's as it bid; `waiting`
    the shapes queued for want of room; `tally` the group's replicas per node without the
    instance (a replica's spread)."""
    if not isinstance(decision, Awarded) or decision.displaced:  # a move never preempts
        return Judgement(Outcome.NO_BIDS)
    winner = decision.winner
    keep = next((b.load for b in decision.bids if b.node_id == holder), math.inf)
    if winner.node_id == holder:
        return Judgement(Outcome.KEPT, holder, winner.load, keep)
    got = Judgement(Outcome.NO_GAIN, winner.node_id, winner.load, keep)
    if math.isinf(keep):
        return got._replace(outcome=Outcome.RELIEVED)
    if tally is not None and request.group:
        theirs = rank(request, winner.node_id, 0.0, tally)[:2]
        ours = rank(request, holder, 0.0, tally)[:2]
        if theirs < ours:
            return got._replace(outcome=Outcome.SPREAD)
        if theirs > ours:  # the spread rule preferred it for want of a better place
            return got._replace(outcome=Outcome.MARGIN)
    if winner.load + margin > keep:
        return got._replace(outcome=Outcome.MARGIN)
    if _frees(request, holder_room, waiting):
        return got._replace(outcome=Outcome.FREES)
    if winner_room is not None and share(winner_room) > share(
            holder_room._replace(committed=holder_room.committed - request)):
        return got._replace(outcome=Outcome.PACKS)
    return got


def _frees(request: Request, room: Room, waiting: Sequence[Shape]) -> bool:
    """Rule 5 (c): a waiting shape the holder's labels allow fits the holder once the
    instance is gone, and does not fit it now."""
    free = room.capacity - room.committed
    after = free + request
    labels = room.labels
    for shape in waiting:
        if shortfall(shape, after) is None and shortfall(shape, free) is not None and all(
                labels.get(k) == v for k, v in shape.labels.items()):
            return True
    return False
