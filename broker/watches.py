"""Nodes' KV watches: the broker makes each node's consumer of its own key; the node makes no
JetStream call at all.

Why the broker: a consumer's deliver subject travels in the create request's payload, which
server permissions cannot see, and every JetStream API answer goes to whatever reply
subject the request names. A node allowed any JetStream call could make the server publish
anywhere: push its node.json onto another node's award subject, the RFB, or the broker's
API, from as many consumers as it cared to make. A node's credential now grants no
JetStream subject (`transport.identity` rule 4); it asks the broker on its own subject, and
the broker's permissions (not its code alone) hold every answer to the node's own inbox.

Rules:
1. A node asks on ``gavel.watch.<node>`` (`WatchRequest`) for a consumer of its own key (the
   subject's node, `transport.inbound` rule 2) delivering to `deliver`, which must be one
   token under its own inbox (``_INBOX_<node>.<token>``: a prefix only that node may read,
   so nobody else hears what is delivered there); anything else is refused with
   `Reason.WATCH_DELIVER`. The node names the consumer, ``<node>_<16 hex digits>`` (its
   first delivery may reach the node before the answer does); another name is refused
   with `Reason.WATCH_NAME`. Answers go to the node's own inbox only (`transport.inbound`
   rule 5).
2. The consumer is the watch's (`worker.watch` rule 2): the key's last value first, then
   every later one, unacknowledged, idle heartbeats, in memory, dropped by the server
   `inactive_s` after nobody listens.
3. Bound per node: one consumer at a time. Granting a new one deletes the node's previous
   one; a request while one is being made, or within `min_gap_s` of the last grant, is
   refused with `Reason.WATCH_TOO_SOON` (the worker asks again a heartbeat later). So one
   node holds at most one consumer of this broker's making, plus those of earlier brokers
   (or leaderships) until the server drops them for want of a listener, and costs JetStream
   at most two calls per `min_gap_s`.
4. A create JetStream refuses (the bucket does not exist yet) is `Reason.WATCH_FAILED`. A
   broker that no longer leads answers nothing (`broker.assign` rule 4).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import api

from gavel.broker.context import Context
from gavel.shared import subjects
from gavel.shared.messages import ApiError, WatchGrant, WatchRequest
from gavel.shared.reasons import Reason
from gavel.transport.inbound import Door, Guard, Malformed, js_answer

__all__ = ["Watches"]

#: Rule 1: one token after the inbox prefix, as nats-py's ``new_inbox`` makes it.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Rule 1: what follows ``<node>_`` in a consumer's name.
_NAME = re.compile(r"[0-9a-f]{16}")


class Watches:
    def __init__(self, ctx: Context, *, min_gap_s: float, inactive_s: float) -> None:
        self.ctx = ctx
        self.min_gap_s = min_gap_s
        self.inactive_s = inactive_s
        door = Door(ctx.rejects, subjects.WATCH_ALL, what="watch request",
                    inbox=_inbox_of, owner=subjects.node_of)
        self._guard = Guard("watch request", WatchRequest, ctx.rejects,
                            node=subjects.node_of, door=door)
        #: Node -> its current consumer (rule 3), when it was granted, and the nodes whose
        #: consumer is being made.
        self.current: dict[str, str] = {}
        self._granted: dict[str, float] = {}
        self._making: set[str] = set()
        #: Consumers made and refusals given (for tests and the metrics).
        self.made = 0
        self.refusals = 0

    async def on_request(self, msg: Msg) -> None:
        """Rules 1-4."""
        req = self._guard(msg)
        answer_to = self._guard.reply
        if not answer_to:
            return
        if req is None:
            reply: ApiError | WatchGrant = self._refuse(self._guard.refused)
        else:
            reply = await self._grant(req.node_id, req.deliver, req.consumer)
        if self.ctx.leader.leading():
            await self.ctx.outbox.nc.publish(answer_to, self.ctx.outbox.encode(reply))

    def _refuse(self, sentence: str) -> ApiError:
        self.refusals += 1
        return ApiError(error=sentence, epoch=self.ctx.leader.epoch)

    async def _grant(self, node: str, deliver: str, name: str) -> ApiError | WatchGrant:
        prefix = f"{subjects.NODE_INBOX.format(node=node)}."
        if not (deliver.startswith(prefix) and _TOKEN.fullmatch(deliver[len(prefix):])):
            self.ctx.rejects.count(Reason.WATCH_DELIVER, subjects.WATCH.format(node=node))
            return self._refuse(Reason.WATCH_DELIVER)
        if not (name.startswith(f"{node}_") and _NAME.fullmatch(name[len(node) + 1:])):
            self.ctx.rejects.count(Reason.WATCH_NAME, subjects.WATCH.format(node=node))
            return self._refuse(Reason.WATCH_NAME)
        now = self.ctx.now()
        if node in self._making or now - self._granted.get(node, -self.min_gap_s) \
                < self.min_gap_s:
            return self._refuse(Reason.WATCH_TOO_SOON)
        self._making.add(node)
        try:
            if not await self._create(node, name, deliver):
                return self._refuse(Reason.WATCH_FAILED)
            self.made += 1
            self._granted[node] = self.ctx.now()
            previous, self.current[node] = self.current.get(node), name
            if previous is not None and previous != name:
                await self._delete(previous)
            return WatchGrant(consumer=name, epoch=self.ctx.leader.epoch)
        finally:
            self._making.discard(node)

    async def _create(self, node: str, name: str, deliver: str) -> bool:
        key = subjects.NODE_KEY.format(node=node)
        config = api.ConsumerConfig(
            name=name, deliver_subject=deliver, filter_subject=key,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, ack_policy=api.AckPolicy.NONE,
            max_deliver=1, idle_heartbeat=self.ctx.timing.heartbeat_s,
            inactive_threshold=self.inactive_s, mem_storage=True, num_replicas=1)
        request = json.dumps({"stream_name": subjects.NODES_STREAM,
                              "config": config.as_dict()}).encode()
        answer = await self._call(subjects.NODE_WATCH.format(name=name, node=node), request)
        if answer is None or answer.get("error"):
            self.ctx.log.info("no KV watch for %s: %s", node,
                              "no answer" if answer is None else answer.get("error"))
            return False
        return True

    async def _delete(self, name: str) -> None:
        """Rule 3: the node's previous consumer (already gone is as good)."""
        await self._call(subjects.NODE_WATCH_DELETE.format(name=name), b"")

    async def _call(self, subject: str, payload: bytes) -> dict[str, Any] | None:
        bound = self.ctx.timing.heartbeat_answer_s
        try:
            async with asyncio.timeout(bound):
                msg = await self.ctx.outbox.nc.request(subject, payload, timeout=bound)
        except (nats.errors.Error, TimeoutError, ValueError):
            return None
        answer = js_answer(msg.data)
        return None if isinstance(answer, Malformed) else answer


def _inbox_of(subject: str) -> str:
    """The inbox of the node that asked on ``gavel.watch.<node>``."""
    return subjects.NODE_INBOX.format(node=subjects.node_of(subject))
