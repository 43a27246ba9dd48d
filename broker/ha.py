"""Several brokers, one leader: a standby until the lease is its, then a leadership - a
`Broker` of its own - until it is not.

Rules:
1. Any number of brokers run against one NATS cluster and one git remote; the one holding
   the lease (`broker.lease`) leads. A standby holds nothing else: it subscribes to none of
   the node protocol or the API, puts nothing in KV, commits nothing. NATS hands every
   request, bid and heartbeat to the leader alone, and a request sent while none leads is
   told "no responders" at once. Not queue groups: they would hand half the requests to
   standbys, which could only answer them from a stale state.
2. Taking over is the lease first, then the remote (`broker.ledger.takeover`): the remote's
   branch becomes ours and our epoch commit lands on it. Only then does the leadership
   start, with a connection of its own, deriving everything from that branch. What can be
   readied before is readied while standing by: the next leadership's parts and its writer
   process, and a copy of the remote fetched every `renew_s` (`Timing.fetch_least_s` at
   least), so the takeover fetches only the last moments.
3. A leadership ends when the lease is lost, when its pusher is fenced (the remote's branch
   names another epoch), or when it stopped on its own (a damaged repository): it is
   aborted (`Broker.abort`: nothing more is sent) and the broker stands by again; a damaged
   repository stops the broker. Stopping (SIGTERM) ends it cleanly: the commits in hand get
   `Timing.flush_s` to reach the remote, the leadership closes, and the lease is let go, so a
   standby takes over at once.
4. A takeover that cannot land its epoch commit (the remote unreachable, refused time after
   time) lets the lease go and stands by for a TTL: another broker may reach the remote.
5. At its start a broker clears the lock a writer of its last life left on its own working
   copy's branch (`broker.ledger.repository` rule 8: one broker per working copy), before
   any takeover moves that branch: killed -9 mid-commit, it would otherwise fail every
   takeover for good.
6. One `Metrics` for every leadership (its endpoint outlives them): who leads as the lease's
   watch sees it, since when, the epoch, renewals by outcome, leaderships taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient
from prometheus_client.core import CounterMetricFamily, Metric

from gavel.broker.config import Config
from gavel.broker.connect import NatsUnreachable, connect_within
from gavel.broker.context import Leadership
from gavel.broker.lease import Lease
from gavel.broker.ledger.remote import Pusher
from gavel.broker.ledger.repository import Damaged, Ledger, LedgerError
from gavel.broker.ledger.takeover import TakeoverError
from gavel.broker.metrics import LeaderView, Metrics
from gavel.broker.service import Broker
from gavel.shared import subjects
from gavel.transport.tasks import Tasks, until

__all__ = ["HaBroker", "HaSettings"]

log = logging.getLogger("gavel.broker.ha")


@dataclass(frozen=True)
class HaSettings:
    """The lease and the remote every broker shares (`cli.config.HaConfig`)."""

    remote: str
    ttl_s: float = 10.0
    renew_s: float = 2.0
    replicas: int = 3


class HaBroker:
    """Rule 1's broker: ``await run()`` until `stop`."""

    def __init__(self, config: Config, *, settings: HaSettings) -> None:
        #: What every leadership is started with; `config.first_connect_s` bounds this
        #: broker's own first connect, a leadership's is the lease's TTL.
        self.config = config
        self.nats_url = config.nats_url
        self.state_dir = Path(config.state_dir)
        self.broker_id = config.broker_id
        self.settings = settings
        self.ref = config.ref
        self.nats_options = dict(config.nats_options)
        self.connect_wait_s = config.first_connect_s
        self.wall = config.wall
        self.metrics = Metrics()
        self.metrics.leadership(self._view, self._extra)
        #: The leadership now, if this broker leads; how many it has had.
        self.current: Broker | None = None
        self.terms = 0
        #: Why the broker stopped on its own (a damaged repository), raised by `run`.
        self.fatal: Exception | None = None
        self.lease: Lease | None = None
        self.nc: Any = None
        self._stopped = asyncio.Event()
        self._fenced = asyncio.Event()
        self._said = ""

    # -- lifecycle -----------------------------------------------------------------------
    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        starting = await until(self._stopped, self.start())  # told to stop as it starts
        if not starting.cancelled():
            starting.result()
        try:
            while not self._stopped.is_set():
                await self._stand_by_then_lead()
        finally:
            await self.close()
        if self.fatal is not None:
            raise self.fatal

    async def start(self) -> None:
        """Connect (the lease's own connection) and open the lease bucket and its watch."""
        # Rule 5.
        await asyncio.to_thread(Ledger(self.state_dir / "state.git", self.ref).clear_stale_lock,
                                self.config.timing.stale_lock_s)
        self.nc = await self._connect()
        self.lease = Lease(self.nc, broker_id=self.broker_id, ttl_s=self.settings.ttl_s,
                           renew_s=self.settings.renew_s, replicas=self.settings.replicas,
                           wall=self.wall, timing=self.config.timing)
        await self.lease.open()
        log.info("broker %s stands by (lease TTL %gs, renewed every %gs, %d replicas)",
                 self.broker_id, self.settings.ttl_s, self.settings.renew_s,
                 self.settings.replicas)

    async def close(self) -> None:
        if self.lease is not None:
            await self.lease.close()
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def _connect(self) -> Any:
        options: dict[str, Any] = {
            "name": f"gavel-broker-{self.broker_id}-lease", "reconnect_time_wait": 0.5,
            "inbox_prefix": subjects.BROKER_INBOX, "max_reconnect_attempts": -1,
            **self.nats_options, "allow_reconnect": False}
        return await connect_within(NatsClient, self.nats_url, options, self.connect_wait_s,
                                    self.config.timing.retry_s)

    # -- one turn: stand by, then lead -------------------------------------------------------
    async def _stand_by_then_lead(self) -> None:
        lease = self.lease
        assert lease is not None
        broker, pusher, leader = self._prepare(lease)
        standby = Tasks("standby", log)  # a crash is said at once; the lease is tried on
        standby.spawn(self._say_who_leads(), name="say-who-leads")
        standby.spawn(self._keep_fresh(pusher), name="keep-fresh")
        try:
            acquiring = await until(self._stopped, lease.acquire())
        finally:
            await standby.aclose(self.config.timing.close_s)
        if acquiring.cancelled():
            await broker.committer.join(broker.timing.close_s)
            pusher.shutdown()
            return
        revision = acquiring.result()
        held = lease.held
        leader.since = held.since if held is not None else ""
        await self._lead(lease, revision, broker, pusher, leader)

    def _prepare(self, lease: Lease) -> tuple[Broker, Pusher, Leadership]:
        """Rule 2's next leadership, built while standing by: its writer process starts now,
        not after a takeover."""
        leader = Leadership(broker_id=self.broker_id, leading=lease.valid,
                            confirm=lease.confirm, ha=True)
        self._fenced.clear()

        def pusher_of(ledger: Ledger, wake: Callable[[], None]) -> Pusher:
            return Pusher(ledger.path, ledger.ref, self.settings.remote,
                          on_merged=lambda change, sha: wake(), leading=lease.valid,
                          on_fenced=lambda why: self._fenced.set(),
                          outcomes=self.metrics.pushes, stale_lock_s=self.settings.ttl_s,
                          push_s=self.config.timing.push_s,
                          backoff_s=self.config.timing.retry_s,
                          max_backoff_s=self.config.timing.retry_max_s)

        broker = Broker(replace(self.config, connect_wait_s=self.settings.ttl_s,
                                kv_replicas=self.settings.replicas),
                        leader=leader, metrics=self.metrics, pusher=pusher_of)
        assert broker.pusher is not None
        pusher = broker.pusher
        return broker, pusher, leader

    async def _keep_fresh(self, pusher: Pusher) -> None:
        """Rule 2: a standby's copy of the remote follows it, so a takeover fetches little."""
        said = False
        while True:
            try:
                await pusher.refreshing()
                said = False
            except Exception as exc:  # the remote may be away for now: the takeover will tell
                if not said:
                    log.warning("standby %s cannot fetch %s: %s", self.broker_id,
                                pusher.url, exc)
                    said = True
            await asyncio.sleep(max(self.config.timing.fetch_least_s, self.settings.renew_s))

    async def _say_who_leads(self) -> None:
        """One log line each time the leader a standby sees changes."""
        while True:
            lease = self.lease
            holder = lease.holder if lease is not None else None
            said = f"{holder.broker_id} (epoch {holder.epoch})" if holder else "nobody"
            if said != self._said:
                self._said = said
                log.info("standing by: %s leads", said)
            await asyncio.sleep(max(self.config.timing.watch_s, self.settings.renew_s))

    async def _lead(self, lease: Lease, revision: int, broker: Broker, pusher: Pusher,
                    leader: Leadership) -> None:
        """Rules 2 and 3: one leadership, from the takeover to its end."""
        try:
            taken = await pusher.lead(self.broker_id, revision, leader.since)
        except (TakeoverError, LedgerError) as exc:  # rule 4
            log.error("broker %s could not take over: %s; letting the lease go", self.broker_id,
                      exc)
            await broker.committer.join(broker.timing.close_s)
            pusher.shutdown()
            await lease.release()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.ttl_s):
                    await self._stopped.wait()
            return
        leader.epoch = taken.epoch
        await lease.announce(taken.epoch)
        pushing: asyncio.Task[None] | None = None
        try:
            await broker.start()
            # A pusher that crashed ends this leadership at once; the broker stands by again.
            leading = Tasks("leadership", log, crashed=lambda crash: broker.stop())
            pushing = leading.spawn(pusher.run(), name="pusher")
            self.current = broker
            self.terms += 1
            log.info("broker %s leads in epoch %d (the remote's branch was epoch %d)",
                     self.broker_id, taken.epoch, taken.previous)
            await self._until_the_end(lease, broker)
        except (NatsUnreachable, Damaged, LedgerError) as exc:
            self.fatal = exc if isinstance(exc, Damaged) else None
            log.error("leadership of broker %s ended: %s", self.broker_id, exc)
        finally:
            self.current = None
            await self._end(lease, broker, pusher, pushing)

    async def _until_the_end(self, lease: Lease, broker: Broker) -> None:
        ends = [asyncio.ensure_future(e.wait())
                for e in (lease.lost, self._fenced, self._stopped, broker.stopped)]
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for e in ends:
                e.cancel()

    async def _end(self, lease: Lease, broker: Broker, pusher: Pusher,
                   pushing: asyncio.Task[None] | None) -> None:
        """Rule 3."""
        if broker.fatal is not None:
            self.fatal = broker.fatal
            self.stop()
        if self._stopped.is_set() and lease.valid() and pushing is not None:
            with contextlib.suppress(TimeoutError):  # the commits in hand reach the remote
                await asyncio.wait_for(pusher.flush(), self.config.timing.flush_s)
            await broker.close()
            await pusher.close(pushing, timeout=0.0)
            await lease.release()
            log.info("broker %s stopped leading and let the lease go", self.broker_id)
            return
        why = lease.why_lost or pusher.fenced or "it stopped"
        log.warning("broker %s stops leading (epoch %d): %s", self.broker_id,
                    broker.leader.epoch, why)
        await broker.abort()
        if pushing is not None:
            pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pushing
        pusher.shutdown()
        if lease.valid():
            await lease.release()

    # -- metrics ---------------------------------------------------------------------------
    def _view(self) -> LeaderView:
        lease = self.lease
        if lease is None:
            return (False, "", 0, "")
        if lease.valid() and lease.held is not None:
            return (True, self.broker_id, lease.held.epoch, lease.held.since)
        holder = lease.holder
        if holder is None:
            return (False, "", 0, "")
        return (False, holder.broker_id, holder.epoch, holder.since)

    def _extra(self) -> Iterator[Metric]:
        lease = self.lease
        renewals = CounterMetricFamily("gavel_lease_renewals", "Lease renewals, by outcome",
                                       labels=["outcome"])
        for outcome, n in (lease.renewals.items() if lease is not None else ()):
            renewals.add_metric([outcome], n)
        yield renewals
        taken = CounterMetricFamily("gavel_leaderships", "Leaderships this broker took")
        taken.add_metric([], lease.taken if lease is not None else 0)
        yield taken
