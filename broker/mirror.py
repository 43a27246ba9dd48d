"""The KV mirror of node.json: what workers converge onto (`worker.converge`).

Every node's node.json at the active ref is kept as compact JSON under its node id in the
JetStream KV bucket ``gavel-nodes``. A put is a publish on the bucket's subject, queued in
the broker's outbox like everything else (no round trip per put).

Rules:
1. Nothing is mirrored before its commit landed: `changed` is called after adoption.
2. A node's node.json is put at most once every `window_s`. A change to a node not put
   within the last `window_s` goes out at once; a change within it waits for the window's
   end, and then only the node's newest node.json goes out. A node that ten commits touched
   in a window is put once, not ten times: under load the puts are most of JetStream's work
   (each is stored, indexed, and replaces the key's previous revision: docs/performance.md).
   Windows are per node, so the puts stay spread over time instead of leaving together when
   one window for all would end.
3. Per node, the newest wins: a pending put is replaced by a later commit's, never sent
   after it. Workers tolerate a mirror that lags its award (converge rule 2) and re-read
   their key every heartbeat; `window_s` is far below a heartbeat.
4. `start` puts every node (the mirror is rebuilt in full at every broker start, so puts a
   dead broker still held are not lost), once the bucket can be made (`broker.kvbucket`:
   a JetStream still electing its leaders is asked again, not given up on); `flush` sends
   everything pending now (on close), `stop` drops it (a broker that no longer leads: `broker.ha`).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Mapping

from gavel.broker.ledger.state import Change, compact
from gavel.shared import subjects
from gavel.shared.records import NodeFile

__all__ = ["Mirror"]

#: A window ending this close to now counts as ended (the loop's timers have a millisecond's
#: grain: one that fires a hair early must not find nothing due and re-arm itself in a spin).
_SLACK_S = 0.001


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
        #: (when its window ends, node id) for every pending node, soonest first.
        self._due: list[tuple[float, str]] = []
        #: Node id -> when its window ends (its last put + `window_s`).
        self._until: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.enabled = False
        #: Puts sent, and node changes folded into a later put instead (for the metrics).
        self.puts = 0
        self.coalesced = 0

    def start(self, nodes: Mapping[str, NodeFile]) -> None:
        """The bucket exists: mirror every node now (rule 4)."""
        self.enabled = True
        now = self._clock()
        for node_id, nf in nodes.items():
            self._put(node_id, compact(nf), now)

    def committed(self, change: Change, _sha: str) -> None:
        """Rule 1: the nodes a landed commit changed, mirrored."""
        if self.enabled and change.nodes:
            self.changed({nid: change.node_compact(nid, nf) if nf is not None
                          else compact(NodeFile(node_id=nid)) for nid, nf in change.nodes.items()})

    def changed(self, nodes: Mapping[str, bytes]) -> None:
        """A commit landed; `nodes`: node id -> its node.json now (compact JSON)."""
        if not self.enabled:
            return
        now = self._clock()
        for node_id, data in nodes.items():
            if node_id in self._pending:
                self.coalesced += 1
                self._pending[node_id] = data
                continue
            until = self._until.get(node_id, now)
            if until <= now:
                self._put(node_id, data, now)
            else:
                self._pending[node_id] = data
                heapq.heappush(self._due, (until, node_id))
        self._arm(now)

    def _arm(self, now: float) -> None:
        if self._due and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                max(0.0, self._due[0][0] - now), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self._clock()
        due = self._due
        while due and due[0][0] <= now + _SLACK_S:
            _, node_id = heapq.heappop(due)
            self._put(node_id, self._pending.pop(node_id), now)
        self._arm(now)

    def flush(self) -> None:
        """Send every pending put now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        self._due.clear()
        pending, self._pending = self._pending, {}
        for node_id, data in pending.items():
            self._put(node_id, data, now)

    def stop(self) -> None:
        """Put nothing more, not even what is pending (a broker that no longer leads)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
        self._pending.clear()
        self.enabled = False

    def _put(self, node_id: str, data: bytes, now: float) -> None:
        self.puts += 1
        self._until[node_id] = now + self.window_s
        self._publish(_key(node_id), data)
