"""The broker's node verbs: nodes (the fleet, or one node in detail), drain, and endpoints
(what a gateway routes to); each answer names the leading broker (`broker.api` rule 6)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.context import Context
from gavel.broker.promises import Promises
from gavel.broker.views import Views
from gavel.shared.api import (
    DrainReply,
    DrainRequest,
    Endpoint,
    EndpointsReply,
    EndpointsRequest,
    NodeAddress,
    NodeDetail,
    NodesReply,
    NodesRequest,
    NodeStatus,
    RecentDecline,
)
from gavel.shared.health import Health
from gavel.shared.messages import ApiError, Capacity, InstanceReport, Message
from gavel.shared.reasons import Reason

__all__ = ["DECLINES_SHOWN", "NodeVerbs"]

#: Recent declines `gavel nodes NODE` shows at most.
DECLINES_SHOWN = 20


class NodeVerbs:
    """The node verbs, served by `broker.api.Api` like every other verb."""

    def __init__(self, ctx: Context, auctioneer: Auctioneer, promises: Promises, views: Views,
                 leader: Callable[[], dict[str, Any]]) -> None:
        self.ctx = ctx
        self.auctioneer = auctioneer
        self.promises = promises
        self.views = views
        #: Who answers (`broker.api` rule 6), for every answer that names it.
        self.leader = leader

    async def nodes(self, req: NodesRequest) -> Message:
        now = self.ctx.now()
        state = self.ctx.ledger.state()
        out = []
        if req.node_id:
            return self._node(req.node_id)
        for node_id in self.ctx.liveness.known():
            hb = self.ctx.liveness.heartbeats[node_id]
            nf = state.nodes.get(node_id)
            committed = state.committed.get(node_id) or Capacity()
            health: Health = self.ctx.liveness.health(node_id, now)
            out.append(NodeStatus(node_id=node_id, health=health, strategy=hb.strategy,
                                  labels=hb.labels, capacity=hb.capacity, committed=committed,
                                  stats=hb.stats,
                                  draining=hb.draining or bool(nf and nf.draining),
                                  instances=len(nf.instances) if nf else 0,
                                  last_seen_s=round(now - self.ctx.liveness.last_seen[node_id],
                                                    3), advertise=hb.advertise,
                                  cpu_used=_cpu(hb.instances),
                                  memory_used_mb=_memory(hb.instances)))
        return NodesReply(nodes=out, rejected=dict(self.ctx.rejects.counts), **self.leader())

    def _node(self, node_id: str) -> Message:
        """One node in detail: its status, what runs there, its ports and recent declines."""
        ctx = self.ctx
        state = ctx.ledger.state()
        liveness = ctx.liveness
        hb = liveness.heartbeats.get(node_id)
        nf = state.nodes.get(node_id)
        if hb is None and nf is None:
            return ApiError(error=f"{Reason.UNKNOWN_NODE}: {node_id}")
        now = ctx.now()
        seen = liveness.last_seen.get(node_id)
        status = NodeStatus(
            node_id=node_id, health=liveness.health(node_id, now),
            strategy=hb.strategy if hb else "", labels=hb.labels if hb else {},
            capacity=hb.capacity if hb else Capacity(),
            committed=state.committed.get(node_id) or Capacity(),
            draining=bool(hb and hb.draining) or bool(nf and nf.draining),
            instances=len(nf.instances) if nf else 0,
            last_seen_s=round(now - seen, 3) if seen is not None else 0.0,
            cpu_used=_cpu(hb.instances) if hb else 0.0,
            memory_used_mb=_memory(hb.instances) if hb else 0.0)
        running = [self.views.instance_status(rec) for iid in sorted(nf.instances if nf else ())
                   if (rec := state.instances.get(iid)) is not None]
        declines = [RecentDecline(instance_id=iid, auction_id=aid, reason=d.reason,
                                  detail=d.detail)
                    for iid, aid, d in self.auctioneer.declines_by(node_id, DECLINES_SHOWN)]
        detail = NodeDetail(node_id=node_id, instances=running,
                            port_range=list(hb.port_range) if hb else [],
                            blocked_ports=list(nf.blocked_ports) if nf else [],
                            declines=declines, drain_deadline=self._drain_deadline(node_id))
        return NodesReply(nodes=[status], detail=detail, **self.leader())

    async def drain(self, req: DrainRequest) -> Message:
        if self.ctx.ledger.pinned:
            return ApiError(error=f"{Reason.PINNED} ({self.ctx.ledger.ref})")
        state = self.ctx.ledger.state()
        known = set(self.ctx.liveness.known()) | set(state.nodes)
        if req.node_id not in known:
            return ApiError(error=f"{Reason.UNKNOWN_NODE}: {req.node_id}")
        if req.node_id in state.unusable_nodes:
            path = f"nodes/{req.node_id}/node.json"
            return ApiError(error=f"{Reason.UNREADABLE_FILE}: {path} "
                            f"({state.unreadable.get(path, '')})")
        moving = self.promises.drain(req.node_id, req.undo, req.migrate, req.deadline_s)
        return DrainReply(node_id=req.node_id, draining=not req.undo, migrating=moving,
                          deadline=self._drain_deadline(req.node_id))

    def _drain_deadline(self, node_id: str) -> float:
        """The node's drain deadline as Unix time (0: none)."""
        at = self.promises.drain_deadlines.get(node_id)
        return 0.0 if at is None else round(time.time() + (at - self.ctx.now()), 3)

    async def endpoints(self, req: EndpointsRequest) -> Message:
        """Every live instance (placed or waiting) whose spec declares routes, as `status`
        tells it, with the health its node last reported, and how each known node is
        reached: a gateway's inputs (`gavel.shared.routes`). Read-only, from memory: the
        placed and the pending indexes, never the ended records."""
        state = self.ctx.ledger.state()
        out: list[Endpoint] = []
        for iid in itertools.chain(state.where, state.pending):
            rec = state.instances.get(iid)
            if rec is None or not rec.spec.routes:
                continue
            st = self.views.instance_status(rec)
            note = self.promises.health.get(iid)
            out.append(Endpoint(instance_id=iid, name=rec.spec.name, state=st.state,
                                node_id=st.node_id, ports=st.ports,
                                health=st.health or (str(note.health) if note else ""),
                                service=rec.service, version=rec.version,
                                routes=list(rec.spec.routes), checked=bool(rec.spec.checks)))
        now = self.ctx.now()
        liveness = self.ctx.liveness
        nodes = [NodeAddress(node_id=n, address=liveness.heartbeats[n].advertise,
                             workdir=liveness.heartbeats[n].workdir,
                             health=liveness.health(n, now)) for n in liveness.known()]
        # A node not heard since this broker started is reached where its stored heartbeat
        # said (`broker.promises` rule 7), as healthy as the broker presumes it.
        nodes += [NodeAddress(node_id=n, address=address, workdir=workdir,
                              health=liveness.health(n, now))
                  for n, (address, workdir) in sorted(self.promises.recalled_at.items())
                  if n not in liveness.heartbeats]
        return EndpointsReply(endpoints=out, nodes=nodes)


def _cpu(reports: Sequence[InstanceReport]) -> float:
    """A node's own load: the cpus its instances measurably use together."""
    return round(sum(r.cpu_used for r in reports), 3)


def _memory(reports: Sequence[InstanceReport]) -> float:
    return round(sum(r.memory_used_mb for r in reports), 1)
