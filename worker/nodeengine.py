"""The node's container engine as its worker holds it: there from the start, or taken up
when it first answers (`worker.engine` rule 5); the container driver over it; what it holds.

Rules:
1. Until an engine answers, image specs go to a driver that declines them
   (`Reason.NO_ENGINE`); while one is still asked for, that driver cannot tell whether a
   container an earlier worker left still runs (`worker.drivers` rule 3), so the instance
   is held, not ended.
2. Once one answers, the worker removes the containers no held instance owns (`sweep`),
   and an engine that does not answer that question leaves them for the next start.
3. The images it holds are asked at every heartbeat, on the engine's threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from gavel.shared.reasons import Reason
from gavel.worker.containers import ContainerDriver, secrets_root
from gavel.worker.drivers import Driver, Unavailable
from gavel.worker.engine import Engine

__all__ = ["NodeEngine"]

log = logging.getLogger("gavel.worker")


class NodeEngine:
    """The worker's engine (None until one answers) and its container driver."""

    def __init__(self, engine: Engine | None, *, find: Callable[[], Engine | None] | None,
                 addresses: list[str], volumes: Mapping[str, str], state_dir: Path,
                 instance_dir: Callable[[str], Path]) -> None:
        self._addresses, self._volumes = addresses, volumes
        self._state_dir, self._instance_dir = state_dir, instance_dir
        #: Asks for the engine again while none answered (None: nobody asks).
        self.find = find if engine is None else None
        self._declined = Unavailable(Reason.NO_ENGINE, unsure="no container engine has "
                                     "answered yet" if self.find is not None else "")
        self.engine: Engine | None = None
        self.containers: ContainerDriver | None = None
        if engine is not None:
            self.attach(engine)

    def driver(self) -> Driver:
        """What runs image specs now (rule 1)."""
        return self.containers or self._declined

    def attach(self, engine: Engine) -> None:
        """Run image specs on `engine` from now on."""
        self.engine = engine
        self.containers = ContainerDriver(
            engine, addresses=self._addresses, volumes=self._volumes,
            secrets_root=secrets_root(self._state_dir), instance_dir=self._instance_dir)

    def images(self) -> frozenset[str]:
        return self.engine.images if self.engine is not None else frozenset()

    async def sweep(self, owned: Mapping[str, int]) -> None:
        """Remove this worker's containers that no held instance owns (rule 2)."""
        if self.containers is None:
            return
        try:
            gone = await self.containers.sweep(owned)
        except Exception as exc:  # the engine's, requests' or the socket's
            log.warning("cannot list this worker's containers (%s): those no instance here "
                        "owns stay until the next start", exc)
            return
        if gone:
            log.info("removed %d container(s) no instance here owns", gone)

    async def wait_for_one(self, every_s: float) -> Engine:
        """Ask for the engine every `every_s` until one answers, and take it up."""
        assert self.find is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            engine = await loop.run_in_executor(None, self.find)
            if engine is not None:
                self.attach(engine)
                log.info("container engine %s answers at %s: image specs are bid on",
                         engine.version, engine.url)
                return engine

    async def learn_images(self) -> bool:
        """Ask what the engine holds now (rule 3); whether that changed."""
        engine = self.engine
        if engine is None:
            return False
        before = engine.images
        try:
            await asyncio.get_running_loop().run_in_executor(engine.calls,
                                                             engine.refresh_images)
        except Exception as exc:  # the engine's, requests' or the socket's
            log.warning("cannot list the engine's images: %s", exc)
        return engine.images != before
