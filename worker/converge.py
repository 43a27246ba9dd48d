"""Convergence: this node runs what its node.json lists — no more, no less.

The broker mirrors every node's node.json into the JetStream KV bucket ``gavel-nodes``
(key: the node id) after each commit. The node watches its own key (`worker.watch`: a watch
that skips a delivery or goes silent is made anew, which reads the key again) and acts on
the newest revision it has seen.

Rules:
1. Listed but not held: the node asks the broker for the award (`AssignmentRequest` on
   ``gavel.assign.<node>``) and takes it exactly like an award message. The supervisor
   checks "held?" and holds the instance without awaiting in between, and refuses an attempt
   that already ended here, so the award message and the fetched award start it once. The
   node waits one tick before asking, as the award message is usually right behind.
2. Held but not listed: the KV entry alone never stops an instance, because it may be older
   than the award. The broker commits, then publishes the KV put and the award in that
   order, but the put reaches this watcher through the stream (stored, then pushed by a
   consumer) while the award comes straight through, so a revision without an instance that
   was just awarded is normal. Comparing revision times with award arrival would trust two
   clocks; instead the node asks the broker, whose state holds every commit it has awarded
   from (an award is sent only after its commit landed). The held attempt is fenced only if
   the broker answers `ApiError` (not placed here) or an award with a higher attempt, and
   only if that same attempt is still held when the answer comes; no answer (broker down)
   changes nothing. An answer that changes nothing settles the question for that revision:
   the node asks again only when node.json changes.
3. Listed with a higher attempt than the held one: the held attempt is stale (attempts only
   grow), so it is fenced at once; the new attempt is fetched once the old one has ended.
4. Fenced instances are stopped (SIGTERM, SIGKILL after ``kill_grace_s``) and not reported:
   the broker already moved them, an event would only be counted against the instance.
5. ``draining`` follows node.json each time the entry's flag changes (a node drained by hand
   stays drained until node.json's flag next changes).
6. Self-fencing: when NATS has not answered a PING for longer than ``offline_s`` (or the node
   has not reached it for that long since it started), the broker has declared this node
   offline and re-placed its instances, so the node fences all of them itself. There is a
   window (how late the node notices, plus one auction) in which an instance may run on two
   nodes; closing it needs leases the node can check. After contact returns, anything
   node.json still lists here is fetched and started again (rule 1).
7. A KV entry or an assignment answer of an older leadership than the newest this node has
   heard from (`Supervisor.admit`: a deposed broker, paused or cut off, speaking late) is
   counted and ignored: the entry as if it never came, the answer as no answer.

Why an award reaches a node three ways, each closing a gap the others leave open (a test
names each race in `tests/integration/test_convergence.py`):
- The award message (``gavel.award.<node>``, once the commit is durable) is the fast path:
  a placement waits one message. It is lost with a dropped connection or a restarted
  worker (`test_a_worker_that_missed_the_award_converges_from_kv`).
- The KV mirror of node.json is the durable list a node reads whenever it comes back, and
  the only channel that tells a node what it must no longer run
  (`test_node_back_after_offline_stops_the_moved_instance`). It lags its commit by up to
  ``mirror_s`` and comes through a stream: alone, it would slow every placement by that.
- The assignment request (``gavel.assign.<node>``) fetches what node.json lists but does not
  carry (an instance's spec lives once, in its record: rule 1), and asks the broker before a
  KV entry older than an award stops it (rule 2,
  `test_a_stale_node_json_never_stops_a_fresh_award`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from gavel.shared import subjects
from gavel.shared.messages import ApiError, AssignmentRequest, Award
from gavel.shared.records import NodeEntry, NodeFile
from gavel.shared.timing import Timing
from gavel.transport.inbound import Decode, Malformed, Sink
from gavel.transport.tasks import Crashed, Tasks
from gavel.worker.supervisor import OLDER_ANSWER, OLDER_NODE, Supervisor
from gavel.worker.watch import Entry, NodeWatch

__all__ = ["Converger"]

log = logging.getLogger("gavel.worker.converge")

_node_entry: Decode[NodeEntry] = Decode(NodeEntry, json=True)
_reply: Decode[Award | ApiError] = Decode(Award | ApiError)
_enc = msgspec.msgpack.Encoder()


class Converger:
    """Watches node.json in KV and fences, fetches and drains to match it."""

    def __init__(self, *, node_id: str, timing: Timing, supervisor: Supervisor,
                 set_draining: Callable[[bool], None],
                 on_node: Callable[[], None] = lambda: None,
                 sink: Sink | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 crashed: Callable[[Crashed], None] | None = None) -> None:
        self.node_id = node_id
        self.timing = timing
        self.supervisor = supervisor
        self._set_draining = set_draining
        self._on_node = on_node
        self._clock = clock
        #: The newest node.json seen, and its KV revision.
        self.node: NodeFile | None = None
        self.revision = 0
        self._draining_seen: bool | None = None
        self._nc: NATS | None = None
        #: What the KV watch refuses is counted here (the agent's guards' sink).
        self._sink: Sink = sink or _Quiet()
        #: The watch of this node's key, once started.
        self.watch: NodeWatch | None = None
        #: Set once connected (`start`): what asks the broker before that waits for it.
        self._connected = asyncio.Event()
        self._wake = asyncio.Event()
        #: Its loops, whose crash is `crashed`'s to act on, and the questions in flight,
        #: whose crash is that question's alone (`transport.tasks`).
        self._loops = Tasks("converger", log, crashed=crashed)
        self._questions = Tasks("converger", log)
        self._asking: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: Questions the broker settled for the current revision: not asked again until
        #: node.json changes (a stale entry would otherwise be re-verified every pass).
        self._settled: set[tuple[str, str]] = set()
        self._assign_subject = subjects.ASSIGN.format(node=node_id)
        self._warned: set[str] = set()
        self._last_contact = clock()
        self.self_fenced = False
        #: Questions asked of the broker, by kind ("fetch", "verify"), and their outcomes.
        self.asked: collections.Counter[str] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()

    # -- lifecycle ------------------------------------------------------------------------

    def start_link_watch(self, nc: Callable[[], NATS | None]) -> None:
        """Start checking the NATS connection (also before it exists) for rule 6."""
        self._last_contact = self._clock()
        self._loops.spawn(self._link(nc), name="link")

    def start(self, nc: NATS) -> None:
        """Start watching node.json once connected and subscribed."""
        self._nc = nc
        self._connected.set()
        self._loops.spawn(self._watch(), name="watch")
        self._loops.spawn(self._reconcile_loop(), name="reconcile")

    async def close(self) -> None:
        """Stop watching and abandon the questions in flight (nothing starts afterwards)."""
        self._loops.cancel()
        self._questions.cancel()
        # bounded: a task that swallowed its cancel must not hold the worker
        await asyncio.gather(self._loops.wait(self.timing.close_s),
                             self._questions.wait(self.timing.close_s))
        self._asking.clear()

    def wake(self) -> None:
        self._wake.set()

    def blocked(self) -> list[int]:
        """The ports node.json lists as taken outside gavel."""
        return self.node.blocked_ports if self.node is not None else []

    def reserved(self, instance_id: str) -> set[int]:
        """Ports node.json gives to instances other than `instance_id`, and blocked ports."""
        nf = self.node
        if nf is None:
            return set()
        out = set(nf.blocked_ports)
        for iid, placement in nf.instances.items():
            if iid != instance_id:
                out.update(placement.ports.values())
        return out

    # -- node.json from KV ----------------------------------------------------------------

    def _warn_once(self, key: str, text: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text, *args)

    async def _watch(self) -> None:
        assert self._nc is not None
        self.watch = NodeWatch(self._nc, self.node_id, self._observe,
                               heartbeat_s=self.timing.heartbeat_s,
                               answer_s=self.timing.heartbeat_answer_s,
                               sink=self._sink)
        await self.watch.run()

    def _observe(self, entry: Entry) -> None:
        revision = entry.revision or 0
        if revision <= self.revision:
            return
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            nf = NodeEntry(node_id=self.node_id)
        else:
            read = _node_entry(entry.value)
            if isinstance(read, Malformed):
                self._warn_once("decode", "unreadable node.json revision %d in KV (%s)",
                                revision, read.why)
                return
            nf = read
            if not self.supervisor.admit(nf.epoch):  # rule 7
                self._sink.count(OLDER_NODE, f"revision {revision} (epoch {nf.epoch})")
                return
        blocked_before = self.blocked()
        self.node, self.revision = nf, revision
        self._settled.clear()
        if nf.blocked_ports != blocked_before:
            self._on_node()
        self._wake.set()

    async def _reconcile_loop(self) -> None:
        while True:
            self._wake.clear()
            self.reconcile()
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel
                async with asyncio.timeout(self.timing.heartbeat_s):
                    await self._wake.wait()

    # -- making reality match -------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass over the newest node.json: drain, fetch, fence (module rules 1-5)."""
        nf, sup = self.node, self.supervisor
        if nf is None:
            return
        if nf.draining != self._draining_seen:
            self._draining_seen = nf.draining
            log.info("node.json says draining=%s", nf.draining)
            self._set_draining(nf.draining)
        held = sup.held()
        for iid, placement in nf.instances.items():
            attempt = held.get(iid)
            if attempt is None:
                if not sup.holds(iid):
                    self._ask("fetch", iid, self._fetch(iid))
            elif attempt < placement.attempt:
                sup.fence(iid, attempt, f"node.json lists attempt {placement.attempt}")
        for iid, attempt in held.items():
            if iid not in nf.instances:
                self._ask("verify", iid, self._verify(iid, attempt))

    def _ask(self, kind: str, iid: str, work: Coroutine[Any, Any, None]) -> None:
        key = (kind, iid)
        if key in self._asking or key in self._settled:
            work.close()
            return
        task = self._questions.spawn(work, name=f"{kind} {iid}")
        self.asked[kind] += 1
        self._asking[key] = task
        task.add_done_callback(lambda _t: self._asking.pop(key, None))

    async def _assignment(self, iid: str) -> Award | ApiError | None:
        """The broker's word on `iid` for this node; None when it did not answer."""
        if self._nc is None:
            return None
        request = _enc.encode(AssignmentRequest(instance_id=iid, node_id=self.node_id))
        try:
            msg = await self._nc.request(self._assign_subject, request,
                                         timeout=self.timing.heartbeat_answer_s)
        except (nats.errors.Error, TimeoutError) as exc:
            log.info("no answer about %s from the broker (%s)", iid, exc)
            return None
        reply = _reply(msg.data)
        if isinstance(reply, Malformed):
            self._warn_once("reply", "malformed assignment reply dropped (%s)", reply.why)
            return None
        if isinstance(reply, Award) and (reply.node_id != self.node_id
                                         or reply.instance_id != iid):
            self._warn_once("mismatch", "assignment reply for %s/%s dropped",
                            reply.node_id, reply.instance_id)
            return None
        if not self.supervisor.admit(reply.epoch):  # rule 7: as no answer
            self._sink.count(OLDER_ANSWER, f"{iid} (epoch {reply.epoch})")
            return None
        return reply

    async def secrets(self, iid: str, attempt: int) -> dict[str, str] | None:
        """The secret values of the award of `iid` at `attempt`, asked of the broker (a
        re-adopted instance needs them to restart, maybe before this node has connected:
        it waits for the connection up to `offline_s`, after which the node would fence
        itself anyway); None when the broker did not give them (no answer, not placed
        here, or another attempt)."""
        try:
            async with asyncio.timeout(self.timing.offline_s):
                await self._connected.wait()
        except TimeoutError:
            return None
        reply = await self._assignment(iid)
        if isinstance(reply, Award) and reply.attempt == attempt:
            return dict(reply.secret_env)
        return None

    async def _fetch(self, iid: str) -> None:
        # The award message is usually on its way too (the KV copy and the message race):
        # give it one tick to arrive before asking.
        revision = self.revision
        await asyncio.sleep(self.timing.tick_s)
        if self.supervisor.holds(iid) or self.node is None or iid not in self.node.instances:
            return
        reply = await self._assignment(iid)
        if isinstance(reply, Award):
            ignored = await self.supervisor.award(reply)
            if ignored is None:
                self.outcomes["started"] += 1
                log.info("converged: took %s attempt %d from node.json", iid, reply.attempt)
            else:  # e.g. that attempt just ended here and the broker has not heard yet
                self.outcomes["already"] += 1
                self._settle("fetch", iid, revision)
                log.debug("fetched award for %s ignored: %s", iid, ignored)
        elif isinstance(reply, ApiError):
            self.outcomes["not placed"] += 1
            self._settle("fetch", iid, revision)
            log.debug("node.json lists %s but the broker says: %s", iid, reply.error)

    async def _verify(self, iid: str, attempt: int) -> None:
        revision = self.revision
        reply = await self._assignment(iid)
        if isinstance(reply, ApiError):
            if self.supervisor.fence(iid, attempt, reply.error):
                self.outcomes["fenced"] += 1
        elif isinstance(reply, Award) and reply.attempt > attempt:
            if self.supervisor.fence(iid, attempt, f"superseded by attempt {reply.attempt}"):
                self.outcomes["fenced"] += 1
        elif isinstance(reply, Award):
            self.outcomes["kept"] += 1  # the KV entry predates the award
            self._settle("verify", iid, revision)

    def _settle(self, kind: str, iid: str, revision: int) -> None:
        if revision == self.revision:
            self._settled.add((kind, iid))

    # -- self-fencing ---------------------------------------------------------------------

    async def _link(self, nc: Callable[[], NATS | None]) -> None:
        interval, bound = self.timing.heartbeat_s / 2, self.timing.link_s
        while True:
            conn = nc()
            if conn is not None and conn.is_connected:
                try:
                    async with asyncio.timeout(bound):
                        await conn.flush(timeout=math.ceil(bound))  # whole seconds: its type
                    self.contact()
                except (nats.errors.Error, TimeoutError):
                    pass
                _cancelled_anyway()
            self.fence_if_cut_off()
            await asyncio.sleep(interval)

    def contact(self) -> None:
        """NATS answered: rule 6's silence starts again, and a fenced node may run again."""
        self._last_contact = self._clock()
        self.self_fenced = False

    def fence_if_cut_off(self) -> bool:
        """Rule 6: silent longer than `offline_s`, every held instance is fenced, once a
        silence; whether it was now."""
        silent = self._clock() - self._last_contact
        if self.self_fenced or silent <= self.timing.offline_s:
            return False
        self.self_fenced = True
        n = self.supervisor.fence_all(f"no contact with NATS for {silent:.1f}s")
        log.warning("self-fenced: no contact with NATS for %.1fs (> offline %gs); "
                    "stopped %d instances", silent, self.timing.offline_s, n)
        return True


def _cancelled_anyway() -> None:
    """Raise the cancel a call took as an answer: nats-py's `flush` waits with
    `asyncio.wait_for`, which before Python 3.12 returns the PONG that lands with a cancel
    instead of raising it; the loop would go on, holding `Converger.close` for `close_s`."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class _Quiet:
    """A sink that only counts (a converger run without an agent's)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        self.counts[f"malformed {what}"] += 1

    def count(self, kind: str, subject: str, peer: str = "") -> None:
        self.counts[kind] += 1
