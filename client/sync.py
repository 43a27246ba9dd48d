"""The sync client: `Client`'s methods for code that is not async.

Rule: one event loop on a thread of the client's own runs the async `Client`; each call waits
for its answer there, so a script calls ``SyncClient(...).submit(spec)`` as it would any
function. Iterating methods (`follow_events`, `logs`) yield as the async ones do; `close`
stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from typing import Any, TypeVar

from gavel.client.aio import Client
from gavel.client.runwait import Watch
from gavel.shared.api import (
    CancelReply,
    DeployReply,
    DrainReply,
    EndpointsReply,
    EventsReply,
    InstanceStatus,
    NodesReply,
    PeriodicJobsReply,
    ServiceReply,
    ServicesReply,
    ServiceStatus,
    StatsReply,
    StatusReply,
    SubmitReply,
    TuneReply,
    WhyReply,
)
from gavel.shared.execstream import ExecExit, ExecOutput
from gavel.shared.logstream import LogChunk, LogsDone, Stream
from gavel.shared.messages import Event, Spec
from gavel.shared.planning import PlanReply
from gavel.shared.routes import RouteEntry
from gavel.shared.timing import Timing

__all__ = ["SyncClient", "SyncWatch"]

#: The waits' defaults: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()

R = TypeVar("R")
Y = TypeVar("Y")


class SyncWatch:
    """`Client.watch` for the sync client: hand it to `SyncClient.wait`, and ``close`` it
    (or ``with``) when the waits are over."""

    def __init__(self, client: SyncClient, watch: Watch) -> None:
        self._client, self.watch = client, watch

    def close(self) -> None:
        self._client._run(self.watch.close())

    def __enter__(self) -> SyncWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncClient:
    """`Client.connect(url, creds, ...)` behind plain calls; a context manager too."""

    def __init__(self, url: str = "nats://127.0.0.1:4222", creds: str | None = None,
                 **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gavel-client",
                                        daemon=True)
        self._thread.start()
        #: Iterations handed out and not yet closed (`close` ends them).
        self._open: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        try:
            self.client: Client = self._run(Client.connect(url, creds, **options))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, agen: AsyncIterator[Y]) -> Iterator[Y]:
        gen = self._each(agen)
        self._open.add(gen)
        return gen

    def _each(self, agen: AsyncIterator[Y]) -> Generator[Y, None, None]:
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and self._loop.is_running():
                self._run(aclose())

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        """Ends every iteration still open (its subscription too), the connection, the
        loop."""
        for gen in list(self._open):
            gen.close()
        try:
            self._run(self.client.close())
        finally:
            self._stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, spec: Spec, *, instance_id: str = "", count: int = 1,
               key: str = "") -> SubmitReply:
        return self._run(self.client.submit(spec, instance_id=instance_id, count=count,
                                            key=key))

    def status(self, instance_id: str = "") -> StatusReply:
        return self._run(self.client.status(instance_id))

    def instance(self, instance_id: str) -> InstanceStatus:
        return self._run(self.client.instance(instance_id))

    def watch(self, *instance_ids: str) -> SyncWatch:
        return SyncWatch(self, self._run(self.client.watch(*instance_ids)))

    def wait(self, instance_id: str, timeout: float | None = _TIMING.wait_s, *,
             watch: SyncWatch | None = None) -> InstanceStatus:
        return self._run(self.client.wait(instance_id, timeout,
                                          watch=watch.watch if watch else None))

    def started(self, instance_id: str, timeout: float | None = None) -> InstanceStatus:
        return self._run(self.client.started(instance_id, timeout))

    def wait_nodes(self, count: int, timeout: float = _TIMING.wait_s) -> NodesReply:
        return self._run(self.client.wait_nodes(count, timeout))

    def wait_job(self, job_id: str, timeout: float | None = None) -> StatusReply:
        return self._run(self.client.wait_job(job_id, timeout))

    def wait_system(self, name: str, timeout: float | None = _TIMING.wait_s) -> ServiceStatus:
        return self._run(self.client.wait_system(name, timeout))

    def why(self, instance_id: str) -> WhyReply:
        return self._run(self.client.why(instance_id))

    def cancel(self, instance_id: str) -> CancelReply:
        return self._run(self.client.cancel(instance_id))

    def nodes(self, node_id: str = "") -> NodesReply:
        return self._run(self.client.nodes(node_id))

    def drain(self, node_id: str, *, undo: bool = False, migrate: bool = False,
              deadline_s: float = 0.0) -> DrainReply:
        return self._run(self.client.drain(node_id, undo=undo, migrate=migrate,
                                           deadline_s=deadline_s))

    def events(self, instance_id: str = "", *, limit: int = 100,
               since: float = 0.0) -> EventsReply:
        return self._run(self.client.events(instance_id, limit=limit, since=since))

    def follow_events(self, instance_id: str = "", *,
                      after: int | None = None) -> Iterator[Event]:
        return self._iterate(self._run(self.client.follow_events(instance_id, after=after)))

    def deploy(self, spec: Spec, *, key: str = "", check_index: int | None = None
               ) -> DeployReply:
        return self._run(self.client.deploy(spec, key=key, check_index=check_index))

    def wait_deployed(self, name: str, version: int,
                      timeout: float | None = None) -> ServiceStatus:
        return self._run(self.client.wait_deployed(name, version, timeout))

    def plan(self, spec: Spec) -> PlanReply:
        return self._run(self.client.plan(spec))

    def service(self, name: str) -> ServiceReply:
        return self._run(self.client.service(name))

    def services(self) -> ServicesReply:
        return self._run(self.client.services())

    def periodic_jobs(self) -> PeriodicJobsReply:
        return self._run(self.client.periodic_jobs())

    def scale(self, name: str, count: int) -> ServiceReply:
        return self._run(self.client.scale(name, count))

    def stop(self, name: str) -> ServiceReply:
        return self._run(self.client.stop(name))

    def rollback(self, name: str, to_version: int = 0) -> ServiceReply:
        return self._run(self.client.rollback(name, to_version))

    def endpoints(self) -> EndpointsReply:
        return self._run(self.client.endpoints())

    def routes(self) -> list[RouteEntry]:
        return self._run(self.client.routes())

    def stats(self) -> StatsReply:
        return self._run(self.client.stats())

    def tune(self, *, batch_max: int | None = None, max_auctions: int | None = None,
             commit_gap_ms: float | None = None, apply: bool = True) -> TuneReply:
        return self._run(self.client.tune(batch_max=batch_max, max_auctions=max_auctions,
                                          commit_gap_ms=commit_gap_ms, apply=apply))

    def exec(self, instance_id: str, command: list[str], *,
             on_output: Callable[[ExecOutput], Any], node_id: str = "",
             timeout_s: float = 0.0) -> ExecExit:
        """`Client.exec` without input (`on_output` is called on the client's thread)."""
        return self._run(self.client.exec(instance_id, command, on_output=on_output,
                                          node_id=node_id, timeout_s=timeout_s))

    def logs(self, instance_id: str, *, node_id: str = "",
             streams: list[Stream] | None = None, tail: int = -1, since: float = 0.0,
             follow: bool = False) -> Iterator[LogChunk | LogsDone]:
        return self._iterate(self.client.logs(instance_id, node_id=node_id, streams=streams,
                                              tail=tail, since=since, follow=follow))
