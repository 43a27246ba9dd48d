"""Heartbeats in: each one checked before it counts, the cheap checks first.

Rules:
1. What is no message of gavel's (headers, a JetStream reply: `transport.inbound` rule 4)
   is refused first; then a heartbeat larger than its node could truthfully send
   (`shared.bounds`: from the most git has placed on that node since this broker started),
   before it is decoded, by its length; then one that decodes but lists more instances
   than that bound. Each is counted under a fixed kind, like every refusal.
2. Then the guard (it decodes, and names its subject's node), then what cannot be true
   (a node id unusable as a subject token or a git path, a capacity that is not a finite
   amount, a port range outside 1-65535, more than `shared.bounds.ENDED_MAX` ends or one
   that is not an end of its own).
3. What passes is the node's word: liveness records it, the candidate index learns its
   labels, total capacity and drain (`shared.candidates`: whom a sampled auction may ask),
   the instances it lists confirm their placements, the ends it carries are heard if their
   events were not (`broker.promises` rule 8), ports it reports free are unblocked, and a
   node that comes (back) up, stops draining, or says other labels or a new capacity makes
   waiting work worth another auction
   (`shared.auctioneer` rule 7: what waits is otherwise asked less and less often).
4. A heartbeat stored before the broker started passes the same checks and is only
   recalled: what it says of instances, and where the node is reached, is shown until the
   node is heard (`broker.promises` rule 7), never recorded as heard now.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gavel.broker.context import Context
from gavel.broker.promises import Promises
from gavel.shared import subjects
from gavel.shared.bounds import ENDED_MAX, HeartbeatBound, heartbeat_bound
from gavel.shared.candidates import Candidates
from gavel.shared.health import Health
from gavel.shared.messages import NODE_ENDS, Heartbeat
from gavel.transport.inbound import Door, Guard, Received

__all__ = ["TOO_LARGE", "TOO_MANY", "Heartbeats"]

#: Rule 1's reject kinds.
TOO_LARGE = "heartbeat larger than its node could send"
TOO_MANY = "heartbeat listing more instances than its node could hold"


class Heartbeats:
    def __init__(self, ctx: Context, promises: Promises,
                 capacity_freed: Callable[[], None],
                 candidates: Candidates | None = None) -> None:
        self.ctx = ctx
        self.promises = promises
        self.capacity_freed = capacity_freed
        self.candidates = candidates
        self._door = Door(ctx.rejects, subjects.HEARTBEAT_ALL)
        self._guard = Guard("heartbeat", Heartbeat, ctx.rejects, node=subjects.node_of)
        #: Node -> the most instances and ports git has placed on it since this broker
        #: started (rule 1): what it may still be stopping is no more than it once held.
        self._most: dict[str, tuple[int, int]] = {}

    def bound(self, node_id: str) -> HeartbeatBound:
        """Rule 1's bound for `node_id` now."""
        state = self.ctx.ledger.state()
        nf = state.nodes.get(node_id)
        placed, ports, blocked = 0, 0, 0
        if nf is not None:
            held = state.committed.get(node_id)
            placed, ports, blocked = (len(nf.instances), held.ports if held else 0,
                                      len(nf.blocked_ports))
        seen = self._most.get(node_id, (0, 0))
        most = (max(placed, seen[0]), max(ports, seen[1]))
        if most != seen:  # only nodes git placed something on: a forged id takes no memory
            self._most[node_id] = most
        return heartbeat_bound(most[0], most[1], blocked)

    def _checked(self, msg: Received) -> Heartbeat | None:
        """Rules 1 and 2: the heartbeat, or None (counted) when it does not pass."""
        ctx = self.ctx
        if not self._door(msg):
            return None
        bound = self.bound(subjects.node_of(msg.subject))
        if len(msg.data) > bound.size:
            ctx.rejects.count(TOO_LARGE, msg.subject)
            return None
        hb = self._guard(msg)
        if hb is None:
            return None
        if len(hb.instances) > bound.instances:
            ctx.rejects.count(TOO_MANY, msg.subject)
            return None
        impossible = _impossible(hb)
        if impossible:
            ctx.rejects.count(impossible, msg.subject)
            return None
        return hb

    def recall(self, msg: Received) -> None:
        """Rule 4: a node's newest heartbeat stored before the broker started."""
        hb = self._checked(msg)
        if hb is not None:
            self.promises.recall(hb.node_id, hb.instances, (hb.advertise, hb.workdir))

    def on_heartbeat(self, msg: Received) -> None:
        ctx = self.ctx
        hb = self._checked(msg)
        if hb is None:
            return
        last = ctx.liveness.heartbeats.get(hb.node_id)
        if last is not None and hb.seq < last.seq:  # its agent started again: counts anew
            self.promises.node_restarted(hb.node_id)
        before = ctx.liveness.record(hb, ctx.now())
        if self.candidates is not None:
            self.candidates.update(hb.node_id, hb.labels, hb.capacity, hb.draining)
        self.promises.heartbeat_lists(hb.node_id, hb.instances, hb.reported)
        if hb.ended:
            self.promises.heartbeat_ended(hb.ended, msg.subject)
        if hb.freed_ports:
            self.promises.ports_freed(hb.node_id, hb.freed_ports)
        if before is not Health.HEALTHY:
            ctx.log.info("node %s is %s", hb.node_id, "up" if before is None else "back")
            self.capacity_freed()
        elif last is not None and (
                (last.draining and not hb.draining)  # it takes work again
                or last.labels != hb.labels or last.capacity != hb.capacity):  # or other work
            self.capacity_freed()


def _impossible(hb: Heartbeat) -> str:
    """Why a well-formed heartbeat cannot be true (the reject kind), or "" when it can: the
    node id must be usable as a subject token and a git path, the capacity finite and not
    negative, the port range empty or [first, last] within 1-65535."""
    if not subjects.is_node_id(hb.node_id):
        return "heartbeat from an unusable node id"
    cap = hb.capacity
    if not (math.isfinite(cap.cpu) and cap.cpu >= 0 and cap.memory_mb >= 0 and cap.ports >= 0):
        return "heartbeat with an impossible capacity"
    pr = hb.port_range
    if pr and not (len(pr) == 2 and 1 <= pr[0] <= pr[1] <= 65535):
        return "heartbeat with an impossible port range"
    if len(hb.ended) > ENDED_MAX or any(
            e.node_id != hb.node_id or e.type not in NODE_ENDS for e in hb.ended):
        return "heartbeat with ends that are not its own"
    return ""
