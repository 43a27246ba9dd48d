"""The instances this node holds: start them, watch them, time them out, stop them.

Rules: an award is recorded and persisted before ``provisioning`` is reported, and one
instance never runs twice (it is held, or that attempt already ended here); nothing awaits
between the "held?" check and holding it, so an award message and the same award fetched by
convergence cannot both start it. Every instance ends exactly once, through `end`, which
reports how it ended and then persists (a crash in between repeats the report after a
restart rather than losing it) — except a fenced one: the broker moved it away, so its end
is logged, not reported, and the attempt is not remembered as run (if the broker places it
here again, convergence may start it again). An instance stopped because the worker shuts
down is reported but not remembered as run either: if no broker heard the report, its
node.json still lists it, and the next worker on this node starts that attempt again. Ports
are checked before the process starts (`worker.ports`); ``provisioning`` and ``running``
carry the real ports and the ones found taken. Secret values go to the child's environment
only: never into a log line, never into ``agent.json``. With a cgroup hierarchy
(`worker.cgroups`) each instance has a cgroup of its own, limited to its award, that every
run of its process enters; the cgroup goes once the instance has ended (never between
restarts in place), and a process left running for the next worker keeps it.

What happens between an instance's start and its end (restarts in place, health checks, a
process the kernel killed for its memory) is its `worker.instance.Life`.

Epochs: with several brokers (`broker.ha`) every award, cancel, KV entry and assignment
answer names the leadership that sent it. `admit` refuses one of an older epoch than the
newest this node has heard from (a deposed leader, paused or cut off, speaking late), and
remembers a newer one in ``agent.json`` before anything acts on it. Epoch 0 is a broker
without HA: there is nothing to compare, and it is admitted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any

from gavel.shared.execstream import Ended
from gavel.shared.messages import (
    Award,
    Capacity,
    EventType,
    InstanceReport,
    InstanceState,
    Victim,
)
from gavel.shared.reasons import Reason
from gavel.shared.records import Placement
from gavel.shared.spec import Spec
from gavel.shared.timing import Timing
from gavel.transport.tasks import Tasks
from gavel.worker.cgroups import Hierarchy, release
from gavel.worker.driver import instance_env
from gavel.worker.drivers import Driver, ProcessDriver, Target
from gavel.worker.instance import Begin, Held, Life, Report, Secrets
from gavel.worker.isolation import Identity, Isolation, off, processes, zombie
from gavel.worker.localstate import FINISHED_KEPT, AgentFile, LocalInstance, load, save
from gavel.worker.ports import assign
from gavel.worker.readopt import readopt
from gavel.worker.usage import Meter

__all__ = ["OLDER_ANSWER", "OLDER_AWARD", "OLDER_CANCEL", "OLDER_NODE", "Report",
           "Supervisor"]

log = logging.getLogger("gavel.worker")


async def _no_secrets(_iid: str, _attempt: int) -> dict[str, str] | None:
    return None


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: What a node ignores from a broker of an older leadership (the kinds it counts).
OLDER_AWARD = "award from an older leadership"
OLDER_CANCEL = "cancel from an older leadership"
OLDER_NODE = "node.json from an older leadership"
OLDER_ANSWER = "assignment answer from an older leadership"


class Supervisor:
    """Owns the held instances and ``<state_dir>/agent.json``; `on_change` runs whenever
    what the node has committed changes."""

    def __init__(self, *, node_id: str, state_dir: Path, timing: Timing,
                 port_range: tuple[int, int], report: Report,
                 on_change: Callable[[], None],
                 reserved: Callable[[str], Collection[int]] = lambda _iid: (),
                 secrets: Secrets = _no_secrets,
                 cgroups: Hierarchy | None = None,
                 isolation: Isolation | None = None,
                 drivers: Callable[[Spec], Driver] | None = None,
                 volumes: Mapping[str, str] | None = None) -> None:
        self.node_id = node_id
        self.state_dir = state_dir
        self.timing = timing
        self.port_range = port_range
        self._report = report
        self._on_change = on_change
        #: Ports node.json gives to instances other than the one named, or blocks.
        self._reserved = reserved
        self._secrets = secrets
        #: Where instances' cgroups live (None: resources are not enforced).
        self.cgroups = cgroups
        self.isolation = isolation or off()
        #: Who each held instance runs as, once its first run was confined.
        self._identities: dict[str, Identity | None] = {}
        #: The exec driver (`worker.drivers`), each run confined as `confine` says.
        self.process = ProcessDriver(poll_s=timing.tick_s, cgroups=cgroups, node_id=node_id,
                                     volumes=volumes, confine=self.confine)
        #: Which driver runs a spec: the exec driver unless told otherwise.
        self._drivers: Callable[[Spec], Driver] = drivers or (lambda _spec: self.process)
        self.meter = Meter()
        self._path = state_dir / "agent.json"
        self._held: dict[str, Held] = {}
        self._finished: collections.deque[str] = collections.deque(maxlen=FINISHED_KEPT)
        #: Each instance's life and each stop under way (`transport.tasks`): a crash is
        #: reported as it happens; `shutdown` waits for them.
        self._lives = Tasks("supervisor", log)
        self._stoppers = Tasks("supervisor", log)
        #: The newest leadership epoch heard from (module docstring).
        self.epoch = 0

    def admit(self, epoch: int) -> bool:
        """Whether a message of leadership `epoch` may be acted on (module docstring)."""
        if epoch == 0 or epoch == self.epoch:
            return True
        if epoch < self.epoch:
            return False
        log.info("leadership epoch %d (was %d)", epoch, self.epoch)
        self.epoch = epoch
        self.persist()
        return True

    # -- what the node holds ----------------------------------------------------------------

    def committed(self) -> Capacity:
        total = Capacity()
        for h in self._held.values():
            total.charge(h.local.placement.reserves())
        return total

    def residents(self) -> tuple[Victim, ...]:
        """What this node may offer to stop for higher-priority work (`shared.preemption`
        rule 2): every held instance but those being stopped and a system job's, whose
        instance belongs on this node alone."""
        return tuple(
            Victim(instance_id=h.id, priority=spec.priority, cpu=spec.cpu,
                   memory_mb=spec.memory_mb, ports=len(h.local.placement.ports))
            for h in self._held.values()
            if h.stopping is None and not (spec := h.local.placement.spec).system)

    def reports(self) -> list[InstanceReport]:
        """What each held instance is, and what it measurably uses (`worker.usage`)."""
        self.meter.keep(self._held)
        return [
            InstanceReport(instance_id=h.id, state=h.local.state, pid=h.local.pid,
                           attempt=h.attempt, ports=dict(h.local.placement.ports),
                           health=h.health, restarts=h.local.restarts,
                           cpu_used=used.cpu, memory_used_mb=used.memory_mb)
            for h in self._held.values()
            for used in (self.meter.measure(h.id, h.cgroup),)
        ]

    def held(self) -> dict[str, int]:
        """Instance id -> attempt of every held instance that is not being stopped."""
        return {iid: h.attempt for iid, h in self._held.items() if h.stopping is None}

    def held_ports(self) -> set[int]:
        """The ports this node's instances hold right now."""
        return {p for h in self._held.values() for p in h.local.placement.ports.values()}

    def holds(self, instance_id: str) -> bool:
        """True while the instance is held, even while it is being stopped."""
        return instance_id in self._held

    def fence(self, instance_id: str, attempt: int, detail: str) -> bool:
        """Stop that attempt without reporting it: the broker moved it away. False if that
        attempt is not held (ended, or another attempt is held)."""
        held = self._held.get(instance_id)
        if held is None or held.attempt != attempt:
            return False
        if held.stopping is None:
            log.warning("fenced instance %s attempt %d: %s (%s)", instance_id, attempt,
                        Reason.FENCED, detail)
        self._stop(held, Reason.FENCED)
        return True

    def fence_all(self, detail: str) -> int:
        """Fence every held instance; how many there were."""
        held = list(self._held.values())
        for h in held:
            self.fence(h.id, h.attempt, detail)
        return len(held)

    # -- restart ----------------------------------------------------------------------------

    async def restore(self) -> None:
        """Adopt the instances an earlier worker left running; report the ones that ended."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.isolation.protect(self.state_dir)
        saved = load(self._path)
        if saved is not None:
            if saved.node_id != self.node_id:
                raise ValueError(f"{self._path} belongs to node {saved.node_id!r}, "
                                 f"not {self.node_id!r}")
            self._finished.extend(saved.finished)
            self.epoch = max(self.epoch, saved.epoch)
            for local in saved.instances.values():
                await readopt(self, Held(local))
        freed = self.isolation.reclaim(keep=set(self._held))
        if freed:
            log.info("took back %d uid lease(s) of instances no longer here: %s", len(freed),
                     ", ".join(map(str, freed)))
        self.persist()
        self._on_change()

    def hold(self, held: Held, life: Coroutine[Any, Any, None], what: str) -> None:
        """Hold `held` again, `life` its task (`worker.readopt`: its life, or asking its
        driver again), its timeout armed."""
        self._held[held.id] = held
        held.task = self._lives.spawn(life, name=f"{what} {held.id}")
        self.arm_timeout(held)

    def identify(self, held: Held) -> None:
        """Take up the uid a re-adopted instance runs as (`worker.isolation`)."""
        if self.isolation.on and not held.local.placement.spec.root:
            with contextlib.suppress(OSError):
                self._identities[held.id] = self.isolation.identity(
                    held.id, self.instance_dir(held.id), root=False)

    # -- awards and cancels -----------------------------------------------------------------

    async def award(self, award: Award) -> str | None:
        """Take `award` (its node id already checked); the reason it was ignored, if it was."""
        iid = award.instance_id
        if iid in self._held:
            return "award for an instance already held"
        if f"{iid}/{award.attempt}" in self._finished:
            return "award for an attempt that already ran here"
        if not _SAFE_ID.match(iid):
            await self._report(iid, award.attempt, EventType.FAILED, Reason.DRIVER_FAILED,
                               "instance id unusable as a directory name", None)
            return None
        held_ports = self.held_ports()
        got = assign(award.spec.ports, award.ports, self.port_range, held=held_ports,
                     reserved=self._reserved(iid))
        if got.short:  # the awarded ports found taken go too: the broker blocks them
            await self._report(iid, award.attempt, EventType.FAILED, Reason.NO_ROOM_PORTS,
                               f"range {self.port_range[0]}-{self.port_range[1]}", None,
                               taken=got.taken or None)
            return None
        placement = Placement(instance_id=iid, spec=award.spec, auction_id=award.auction_id,
                              attempt=award.attempt, ports=got.ports)
        held = Held(LocalInstance(placement=placement, state=InstanceState.PROVISIONING),
                    taken=got.taken, secret_env=dict(award.secret_env))
        self._held[iid] = held
        self._on_change()
        self.persist()
        if got.taken:
            log.warning("instance %s: %s: %s; got %s instead", iid, Reason.PORT_TAKEN,
                        got.taken, got.ports)
        await self._report(iid, award.attempt, EventType.PROVISIONING, "",
                           f"commit {award.commit}" if award.commit else "", None,
                           ports=got.ports, taken=got.taken)
        held.task = self._lives.spawn(Life(self, held).run(Begin.SPAWN), name=f"life {iid}")
        return None

    async def cancel(self, instance_id: str, attempt: int = 0) -> None:
        """Stop `attempt` (0: whichever is held). A stop of an earlier attempt than the one
        held - sent as the broker gave that one up, arriving after the instance was placed
        here again - leaves the held one running."""
        held = self._held.get(instance_id)
        if held is not None and attempt and held.attempt > attempt:
            log.info("instance %s: cancel of attempt %d ignored, attempt %d runs here",
                     instance_id, attempt, held.attempt)
        elif held is not None:
            self._stop(held, Reason.CANCELLED)
        else:  # confirm at once, so the broker need not wait out its grace period; the
            # attempt lets the broker drop a confirmation of one it already gave up
            await self._report(instance_id, attempt, EventType.CANCELLED, Reason.CANCELLED,
                               "not running on this node", None)

    # -- stopping and ending -----------------------------------------------------------------

    def arm_timeout(self, held: Held) -> None:
        timeout = held.local.placement.spec.timeout_s
        if timeout is not None:
            left = max(0.0, timeout - (time.time() - held.local.started_at))
            held.timer = asyncio.get_running_loop().call_later(
                left, self._stop, held, Reason.TIMEOUT)

    def _stop(self, held: Held, why: str) -> None:
        """Begin ending `held` (SIGTERM, SIGKILL after the grace); its life reports the end."""
        if held.stopping is not None:
            return
        held.stopping = why
        held.stopped.set()
        self._on_change()  # no longer offered as a victim (`residents`)
        log.info("stopping instance %s: %s", held.id, why)
        if held.proc is not None:
            self._stoppers.spawn(held.proc.stop(self.timing.kill_grace_s),
                                 name=f"stop {held.id}")

    async def end(self, held: Held, type_: str, reason: str, detail: str,
                  exit_code: int | None = None, *, report: bool = True,
                  remember: bool = True) -> None:
        """The one way an instance ends: let go of it, report how it ended, persist. An end
        that is not `remember`-ed (the worker shut down) may run again here."""
        if held.timer is not None:
            held.timer.cancel()
        if self._held.get(held.id) is held:
            del self._held[held.id]
        self._on_change()
        if held.prober is not None:
            held.prober.stop()
        if report:
            if remember:
                self._finished.append(f"{held.id}/{held.attempt}")
            await self.emit(held, type_, reason, detail, exit_code)
        else:  # fenced: nothing the broker would count against the instance
            log.info("fenced instance %s attempt %d ended (exit %s)", held.id, held.attempt,
                     exit_code)
        self.persist()
        if held.proc is not None:
            await held.proc.release()
        if held.cgroup is not None:  # what the process left behind in it goes too
            await release(held.cgroup)
        if held.id in self._identities and self._held.get(held.id) is None:
            self.isolation.release(held.id, self._identities.pop(held.id))

    # -- what an instance's life uses (`worker.instance.Host`) ------------------------------

    def driver(self, spec: Spec) -> Driver:
        return self._drivers(spec)

    def instance_dir(self, instance_id: str) -> Path:
        return self.state_dir / "instances" / instance_id

    async def secrets(self, instance_id: str, attempt: int) -> dict[str, str] | None:
        return await self._secrets(instance_id, attempt)

    def confine(self, held: Held, *, join: int | None = None) -> Callable[[], None] | None:
        iso, spec = self.isolation, held.local.placement.spec
        if not iso.enabled:
            return None
        if held.id not in self._identities:
            try:
                self._identities[held.id] = iso.identity(
                    held.id, self.instance_dir(held.id), root=spec.root)
            except Exception as exc:
                if join is None:
                    raise
                why = str(exc) or type(exc).__name__

                def refuse() -> None:  # a check is never run unconfined
                    raise OSError(f"cannot isolate the check: {why}")

                return refuse
        enter = [d / "cgroup.procs" for d in held.cgroup.dirs] \
            if join is not None and held.cgroup is not None else []
        return iso.child(self._identities[held.id], pids=spec.pids, tmp_mb=spec.memory_mb,
                         join=join, enter=enter)

    def exec_target(self, instance_id: str) -> Target | Ended:
        """Where a `gavel exec` command runs in `instance_id` (`worker.execsession` rule 1):
        its current run and attempt, its environment less its secret values, its directory;
        or why there is none."""
        held = self._held.get(instance_id)
        if held is None:
            return Ended.NOT_HELD
        if held.proc is None or held.stopping is not None or \
                held.local.state != InstanceState.RUNNING:
            return Ended.NOT_RUNNING
        placement, home = held.local.placement, self.home(held)
        env = instance_env(
            base=os.environ if home is None else {**os.environ, "HOME": home},
            spec_env=placement.spec.env, secret_env={}, instance_id=held.id,
            node_id=self.node_id, attempt=held.attempt, ports=placement.ports,
            port_order=placement.spec.ports)
        return Target(held.proc, held.attempt, env, self.instance_dir(held.id))

    def home(self, held: Held) -> str | None:
        if not self.isolation.on or held.local.placement.spec.root:
            return None
        return str(self.instance_dir(held.id))

    def escapes(self) -> int:
        """Kill every instance a process of which runs outside its cgroup (module
        docstring); how many there were."""
        if self.cgroups is None:
            return 0
        watched = [h for h in self._held.values()
                   if h.cgroup is not None and h.proc is not None and h.stopping is None]
        uids = {i.uid for h in watched if (i := self._identities.get(h.id)) is not None}
        try:
            by_uid = processes(uids) if uids else {}
        except OSError as exc:  # no /proc to read: the kernel's refusal still holds
            log.warning("cannot list processes to check cgroups: %s", exc)
            return 0
        found = 0
        for held in watched:
            assert held.cgroup is not None and held.proc is not None
            ident = self._identities.get(held.id)
            mine = by_uid.get(ident.uid, []) if ident is not None else [held.local.pid]
            out = [p for p in held.cgroup.outside(mine) if not zombie(p)]
            if not out:
                continue
            found += 1
            log.warning("instance %s: %s (pids %s)", held.id, Reason.ESCAPED_CGROUP, out)
            for pid in out:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            held.cgroup.kill()
            self._stop(held, Reason.ESCAPED_CGROUP)
        return found

    async def emit(self, held: Held, type_: str, reason: str, detail: str,
                   exit_code: int | None, *, ports: dict[str, int] | None = None,
                   taken: list[int] | None = None, check: str = "") -> None:
        await self._report(held.id, held.attempt, type_, reason, detail, exit_code,
                           ports=ports, taken=taken, check=check,
                           restarts=held.local.restarts)

    # -- the worker stops -------------------------------------------------------------------

    async def shutdown(self, *, kill: bool) -> None:
        """Stop every instance and report each end (`kill`), or let them run unwatched, their
        pids and start times saved for the next worker to adopt."""
        held = list(self._held.values())
        for h in held:
            if kill:
                self._stop(h, Reason.WORKER_STOPPED)
                continue
            if h.timer is not None:
                h.timer.cancel()
            if h.task is not None:
                h.task.cancel()
            if h.prober is not None:
                h.prober.stop()
            if h.proc is not None:
                h.proc.detach()
        if not kill:
            self._stoppers.cancel()
        await asyncio.gather(self._lives.wait(None), self._stoppers.wait(None))
        self.persist()

    def persist(self) -> None:
        save(self._path, AgentFile(
            node_id=self.node_id,
            instances={iid: h.local for iid, h in self._held.items()},
            finished=list(self._finished), epoch=self.epoch))
