"""What a chaos run checks, read from the outside: git, the workers' agent.json, live processes.

Rules:
1. Nothing here takes the broker's or a worker's word for anything. Placements come from
   the state repository; an instance is alive on a node when a process carrying its
   ``GAVEL_INSTANCE_ID`` runs with its cwd under that node's state directory, or when that
   node's ``agent.json`` names a pid that still runs with the recorded start time. Someone
   else's commits are written here with the same compare-and-swap on the ref the broker
   uses.
2. Each submitted instance ends in exactly one of: placed once (and alive where placed, if
   it runs for good), honestly terminal (with a reason unless it succeeded), ended `lost`
   by the broker, missing (never accepted, no record in git, or neither placed nor
   terminal) or duplicated (in two node.json files, or alive on two nodes). A `lost` is an
   honest outcome, never a clean one: the verdict counts it on its own (`ended_lost`), not
   among the other terminal states, so a run that lost instances never reads as one that
   lost none.
3. Work the broker keeps unschedulable for want of room (every node that bid had no room,
   `_ROOM`) is accounted for and counted on its own (`unschedulable`): the fleet was too
   small, nothing was lost. Unschedulable for any other reason (no bids, no nodes) is a
   wait the broker must end by itself once nodes answer, so it stays missing until then.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psutil
import pygit2

from gavel.broker.ledger.state import State
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import instance_path
from gavel.worker.localstate import AgentFile, process_alive

__all__ = [
    "Foreign",
    "Verdict",
    "alive_by_node",
    "chain_errors",
    "foreign_commit",
    "held_by",
    "kill_instances",
    "read_head",
    "verify",
]

REF = "refs/heads/main"
_agent_dec = msgspec.json.Decoder(AgentFile)
_SIGNATURE = ("someone-else", "someone@elsewhere.example")
#: The reasons an instance waits for want of room (rule 3).
_ROOM = frozenset({Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS,
                   Reason.OVER_CEILING, Reason.ALL_FULL})


@dataclass(frozen=True)
class Foreign:
    """A commit someone else put on the state branch: it must stay in history, unchanged."""

    sha: str
    path: str
    text: str


def read_head(repo: pygit2.Repository) -> str | None:
    ref = repo.references.get(REF)
    return None if ref is None else str(ref.target)


def foreign_commit(repo_path: Path, n: int, tries: int = 200) -> Foreign | None:
    """Add ``notes/<n>.md`` on top of the current head and move the branch by compare-and-
    swap, retrying while the broker holds the ref lock or moves the ref first."""
    repo = pygit2.Repository(str(repo_path))
    path, text = f"notes/{n}.md", f"# note {n}\n\nwritten beside the broker at {time.time()}\n"
    sig = pygit2.Signature(*_SIGNATURE)
    for _ in range(tries):
        head = read_head(repo)
        if head is None:  # nothing committed yet
            time.sleep(0.05)
            continue
        base = repo[head].peel(pygit2.Tree)
        notes = repo[base["notes"].id] if "notes" in base else None
        nb = repo.TreeBuilder(notes) if isinstance(notes, pygit2.Tree) else repo.TreeBuilder()
        nb.insert(f"{n}.md", repo.create_blob(text.encode()), pygit2.enums.FileMode.BLOB)
        tb = repo.TreeBuilder(base)
        tb.insert("notes", nb.write(), pygit2.enums.FileMode.TREE)
        sha = repo.create_commit(None, sig, sig, f"notes: note {n}, by someone else\n",
                                 tb.write(), [pygit2.Oid(hex=head)])
        try:
            with repo.transaction() as txn:
                txn.lock_ref(REF)
                if read_head(repo) != head:
                    raise _Moved
                txn.set_target(REF, sha, message=f"someone else: note {n}")
        except (_Moved, pygit2.GitError):  # moved under us, or the broker holds the lock
            time.sleep(0.01)
            continue
        return Foreign(sha=str(sha), path=path, text=text)
    return None


class _Moved(Exception):
    pass


def chain_errors(repo: pygit2.Repository, heads: list[str], foreign: Iterable[Foreign],
                 final: str | None) -> list[str]:
    """Each observed head is an ancestor of the next; every foreign commit is an ancestor of
    the final head and its file is still in the final tree, byte for byte."""
    errors = []
    for a, b in itertools.pairwise(heads):
        if a != b and not repo.descendant_of(pygit2.Oid(hex=b), pygit2.Oid(hex=a)):
            errors.append(f"history rewritten: head {b[:12]} does not descend from the "
                          f"earlier head {a[:12]}")
    tree = repo[final].peel(pygit2.Tree) if final else None
    for f in foreign:
        if final is None or (f.sha != final and not repo.descendant_of(
                pygit2.Oid(hex=final), pygit2.Oid(hex=f.sha))):
            errors.append(f"foreign commit {f.sha[:12]} ({f.path}) is not in the history "
                          "of the final head")
            continue
        assert tree is not None
        try:
            blob = repo[tree[f.path].id]
        except KeyError:
            blob = None
        if not isinstance(blob, pygit2.Blob) or blob.data != f.text.encode():
            errors.append(f"foreign file {f.path} of {f.sha[:12]} is missing or changed "
                          "in the final tree")
    return errors


def _instance_procs(workers: Path) -> Iterable[tuple[psutil.Process, dict[str, str]]]:
    base = str(workers.resolve()) + os.sep
    for p in psutil.process_iter():
        try:
            if not p.cwd().startswith(base) or p.status() == psutil.STATUS_ZOMBIE:
                continue
            env = p.environ()
        except psutil.Error:
            continue
        yield p, env


def alive_by_node(workers: Path) -> dict[str, set[str]]:
    """Instance id -> the nodes it is alive on, from live processes and agent.json files."""
    out: dict[str, set[str]] = {}
    for _p, env in _instance_procs(workers):
        iid, node = env.get("GAVEL_INSTANCE_ID"), env.get("GAVEL_NODE_ID")
        if iid and node:
            out.setdefault(iid, set()).add(node)
    for path in sorted(workers.glob("*/agent.json")):
        try:
            agent = _agent_dec.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue  # being replaced right now; the processes above still count
        for iid, local in agent.instances.items():
            if process_alive(local.pid, local.create_time):
                out.setdefault(iid, set()).add(agent.node_id)
    return out


def held_by(state_dir: Path) -> list[str]:
    """The instances a worker's agent.json holds (read only: never set aside like the
    worker's own `load` does with a file it cannot read)."""
    try:
        return sorted(_agent_dec.decode((state_dir / "agent.json").read_bytes()).instances)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return []


def kill_instances(workers: Path) -> int:
    """SIGKILL every instance process still running under `workers` (its whole group)."""
    n = 0
    for p, env in _instance_procs(workers):
        if "GAVEL_INSTANCE_ID" not in env:
            continue
        try:
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
            n += 1
        except (OSError, psutil.Error):
            pass
    return n


@dataclass
class Verdict:
    """Rule 2, instance by instance."""

    placed_once: int = 0
    #: Ended honestly, by state - every terminal state but `lost`.
    terminal: Counter[str] = field(default_factory=Counter)
    #: Ended `lost` by the broker (its lease ran out, its attempts were spent).
    ended_lost: list[str] = field(default_factory=list)
    #: Waiting for room (rule 3): accounted for, counted on its own.
    unschedulable: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Every instance accounted for (a `lost` is accounted for: it is counted)."""
        return not (self.missing or self.duplicated or self.errors)

    @property
    def clean(self) -> bool:
        """Settled, and the broker lost nothing."""
        return self.settled and not self.ended_lost


def verify(state: State, submitted: Mapping[str, bool], accepted: Iterable[str],
           alive: Mapping[str, set[str]]) -> Verdict:
    """The per-instance invariants. `submitted` maps each id to whether it runs for good
    (a sleeper) — a sleeper that "succeeded" was killed and reported as a success."""
    v = Verdict()
    holders: dict[str, list[str]] = {}
    for node, nf in sorted(state.nodes.items()):
        for iid in nf.instances:
            holders.setdefault(iid, []).append(node)
    ok = set(accepted)
    for iid, long in submitted.items():
        held = holders.get(iid, [])
        rec = state.instances.get(iid)
        nodes = alive.get(iid, set())
        if iid not in ok:
            v.missing.append(iid)
            v.errors.append(f"{iid}: the broker never accepted the submission")
        elif rec is None:
            v.missing.append(iid)
            v.errors.append(f"{iid}: accepted, but {instance_path(iid)} is not in git")
        elif len(held) > 1:
            v.duplicated.append(iid)
            v.errors.append(f"{iid}: placed in {len(held)} node.json files: {held}")
        elif len(nodes) > 1:
            v.duplicated.append(iid)
            v.errors.append(f"{iid}: alive on {len(nodes)} nodes: {sorted(nodes)}")
        elif held:
            if rec.state not in PENDING:
                v.errors.append(f"{iid}: in {held[0]}'s node.json but {rec.state} in git")
            elif long and nodes != {held[0]}:
                v.errors.append(f"{iid}: placed on {held[0]} but alive on "
                                f"{sorted(nodes) or 'no node'}")
            elif not long:
                v.errors.append(f"{iid}: a short instance still placed on {held[0]}")
            v.placed_once += 1
        elif rec.state.terminal:
            if rec.state is InstanceState.LOST:
                v.ended_lost.append(iid)
            else:
                v.terminal[str(rec.state)] += 1
            if rec.state is not InstanceState.SUCCEEDED and not rec.reason:
                v.errors.append(f"{iid}: {rec.state} without a reason")
            if long and rec.state is InstanceState.SUCCEEDED:
                v.errors.append(f"{iid}: a sleeper reported as succeeded "
                                f"({rec.detail or 'no detail'})")
            if nodes:
                v.errors.append(f"{iid}: {rec.state} in git but alive on {sorted(nodes)}")
        elif rec.state is InstanceState.UNSCHEDULABLE and rec.reason in _ROOM:
            v.unschedulable.append(iid)
        else:
            v.missing.append(iid)
            v.errors.append(f"{iid}: {rec.state} and in no node.json"
                            + (f" ({rec.reason})" if rec.reason else ""))
    for iid, nodes in sorted(alive.items()):
        if iid not in submitted:
            v.errors.append(f"{iid}: alive on {sorted(nodes)} but never submitted")
    return v
