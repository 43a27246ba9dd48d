"""End to end (`gavel bench --end-to-end`): submit -> running and -> healthy as a user feels
it, for a process and for a container of a warm and of a cold image, at a stated offered load.

Rules:
1. The production shape: a nats-server, the broker as a child process (`bench.brokerproc`,
   its defaults: every node asked, its tuning on), one real `gavel worker` child (its
   defaults: cgroups, isolation, the engine it is given) and this process as the user: one
   NATS client that submits, and hears each instance's events on the instance's subject.
2. The offered load: `rate` submissions a second of a short job, one instance each, sent
   through the same client when due (open loop) from before the first measured submission
   until after the last. They land on bench agents (`bench.agents`: a no-op driver, each
   instance ends `LOAD_LIFETIME_S` after it started), never on the measured worker: a load
   job asks for more memory than the worker has, and a measured spec asks for a label only
   the worker carries. So the broker auctions and commits at the offered rate (and every
   node hears every request, the worker too) while the worker starts only what is measured.
   The agents run at `rate` 0 too: the fleet is the same at every load.
3. The measured submissions: `n` of each kind, one at a time, the kinds in turn (process,
   warm container, cold container, process, ...) so the machine's load falls on all alike;
   a first round warms up (the warm image is started there) and is not counted. Each spec
   has an exec check that passes at once (``true``; every second, 10 s to answer). The
   clock runs from just before the submit request to the instance's ``placed``,
   ``running`` and ``healthy`` events; each is then cancelled, and the run waits for it to
   end before it stops.
4. *Warm* and *cold* are `bench.containerstart` rule 2's. Containers need an engine that
   answers and Debian's static busybox to build the images from; without them (or with
   `containers` off) the container kinds are reported skipped, with the sentence why.
5. Every process, container and image the run started or built is stopped or removed.
6. A start whose ``placed`` or ``running`` event never came (a later one did: the events of
   one instance arrive in order), or whose ``healthy`` did not within `_EVENT_WAIT_S` while
   the broker's status says healthy, is counted as `lost_events` of its kind, not timed;
   the run goes on. What a user following the events would not have heard is a figure too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gavel.bench.ceilings import Probe
from gavel.bench.containerstart import build_image
from gavel.bench.endreport import KINDS, STAGES, KindFigures, Report, percentile, summarize
from gavel.bench.interrupt import Interrupted, stopped_by_signals
from gavel.shared import subjects
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    NodesReply,
    NodesRequest,
    StatsReply,
    StatsRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import Event, Spec
from gavel.shared.spec import Check
from gavel.shared.timing import Timing
from gavel.transport import wire
from gavel.transport.client import ClientError, call, connect
from gavel.transport.inbound import Decode, Malformed
from gavel.transport.natsserver import NatsServer
from gavel.worker.engine import Engine
from gavel.worker.engine import connect as engine_connect

__all__ = ["ALL_LOST", "LOAD_LIFETIME_S", "NO_BUSYBOX", "NO_CONTAINERS", "NO_ENGINE",
           "EndToEndFailed", "Options", "run"]

#: Rule 2: how long a load job runs on its agent, the agents, and the memory a load job asks
#: (more than the measured worker's `_WORKER_MEMORY_MB`, far less than an agent's).
LOAD_LIFETIME_S = 1.0
LOAD_AGENTS = 10
_LOAD_MEMORY_MB = 8192
_WORKER_MEMORY_MB = 4096
#: Rule 2: the label only the measured worker carries.
_MEASURED = {"gavel-bench": "measured"}
_BUSYBOX = Path("/bin/busybox")
#: Rule 4's sentences.
NO_CONTAINERS = "--no-containers: containers are not measured"
NO_ENGINE = ("no Docker Engine answers (DOCKER_HOST, else /var/run/docker.sock): containers "
             "are not measured")
ALL_LOST = "every measured start lost an event: nothing to time"
NO_BUSYBOX = (f"no {_BUSYBOX} (Debian's busybox-static) to build the images from: containers "
              "are not measured")
#: A start that takes longer than this is a broken run, not a figure.
_EVENT_WAIT_S = 120.0
#: The measured instance's command: it ends at once on SIGTERM, as PID 1 of a container too.
_COMMAND = ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
#: Rule 3's check: a probe that outlives a loaded engine's exec is not a failure, and one
#: that failed is tried again in a second, not in the default ten.
_CHECK_EVERY_S, _CHECK_TIMEOUT_S = 1.0, 10.0
#: The events that end an instance.
_ENDS = ("exited", "failed", "lost", "error", "cancelled")
#: Where a run without `state` keeps it: not under /tmp, which an isolated instance sees as
#: its own empty tmpfs, so that an exec check (run in the instance's mount namespace, in its
#: directory) would not find the directory it runs in.
_RUN_DIR = "/var/tmp"
#: The load's submissions in flight at most (the rest wait for a place, `_offer`).
_LOAD_IN_FLIGHT = 64


class EndToEndFailed(Exception):
    """The run could not measure: a process that would not start, a start that failed or
    never came; the message says which and names the run's directory, which is kept."""


@dataclass(frozen=True)
class Options:
    n: int = 20
    #: Rule 2: offered submissions a second (0: none).
    rate: float = 0.0
    containers: bool = True
    state: Path | None = None


@dataclass
class _Watch:
    """One measured instance's events: when each of `STAGES` came, and its end. The node
    and the broker send an instance's events in order, so a stage heard before an earlier
    one was is the end of the wait: the earlier one's event was `lost` (rule 6)."""

    seen: dict[str, float] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    failure: str = ""
    all_seen: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def heard(self, event: Event, at: float) -> None:
        kind = str(event.type)
        if kind in STAGES:
            self.seen.setdefault(kind, at)
            self.lost = [s for s in STAGES[:STAGES.index(kind)] if s not in self.seen]
            if self.lost:
                self.all_seen.set()
        elif kind in _ENDS or kind in ("unhealthy", "unschedulable"):
            if len(self.seen) < len(STAGES) and not self.failure:
                self.failure = ": ".join(x for x in (kind, event.reason, event.detail) if x)
                self.all_seen.set()
            if kind in _ENDS:
                self.ended.set()
        if len(self.seen) == len(STAGES):
            self.all_seen.set()


@dataclass
class _Tally:
    sent: int = 0
    refused: int = 0


async def run(opts: Options) -> Report:
    """One run, in `opts.state` or a temporary directory (removed after a run that measured;
    a failed run's is kept and named)."""
    root = opts.state if opts.state is not None else Path(tempfile.mkdtemp(
        prefix="gavel-e2e-", dir=_RUN_DIR if Path(_RUN_DIR).is_dir() else None))
    root.chmod(0o755)  # as any state directory: an instance's uid passes through to its own
    try:
        report = await stopped_by_signals(_run_in(opts, root))
    except Interrupted as exc:
        raise EndToEndFailed(f"{exc} (the run's state is kept in {root})") from None
    except Exception as exc:
        first = _first(exc)
        raise EndToEndFailed(f"{type(first).__name__}: {first or 'no detail'} (the run's state "
                             f"is kept in {root})") from exc
    if opts.state is None:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _first(exc: BaseException) -> BaseException:
    """What went wrong, out of the task groups' wrapping."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _engine(opts: Options, node: str, home: Path) -> tuple[Engine | None, str]:
    """Rule 4: the engine the containers run on, or None and the sentence why not."""
    if not opts.containers:
        return None, NO_CONTAINERS
    if not _BUSYBOX.exists():
        return None, NO_BUSYBOX
    engine = engine_connect("auto", node_id=node, home=str(home))
    return engine, "" if engine is not None else NO_ENGINE


def _spawn(argv: list[str], log: Path, stdout: int = subprocess.DEVNULL
           ) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", *argv], stdout=stdout, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)


async def _run_in(opts: Options, root: Path) -> Report:
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    node = f"e2e-{os.getpid()}"
    engine, skipped = _engine(opts, node, root / "worker")
    server = NatsServer(store_dir=root / "nats", log=logs / "nats.log").start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    built: list[str] = []
    try:
        procs["the broker"] = _spawn(["gavel.bench.brokerproc", "--url", server.url,
                                      "--state", str(root)], logs / "broker.log")
        agents = _spawn(["gavel.bench.agents", "--url", server.url, "--count",
                         str(LOAD_AGENTS), "--lifetime-s", str(LOAD_LIFETIME_S),
                         "--heartbeat-s", str(Timing.from_env(os.environ).heartbeat_s)],
                        logs / "agents.log", stdout=subprocess.PIPE)
        procs["the load's agents"] = agents
        assert agents.stdout is not None
        if (await asyncio.to_thread(agents.stdout.readline)).strip() != b"ready":
            raise RuntimeError(f"the load's agents did not start; see {logs / 'agents.log'}")
        procs["the worker"] = _spawn(
            ["gavel", "worker", "--nats", server.url, "--node-id", node, "--state",
             str(root / "worker"), "--cpu", "4", "--memory-mb", str(_WORKER_MEMORY_MB),
             "--labels", ",".join(f"{k}={v}" for k, v in _MEASURED.items()),
             "--engine", engine.url if engine is not None else "off",
             "--log-level", "WARNING"], logs / "worker.log")
        nc = await connect(server.url)
        try:
            await _until_heard(nc, LOAD_AGENTS + 1, procs, logs)
            return await _measure(nc, opts, server.url, engine, skipped, node, built)
        finally:
            await nc.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()
        if engine is not None:
            _remove(engine, node, built)
            engine.close()


def _remove(engine: Engine, node: str, images: list[str]) -> None:
    """Rule 5: the worker's containers (a cancelled one may not be removed yet), then the
    images the run built."""
    client = engine.client
    for c in client.containers.list(all=True, filters={"label": f"gavel.node={node}"}):
        with contextlib.suppress(Exception):
            c.remove(force=True)
    for name in images:
        try:
            client.images.remove(name, force=True)
        except Exception as exc:
            print(f"could not remove {name}: {exc}", file=sys.stderr)


async def _until_heard(nc: Any, nodes: int, procs: dict[str, subprocess.Popen[bytes]],
                       logs: Path, within_s: float = 90.0) -> None:
    """Every node healthy at the broker, or a sentence: which process exited, or time."""
    deadline = time.monotonic() + within_s
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode}; see {logs}")
        with contextlib.suppress(ClientError):  # the broker may still be starting
            stats = await call(nc, "stats", StatsRequest(), StatsReply, timeout=10)
            if stats.nodes_healthy >= nodes:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not hear all {nodes} nodes within "
                               f"{within_s:g}s; see {logs}")
        await asyncio.sleep(0.2)


def _spec(kind: str, image: str | None) -> Spec:
    # An exec check's command is not looked up in PATH: it names its program's path.
    check = Check(type="exec", command=[str(_BUSYBOX), "true"] if image
                  else [shutil.which("true") or "/bin/true"],
                  interval_s=_CHECK_EVERY_S, timeout_s=_CHECK_TIMEOUT_S)
    return Spec(name=kind, image=image, command=_COMMAND, cpu=0.01, memory_mb=16,
                labels=dict(_MEASURED), checks=[check])


async def _measure(nc: Any, opts: Options, url: str, engine: Engine | None, skipped: str,
                   node: str, built: list[str]) -> Report:
    kinds = KINDS if engine is not None else KINDS[:1]
    if engine is not None:
        built.append(await asyncio.to_thread(build_image, engine.client, f"{node}-warm",
                                             "warm"))
    samples: dict[str, dict[str, list[float]]] = {k: {s: [] for s in STAGES} for k in kinds}
    watches: list[_Watch] = []
    lost = dict.fromkeys(kinds, 0)
    tally, stop = _Tally(), asyncio.Event()
    probe = Probe(url)
    await probe.start()
    load0, began = os.getloadavg()[0], time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            if opts.rate > 0:
                tg.create_task(_offer(nc, opts.rate, stop, tally), name="offered-load")
            try:
                for i in range(opts.n + 1):  # rule 3: round 0 warms up
                    for kind in kinds:
                        image = await _image(kind, i, engine, node, built)
                        watch = _Watch()
                        watches.append(watch)
                        took = await _one(nc, _spec(kind, image), f"{kind}-{i}", watch)
                        if i and took is None:
                            lost[kind] += 1
                        elif i and took is not None:
                            for stage in STAGES:
                                samples[kind][stage].append(took[stage])
            finally:
                stop.set()
    finally:
        rr_p99 = await probe.stop()
    seconds, load1 = time.perf_counter() - began, os.getloadavg()[0]
    rr_p50 = 1000 * percentile(probe.took, 0.5) if probe.took else 0.0
    stats = await call(nc, "stats", StatsRequest(), StatsReply, timeout=30)
    nodes = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=30)
    await _ended(watches)
    figures = [summarize(k, samples[k], rr_p50, lost[k]) if samples[k]["running"] else
               KindFigures(kind=k, lost_events=lost[k], skipped=ALL_LOST) for k in kinds]
    figures += [KindFigures(kind=k, skipped=skipped) for k in KINDS if k not in kinds]
    return Report(n=opts.n, offered_per_s=opts.rate, sent_per_s=round(tally.sent / seconds, 1),
                  load_refused=tally.refused, loadavg_start=round(load0, 2),
                  loadavg_end=round(load1, 2), cores=os.cpu_count() or 1,
                  nats_reqreply_p50_ms=round(rr_p50, 3), nats_reqreply_p99_ms=round(rr_p99, 3),
                  round_p50_ms=round(stats.round_p50_ms, 2),
                  round_p99_ms=round(stats.round_p99_ms, 2), seconds=round(seconds, 1),
                  kinds=figures, rejected=dict(nodes.rejected))


async def _image(kind: str, i: int, engine: Engine | None, node: str, built: list[str]
                 ) -> str | None:
    """Rule 4: the image of round `i`'s container of `kind` (None: the process); a cold
    one is built here, off the clock."""
    if kind == "process" or engine is None:
        return None
    if kind == "container-warm":
        return built[0]
    image = await asyncio.to_thread(build_image, engine.client, f"{node}-cold-{i}",
                                    f"cold-{i}-{time.time()}")
    built.append(image)
    return image


async def _one(nc: Any, spec: Spec, iid: str, watch: _Watch) -> dict[str, float] | None:
    """Rule 3 for one submission: ms from the submit request to each of `STAGES` (None: an
    event was lost, rule 6)."""
    decode: Decode[Event] = Decode(Event)

    async def on_event(msg: Any) -> None:
        event = decode(msg.data)
        if not isinstance(event, Malformed):
            watch.heard(event, time.perf_counter())
        if watch.ended.is_set():
            await sub.unsubscribe()

    sub = await nc.subscribe(subjects.EVENTS.format(instance=iid), cb=on_event)
    await wire.subscribed(nc)  # the events come after the SUB, never before it
    sent = time.perf_counter()
    await call(nc, "submit", SubmitRequest(spec=spec, instance_id=iid), SubmitReply, timeout=30)
    try:
        await asyncio.wait_for(watch.all_seen.wait(), _EVENT_WAIT_S)
    except TimeoutError:
        got = await call(nc, "status", StatusRequest(instance_id=iid), StatusReply, timeout=30)
        if not any(st.health == "healthy" for st in got.instances):
            raise RuntimeError(f"{iid}: only {sorted(watch.seen) or 'no event'} within "
                               f"{_EVENT_WAIT_S:g}s of its submission") from None
        watch.lost = [s for s in STAGES if s not in watch.seen]  # the broker says healthy
    if watch.failure:
        raise RuntimeError(f"{iid} did not start: {watch.failure}")
    await call(nc, "cancel", CancelRequest(instance_id=iid), CancelReply, timeout=30)
    if watch.lost:  # rule 6
        return None
    return {s: 1000 * (watch.seen[s] - sent) for s in STAGES}


async def _ended(watches: list[_Watch], within_s: float = 60.0) -> None:
    """Rule 3's end: every measured instance's end heard (a cancelled container stops in
    the background), or a line on stderr saying how many were not."""
    pending = [asyncio.ensure_future(w.ended.wait()) for w in watches if not w.ended.is_set()]
    if not pending:
        return
    _, left = await asyncio.wait(pending, timeout=within_s)
    for task in left:
        task.cancel()
    if left:
        print(f"{len(left)} measured instances had not ended {within_s:g}s after the run; "
              "the bench removes their containers", file=sys.stderr)


async def _offer(nc: Any, rate: float, stop: asyncio.Event, tally: _Tally) -> None:
    """Rule 2: a load job due every 1/`rate` s until `stop`, each sent when due and a
    place among `_LOAD_IN_FLIGHT` is free; at `stop` those still waiting for a place are
    not sent (a broker that answers slower than it is offered leaves `sent` behind)."""
    spec = Spec(name="load", command=["true"], cpu=0.01, memory_mb=_LOAD_MEMORY_MB)
    room = asyncio.Semaphore(_LOAD_IN_FLIGHT)
    began = time.perf_counter()

    async def submit(k: int) -> None:
        async with room:
            if stop.is_set():
                return
            tally.sent += 1
            try:
                await call(nc, "submit", SubmitRequest(spec=spec, instance_id=f"load-{k:07d}"),
                           SubmitReply, timeout=60)
            except ClientError:
                tally.refused += 1

    async with asyncio.TaskGroup() as tg:
        due_count = 0
        while not stop.is_set():
            due = began + due_count / rate - time.perf_counter()
            if due > 0:
                await asyncio.sleep(due)
                continue
            tg.create_task(submit(due_count))
            due_count += 1
