"""The brokers' leadership lease: one key in a JetStream KV bucket the NATS cluster
replicates (`gavel.shared.subjects.LEADER_BUCKET`).

Rules:
1. Taking the lease is a create: a put expecting the key's last revision to be 0 (no
   value: it lapsed, or never was) or that of the delete marker a leader left when it let
   go. The server refuses it while anyone holds the key. The create's revision is where the
   leadership's epoch starts (`broker.ledger.takeover` rule 4).
2. Holding it is renewing it every `renew_s`: a put expecting the revision of our last
   one. The bucket's max age is the TTL: a key not renewed for `ttl_s` is gone, and a
   standby's create then succeeds. Every put carries a ``Nats-Msg-Id`` of its own, the
   same on every retry of that put, so a put whose answer was lost is not made twice. The
   server checks the expected revision before the id, so the retry of a put that landed
   is refused ("wrong last sequence"), not answered "duplicate": a refused put reads the
   key's last message, and if that carries the put's own id the put landed, at that
   revision (counted as a duplicate, rule 3) - else the refusal stands.
3. The lease is lost - `lost` is set, and nothing more is done in its name - when a renewal
   is refused (someone else holds the key, or it lapsed and was taken), when its renewal
   or its watch crashed (`transport.tasks`: nothing would renew it), or when by this
   process's own clock `ttl_s` less a margin has passed since the last renewal that landed
   was sent (the server's clock starts later: at its write). Which send: the one that was
   stored - the attempt answered, unless the server answers "duplicate" (an earlier attempt
   of that put, unanswered, was stored first), then the put's first attempt. A create
   retried through a stream's election for longer than the TTL that lands fresh is a whole
   lease, not one already run out. `valid()` is that
   clock's verdict, asked by every path that would speak for the leader. A renewal without
   an answer (NATS away, the stream electing a leader after a server died) is sent again
   until then: it may still land.
4. Standbys watch the key (a consumer of it alone, like a node's watch of its node.json)
   and try to take it when the holder's lease must have lapsed by their own clock (the
   last value they saw plus `ttl_s`), when it is deleted, and every `renew_s` regardless:
   the watch may be down.
5. Letting go (`release`, on a clean stop) writes a delete marker expecting our last
   revision: a watching standby takes over at once, and a deposed leader that lets go
   deletes nothing of its successor's.
6. The value names the holder: its broker id, a term token of its own, its epoch once the
   takeover set it (0 until then), and since when it holds the lease (UTC, ISO 8601).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.errors
from nats.js import api

from gavel.shared import subjects
from gavel.shared.timing import Timing
from gavel.transport.inbound import Decode, Malformed, js_answer
from gavel.transport.tasks import Crashed, Tasks

__all__ = ["Holder", "Lease", "LeaseError"]

log = logging.getLogger("gavel.broker.lease")

#: The share of the TTL a leader gives up early (rule 3): room for the two clocks' rates
#: and for the moment between the server's write and our reading of its answer.
DRIFT = 0.05
#: How many TTLs the server keeps a watch's consumer that nobody listens to, at least
#: (`Timing.idle_watch_s` if longer): a standby's watch outlives a reconnect.
IDLE_TTLS = 10
#: JetStream's "wrong last sequence" error codes: the expectation of rule 1 or 2 failed.
_WRONG_LAST = (10071, 10164)
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_MSG_ID = "Nats-Msg-Id"
_TIMING = Timing()


class LeaseError(Exception):
    """The lease bucket cannot be used as configured (one sentence)."""


class Holder(msgspec.Struct, kw_only=True, frozen=True):
    """Rule 6: the key's value."""

    broker_id: str
    term: str = ""
    epoch: int = 0
    since: str = ""


_holder: Decode[Holder] = Decode(Holder, json=True)
_enc = msgspec.json.Encoder()


@dataclass
class _Answer:
    """What one put came back with: its revision, or a refusal, or nothing."""

    revision: int = 0
    refused: str = ""
    unanswered: str = ""
    #: The server had stored this put already: an earlier attempt landed (rule 3).
    duplicate: bool = False


class Lease:
    def __init__(self, nc: Any, *, broker_id: str, ttl_s: float, renew_s: float,
                 replicas: int, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 timing: Timing = _TIMING) -> None:
        self.nc = nc
        #: How long a put of the key, or its release, waits for JetStream's answer, and how
        #: long `close` waits between cancels of its tasks.
        self.ack_s = timing.ack_s
        self.retry_s = timing.retry_s
        #: How long after a holder's lease should have lapsed a standby keeps trying closely.
        self.lapse_s = timing.lapse_s
        #: The floors and caps of the waits `renew_s` and `ttl_s` pace (`Timing`).
        self.timing = timing
        self.broker_id = broker_id
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.replicas = replicas
        self.clock = clock
        self.wall = wall
        #: What the watch saw last (rule 4): who holds the key, when we saw that, the key's
        #: last revision and whether it is a delete marker.
        self.holder: Holder | None = None
        self.seen_at = float("-inf")
        self.last_revision = 0
        self.deleted = False
        #: Ours while we hold it.
        self.held: Holder | None = None
        self.revision = 0
        self.deadline = float("-inf")
        self.lost = asyncio.Event()
        self.why_lost = ""
        #: Renewals by outcome, leaderships taken (for the metrics).
        self.renewals: dict[str, int] = {"landed": 0, "unanswered": 0, "refused": 0}
        self.taken = 0
        self._seen = asyncio.Event()
        #: Its watch and renewals (`transport.tasks`): a crash while it holds the lease
        #: loses it at once (rule 3), as nothing would renew it any more.
        self._tasks = Tasks("lease", log, crashed=self._crashed)
        self._expiry: asyncio.TimerHandle | None = None
        self._msg = 0
        self._tried_at = float("-inf")

    # -- the bucket and the watch --------------------------------------------------------
    async def open(self) -> None:
        """Make sure the bucket exists (retried while the cluster cannot make it yet), then
        start watching the key (rule 4)."""
        js = self.nc.jetstream()
        said = False
        while True:
            try:
                await js.create_key_value(
                    bucket=subjects.LEADER_BUCKET, history=1, ttl=self.ttl_s,
                    replicas=self.replicas, storage=api.StorageType.FILE)
                break
            except Exception as exc:
                text = str(exc) or type(exc).__name__
                if "already in use" in text or "10058" in text:
                    raise LeaseError(
                        f"the lease bucket {subjects.LEADER_BUCKET} exists with other settings "
                        f"than ttl {self.ttl_s:g}s and {self.replicas} replicas: every broker "
                        f"must use the same [ha] settings ({text})") from None
                if not said:
                    log.warning("cannot make the lease bucket yet (%s); retrying", text)
                    said = True
                await asyncio.sleep(min(self.timing.rewatch_s, self.renew_s))
        self._tasks.spawn(self._watch(), name="lease-watch")

    async def close(self) -> None:
        """Stop the watch and the renewals. A cancel is sent again until the task ends: on
        3.11 a cancel that lands as an awaited answer arrives (`asyncio.wait_for` inside
        nats-py's request) can be swallowed, and the task would run on."""
        left = self._tasks.running
        self._tasks.cancel()  # a failure on the way out is no news (`transport.tasks`)
        while left:
            for task in left:
                task.cancel()
            await asyncio.wait(left, timeout=self.retry_s)
            left = frozenset(t for t in left if not t.done())
        if self._expiry is not None:
            self._expiry.cancel()

    async def _watch(self) -> None:
        """Rule 4: one consumer of the key at a time, made anew when it goes silent."""
        while True:
            sub = None
            try:
                name = f"lease_{secrets.token_hex(8)}"
                inbox = self.nc.new_inbox()
                heard = [self.clock()]

                async def on_msg(msg: Any, heard: list[float] = heard) -> None:
                    heard[0] = self.clock()
                    self._observe(msg)

                sub = await self.nc.subscribe(inbox, cb=on_msg)
                config = api.ConsumerConfig(
                    name=name, deliver_subject=inbox, filter_subject=subjects.LEADER_KEY,
                    deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                    ack_policy=api.AckPolicy.NONE, max_deliver=1,
                    idle_heartbeat=self.renew_s,
                    inactive_threshold=max(self.timing.idle_watch_s, IDLE_TTLS * self.ttl_s),
                    mem_storage=True, num_replicas=1)
                request = json.dumps({"stream_name": subjects.LEADER_STREAM,
                                      "config": config.as_dict()}).encode()
                msg = await self.nc.request(subjects.LEADER_WATCH.format(name=name), request,
                                            timeout=self.timing.answer_within(self.renew_s))
                answer = js_answer(msg.data)
                if isinstance(answer, Malformed) or answer.get("error"):
                    raise LeaseError(answer.why if isinstance(answer, Malformed)
                                     else str(answer["error"]))
                while self.clock() - heard[0] < 3 * self.renew_s:
                    await asyncio.sleep(self.renew_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("lease watch: %s; made anew", exc)
                await asyncio.sleep(min(self.timing.rewatch_s, self.renew_s))
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()

    def _observe(self, msg: Any) -> None:
        headers = msg.headers or {}
        if "Status" in headers:
            return  # an idle heartbeat: the consumer is alive
        try:
            meta = msg.metadata
        except (nats.errors.Error, ValueError, IndexError):
            return
        if msg.subject != subjects.LEADER_KEY or meta.stream != subjects.LEADER_STREAM:
            return
        revision = meta.sequence.stream
        if revision < self.last_revision:
            return
        self.last_revision = revision
        self.seen_at = self.clock()
        if headers.get("KV-Operation") in ("DEL", "PURGE") or not msg.data:
            self.deleted, self.holder = True, None
        else:
            holder = _holder(msg.data)
            self.deleted = False
            self.holder = Holder(broker_id="?") if isinstance(holder, Malformed) else holder
        self._seen.set()

    # -- taking and holding --------------------------------------------------------------
    def valid(self) -> bool:
        """Rule 3: we hold the lease, by our own clock."""
        return self.held is not None and not self.lost.is_set() \
            and self.clock() < self.deadline

    async def acquire(self) -> int:
        """Rule 4: wait until our create lands; the lease's revision (the epoch's floor)."""
        self.lost = asyncio.Event()
        self.why_lost = ""
        term = secrets.token_hex(6)
        since = self.wall().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        mine = Holder(broker_id=self.broker_id, term=term, since=since)
        #: When the create now being tried was first sent (rule 3: our clock starts there
        #: if the answer is a duplicate - a create without an answer may have landed).
        first: float | None = None
        while True:
            wait = self._due() - self.clock()
            if wait > 0:
                self._seen.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._seen.wait()
                continue
            self._tried_at = self.clock()
            for last in ([self.last_revision, 0] if self.deleted else [0]):
                sent = self.clock()
                if first is None:
                    first = sent
                got = await self._put(_enc.encode(mine), last, f"{term}.create")
                if got.revision:
                    self._hold(mine, got.revision, first if got.duplicate else sent)
                    self.taken += 1
                    log.info("broker %s holds the lease (revision %d)", self.broker_id,
                             got.revision)
                    return got.revision
                if got.refused:
                    first = None  # refused: nothing was stored, the next try starts afresh

    def _due(self) -> float:
        """Rule 4: when to try to take the lease next."""
        tried = self._tried_at
        if self.deleted:
            return tried + self.timing.retake_s
        if self.holder is None:
            return tried + self.renew_s  # nothing seen: absent, or the watch is not up yet
        lapses = self.seen_at + self.ttl_s
        now = self.clock()
        if now < lapses:
            return lapses
        if now < lapses + self.lapse_s:  # the server expires the key a moment after our guess
            return tried + self.timing.retake_s
        return tried + self.renew_s  # an old value: the watch is down, or the key lapsed

    def _hold(self, holder: Holder, revision: int, sent: float) -> None:
        self.held = holder
        self.revision = revision
        self._extend(sent)
        self._tasks.spawn(self._renew(holder.term), name="lease-renew")

    def _extend(self, sent: float) -> None:
        self.deadline = sent + self.ttl_s * (1 - DRIFT)
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(0.0, self.deadline - self.clock()), self._expired)

    def _expired(self) -> None:
        if self.held is not None and self.clock() >= self.deadline:
            self._lose("its lease ran out by its own clock before a renewal landed")

    def _crashed(self, crash: Crashed) -> None:
        if self.held is not None:  # a standby's watch may be down: it tries anyway (rule 4)
            self._lose(str(crash))

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self.why_lost = why
        self.lost.set()
        self.held = None
        log.warning("broker %s no longer leads: %s", self.broker_id, why)

    async def announce(self, epoch: int) -> None:
        """Rule 6: the epoch the takeover settled on, in the next value (renewed now)."""
        if self.held is not None:
            self.held = msgspec.structs.replace(self.held, epoch=epoch)
            await self.renew()

    async def _renew(self, term: str) -> None:
        while self.held is not None and self.held.term == term and not self.lost.is_set():
            await asyncio.sleep(self.renew_s)
            if self.held is not None and self.held.term == term:
                await self.renew()

    async def renew(self) -> None:
        """One renewal (rule 2), sent again without an answer until it lands or the lease
        runs out (rule 3)."""
        held = self.held
        if held is None or self.lost.is_set():
            return
        self._msg += 1
        msg_id, first = f"{held.term}.{self._msg}", self.clock()
        while self.valid():
            sent = self.clock()
            got = await self._put(_enc.encode(held), self.revision, msg_id,
                                  timeout=max(self.timing.put_least_s,
                                              min(self.renew_s, self.deadline - first)))
            if got.revision:
                self.renewals["landed"] += 1
                self.revision = got.revision
                self._extend(first if got.duplicate else sent)
                return
            if got.refused:
                self.renewals["refused"] += 1
                self._lose(f"a renewal was refused ({got.refused})")
                return
            self.renewals["unanswered"] += 1
            log.info("lease renewal unanswered (%s); again", got.unanswered)
            await asyncio.sleep(max(0.0, min(self.renew_s / 4, self.deadline - self.clock())))
        self._expired()

    async def confirm(self) -> bool:
        """Whether we still hold the lease, asked of the server: a renewal now (rule 3)."""
        await self.renew()
        return self.valid()

    async def release(self) -> None:
        """Rule 5 (best effort: a lease not released lapses after `ttl_s`)."""
        if not self.valid():
            return
        self.held, revision = None, self.revision
        with contextlib.suppress(Exception):
            await self.nc.request(subjects.LEADER_KEY, b"", timeout=self.ack_s, headers={
                "KV-Operation": "DEL", _EXPECTED: str(revision),
                "Nats-Msg-Id": f"{secrets.token_hex(6)}.release"})
        if self._expiry is not None:
            self._expiry.cancel()
        self.lost.set()
        self.why_lost = "it let go"

    async def _put(self, value: bytes, last: int, msg_id: str, timeout: float | None = None
                   ) -> _Answer:
        try:
            msg = await self.nc.request(subjects.LEADER_KEY, value, timeout=timeout or self.ack_s,
                                        headers={_EXPECTED: str(last), "Nats-Msg-Id": msg_id})
        except (nats.errors.Error, TimeoutError, ValueError) as exc:
            return _Answer(unanswered=str(exc) or type(exc).__name__)
        answer = js_answer(msg.data)
        if isinstance(answer, Malformed):
            return _Answer(unanswered=answer.why)
        error = answer.get("error")
        if not error:
            return _Answer(revision=int(answer.get("seq", 0)),
                           duplicate=bool(answer.get("duplicate")))
        if isinstance(error, dict) and error.get("err_code") in _WRONG_LAST:
            landed = await self._landed(msg_id)
            if landed is not None:
                return landed
            return _Answer(refused=str(error.get("description", "wrong last sequence")))
        return _Answer(unanswered=str(error))

    async def _landed(self, msg_id: str) -> _Answer | None:
        """Rule 2: the key's last message, if it is the put `msg_id` (it landed, and the
        refusal was of its retry); None if it is another's; unanswered if unknown."""
        try:
            msg = await self.nc.request(subjects.LEADER_GET, _enc.encode(
                {"last_by_subj": subjects.LEADER_KEY}),
                timeout=max(self.timing.landed_least_s, self.renew_s))
            answer = js_answer(msg.data)
            if isinstance(answer, Malformed):
                return _Answer(unanswered=f"a refused put not yet checked ({answer.why})")
            got = answer.get("message") or {}
            head = base64.b64decode(got.get("hdrs") or "").decode(errors="replace")
        except (nats.errors.Error, TimeoutError, ValueError, AttributeError) as exc:
            return _Answer(unanswered=f"a refused put not yet checked ({exc})")
        if f"{_MSG_ID}: {msg_id}" in head.split("\r\n"):
            return _Answer(revision=int(got.get("seq", 0)), duplicate=True)
        return None
