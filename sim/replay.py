"""``gavel sim --replay``: re-decide the auctions a state repository recorded, under changes.

Rules:
1. The input is history only: every ``Gavel-Auction:`` trailer of the commits in the range
   (oldest first), read with pygit2 from ``<state>/state.git`` (or the bare repo given).
2. With no change and the production rule, each replayed round goes through the real
   `shared.auction.Auction` and must reproduce the recorded winner; a difference is a
   ledger disagreement and is reported as one.
3. A switched node re-bids through `shared.strategies.answer` with its new strategy on a
   view rebuilt from the ledger: committed = the placements in its ``node.json`` before the
   round (plus earlier awards in the same commit), capacity = the assumed ``--capacity``
   (the ledger does not record it). Declines for hard constraints (labels, draining, no
   room) are kept: a strategy cannot change them.
4. Each round is re-decided against recorded history, not against the replay's own
   earlier answers: the report says how each award would have gone, round by round.
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pygit2
from pygit2.enums import SortMode

from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, Capacity, Decline, Request
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    flat_instance_path,
    instance_path,
    node_path,
    parse_trailers,
)
from gavel.shared.strategies import Strategy, answer, make_strategy
from gavel.sim.rounds import Answer, run_round, winner_of

__all__ = ["ReplayError", "Round", "Switch", "replay", "run_replay"]

_HARD = frozenset({Reason.MISSING_LABEL, Reason.DRAINING, Reason.NO_ROOM_CPU,
                   Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS})
_instance = msgspec.json.Decoder(InstanceRecord)
_node = msgspec.json.Decoder(NodeFile)


class ReplayError(ValueError):
    """Bad replay input; the message is the sentence the operator reads."""


class Switch(msgspec.Struct, frozen=True):
    pattern: str
    strategy: str
    params: dict[str, float] = {}


class Round(msgspec.Struct, kw_only=True):
    commit: str
    auction_id: str
    instance_id: str
    recorded: str
    replayed: str
    recorded_strategy: str = ""
    replayed_strategy: str = ""
    rebid: list[str] = []

    @property
    def changed(self) -> bool:
        return self.recorded != self.replayed


class ReplayResult(msgspec.Struct, kw_only=True):
    repository: str
    range: str
    award: str
    switches: list[Switch]
    commits: int
    auctions: int
    changed: int
    disagreements: int
    wins_recorded: dict[str, int]
    wins_replayed: dict[str, int]
    rounds: list[Round]


def parse_switch(text: str) -> Switch:
    pattern, sep, rest = text.partition("=")
    name, _, raw = rest.partition(":")
    if not sep or not pattern or not name:
        raise ReplayError(f"--switch {text!r}: expected NODES=STRATEGY[:key=value,...].")
    params: dict[str, float] = {}
    for item in filter(None, raw.split(",")):
        key, eq, value = item.partition("=")
        try:
            params[key] = float(value)
        except ValueError:
            raise ReplayError(f"--switch {text!r}: parameter {key!r} needs a number.") from None
        if not eq:
            raise ReplayError(f"--switch {text!r}: expected key=value parameters.")
    try:
        make_strategy(name, params or None)
    except ValueError as exc:
        raise ReplayError(f"--switch {text!r}: {exc}.") from None
    return Switch(pattern, name, params)


def parse_capacity(text: str) -> Capacity:
    fields: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in ("cpu", "memory_mb", "ports"):
            raise ReplayError(f"--capacity: expected cpu=, memory_mb= or ports=, got {key!r}.")
        try:
            fields[key] = float(value)
        except ValueError:
            raise ReplayError(f"--capacity: {key} needs a number, got {value!r}.") from None
    return Capacity(cpu=fields.get("cpu", 8.0), memory_mb=int(fields.get("memory_mb", 16384)),
                    ports=int(fields.get("ports", 1000)))


def open_repo(path: Path) -> pygit2.Repository:
    for candidate in (path / "state.git", path):
        if (candidate / "HEAD").exists():
            return pygit2.Repository(str(candidate))
    raise ReplayError(f"--replay {path}: expected a state directory holding state.git, "
                      "or a bare git repository.")


def commits(repo: pygit2.Repository, rev_range: str) -> Iterator[pygit2.Commit]:
    """Oldest first; ``A..B`` is what B has and A has not, ``B`` is all of B's history."""
    start, dots, end = rev_range.partition("..")
    try:
        tip = repo.revparse_single(end if dots else start)
        walker = repo.walk(tip.peel(pygit2.Commit).id, SortMode.TOPOLOGICAL | SortMode.REVERSE)
        if dots and start:
            walker.hide(repo.revparse_single(start).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise ReplayError(f"REV_RANGE {rev_range!r}: not found in the state repository "
                          f"({exc}).") from None
    yield from walker


def _blob(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> bytes | None:
    try:
        entry = tree[path]
    except KeyError:
        return None
    obj = repo[entry.id]
    return obj.data if isinstance(obj, pygit2.Blob) else None


def _request(repo: pygit2.Repository, tree: pygit2.Tree, instance_id: str) -> Request | None:
    raw = _blob(repo, tree, instance_path(instance_id))
    if raw is None:
        raw = _blob(repo, tree, flat_instance_path(instance_id))
    if raw is None:
        return None
    try:
        return Request.of(instance_id, _instance.decode(raw).spec)
    except msgspec.DecodeError:
        return None


def _committed(repo: pygit2.Repository, tree: pygit2.Tree | None, node_id: str) -> Capacity:
    raw = _blob(repo, tree, node_path(node_id)) if tree is not None else None
    used = Capacity()
    if raw is not None:
        for placement in _node.decode(raw).instances.values():
            used.cpu += placement.cpu
            used.memory_mb += placement.memory_mb
            used.ports += len(placement.ports)
    return used


class _Rule:
    """The award rule under test: "lowest" is production; the others are what-ifs."""

    def __init__(self, text: str, rng: random.Random) -> None:
        self.text = text
        self.rng = rng
        self.kind, _, d = text.partition(":")
        if self.kind not in ("lowest", "highest", "random", "sample"):
            raise ReplayError(f"--award {text!r}: expected lowest, highest, random or "
                              "sample:D.")
        try:
            self.d = int(d) if self.kind == "sample" else 0
        except ValueError:
            raise ReplayError(f"--award {text!r}: sample needs a count, as in sample:2.") from None
        if self.kind == "sample" and self.d < 1:
            raise ReplayError(f"--award {text!r}: sample needs a count of at least 1.")

    def decide(self, rec: AuctionRecord, request: Request,
               replies: list[tuple[str, Answer]]) -> str:
        if self.kind == "sample":
            replies = [replies[i] for i in sorted(self.rng.sample(range(len(replies)),
                                                                  min(self.d, len(replies))))]
        if self.kind in ("lowest", "sample"):
            decision = run_round(rec.auction_id, request, replies,
                                 [] if self.kind == "sample" else rec.silent, 0.0, 1.0, 0.0)
            return winner_of(decision) or ""
        bids = sorted((n, a) for n, a in replies if isinstance(a, Bid))
        if not bids:
            return ""
        if self.kind == "random":
            return bids[self.rng.randrange(len(bids))][0]
        return min(bids, key=lambda b: (-b[1].load, b[0]))[0]


def replay(repo: pygit2.Repository, rev_range: str, rule: _Rule, switches: list[Switch],
           capacity: Capacity) -> ReplayResult:
    rounds: list[Round] = []
    made = [(s.pattern, make_strategy(s.strategy, s.params or None)) for s in switches]
    seen = 0
    for commit in commits(repo, rev_range):
        seen += 1
        records = parse_trailers(commit.message)
        if not records:
            continue
        parent = commit.parents[0].tree if commit.parents else None
        extra: Counter[str] = Counter()  # awards earlier in this commit, per node
        extra_req: dict[str, list[Request]] = {}
        for rec in records:
            request = _request(repo, commit.tree, rec.instance_id)
            replies, rebid = _answers(repo, parent, rec, request, made, capacity, extra_req)
            winner = rule.decide(rec, request or Request(instance_id=rec.instance_id, cpu=0.0,
                                                         memory_mb=0), replies)
            by_node = dict(replies)
            won = by_node.get(winner)
            recorded_bid = next((b for b in rec.bids if b.node_id == rec.winner), None)
            rounds.append(Round(
                commit=str(commit.id)[:12], auction_id=rec.auction_id,
                instance_id=rec.instance_id, recorded=rec.winner, replayed=winner,
                recorded_strategy=recorded_bid.strategy if recorded_bid else "",
                replayed_strategy=won.strategy if isinstance(won, Bid) else "",
                rebid=rebid))
            if rec.winner and request is not None:
                extra[rec.winner] += 1
                extra_req.setdefault(rec.winner, []).append(request)
    unchanged_rule = rule.kind == "lowest" and not switches
    return ReplayResult(
        repository=str(repo.path), range=rev_range, award=rule.text, switches=switches,
        commits=seen, auctions=len(rounds), changed=sum(r.changed for r in rounds),
        disagreements=sum(r.changed for r in rounds) if unchanged_rule else 0,
        wins_recorded=dict(sorted(Counter(r.recorded or "(none)" for r in rounds).items())),
        wins_replayed=dict(sorted(Counter(r.replayed or "(none)" for r in rounds).items())),
        rounds=rounds)


def _answers(repo: pygit2.Repository, parent: pygit2.Tree | None, rec: AuctionRecord,
             request: Request | None, made: list[tuple[str, Strategy]], capacity: Capacity,
             earlier: dict[str, list[Request]]) -> tuple[list[tuple[str, Answer]], list[str]]:
    """The replies of one round, with switched nodes re-bidding (rule 3)."""
    recorded: dict[str, Answer] = {}
    for b in rec.bids:
        recorded[b.node_id] = Bid(shape=0, load=b.load, strategy=b.strategy)
    for d in rec.declines:
        recorded[d.node_id] = Decline(shape=0, reason=d.reason,
                                      detail=d.detail)
    rebid: list[str] = []
    for node_id, old in sorted(recorded.items()):
        switch = next((st for pat, st in made if fnmatch.fnmatchcase(node_id, pat)), None)
        if switch is None or request is None:
            continue
        if isinstance(old, Decline) and old.reason in _HARD:
            continue
        used = _committed(repo, parent, node_id)
        for r in earlier.get(node_id, []):
            used.cpu += r.cpu
            used.memory_mb += r.memory_mb
            used.ports += r.ports
        view = NodeView(node_id=node_id, capacity=capacity, committed=used,
                        labels=dict(request.labels))
        recorded[node_id] = answer(switch, request, view)
        rebid.append(node_id)
    return sorted(recorded.items()), rebid


def _markdown(result: ReplayResult) -> str:
    lines = [f"# gavel sim --replay {result.repository}", "",
             f"Range `{result.range}`: {result.commits} commits, {result.auctions} recorded "
             f"auctions, award rule `{result.award}`"
             + (", switched: " + ", ".join(f"`{s.pattern}` → {s.strategy}"
                                          for s in result.switches) if result.switches else "")
             + ".", "",
             f"**{result.changed} of {result.auctions}** awards would have gone elsewhere.", ""]
    if result.disagreements:
        lines += [f"**{result.disagreements}** recorded awards disagree with the production "
                  "rule on their own recorded bids.", ""]
    lines += ["| node | wins recorded | wins replayed |", "|---|---:|---:|"]
    for node in sorted(set(result.wins_recorded) | set(result.wins_replayed)):
        lines.append(f"| {node} | {result.wins_recorded.get(node, 0)} | "
                     f"{result.wins_replayed.get(node, 0)} |")
    changed = [r for r in result.rounds if r.changed]
    if changed:
        lines += ["", "| commit | auction | instance | recorded | replayed |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r.commit} | {r.auction_id} | {r.instance_id} | {r.recorded or '-'} | "
                  f"{r.replayed or '-'} |" for r in changed]
    return "\n".join(lines) + "\n"


def run_replay(args: argparse.Namespace) -> int:
    try:
        repo = open_repo(args.replay)
        rule = _Rule(args.award, random.Random(f"{args.seed or 1}/replay"))
        switches = [parse_switch(s) for s in args.switch]
        result = replay(repo, args.target or "refs/heads/main", rule, switches,
                        parse_capacity(args.capacity))
    except ReplayError as exc:
        print(f"gavel sim: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out or Path("sim-out") / "replay"
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    (out / "replay.md").write_text(_markdown(result))
    print(f"replayed {result.auctions} auctions from {result.commits} commits "
          f"({result.range}) under award rule {result.award!r}"
          + (f" with {len(switches)} switch(es)" if switches else ""))
    print(f"  {result.changed} of {result.auctions} awards would have gone elsewhere")
    if result.disagreements:
        print(f"  {result.disagreements} recorded awards disagree with the production rule")
    for node in sorted(set(result.wins_recorded) | set(result.wins_replayed)):
        print(f"  {node:<20} recorded {result.wins_recorded.get(node, 0):>6}  "
              f"replayed {result.wins_replayed.get(node, 0):>6}")
    print(f"results in {out}/")
    return 0

