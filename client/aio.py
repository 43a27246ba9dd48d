"""The async client: one method per verb, over one NATS connection.

Rules:
1. Every method sends the verb's request struct and returns its reply struct; a broker that
   says no raises `BrokerRefused` with its sentence, nobody answering raises `NoBroker`, no
   answer in time `NoAnswer` (all `ClientError`, from `gavel.transport.client`).
2. `submit` and `deploy` carry an idempotency key (the caller's, or a new uuid4) and ask
   again with the same key when the broker does not answer within `TRY_S`, up to `TRIES`
   times, and while no broker answers at all (a failover) for as long: a request whose
   answer was lost is answered again, never carried out twice (`broker.api` rule 4). A
   caller may give its own figures (`Retries`); `on_retry` hears each error asked past.
3. `exec` runs a command in a running instance and returns how it ended, its output handed
   to a callback as it comes (`transport.execclient`). `follow_events` and `logs` are async
   iterators: events as the broker stores them in its
   history (in place before the first is awaited; in order, each once, across reconnects),
   output as the node sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gavel.client.deploywait import deployed
from gavel.client.jobwait import Ended, healthy_nodes, job_end, system_running
from gavel.client.runwait import Watch, has_run, running
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    DeployReply,
    DeployRequest,
    DrainReply,
    DrainRequest,
    EndpointsReply,
    EndpointsRequest,
    EventsReply,
    EventsRequest,
    InstanceStatus,
    NodesReply,
    NodesRequest,
    PeriodicJobsReply,
    PeriodicJobsRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    ServicesReply,
    ServicesRequest,
    ServiceStatus,
    StatsReply,
    StatsRequest,
    StatusReply,
    StopServiceRequest,
    SubmitReply,
    SubmitRequest,
    TuneReply,
    TuneRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.execstream import ExecExit, ExecOutput, ExecStart
from gavel.shared.logstream import LogChunk, LogsDone, LogsRequest, Stream
from gavel.shared.messages import Event, Message, Spec
from gavel.shared.planning import PlanReply, PlanRequest
from gavel.shared.routes import RouteEntry, derive
from gavel.shared.timing import Timing
from gavel.transport import eventstream, execclient
from gavel.transport.client import (
    ClientError,
    NoAnswer,
    NoBroker,
    call,
    connect,
    operator_of,
)
from gavel.transport.client import status as status_of
from gavel.transport.execclient import new_session
from gavel.transport.logclient import read

__all__ = ["PAUSE_S", "TRIES", "TRY_S", "Client", "Ended", "EventFeed", "OnRetry", "Retries",
           "Watch"]

T = TypeVar("T", bound=Message)
#: The operator's waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()
#: Rule 2: how long each try waits, how many there are, the pause while no broker answers.
TRY_S = _TIMING.answer_s
TRIES = 3
PAUSE_S = _TIMING.failover_s
#: Rule 2: what hears each error a request is asked again past (`NoAnswer` or `NoBroker`).
OnRetry = Callable[[ClientError], None]


@dataclass(frozen=True)
class Retries:
    """Rule 2's figures: how long each try waits, how many there are, the pause while no
    broker answers, and whether to ask again then at all (`failover`; without it, `NoBroker`
    is raised at once)."""

    try_s: float = TRY_S
    tries: int = TRIES
    pause_s: float = PAUSE_S
    failover: bool = True



class EventFeed:
    """Events in the order they were stored, each once, across reconnects (rule 3,
    `gavel.transport.eventstream`); `last` is the history's sequence of the newest yielded,
    to resume from with ``follow_events(after=...)``."""

    def __init__(self, follower: eventstream.Follower) -> None:
        self._follower = follower

    @property
    def last(self) -> int:
        return self._follower.last or 0

    def __aiter__(self) -> EventFeed:
        return self

    async def __anext__(self) -> Event:
        try:
            return (await self._follower.__anext__()).event
        except (asyncio.CancelledError, StopAsyncIteration):
            raise
        except Exception:  # the connection went for good
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._follower.aclose()


class Client:
    """A cluster's API over `nc` (a nats-py connection). `Client.connect` makes one that
    owns its connection and closes it with `close` (or ``async with``)."""

    def __init__(self, nc: Any, *, timeout: float = _TIMING.answer_s, owned: bool = False,
                 timing: Timing = _TIMING) -> None:
        self.nc = nc
        self.timeout = timeout
        self._owned = owned
        #: The clocks of its waits and follows (`follow_s`): the program's `Timing`.
        self.timing = timing

    @classmethod
    async def connect(cls, url: str = "nats://127.0.0.1:4222", creds: str | None = None,
                      *, timeout: float = _TIMING.answer_s, timing: Timing = _TIMING,
                      **options: Any) -> Client:
        """A client on a connection of its own (`creds`: an nkey seed or .creds file)."""
        return cls(await connect(url, creds, **options), timeout=timeout, owned=True,
                   timing=timing)

    async def close(self) -> None:
        if self._owned:
            await self.nc.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, verb: str, request: Message, reply_type: type[T],
                      timeout: float | None = None) -> T:
        """Rule 1: any verb of the NATS API by name (``gavel.api.<verb>``)."""
        return await call(self.nc, verb, request, reply_type, timeout or self.timeout)

    async def _again(self, verb: str, request: Message, reply_type: type[T],
                     on_retry: OnRetry | None, retries: Retries | None) -> T:
        """Rule 2: `request` (which carries its key) until it is answered."""
        r = retries or Retries()
        tries = 0
        deadline = time.monotonic() + r.tries * r.try_s
        while True:
            try:
                return await self.request(verb, request, reply_type, r.try_s)
            except NoAnswer as exc:
                tries += 1
                if tries >= r.tries:
                    raise
                if on_retry is not None:
                    on_retry(exc)
            except NoBroker as exc:
                if not r.failover or time.monotonic() + r.pause_s > deadline:
                    raise
                if on_retry is not None:
                    on_retry(exc)
                await asyncio.sleep(r.pause_s)

    # -- instances ------------------------------------------------------------------------
    async def submit(self, spec: Spec, *, instance_id: str = "", count: int = 1,
                     key: str = "", on_retry: OnRetry | None = None,
                     retries: Retries | None = None) -> SubmitReply:
        """Submit `spec` (`count` instances of it); rule 2 with `key` or a new one."""
        req = SubmitRequest(spec=spec, instance_id=instance_id, count=count,
                            key=key or uuid.uuid4().hex)
        return await self._again("submit", req, SubmitReply, on_retry, retries)

    async def status(self, instance_id: str = "") -> StatusReply:
        """Every instance (every page: `broker.api` rule 8), or the one named."""
        return await status_of(self.nc, instance_id, self.timeout)

    async def instance(self, instance_id: str) -> InstanceStatus:
        """One instance's status."""
        return (await self.status(instance_id)).instances[0]

    async def why(self, instance_id: str) -> WhyReply:
        """The instance and every auction for it: bids, declines, the winner."""
        return await self.request("why", WhyRequest(instance_id=instance_id), WhyReply)

    async def cancel(self, instance_id: str) -> CancelReply:
        return await self.request("cancel", CancelRequest(instance_id=instance_id),
                                  CancelReply)

    async def watch(self, *instance_ids: str) -> Watch:
        """Subscriptions to these instances' events, to make before a submit and hand to
        `wait`: it then hears what happened between the submit's answer and its first look
        (`gavel.client.runwait` rule 3). ``close()`` it (or ``async with``) when done."""
        return await Watch(self.nc).add(*instance_ids)

    async def wait(self, instance_id: str, timeout: float | None = _TIMING.wait_s, *,
                   watch: Watch | None = None) -> InstanceStatus:
        """Until the instance runs healthy (or has succeeded): its status. `Ended` when it
        ends otherwise, is unschedulable or meets an error; `TimedOut` (a `NoAnswer`) past
        `timeout` (None: no limit), naming the last failing check heard of. `watch`: one
        made before the submit (`watch`). `gavel submit --wait=running` is this wait."""
        return await running(self, instance_id, timeout, watch, poll_s=self.timing.follow_s)

    async def started(self, instance_id: str, timeout: float | None = None) -> InstanceStatus:
        """Until the instance has run on a node - it runs, in any health, or has ended there:
        its status, with the node that has its output. `Ended` when it ends before any node
        ran it or meets an error; `TimedOut` past `timeout` (None: no limit). An
        unschedulable instance is waited through: the broker asks again when a node comes or
        room is freed. What `logs(follow=True)` waits for first."""
        return await running(self, instance_id, timeout, poll_s=self.timing.follow_s,
                             started=True)

    async def wait_job(self, job_id: str, timeout: float | None = None) -> StatusReply:
        """Until the job ends - a lone instance in a terminal state, a batch array with no
        task held or running - its status; `Ended` unless it all succeeded (or when no node
        will take a lone instance); `TimedOut` (a `NoAnswer`, with the status) past
        `timeout` (None: no limit)."""
        return await job_end(self, job_id, timeout)

    async def wait_system(self, name: str, timeout: float | None = _TIMING.wait_s) -> ServiceStatus:
        """Until an instance of the system job `name` runs healthy on every node that could
        run it now: its status; `Ended` when it is stopped or a node declines its instance;
        `TimedOut` (a `NoAnswer`, with the status) past `timeout`."""
        return await system_running(self, name, timeout)

    # -- nodes ----------------------------------------------------------------------------
    async def nodes(self, node_id: str = "") -> NodesReply:
        """Every node in brief, or one in detail (`NodesReply.detail`)."""
        return await self.request("nodes", NodesRequest(node_id=node_id), NodesReply)

    async def wait_nodes(self, count: int, timeout: float = _TIMING.wait_s) -> NodesReply:
        """Until the broker counts at least `count` healthy nodes: its nodes; `TimedOut`
        (a `NoAnswer`, with the nodes last heard of) past `timeout`."""
        return await healthy_nodes(self, count, timeout)

    async def drain(self, node_id: str, *, undo: bool = False, migrate: bool = False,
                    deadline_s: float = 0.0) -> DrainReply:
        return await self.request("drain", DrainRequest(node_id=node_id, undo=undo,
                                                        migrate=migrate,
                                                        deadline_s=deadline_s), DrainReply)

    # -- events ---------------------------------------------------------------------------
    async def events(self, instance_id: str = "", *, limit: int = 100,
                     since: float = 0.0) -> EventsReply:
        """The newest `limit` events the broker keeps (0: all), at or after `since`."""
        return await self.request("events", EventsRequest(instance_id=instance_id,
                                                          limit=limit, since=since),
                                  EventsReply)

    async def follow_events(self, instance_id: str = "", *,
                            after: int | None = None) -> EventFeed:
        """Rule 3: every event from now on (or stored after sequence `after`), of one
        instance or all, as an async iterator; it is in place when this returns, and goes
        on where it left off after a reconnect. ``aclose()`` ends it."""
        return EventFeed(await eventstream.follow(self.nc, instance_id, after,
                                                  follow_s=self.timing.follow_s).start())

    # -- services -------------------------------------------------------------------------
    async def deploy(self, spec: Spec, *, key: str = "",
                     on_retry: OnRetry | None = None, check_index: int | None = None,
                     retries: Retries | None = None) -> DeployReply:
        """Create the service `spec` names, or deploy it as its next version (rule 2); with
        `check_index`, only while the service's version index is still that (`plan`)."""
        return await self._again("deploy", DeployRequest(spec=spec, key=key or
                                                         uuid.uuid4().hex,
                                                         check_index=check_index),
                                 DeployReply, on_retry, retries)

    async def wait_deployed(self, name: str, version: int,
                            timeout: float | None = None) -> ServiceStatus:
        """Until `version` of the service `name` is deployed (`count` replicas of it healthy,
        no other version running): its status; `Ended` with the sentence when the deploy
        failed, was rolled back, cancelled or replaced, or the service stopped; `TimedOut`
        past `timeout` (None: no limit). `gavel deploy --wait` is this wait."""
        return await deployed(self, name, version, timeout)

    async def plan(self, spec: Spec) -> PlanReply:
        """Where `spec` would go and what submitting or deploying it would change, asked of
        the nodes as a dry run: nothing is committed or reserved (`gavel.shared.planning`)."""
        return await self.request("plan", PlanRequest(spec=spec), PlanReply)

    async def service(self, name: str) -> ServiceReply:
        return await self.request("service", ServiceRequest(name=name), ServiceReply)

    async def services(self) -> ServicesReply:
        return await self.request("services", ServicesRequest(), ServicesReply)

    async def periodic_jobs(self) -> PeriodicJobsReply:
        """Every periodic job: its schedule, next fire time and latest runs."""
        return await self.request("periodic", PeriodicJobsRequest(), PeriodicJobsReply)

    async def scale(self, name: str, count: int) -> ServiceReply:
        return await self.request("scale", ScaleRequest(name=name, count=count), ServiceReply)

    async def stop(self, name: str) -> ServiceReply:
        return await self.request("stop", StopServiceRequest(name=name), ServiceReply)

    async def rollback(self, name: str, to_version: int = 0) -> ServiceReply:
        return await self.request("rollback", RollbackRequest(name=name,
                                                              to_version=to_version),
                                  ServiceReply)

    # -- routes, logs, the broker ---------------------------------------------------------
    async def endpoints(self) -> EndpointsReply:
        return await self.request("endpoints", EndpointsRequest(), EndpointsReply)

    async def routes(self) -> list[RouteEntry]:
        """The route table a gateway derives from the endpoints (`gavel.shared.routes`)."""
        reply = await self.endpoints()
        return derive(reply.endpoints, reply.nodes)

    async def stats(self) -> StatsReply:
        return await self.request("stats", StatsRequest(), StatsReply)

    async def tune(self, *, batch_max: int | None = None, max_auctions: int | None = None,
                   commit_gap_ms: float | None = None, apply: bool = True) -> TuneReply:
        """`gavel tune`: pin what is given and tune the rest again (all None: tune all), or
        with `apply` False only read the settings and the rounds since the last change
        (`TuneRequest`)."""
        return await self.request("tune", TuneRequest(
            batch_max=batch_max, max_auctions=max_auctions, commit_gap_ms=commit_gap_ms,
            apply=apply), TuneReply)

    async def exec(self, instance_id: str, command: list[str], *,
                   on_output: Callable[[ExecOutput], Any],
                   stdin: AsyncIterator[bytes] | None = None, node_id: str = "",
                   tty: bool = False, timeout_s: float = 0.0, rows: int = 0,
                   cols: int = 0) -> ExecExit:
        """`command` inside the running instance (`gavel exec`, `shared.execstream`): each
        output chunk handed to `on_output`, `stdin`'s bytes as its input; the node's
        `ExecExit` (its ``exit_code``, and ``reason`` when the session ended it early).
        `node_id`: ask that node, without the status API."""
        if not node_id:
            inst = await self.instance(instance_id)
            if not inst.node_id or inst.state != "running":
                raise ClientError(f"{instance_id} is not running ({inst.state}): nothing to "
                                  "exec into")
            node_id = inst.node_id
        start = ExecStart(node_id=node_id, instance_id=instance_id, session=new_session(),
                          command=list(command), tty=tty, timeout_s=timeout_s, rows=rows,
                          cols=cols)
        return await execclient.run(self.nc, start, on_output, stdin=stdin,
                                    operator=operator_of(self.nc))

    async def logs(self, instance_id: str, *, node_id: str = "",
                   streams: list[Stream] | None = None, tail: int = -1, since: float = 0.0,
                   follow: bool = False) -> AsyncIterator[LogChunk | LogsDone]:
        """Rule 3: the instance's output from its node (`node_id`: ask that node, without
        the status API), chunk by chunk, then the `LogsDone` that ended it. A `follow` of an
        instance no node has run yet waits until one does (`started`)."""
        if not node_id:
            inst = await self.instance(instance_id)
            if follow and not has_run(inst):
                inst = await self.started(instance_id)
            if not inst.node_id:
                raise ClientError(f"{instance_id} has not run on a node yet ({inst.state}): "
                                  "it has no output")
            node_id = inst.node_id
        queue: asyncio.Queue[LogChunk | LogsDone | BaseException] = asyncio.Queue()
        req = LogsRequest(node_id=node_id, instance_id=instance_id,
                          streams=streams or ["stdout"], tail=tail, since=since, follow=follow)

        async def pump() -> None:
            try:
                queue.put_nowait(await read(self.nc, req, queue.put))
            except BaseException as exc:  # handed to the iterating caller
                queue.put_nowait(exc)

        task = asyncio.ensure_future(pump())
        try:
            while True:
                got = await queue.get()
                if isinstance(got, BaseException):
                    raise got
                yield got
                if isinstance(got, LogsDone):
                    return
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
