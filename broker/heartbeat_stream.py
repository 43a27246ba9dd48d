"""The heartbeat stream: each node's newest heartbeat, kept by NATS, read by the broker at
its own pace.

Rules:
1. JetStream keeps the newest message of every heartbeat subject, and of the broker's probe
   (`subjects.HEARTBEAT_STREAM`: in memory, one message a subject, none above
   `shared.bounds.HEARTBEAT_MAX_BYTES`, so it holds at most that much a node). Nodes publish
   as they would without it and need no permission for it. Memory, not a file: a flood is
   ingested without touching a disk, and a restarted nats-server starts it empty (rule 5).
   On a NATS cluster (HA) it is kept on `replicas` servers (the brokers' `kv_replicas`, 3):
   losing the one server that held an R1 stream would leave whoever leads deaf to every
   heartbeat until that server returned, while a replicated stream elects another leader
   among the survivors and keeps every node's newest stamp; a restarted replica catches
   up from its peers. Still memory at R3: a heartbeat is worth only its freshness, every
   one is written on each replica, and losing all replicas at once is rule 5's case. A
   server outside a cluster refuses replicas, so there it is kept at one (said once).
   No total is set: one would be reserved out of JetStream's memory whether used or not,
   and what overflowed it would drop the oldest stamps, the silent nodes'.
2. The broker reads it through a pull consumer of its own: every `poll_s`, what the stream
   holds now (``no_wait``), again at once after a full batch. A node that publishes faster
   than its interval only replaces its own message, so however fast it floods, the broker
   reads at most one of its heartbeats a poll, and never more than it asked for: a flood
   stays between the node and the stream, and never makes the server cut the broker off.
3. The consumer starts with every subject's newest message (the stream as it stood at
   start). Their server timestamps are returned by `start`: how long each node had been
   silent is counted from them alone (`shared.health.silences`), never against the
   broker's clock, and only from what is that node's heartbeat (it decodes, names the
   node its subject does, has no headers): anything else stored there stamps nothing.
   Those older than the consumer are not heartbeats heard now; the newest of each node's
   is kept (`past`) for what it said.
4. Every `poll_s` the broker publishes a probe (`subjects.HEARTBEAT_PROBE`, beside the
   heartbeat subjects, so no one listening to those hears it; its own subject, so another
   broker's never replaces it) into the same stream and reads it back like a heartbeat.
   Probes keep a clock of their own, apart from the reads, so a read that hangs cannot
   hold them back. When a probe older than the newest two is not back, the feed may be
   losing anyone's heartbeats (an ingest that cannot keep up, a consumer gone, NATS
   away): the broker is deaf from the last probe it read back until the next comes back
   (`shared.health.Deafness`). Probes of brokers long gone are purged at start.
5. A pull that fails (the consumer or the stream gone: a restarted nats-server has emptied
   its memory; no answer in time) makes the stream again if need be and a new consumer,
   delivering only what is new from then on - never the stream's past again, which would
   pass a dead node's last heartbeat off as heard now - and the old one is deleted; rule 4
   covers the gap.
6. Without JetStream the broker subscribes to the heartbeat subjects directly (logged once):
   a restart then presumes every node heard at start, and a node flooding its subject faster
   than the broker reads can make nats-server cut the broker off. The probe works the same.
7. JetStream that cannot answer yet (`transport.asklater` rules 2 and 3: electing its
   leaders, or any failure with several brokers) is rule 6 only until it answers: asked
   again every tick, and once the stream and a consumer of what is new are made the
   broker reads the stream and stops hearing the subjects directly (the consumer first,
   so nothing falls between; a heartbeat heard both ways only says again what it said).
   Else a leadership begun while JetStream elects would stay on rule 6 for its whole term.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError

from gavel.shared import subjects
from gavel.shared.bounds import HEARTBEAT_MAX_BYTES
from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing
from gavel.transport.asklater import Made, again, verdict, why
from gavel.transport.inbound import Decode, Malformed, Received

__all__ = ["BATCH", "PROBE", "HeartbeatStream", "stream_config"]

#: Messages one pull asks for (rule 2); a full batch is followed by another at once.
BATCH = 1024
#: Error codes of JetStream's API: the stream exists with another configuration; replicas
#: asked of a server outside a cluster.
_STREAM_NAME_IN_USE = 10058
_REPLICAS_UNSUPPORTED = 10074
_MSG_NEXT = f"$JS.API.CONSUMER.MSG.NEXT.{subjects.HEARTBEAT_STREAM}"
_PULL = json.dumps({"batch": BATCH, "no_wait": True}).encode()
#: The key of the probe's stamp in what `start` returns: no node id (`subjects.is_node_id`
#: refuses ``@``), so no node's silence is ever counted from it.
PROBE = "@probe"
_STORED = [subjects.HEARTBEAT_ALL, subjects.HEARTBEAT_PROBE_ALL]
_PROBES = subjects.HEARTBEAT_PROBE_ALL.removesuffix("*")
#: Probes that may be out at once before the feed counts as deaf (rule 4): the reads and
#: the probes keep clocks of their own, so the newest two may still be on their way.
_PROBE_LAG = 2


_heartbeat: Decode[Heartbeat] = Decode(Heartbeat)


def _heartbeat_of(node: str, data: bytes) -> bool:
    """Rule 3: `data` is a heartbeat of `node`'s."""
    heartbeat = _heartbeat(data)
    return not isinstance(heartbeat, Malformed) and heartbeat.node_id == node


def stream_config(replicas: int = 1) -> StreamConfig:
    """Rule 1's stream, kept on `replicas` servers."""
    return StreamConfig(name=subjects.HEARTBEAT_STREAM, subjects=list(_STORED),
                        max_msgs_per_subject=1, max_msg_size=HEARTBEAT_MAX_BYTES,
                        storage=StorageType.MEMORY, num_replicas=replicas)


class _Pulled(NamedTuple):
    """A stored message as the broker heard it (`transport.inbound.Received`: its own
    consumer's reply is no business of the handler's, its headers are what was stored)."""

    subject: str
    data: bytes
    reply: str
    headers: Any
    seq: int  # its sequence in the stream
    stamp: float  # when the server stored it, seconds since the epoch (the server's clock)


class HeartbeatStream:
    """Rules 1-7 for one broker: `start` once connected, then `run` as a task; `deliver`
    gets every heartbeat heard, `deaf` (when the feed went deaf) and `hearing` (it hears
    again) follow rule 4. `ha`: one leadership of several brokers (rule 7)."""

    def __init__(self, *, timing: Timing, deliver: Callable[[Received], None],
                 deaf: Callable[[float], None], hearing: Callable[[], None],
                 now: Callable[[], float], log: logging.Logger, replicas: int = 1,
                 ha: bool = False) -> None:
        self.timing = timing
        self.ha = ha
        #: Rule 1: the stream's replicas (1 once a lone server refused more).
        self.replicas = replicas
        self.poll_s = timing.tick_s / 2
        self._deliver = deliver
        self._deaf_cb = deaf
        self._hearing_cb = hearing
        self.now = now
        self.log = log
        #: True while heartbeats come through the stream (rule 6: False without JetStream).
        self.jetstream = False
        #: Rule 7: the stream is asked for again (`run`), and these are heard meanwhile.
        self._later = False
        self._direct: list[Any] = []
        self.nc: Any = None
        self._id = uuid.uuid4().hex[:12]
        self._consumer = f"broker-{self._id}"
        self._consumers = 0  # made after the first (rule 5)
        self._probe_subject = subjects.HEARTBEAT_PROBE.format(broker=self._id)
        self._inbox = ""
        self._pull_sub: Any = None
        self._got: list[_Pulled] = []
        self._round = ""  # the reply subject of the pull in flight
        self._done: asyncio.Future[bool] | None = None
        self._early: list[_Pulled] = []  # heard while `start` read the stream's past
        #: Probes published (a count), the newest read back and when that one was sent.
        self._sent = 0
        self._back = 0
        self._back_sent_at = 0.0
        self._deaf = False
        self._failing = False
        self._broken = False
        self.pulls = 0
        #: Node -> its newest heartbeat stored before `start` (rule 3): what it last said,
        #: for `status` alone (`broker.heartbeats` rule 4).
        self.past: dict[str, _Pulled] = {}

    # -- start and stop -----------------------------------------------------------------
    async def start(self, nc: Any) -> dict[str, float]:
        """The stream, this broker's consumer and the stream's past (rule 3): node id (or
        `PROBE`) -> server time its newest message was stored. Empty without JetStream
        (rule 6)."""
        self.nc = nc
        self._back_sent_at = self.now()
        self._inbox = nc.new_inbox()
        try:
            before = await self._ensure_stream()
            self._pull_sub = await nc.subscribe(f"{self._inbox}.*", cb=self._on_pulled)
            await self._make_consumer(DeliverPolicy.LAST_PER_SUBJECT)
        except Exception as exc:  # rule 6, or rule 7 until JetStream answers
            self._later = verdict(exc, self.ha) is Made.LATER
            if self._later:
                self.log.warning("JetStream cannot make the heartbeat stream yet (%s): "
                                 "heartbeats are heard directly meanwhile; asked again "
                                 "every %gs", why(exc), self.timing.tick_s)
            else:
                self._no_stream(why(exc))
            if self._pull_sub is not None and not self._later:
                with contextlib.suppress(Exception):
                    await self._pull_sub.unsubscribe()
            self._direct = [await nc.subscribe_direct(subject, self._on_direct)
                            for subject in (subjects.HEARTBEAT_ALL, self._probe_subject)]
            return {}
        self.jetstream = True
        stamps: dict[str, float] = {}
        probes: dict[str, float] = {}  # other brokers' probe subjects, the newest stamp of each
        while True:
            got = await self._pull()
            if got is None:
                break  # the past is lost to us; `run` makes the consumer again (rule 5)
            for m in got:
                if m.seq > before:
                    self._early.append(m)
                if m.headers:
                    continue
                if m.subject.startswith(_PROBES):
                    probes[m.subject] = m.stamp
                    key = PROBE
                else:
                    key = subjects.node_of(m.subject)
                    if not _heartbeat_of(key, m.data):
                        continue
                    if m.seq <= before and m.stamp >= stamps.get(key, m.stamp):
                        self.past[key] = m
                stamps[key] = max(stamps.get(key, m.stamp), m.stamp)
            if len(got) < BATCH:
                break
        await self._forget(probes, max(stamps.values(), default=0.0))
        return stamps

    def _no_stream(self, reason: str) -> None:
        self.log.warning("no JetStream heartbeat stream (%s): heartbeats are heard "
                         "directly, and a broker restart presumes every node heard at "
                         "start", reason)

    async def _forget(self, probes: dict[str, float], freshest: float) -> None:
        """Probe subjects of brokers gone (none probed for `offline_s` before the freshest
        stamp) leave the stream: one would be left by every broker that ever ran."""
        js = self.nc.jetstream(timeout=self.timing.call_s)
        for subject, stamp in probes.items():
            if stamp < freshest - self.timing.offline_s:
                with contextlib.suppress(Exception):
                    await js.purge_stream(subjects.HEARTBEAT_STREAM, subject=subject)

    async def close(self) -> None:
        """Delete this broker's consumer (else the server does, once it has been idle)."""
        if not self.jetstream or self.nc is None or self.nc.is_closed:
            return
        with contextlib.suppress(Exception):
            await self.nc.jetstream().delete_consumer(subjects.HEARTBEAT_STREAM,
                                                      self._consumer)
        with contextlib.suppress(Exception):
            await self._pull_sub.unsubscribe()

    # -- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        early, self._early = self._early, []
        self._hand_over(early)
        # The probes and the stream's later making are this loop's own: a group, so a
        # crash in either ends the feed at once (its owner, the broker, reports it) and a
        # cancel of the feed ends them before it returns.
        async with asyncio.TaskGroup() as group:
            group.create_task(self._probing(), name="heartbeat-probe")
            if self._later:
                group.create_task(self._until_stream(), name="heartbeat-stream-later")
            while True:
                try:
                    if self.jetstream:
                        await self._read()
                    self._check_probes()  # what was read back ends a deafness at once
                    self._broken = False
                except Exception:  # never let the feed die: rule 4 notices what it misses
                    if not self._broken:
                        self.log.exception("reading the heartbeat stream failed; retrying")
                    self._broken = True
                await asyncio.sleep(self.poll_s)

    async def _until_stream(self) -> None:
        """Rule 7: the stream asked for every tick; once made, read instead of the direct
        subscriptions."""
        made, reason = await again(self._attempt, self.timing.tick_s)
        self._later = False
        if not made:
            self._no_stream(reason)
            return
        self.jetstream = True
        direct, self._direct = self._direct, []
        for sub in direct:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.log.info("the heartbeat stream is made now; heartbeats are read from it")

    async def _attempt(self) -> tuple[Made, str]:
        """One try of rule 7: the stream, and a consumer of what is new from now on (what
        it held before was heard directly, or not at all - never as heard now)."""
        self._consumers += 1
        self._consumer = f"broker-{self._id}-{self._consumers}"
        try:
            await self._ensure_stream()
            if self._pull_sub is None:
                self._pull_sub = await self.nc.subscribe(f"{self._inbox}.*",
                                                         cb=self._on_pulled)
            await self._make_consumer(DeliverPolicy.NEW)
        except Exception as exc:
            return verdict(exc, self.ha), why(exc)
        return Made.MADE, ""

    async def _probing(self) -> None:
        """Rule 4 on a clock of its own: a pull that hangs (its consumer's server died, the
        answer never comes) must not hold the probes back, else the broker would judge the
        nodes by a feed that stopped, before it knew it was deaf."""
        while True:
            try:
                self._check_probes()
                await self._probe()
            except Exception:
                self.log.exception("probing the heartbeat stream failed; retrying")
            await asyncio.sleep(self.poll_s)

    async def _read(self) -> None:
        """Rule 2: what the stream holds now, batch after batch; rule 5 when it fails."""
        while True:
            got = await self._pull()
            if got is None:
                await self._recover()
                return
            if self._failing:
                self.log.info("the heartbeat stream is back")
                self._failing = False
            self._hand_over(got)
            if len(got) < BATCH:
                return

    def _hand_over(self, got: list[_Pulled]) -> None:
        for m in got:
            self._heard(m)

    def _on_direct(self, msg: Received) -> None:
        self._heard(msg)

    def _heard(self, msg: Received) -> None:
        if msg.subject == self._probe_subject:
            self._probe_back(msg.data)
        elif not msg.subject.startswith(_PROBES):  # another broker's probe is not for us
            self._deliver(msg)

    # -- the probe (rule 4) -------------------------------------------------------------
    async def _probe(self) -> None:
        """A probe: its number and when it was sent (this broker's clock: only this broker
        reads it back)."""
        self._sent += 1
        with contextlib.suppress(nats.errors.Error):  # closed or draining: we are stopping
            await self.nc.publish(self._probe_subject, f"{self._sent} {self.now()!r}".encode())

    def _probe_back(self, data: bytes) -> None:
        try:
            number, sent_at = data.decode().split(" ")
            n, at = int(number), float(sent_at)
        except ValueError:  # UnicodeDecodeError is one
            return
        if n > self._back:
            self._back, self._back_sent_at = n, at

    def _check_probes(self) -> None:
        if self._back >= self._sent - _PROBE_LAG:
            if self._deaf:
                self._deaf = False
                self._hearing_cb()
        elif not self._deaf:
            self._deaf = True
            self._deaf_cb(self._back_sent_at)

    # -- JetStream ----------------------------------------------------------------------
    async def _ensure_stream(self) -> int:
        """Rule 1's stream, made or brought to this configuration; its last sequence."""
        js = self.nc.jetstream(timeout=self.timing.call_s)
        while True:
            config = stream_config(self.replicas)
            try:
                try:
                    info = await js.add_stream(config)
                except BadRequestError as exc:
                    if exc.err_code != _STREAM_NAME_IN_USE:
                        raise
                    info = await js.update_stream(config)
            except APIError as exc:
                if exc.err_code != _REPLICAS_UNSUPPORTED or self.replicas == 1:
                    raise
                self.log.warning("nats-server is not clustered: the heartbeat stream is kept "
                                 "on it alone, not on %d replicas", self.replicas)
                self.replicas = 1
                continue
            return int(info.state.last_seq)

    async def _make_consumer(self, deliver: DeliverPolicy) -> None:
        await self.nc.jetstream(timeout=self.timing.call_s).add_consumer(
            subjects.HEARTBEAT_STREAM, ConsumerConfig(
                name=self._consumer, deliver_policy=deliver, ack_policy=AckPolicy.NONE,
                filter_subjects=list(_STORED), mem_storage=True,
                inactive_threshold=max(self.timing.offline_s, 10 * self.poll_s)))

    async def _recover(self) -> None:
        """Rule 5: the stream if need be, and a new consumer of what is new."""
        old = self._consumer
        self._consumers += 1
        self._consumer = f"broker-{self._id}-{self._consumers}"
        try:
            await self._ensure_stream()
            await self._make_consumer(DeliverPolicy.NEW)
        except Exception as exc:
            if not self._failing:
                self.log.warning("the heartbeat stream is unreachable (%s); retrying every "
                                 "%gs", str(exc) or type(exc).__name__, self.poll_s)
            self._failing = True
            return
        with contextlib.suppress(Exception):  # gone already, most likely
            await self.nc.jetstream(timeout=self.timing.call_s).delete_consumer(
                subjects.HEARTBEAT_STREAM, old)

    async def _pull(self) -> list[_Pulled] | None:
        """One ``no_wait`` pull (rule 2): what it delivered, or None if it failed."""
        self.pulls += 1
        self._round = f"{self._inbox}.{self.pulls}"
        self._got = []
        done = self._done = asyncio.get_running_loop().create_future()
        try:
            await self.nc.publish(f"{_MSG_NEXT}.{self._consumer}", _PULL, reply=self._round)
            async with asyncio.timeout(self.timing.call_s):
                ok = await done
        except Exception:  # not connected, or no answer in time
            return None
        return self._got if ok else None

    async def _on_pulled(self, msg: Msg) -> None:
        done = self._done
        if done is None or done.done():
            return
        if msg.subject.startswith(self._inbox):  # the pull's own end: 404 nothing more now,
            status = msg.headers.get("Status") if msg.headers else None  # 408 the same
            if msg.subject == self._round and status is not None:
                done.set_result(status in ("404", "408"))
            return
        try:
            meta = msg.metadata
        except Exception:  # not from a consumer: nothing we asked for
            return
        if meta.stream != subjects.HEARTBEAT_STREAM or meta.consumer != self._consumer:
            return  # delivered into our inbox by someone else's consumer: not our stream
        self._got.append(_Pulled(msg.subject, msg.data, "", msg.headers or None,
                                 meta.sequence.stream, meta.timestamp.timestamp()))
        if len(self._got) >= BATCH:
            done.set_result(True)
