"""The KV mirror's puts for a leader of several brokers (`broker.ha`): each checked against
the key's revision, each carrying the leadership's epoch.

Rules:
1. A node's first put in a leadership is unconditional (every leadership rebuilds the whole
   mirror as it starts: `broker.mirror` rule 4); every later one expects the revision its
   own last put made (``Nats-Expected-Last-Subject-Sequence``). So a deposed leader's late
   put is refused by the server once the new leadership has put that key.
2. Every value carries the epoch (`gavel.shared.records.NodeEntry`), and a worker ignores
   a value of an epoch older than the newest it has seen (`worker.converge`): what rule 1
   cannot refuse (a key the new leadership has not put yet) is ignored where it lands.
3. A refused put means someone else wrote the key: another leadership, which would make
   this one deposed, or a deposed leader's late put, or a hand. So the lease is asked first
   (`Leadership.confirm`: a renewal now); only if it still holds is the key put again
   unconditionally, its revision learned anew (and the refusal counted). Otherwise the put
   is dropped, and nothing more is put.
4. One put per key in flight; what comes meanwhile waits, the newest only. A put without
   an answer is sent again with the same ``Nats-Msg-Id``, which the server dedupes if the
   first landed. Nothing is put once `leading()` is false, and at most `MAX_IN_FLIGHT`
   keys are being put at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import nats.errors

from gavel.broker.context import Leadership
from gavel.shared import subjects
from gavel.shared.timing import Timing
from gavel.transport.inbound import Malformed, js_answer
from gavel.transport.tasks import Tasks

__all__ = ["FencedPuts", "with_epoch"]

log = logging.getLogger("gavel.broker")

#: Keys put at once at most (a leadership's start puts every node's).
MAX_IN_FLIGHT = 256
#: JetStream's "wrong last sequence" error codes.
_WRONG_LAST = (10071, 10164)
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_TIMING = Timing()


def with_epoch(data: bytes, epoch: int) -> bytes:
    """Rule 2: a node.json's compact JSON with the epoch in it (the first key)."""
    return b'{"epoch":%d,' % epoch + data[1:] if data.startswith(b"{") and \
        data != b"{}" else data


class FencedPuts:
    """Rules 1-4 for the leadership `leader` (its epoch is read at each put: it is settled
    once the takeover landed, before the first)."""

    def __init__(self, leader: Leadership, *, timing: Timing = _TIMING) -> None:
        self.leader = leader
        self.leading: Callable[[], bool] = leader.leading
        #: How long a put waits for its answer, and before it is tried again.
        self.timeout_s = timing.ack_s
        self.retry_s = timing.retry_s
        #: The connection the puts go on (set once the broker connected).
        self.nc: Any = None
        #: Node id -> the revision our last put of its key made (rule 1).
        self.revision: dict[str, int] = {}
        self._next: dict[str, bytes] = {}
        self._busy: set[str] = set()
        self._tasks = Tasks("kv", log)  # a node's puts under way, one task a node
        self._room = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._seq = 0
        #: Puts refused for a revision someone else made, and puts that found no answer.
        self.refused = 0
        self.unanswered = 0

    def put(self, subject: str, data: bytes) -> None:
        """The mirror's publish: `subject` is the node's key."""
        node = subjects.node_of(subject)
        value = with_epoch(data, self.leader.epoch)
        if node in self._busy:
            self._next[node] = value  # rule 4: the newest only
            return
        self._busy.add(node)
        self._tasks.spawn(self._send(node, subject, value), name=f"put {node}")

    def close(self) -> None:
        self._tasks.cancel()

    async def _send(self, node: str, subject: str, value: bytes | None) -> None:
        try:
            async with self._room:
                while value is not None:
                    await self._one(node, subject, value)
                    value = self._next.pop(node, None)
        finally:
            self._busy.discard(node)

    async def _one(self, node: str, subject: str, value: bytes) -> None:
        self._seq += 1
        msg_id = f"{self.leader.epoch}.{node}.{self._seq}"
        while self.leading():
            headers = {"Nats-Msg-Id": msg_id}
            if node in self.revision:
                headers[_EXPECTED] = str(self.revision[node])
            try:
                msg = await self.nc.request(subject, value, timeout=self.timeout_s,
                                            headers=headers)
            except (nats.errors.Error, TimeoutError, ValueError, AttributeError):
                msg = None
            answer = None if msg is None else js_answer(msg.data)
            if answer is None or isinstance(answer, Malformed):
                self.unanswered += 1  # rule 4: the same id again; a landed one is deduped
                await asyncio.sleep(self.retry_s)
                continue
            error = answer.get("error")
            if not error:
                self.revision[node] = int(answer.get("seq", 0))
                return
            if isinstance(error, dict) and error.get("err_code") in _WRONG_LAST:
                self.refused += 1  # rule 3
                if not (self.leading() and await self.leader.confirm() and self.leading()):
                    return
                log.warning("node %s's KV entry was written by someone else (%s); put again",
                            node, error.get("description", ""))
                self.revision.pop(node, None)
                self._seq += 1
                msg_id = f"{self.leader.epoch}.{node}.{self._seq}"
                continue
            log.warning("KV put of node %s refused: %s; retrying", node, error)
            await asyncio.sleep(self.retry_s)
