"""System jobs: one instance on every node that could run it, following the fleet. Pure: the
broker passes in the nodes it knows and the job's live instances.

Rules:
1. A node is the job's when it is heard (not offline), not draining and carries every label
   the spec asks for. Each such node that is healthy and lacks a live instance of the job's
   version gets one, bound to it (`InstanceRecord.only_node`): its placement is still an
   auction, among that node alone, and the node may decline with its reason (no room: the
   instance waits, unschedulable, and `gavel why` shows the decline).
2. An instance whose node is no longer the job's (drained, offline, gone, relabelled) is
   stopped, never placed elsewhere; a stopped job keeps none.
6. A new version rolls node by node (Nomad's system `update`): an instance of another
   version is stopped, and its node given the new version's, only while fewer than
   `max_parallel` nodes are between versions - those whose instance of the job's version
   is not yet `settled` (healthy, as the broker hears it). A version that never becomes
   healthy so stops at `max_parallel` nodes and the rest keep the version they run.
   A node with no instance at all is not between versions: it gets one at once.
   `max_parallel` 0 replaces every node at once.
3. A node the broker has not heard since it started keeps its instance until it is heard
   (then judged) or goes offline: a broker started again stops nothing on a guess.
4. Nodes and instances are visited in id order, so the same inputs give the same decision.
5. An instance that ended on its own (failed past its restarts and attempts, lost) is
   replaced on its node after the back-off the broker keeps for that node (`hold`, as a
   service's: `broker.keeper.Backoff`), so a job that cannot run there is not re-made every
   tick.
7. The broker's cluster cap (`--max-instances`, `gavel.shared.admission` rule 4) holds for
   a system job's instances as for a submit: given the `room` it leaves, only the first
   nodes in id order that lack an instance get one; the rest are `capped` - they wait, with
   the submit's refusal as their reason, and get theirs when room appears (an instance
   ends, the cap is raised). A node whose instance of another version is stopped for the
   new one needs no room: its own is replaced, not added (`gavel.shared.admission` rule 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from gavel.shared.reasons import Reason

__all__ = ["Decision", "Node", "Placed", "decide"]


@dataclass(frozen=True)
class Node:
    """A node as the broker knows it now."""

    #: Its labels as its heartbeat says them; None: not heard since the broker started.
    labels: Mapping[str, str] | None
    healthy: bool = True
    offline: bool = False
    draining: bool = False


@dataclass(frozen=True)
class Placed:
    """A live instance of the job (not being stopped): the node it is bound to, its version."""

    instance_id: str
    node_id: str
    version: int


@dataclass
class Decision:
    #: Nodes that get a new instance now.
    start: list[str] = field(default_factory=list)
    stop: list[tuple[str, Reason]] = field(default_factory=list)
    #: Nodes that lack an instance but the cluster cap leaves no room for (rule 7).
    capped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.start or self.stop)


def eligible(labels: Mapping[str, str], node: Node) -> bool:
    """Rule 1: the node is the job's."""
    return node.labels is not None and not node.offline and not node.draining and all(
        node.labels.get(k) == v for k, v in labels.items())


def _left(labels: Mapping[str, str], node: Node | None) -> bool:
    """Rule 2: the node is known to be no longer the job's. A node not heard since the broker
    started (None, or no labels yet) is given the benefit of the doubt until it is heard or
    goes offline: a broker started again stops nothing it has not seen."""
    if node is None:
        return False
    if node.offline or node.draining:
        return True
    return node.labels is not None and not all(
        node.labels.get(k) == v for k, v in labels.items())


def decide(labels: Mapping[str, str], version: int, nodes: Mapping[str, Node],
           live: Sequence[Placed], *, stopped: bool = False,
           hold: AbstractSet[str] = frozenset(), max_parallel: int = 0,
           settled: AbstractSet[str] = frozenset(), room: int | None = None) -> Decision:
    """What the job needs now (rules 1-7); `hold`: nodes whose start the back-off holds;
    `settled`: the instances of `version` known healthy (rule 6); `room`: the more live
    instances the cluster cap admits (None: no cap, rule 7)."""
    out = Decision()
    if stopped:
        out.stop = [(p.instance_id, Reason.SERVICE_STOPPED)
                    for p in sorted(live, key=lambda p: p.instance_id)]
        return out
    covered: set[str] = set()
    old: list[Placed] = []
    swapped: set[str] = set()  # nodes whose instance of another version this stops
    rolling = 0  # nodes between versions (rule 6)
    for p in sorted(live, key=lambda p: p.instance_id):
        if _left(labels, nodes.get(p.node_id)):
            out.stop.append((p.instance_id, Reason.SYSTEM_NODE_LEFT))
        elif p.version != version:
            old.append(p)
        elif p.node_id in covered:  # two on one node (a race of two brokers): keep one
            out.stop.append((p.instance_id, Reason.SCALED_DOWN))
        else:
            covered.add(p.node_id)
            rolling += p.instance_id not in settled
    for p in old:
        node = nodes.get(p.node_id)
        replaceable = p.node_id not in covered and p.node_id not in hold and \
            node is not None and node.healthy and eligible(labels, node)
        if p.node_id in covered or (replaceable and (not max_parallel
                                                     or rolling < max_parallel)):
            out.stop.append((p.instance_id, Reason.SUPERSEDED))
            rolling += p.node_id not in covered
            swapped.add(p.node_id)
        else:
            covered.add(p.node_id)  # it keeps its version for now
    out.stop.sort(key=lambda s: s[0])
    out.start = [n for n in sorted(nodes) if n not in covered and n not in hold
                 and nodes[n].healthy and eligible(labels, nodes[n])]
    if room is not None:  # rule 7: a node whose own instance is swapped needs no room
        out.capped = [n for n in out.start if n not in swapped][room:]
        out.start = [n for n in out.start if n not in out.capped]
    return out
