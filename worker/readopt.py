"""Re-adoption: the instances an earlier worker left behind, found again through their
drivers when a worker starts on the same state directory.

Rules:
1. Each instance in ``agent.json`` is asked of its driver (`worker.drivers` rule 3): a run
   found is watched again (a first run its worker never recorded is recorded and reported
   ``running``, its timeout counted from its start); a service whose run ended restarts; a
   job whose run ended ends "exit status unknown"; one that never started fails.
2. A driver that cannot tell (its engine does not answer) does not end the instance: it is
   held, so nothing sweeps its run, and asked again, backing off from `Timing.retry_s` to a
   heartbeat, until it can tell. A stop meanwhile ends it as a stop does; a container that
   still runs then is removed by the next worker's sweep (`worker.containers` rule 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from gavel.shared.messages import EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec
from gavel.shared.timing import Timing
from gavel.worker.drivers import CannotTell, Driver, Run
from gavel.worker.instance import Begin, Held, Life
from gavel.worker.instance import Host as LifeHost

__all__ = ["Host", "adopt_later", "readopt"]

log = logging.getLogger("gavel.worker")


class Host(LifeHost, Protocol):
    """What re-adoption uses of the supervisor."""

    timing: Timing

    def driver(self, spec: Spec) -> Driver: ...

    def identify(self, held: Held) -> None: ...

    def hold(self, held: Held, life: Coroutine[Any, Any, None], what: str) -> None: ...


async def readopt(host: Host, held: Held) -> None:
    """Find `held`'s run again and hold it as found (rule 1), or unsure (rule 2)."""
    host.identify(held)
    try:
        run = await host.driver(held.local.placement.spec).adopt(held)  # finds its cgroup
    except CannotTell as exc:
        log.warning("cannot tell whether instance %s still runs (%s): held, asked again",
                    held.id, exc)
        host.hold(held, adopt_later(host, held), "adopt")
        return
    await _adopted(host, held, run)


async def adopt_later(host: Host, held: Held) -> None:
    """Ask `held`'s driver again until it can tell (rule 2)."""
    delay, spec = host.timing.retry_s, held.local.placement.spec
    while held.stopping is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.stopped.wait(), delay)
        if held.stopping is not None:
            break
        try:
            run = await host.driver(spec).adopt(held)
        except CannotTell:
            delay = min(delay * 2, host.timing.heartbeat_s)
            continue
        if held.timer is not None:
            held.timer.cancel()
        await _adopted(host, held, run)
        return
    await Life(host, held).run(Begin.STOPPED)


async def _adopted(host: Host, held: Held, run: Run | None) -> None:
    """Hold `held` again as its driver found its run (`run`; None: it is gone) (rule 1)."""
    local = held.local
    if local.restart_at:
        begin = Begin.BACKOFF
    else:
        held.proc = run
        if run is not None:
            begin = Begin.WATCH
            if local.state != InstanceState.RUNNING:  # killed before it recorded the run
                await _ran(host, held, run)
        elif local.pid and local.placement.spec.service:
            begin = Begin.ENDED  # a service's end restarts it, seen late or not
        elif local.pid:
            await host.end(held, EventType.EXITED, "",
                           "exit status unknown: process ended while the worker was down")
            return
        else:
            await host.end(held, EventType.FAILED, Reason.DRIVER_FAILED,
                           "the worker restarted before the process started")
            return
    log.info("re-adopted instance %s (%s, pid %d)", held.id, begin.value, local.pid)
    host.hold(held, Life(host, held).run(begin), "life")


async def _ran(host: Host, held: Held, run: Run) -> None:
    """Record a first run found running that its worker did not record, and report it (as
    `worker.instance.Life` does once a run starts): its timeout counts from its start."""
    local = held.local
    run.record(local)
    local.started_at, local.state = local.create_time or time.time(), InstanceState.RUNNING
    await host.emit(held, EventType.RUNNING, "", run.describe(), None,
                    ports=dict(local.placement.ports), taken=[])
