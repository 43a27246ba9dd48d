"""The KV mirror of node.json: what workers converge onto (`worker.converge`).

Every node's node.json at the active ref is kept as compact JSON under its node id in the
JetStream KV bucket ``gavel-nodes``. A put is a publish on the bucket's subject, queued in
the broker's outbox like everything else (no round trip per put).

Rules:
1. Nothing is mirrored before its commit landed: `changed` is called after adoption.
2. Puts are coalesced. The first commit after a quiet `window_s` is mirrored at once; what
   later commits change within `window_s` of that publication waits for the window's end,
   and then only each node's newest node.json goes out. A node that ten commits touched in
   a window is put once, not ten times. Under load this is most of JetStream's work: a put
   is stored, indexed, and replaces the key's previous revision (measured with `gavel
   bench`, README "Performance").
3. Per node, the newest wins: a pending put is replaced by a later commit's, never sent
   after it. Workers tolerate a mirror that lags its award (converge rule 2) and re-read
   their key every heartbeat; `window_s` is far below a heartbeat.
4. `start` puts every node (the mirror is rebuilt in full at every broker start, so puts a
   dead broker still held are not lost); `flush` sends what is pending now (on close).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from broker.state import compact
from shared import subjects
from shared.records import NodeFile

__all__ = ["Mirror"]


def _key(node_id: str) -> str:
    return f"$KV.{subjects.NODES_BUCKET}.{node_id}"


class Mirror:
    def __init__(self, publish: Callable[[str, bytes], None], window_s: float,
                 clock: Callable[[], float]) -> None:
        self._publish = publish
        self.window_s = window_s
        self._clock = clock
        #: Node id -> its newest node.json not yet put (compact JSON).
        self._pending: dict[str, bytes] = {}
        self._last = float("-inf")  # when the last coalesced publication went out
        self._timer: asyncio.TimerHandle | None = None
        self.enabled = False
        #: Puts sent, and node changes folded into a later put instead (for the metrics).
        self.puts = 0
        self.coalesced = 0

    def start(self, nodes: Mapping[str, NodeFile]) -> None:
        """The bucket exists: mirror every node now (rule 4)."""
        self.enabled = True
        for node_id, nf in nodes.items():
            self._put(node_id, compact(nf))

    def changed(self, nodes: Mapping[str, bytes]) -> None:
        """A commit landed; `nodes`: node id -> its node.json now (compact JSON)."""
        if not self.enabled or not nodes:
            return
        for node_id, data in nodes.items():
            if node_id in self._pending:
                self.coalesced += 1
            self._pending[node_id] = data
        if self._timer is not None:
            return  # the window's end sends it
        wait = self._last + self.window_s - self._clock()
        if wait <= 0:
            self.flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Send every pending put now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._last = self._clock()
        pending, self._pending = self._pending, {}
        for node_id, data in pending.items():
            self._put(node_id, data)

    def _put(self, node_id: str, data: bytes) -> None:
        self.puts += 1
        self._publish(_key(node_id), data)
