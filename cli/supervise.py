"""The children of `gavel up`: started in order, watched, and stopped on one path.

Rules:
1. Every child is ``python -P -m gavel ...`` in a session of its own, its output appended to
   its own log, and carries what its exit means: ``STOP`` (the cluster cannot go on without
   it: `check` returns one sentence naming it and what it said last), ``SAY`` (its exit is
   said once and the rest carry on - a worker, so a node failure can be practised) or
   ``RESTART`` (said, then started again with the same command line after `RESTART_PAUSE_S`:
   a worker on the same state re-adopts the instances it left running).
2. `stop` is the one way out: the first group (the brokers) gets SIGTERM and is waited for,
   then every other child together; whatever outlives `grace_s` is killed. Then every
   instance a worker left behind - recorded in its ``agent.json`` and still the same process
   (pid and start time, `worker.localstate`) - has its process group stopped the same way,
   so no instance of a worker that died outlives `gavel up`.
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gavel.shared.timing import Timing
from gavel.worker import localstate

__all__ = ["Child", "OnExit", "Supervisor", "stop_instances"]

#: The supervisor's clocks: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()

#: How long a worker that exited waits before it is started again (rule 1's RESTART).
RESTART_PAUSE_S = _TIMING.respawn_s


class OnExit(enum.Enum):
    STOP = "stop"
    SAY = "say"
    RESTART = "restart"


@dataclass
class Child:
    name: str
    args: list[str]
    log: Path
    on_exit: OnExit
    proc: subprocess.Popen[bytes]
    #: Where a worker keeps its agent.json (rule 2), None for the other children.
    state: Path | None = None
    #: When an exited RESTART child starts again (0: not waiting).
    restart_at: float = 0.0
    said: bool = False

    def last_words(self) -> str:
        """The last line the child wrote to its log (what it said on its way out)."""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                     if ln.strip()]
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def exit_sentence(self, code: int) -> str:
        said = self.last_words()
        return (f"the {self.name} exited with status {code}"
                + (f" ({said})" if said else "") + f"; its log is {self.log}")


@dataclass
class Supervisor:
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, args: list[str], log: Path, on_exit: OnExit = OnExit.STOP,
              state: Path | None = None) -> Child:
        child = Child(name, args, log, on_exit, self._popen(args, log), state)
        self.children.append(child)
        return child

    def _popen(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:  # the child holds its own copy
            # -P: the directory the user stands in is not on the child's sys.path, so a
            # folder named gavel there (a clone's parent) cannot shadow the installed gavel.
            return subprocess.Popen([sys.executable, "-P", "-m", "gavel", *args], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)

    def first_exit(self) -> str:
        """A sentence about the first child that is no longer running, or "" (while the
        cluster starts, every exit is the end of it)."""
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                return c.exit_sentence(code)
        return ""

    def check(self, now: float, watched: Iterable[Child] | None = None
              ) -> tuple[list[str], str]:
        """Rule 1, for the `watched` children (default: all): the sentences to say now, and
        why the whole cluster must stop ("" to carry on)."""
        say: list[str] = []
        for c in self.children if watched is None else watched:
            code = c.proc.poll()
            if code is None:
                continue
            if c.on_exit is OnExit.STOP:
                return say, c.exit_sentence(code)
            if c.restart_at and now >= c.restart_at:
                c.proc, c.restart_at, c.said = self._popen(c.args, c.log), 0.0, False
                say.append(f"gavel up: the {c.name} started again")
            elif not c.said:
                c.said = True
                if c.on_exit is OnExit.RESTART:
                    c.restart_at = now + RESTART_PAUSE_S
                    say.append(f"gavel up: {c.exit_sentence(code)}; starting it again "
                               "(--restart-workers)")
                else:
                    say.append(f"gavel up: {c.exit_sentence(code)}; the rest carry on "
                               "(--restart-workers starts a worker that exits again)")
        return say, ""

    def stop(self, grace_s: float = _TIMING.stop_grace_s, first: int = 1) -> None:
        """Rule 2: the first `first` children, then the rest, then what the workers left."""
        for group in (self.children[:first], self.children[first:]):
            _stop_all([c.proc.pid for c in group if c.proc.poll() is None], grace_s,
                      [c.proc for c in group])
        stop_instances([c.state for c in self.children if c.state is not None], grace_s)


def _stop_all(pids: list[int], grace_s: float,
              procs: list[subprocess.Popen[bytes]]) -> None:
    for pid in pids:
        _signal_group(pid, signal.SIGTERM, own=False)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _signal_group(pid: int, sig: int, own: bool) -> None:
    """`sig` to the process `pid` (own=False) or to its whole process group (own=True)."""
    try:
        if own:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_instances(worker_states: list[Path], grace_s: float) -> None:
    """Rule 2's last step: stop every instance process a worker recorded that still runs."""
    alive: list[tuple[int, float]] = []
    for state in worker_states:
        agent = localstate.load(state / "agent.json")
        for inst in (agent.instances.values() if agent is not None else ()):
            if localstate.process_alive(inst.pid, inst.create_time):
                alive.append((inst.pid, inst.create_time))
    for pid, _ in alive:
        _signal_group(pid, signal.SIGTERM, own=True)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        alive = [(p, t) for p, t in alive if localstate.process_alive(p, t)]
        time.sleep(_TIMING.poll_s)
    for pid, _ in alive:
        _signal_group(pid, signal.SIGKILL, own=True)
