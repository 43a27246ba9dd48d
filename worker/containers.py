"""The Docker driver: an instance whose spec names an `image` runs as a container of the
node's engine (`worker.engine`).

Rules:
1. Command: the spec's `command`, when given, replaces the image's CMD; its ENTRYPOINT is
   kept (``docker run IMAGE ARGS...``).
2. Environment: the spec's env and the GAVEL_* variables (PORT, GAVEL_PORT_<NAME>, ...), not
   the worker's PATH/HOME/LANG: the image's own stand. Secrets are never in the container's
   environment (an engine shows a container's environment to anyone who may inspect it):
   each is the file ``/run/secrets/<name>`` (Docker's convention), mounted read-only from a
   directory in memory (``/dev/shm``), never on disk, removed when the instance ends.
3. Ports: each allocated port is published to the same port in the container's own network
   namespace, on 127.0.0.1 and the node's advertised address only (never 0.0.0.0): the
   program listens on $PORT as a process does, and checks and routes reach the same port
   number a process's would, while the container keeps a network of its own.
4. Limits and privileges, by the engine: cpu (a quota of `cpu` cores), memory (`memory_mb`,
   no swap), `pids`, no new privileges, every capability dropped. A container the kernel
   killed for its memory ends with `Reason.MEMORY_EXCEEDED`, as a process does: the engine's
   ``OOMKilled``, or, for a run it says ended by SIGKILL otherwise, the kernel's own log
   (`worker.kernellog`: an engine misses a kill in the first milliseconds of a run).
5. Output: the container's stdout and stderr are appended to the instance's ``stdout.log``
   and ``stderr.log`` (rotated like a process's, `worker.logfiles`) by one thread per run,
   attached before the container starts, so nothing it writes is missed; the run ends
   only once its output is all written. The thread and the rotation take turns
   (`worker.logturns`), so rotation loses none of it either. A container re-adopted after
   a worker restart is attached again from then on: what it wrote while no worker ran is
   in the engine's own log only.
6. Stop: SIGTERM, then SIGKILL after the grace, as for a process. Each run is a new container
   (a restart in place removes the old one first, as a fresh process starts from its
   image); an instance's containers go when it ends.
7. Re-adoption: a container is found again by the id in the instance's local record (or,
   when a worker was killed after the container started and before it recorded the id, by
   its labels: the one running container of that attempt), and trusted only if its labels
   name this worker, the instance and the attempt, and it still runs. At start, `sweep`
   removes this worker's containers that no held instance owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from gavel.shared.spec import Spec
from gavel.worker.checks import OUTPUT_MAX
from gavel.worker.drivers import CannotTell, Held, StartFailed
from gavel.worker.engine import ATTEMPT, HOME, INSTANCE, Engine, get
from gavel.worker.execsession import ContainerSession
from gavel.worker.kernellog import oom_killed as kernel_says_oom
from gavel.worker.localstate import LocalInstance
from gavel.worker.logturns import writing

__all__ = ["SECRETS_PATH", "ContainerDriver", "ContainerRun", "secrets_root"]

log = logging.getLogger("gavel.worker.containers")

#: Where a container finds its secrets, one file per name (rule 2).
SECRETS_PATH = "/run/secrets"
_MB = 1024 * 1024
_BASE_KEYS = ("PATH", "HOME", "LANG")
_SIGKILLED = 128 + signal.SIGKILL  # the status an engine gives a run ended by SIGKILL


def secrets_root(state_dir: Path) -> Path:
    """Where this worker's containers' secrets live (rule 2): in memory (``/dev/shm``), one
    directory per worker state directory, readable by root only."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
    return base / f"gavel-secrets-{tag}"


class ContainerRun:
    """One run of an instance as a container (rules 5-7)."""

    def __init__(self, engine: Engine, container_id: str, *, started: float, adopted: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.id = container_id
        self._started = started
        self._adopted = adopted
        self._loop = loop
        self._exited: asyncio.Future[int | None] = loop.create_future()
        self._detached = threading.Event()
        self.oom_killed = False
        self.pid = 0
        #: The directory in memory its secrets are mounted from (rule 2).
        self.secrets: Path | None = None

    @property
    def started(self) -> float:
        return self._started

    @property
    def adopted(self) -> bool:
        return self._adopted

    def describe(self) -> str:
        return f"container {self.id[:12]}"

    def record(self, local: LocalInstance) -> None:
        local.container, local.pid, local.create_time = self.id, self.pid, self._started

    async def wait(self) -> int | None:
        return await asyncio.shield(self._exited)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM, SIGKILL after `grace_s` (rule 6): two short calls, the grace waited here,
        never on an engine thread (the engine's own ``stop`` would hold one through it)."""
        api = self.engine.client.api
        with contextlib.suppress(Exception):  # gone already: its wait says how it ended
            await self._call(lambda: api.kill(self.id, "SIGTERM"))
        try:
            return await asyncio.wait_for(self.wait(), grace_s)
        except TimeoutError:
            log.info("container %s ignored SIGTERM for %.1fs: SIGKILL", self.id[:12], grace_s)
        with contextlib.suppress(Exception):
            await self._call(lambda: api.kill(self.id, "SIGKILL"))
        return await self.wait()

    def detach(self) -> None:
        self._detached.set()
        if not self._exited.done():
            self._exited.cancel()

    async def cleanup(self, stopped: bool) -> None:
        del stopped
        await self._remove()

    async def release(self) -> None:
        await self._remove()
        if self.secrets is not None:
            shutil.rmtree(self.secrets, ignore_errors=True)

    def exceeded(self, code: int | None) -> bool:
        del code
        return self.oom_killed

    async def execute(self, command: Sequence[str], env: Mapping[str, str],
                      cwd: Path) -> tuple[bool, str]:
        """An exec check inside the container, with the container's own environment. The
        engine cannot end an exec: one the probe gives up on (its timeout, the checks
        stopping) is killed by its host pid before the probe returns, so it never outlives
        the check."""
        del env, cwd
        api = self.engine.client.api
        try:
            exec_id = (await self._call(lambda: api.exec_create(
                self.id, list(command), stdout=True, stderr=True)))["Id"]
        except Exception as exc:
            return False, f"cannot exec in the container: {_sentence(exc)}"
        try:
            out = await self._call(lambda: api.exec_start(exec_id))
            code = (await self._call(lambda: api.exec_inspect(exec_id))).get("ExitCode")
        except asyncio.CancelledError:  # killed before the probe gives up: the next probe
            # starts only once this one is gone (on a busy engine a kill left to run later
            # still ran beside the next probe)
            await asyncio.shield(self._call(lambda: self._kill_exec(exec_id)))
            raise
        except Exception as exc:
            return False, f"cannot exec in the container: {_sentence(exc)}"
        text = out[-OUTPUT_MAX:].decode("utf-8", "replace").strip()
        return code == 0, f"exit status {code}" + (f": {text}" if text else "")

    async def open(self, command: Sequence[str], env: Mapping[str, str], cwd: Path, *,
                   tty: bool = False, rows: int = 0, cols: int = 0) -> ContainerSession:
        """A `gavel exec` command inside the container, with its own environment."""
        del env, cwd
        return await ContainerSession.open(self.engine.client.api, self.id, command, tty=tty,
                                           rows=rows, cols=cols)

    def _kill_exec(self, exec_id: str) -> None:
        with contextlib.suppress(Exception):  # ended meanwhile, or not ours to signal
            info = self.engine.client.api.exec_inspect(exec_id)
            if info.get("Running") and info.get("Pid"):
                os.kill(int(info["Pid"]), signal.SIGKILL)

    # -- the engine's threads ---------------------------------------------------------------

    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await self._loop.run_in_executor(self.engine.calls, fn)

    async def _remove(self) -> None:
        api = self.engine.client.api
        with contextlib.suppress(Exception):  # already gone
            await self._call(lambda: api.remove_container(self.id, force=True))

    def follow(self, stream: Any, cwd: Path) -> None:
        """Start the thread that writes the output and then settles the exit (rule 5)."""
        threading.Thread(target=self._follow, args=(stream, cwd), daemon=True,
                         name=f"gavel-container-{self.id[:12]}").start()

    def _follow(self, stream: Any, cwd: Path) -> None:
        api = self.engine.client.api
        code: int | None = None
        try:
            with open(cwd / "stdout.log", "ab", buffering=0) as out, \
                    open(cwd / "stderr.log", "ab", buffering=0) as err, \
                    writing(cwd) as turn:  # rotation loses none of it (`worker.logturns`)
                for stdout, stderr in stream:
                    if self._detached.is_set():
                        return
                    with turn:
                        if stdout:
                            out.write(stdout)
                        if stderr:
                            err.write(stderr)
            if self._detached.is_set():
                return
            code = api.wait(self.id, timeout=None)["StatusCode"]
            state = api.inspect_container(self.id)["State"]
            self.oom_killed = bool(state.get("OOMKilled")) or (
                code == _SIGKILLED and kernel_says_oom(self.id))
        except Exception as exc:  # the engine went away or removed it: status unknown
            log.warning("lost container %s: %s", self.id[:12], _sentence(exc))
        self._settle(code)

    def _settle(self, code: int | None) -> None:
        def settle() -> None:
            if not self._exited.done():
                self._exited.set_result(code)

        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            self._loop.call_soon_threadsafe(settle)


class ContainerDriver:
    """Runs image specs on `engine` (rules 1-7)."""

    def __init__(self, engine: Engine, *, addresses: Sequence[str],
                 volumes: Mapping[str, str], secrets_root: Path,
                 instance_dir: Callable[[str], Path]) -> None:
        self.engine = engine
        self.instance_dir = instance_dir
        self.addresses = list(dict.fromkeys(addresses))
        self.volumes = dict(volumes)
        self.secrets_root = secrets_root

    async def start(self, held: Held, env: Mapping[str, str], cwd: Path) -> ContainerRun:
        loop = asyncio.get_running_loop()
        spec = held.local.placement.spec
        secrets = self._write_secrets(held)
        try:
            return await loop.run_in_executor(
                self.engine.calls, self._start, held, self._env(spec, env), cwd, secrets, loop)
        except StartFailed:
            raise
        except Exception as exc:  # the engine's refusal, in its words
            raise StartFailed(_sentence(exc)) from exc

    async def adopt(self, held: Held) -> ContainerRun | None:
        """The container of `held`'s attempt if it still runs (rule 7), asked on the engine's
        threads (`worker.engine` rule 1); raises `CannotTell` when the engine does not answer
        (a container that may be healthy is not given up for an engine's hiccup)."""
        if held.local.restart_at:
            return None
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.engine.calls, self._adopt, held, loop)
        except CannotTell:
            raise
        except Exception as exc:  # the engine's, requests' or the socket's
            if _status(exc) == 404:  # removed between the questions
                return None
            raise CannotTell(_sentence(exc)) from exc

    def _adopt(self, held: Held, loop: asyncio.AbstractEventLoop) -> ContainerRun | None:
        """Blocking: find, check and attach the recorded container (rule 7)."""
        api = self.engine.client.api
        cid = held.local.container or self._unrecorded(held)
        if not cid:
            return None
        try:
            info = api.inspect_container(cid)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise
        labels, state = info["Config"].get("Labels") or {}, info["State"]
        if (labels.get(HOME) != self.engine.home or labels.get(INSTANCE) != held.id
                or labels.get(ATTEMPT) != str(held.attempt) or not state.get("Running")):
            return None
        run = ContainerRun(self.engine, cid, started=_time(state["StartedAt"]),
                           adopted=True, loop=loop)
        run.pid = int(state.get("Pid") or 0)
        stream = api.attach(cid, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        run.secrets = self.secrets_root / held.id
        run.follow(stream, self.instance_dir(held.id))
        return run

    def _unrecorded(self, held: Held) -> str:
        """The running container of `held`'s attempt found by its labels, for a record
        without its id (rule 7); "" unless there is exactly one."""
        labels = [*self.engine.filters(held.id)["label"], f"{ATTEMPT}={held.attempt}"]
        found = self.engine.client.api.containers(filters={"label": labels})
        return str(found[0]["Id"]) if len(found) == 1 else ""

    async def sweep(self, owned: Mapping[str, int]) -> int:
        """Remove this worker's containers that no held instance owns (`owned`: instance ->
        attempt); how many went (rule 7). Listed with a plain GET: an idle worker with
        nothing to remove never loads the SDK (`worker.engine` rule 2)."""
        engine = self.engine

        def run() -> int:
            query = urlencode({"all": "1", "filters": json.dumps(engine.filters())})
            gone = 0
            for c in get(engine.url, f"/containers/json?{query}", engine.timing.engine_ask_s):
                labels = c.get("Labels") or {}
                if owned.get(labels.get(INSTANCE, "")) == int(labels.get(ATTEMPT, "0") or 0) \
                        and c.get("State") == "running":
                    continue
                with contextlib.suppress(Exception):
                    engine.client.api.remove_container(c["Id"], force=True)
                    gone += 1
            return gone

        return int(await asyncio.get_running_loop().run_in_executor(engine.calls, run))

    # -- starting -----------------------------------------------------------------------------

    def _env(self, spec: Spec, env: Mapping[str, str]) -> dict[str, str]:
        """Rule 2: the spec's env and GAVEL_*, without secrets or the worker's own."""
        drop = set(spec.secrets) | (set(_BASE_KEYS) - set(spec.env))
        return {k: v for k, v in env.items() if k not in drop}

    def _write_secrets(self, held: Held) -> Path | None:
        spec = held.local.placement.spec
        if not spec.secrets:
            return None
        values = held.secret_env or {}
        self.secrets_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.secrets_root, 0o700)
        d = self.secrets_root / held.id
        d.mkdir(mode=0o755, exist_ok=True)
        for name in spec.secrets:
            path = d / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
            with os.fdopen(fd, "w") as f:
                f.write(values.get(name, ""))
        return d

    def _start(self, held: Held, env: dict[str, str], cwd: Path, secrets: Path | None,
               loop: asyncio.AbstractEventLoop) -> ContainerRun:
        """Blocking: remove what an earlier run left, create, attach, start (rules 1-6)."""
        engine, spec = self.engine, held.local.placement.spec
        api = engine.client.api
        for old in api.containers(all=True, filters=engine.filters(held.id)):
            with contextlib.suppress(Exception):
                api.remove_container(old["Id"], force=True)
        assert spec.image is not None
        self._ensure_image(spec.image)
        binds: dict[str, dict[str, str]] = {}
        for v in spec.volumes:
            host = self.volumes.get(v.name)
            if host is None:
                raise StartFailed(f"this node holds no host volume {v.name!r}")
            binds[host] = {"bind": v.path, "mode": "rw"}
        if secrets is not None:
            binds[str(secrets)] = {"bind": SECRETS_PATH, "mode": "ro"}
        ports = held.local.placement.ports
        host_config = api.create_host_config(
            port_bindings={f"{p}/tcp": [(a, p) for a in self.addresses] for p in ports.values()},
            binds=binds or None,
            mem_limit=spec.memory_mb * _MB, memswap_limit=spec.memory_mb * _MB,
            nano_cpus=max(1, round(spec.cpu * 1e9)), pids_limit=spec.pids,
            security_opt=["no-new-privileges"], cap_drop=["ALL"],
            restart_policy={"Name": "no"})
        created = api.create_container(
            spec.image, command=list(spec.command) or None, environment=env,
            labels=engine.labels(held.id, held.attempt), host_config=host_config,
            ports=[(p, "tcp") for p in ports.values()], stdin_open=False, tty=False,
            detach=True)
        cid = created["Id"]
        cwd.mkdir(mode=0o700, parents=True, exist_ok=True)  # the worker's, not the container's
        os.chmod(cwd, 0o700)
        try:
            stream = api.attach(cid, stdout=True, stderr=True, stream=True, logs=True,
                                demux=True)
            api.start(cid)
            state = api.inspect_container(cid)["State"]
        except Exception:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True)
            raise
        run = ContainerRun(engine, cid, started=_time(state.get("StartedAt", "")) or time.time(),
                           adopted=False, loop=loop)
        run.pid = int(state.get("Pid") or 0)
        run.secrets = secrets
        run.follow(stream, cwd)
        return run

    def _ensure_image(self, image: str) -> None:
        """The image, pulled where the node lacks it; a failed pull is the registry's
        sentence."""
        from docker.errors import ImageNotFound

        client = self.engine.client
        try:
            client.images.get(image)
            return
        except ImageNotFound:
            pass
        try:
            client.images.pull(image)
        except Exception as exc:
            raise StartFailed(f"image {image} is not on this node and cannot be pulled: "
                              f"{_sentence(exc)}") from exc
        with contextlib.suppress(Exception):
            self.engine.refresh_images()


def _time(text: str) -> float:
    """An engine timestamp (RFC 3339, nanoseconds) as wall-clock seconds; 0 if unreadable."""
    if not text or text.startswith("0001-"):
        return 0.0
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        at = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    except ValueError:
        return 0.0
    return at.timestamp() + (float(f"0.{frac}") if frac.isdigit() else 0.0)


def _sentence(exc: BaseException) -> str:
    """The engine's own explanation of a failure, on one line."""
    text = getattr(exc, "explanation", None) or str(exc) or type(exc).__name__
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " ".join(str(text).split())[:512]


def _status(exc: BaseException) -> int | None:
    """The HTTP status of an engine's refusal (the SDK's ``APIError.status_code``), if any."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None
