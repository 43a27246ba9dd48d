"""Awards: what the winner of an auction is told, and what a converging worker may ask for.

Rules:
1. An award is made from git - the instance's record and its placement in the node's
   node.json at the commit that placed it - with secrets resolved now, into the award only
   (they are never written to git, never logged).
2. A worker may ask for the award of an instance its node.json lists
   (``gavel.assign.<node>``, `AssignmentRequest`); only for its own node (the subject's), and
   only an instance git places there. Anything else is answered with `ApiError` - the asker
   never waits out its timeout - and counted.
3. The answer goes only to the asking node's own inbox (``_INBOX_<node>.``, the one prefix
   its credential may read and no other node's may): a request whose reply subject lies
   anywhere else is counted and never answered (`transport.inbound` rule 5), since the
   answer carries that node's secrets and the broker may publish where the node may not.
4. Awards and refusals carry the leadership's epoch. With HA (`broker.ha`) the answer,
   worked out from the state as it is, waits until every commit so far is on the remote
   (`broker.ledger.committer` rule 10): a node never starts what a failover could undo. A
   broker that no longer leads answers nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.msg import Msg

from gavel.broker.context import Context
from gavel.shared import subjects
from gavel.shared.messages import ApiError, AssignmentRequest, Award
from gavel.transport.inbound import Door, Guard

__all__ = ["Assignments"]


class Assignments:
    def __init__(self, ctx: Context, secrets: Mapping[str, str]) -> None:
        self.ctx = ctx
        self.secrets = secrets
        door = Door(ctx.rejects, subjects.ASSIGN_ALL, what="assignment request",
                    inbox=_inbox_of, owner=subjects.node_of)
        self._guard = Guard("assignment request", AssignmentRequest, ctx.rejects,
                            node=subjects.node_of, door=door)

    def award_for(self, iid: str, node: str, sha: str) -> Award | None:
        """The award for an instance git places on `node` (rule 1); None if it is not."""
        state = self.ctx.ledger.state()
        rec = state.instances.get(iid)
        nf = state.nodes.get(node)
        if rec is None or nf is None or iid not in nf.instances:
            return None
        pl = nf.instances[iid]
        secret_env = {n: self.secrets[n] for n in rec.spec.secrets if n in self.secrets}
        return Award(auction_id=pl.auction_id, instance_id=iid, node_id=node, spec=rec.spec,
                     ports=dict(pl.ports), attempt=pl.attempt, commit=sha,
                     secret_env=secret_env, epoch=self.ctx.leader.epoch)

    async def on_request(self, msg: Msg) -> None:
        """Rules 2 and 3."""
        req = self._guard(msg)
        answer_to = self._guard.reply  # "" unless rule 3 allows an answer
        if not answer_to:
            return
        epoch = self.ctx.leader.epoch
        if req is None:
            reply: ApiError | Award = ApiError(error=self._guard.refused, epoch=epoch)
        else:
            node = req.node_id
            sha = self.ctx.ledger.state().head or ""
            reply = self.award_for(req.instance_id, node, sha) or ApiError(
                error=f"{req.instance_id} is not placed on {node}", epoch=epoch)
        durable = self.ctx.durable
        if durable is not None:  # rule 4
            await durable.wait(durable.mark())
        if not self.ctx.leader.leading():
            return
        await self.ctx.outbox.nc.publish(answer_to, self.ctx.outbox.encode(reply))


def _inbox_of(subject: str) -> str:
    """The inbox of the node that asked on ``gavel.assign.<node>``."""
    return subjects.NODE_INBOX.format(node=subjects.node_of(subject))
