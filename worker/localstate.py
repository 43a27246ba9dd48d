"""The worker's own record of what it runs: ``<state_dir>/agent.json``.

Rules: the file is replaced atomically (temp file, fsync, ``os.replace``), so a crash leaves
either the old or the new file, never half of one. It holds placements (the spec, which
names secrets but never carries their values), ports, attempt, state, the restarts in place
so far (so a restart policy's count survives a worker restart), and the pid together with the
process start time: a pid is only trusted if the process with that pid still has
that start time, so a recycled pid is never adopted, signalled or reported.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec
import psutil

from gavel.shared.records import Placement

__all__ = [
    "FINISHED_KEPT",
    "AgentFile",
    "LocalInstance",
    "load",
    "process_alive",
    "process_start_time",
    "save",
]

log = logging.getLogger("gavel.worker.localstate")

#: How many ended (instance, attempt) pairs the file remembers, so a replayed award for an
#: attempt that already ran here is recognised and not run twice.
FINISHED_KEPT = 256

# Start times come from the kernel in clock ticks (1/100 s); two readings of the same process
# agree exactly, a recycled pid cannot start within the same tick.
_START_TIME_TOLERANCE = 0.005


class LocalInstance(msgspec.Struct, kw_only=True):
    """One instance this node holds (awarded and not yet ended)."""

    placement: Placement
    state: str
    pid: int = 0
    create_time: float = 0.0
    #: The engine's id of its container, for an image spec (`worker.containers`).
    container: str = ""
    #: Wall-clock time the process first started; a re-adopted instance keeps its timeout
    #: budget, and restarts in place do not renew it.
    started_at: float = 0.0
    #: In-place restarts of this attempt so far (`worker.restarts`).
    restarts: int = 0
    #: Wall-clock times of the restarts still inside the restart policy's interval.
    restart_times: list[float] = []
    #: While the process waits out a restart's back-off: the wall-clock time it starts
    #: again (0: not waiting). `pid` is 0 meanwhile.
    restart_at: float = 0.0


class AgentFile(msgspec.Struct, kw_only=True):
    node_id: str
    instances: dict[str, LocalInstance] = {}
    #: ``"<instance_id>/<attempt>"`` of the most recent attempts that ended here, oldest first.
    finished: list[str] = []
    #: The newest leadership epoch this node has heard from (`worker.supervisor.admit`):
    #: kept across restarts, so a deposed broker is not believed again after one.
    epoch: int = 0


_decoder = msgspec.json.Decoder(AgentFile)
_encoder = msgspec.json.Encoder()


def load(path: Path) -> AgentFile | None:
    """The saved state, or None when there is none. An unreadable file is set aside, not lost."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        os.replace(path, aside)
        log.error("local state %s is unreadable (%s); moved to %s, starting empty",
                  path, exc, aside)
        return None


def save(path: Path, state: AgentFile) -> None:
    """Write `state` to `path` atomically and durably."""
    tmp = path.with_name(f".{path.name}.tmp")
    data = msgspec.json.format(_encoder.encode(state), indent=2)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def process_start_time(pid: int) -> float | None:
    """psutil's create time of `pid`, or None if there is no such process."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def process_alive(pid: int, create_time: float) -> bool:
    """True while the process `pid` that started at `create_time` runs (a zombie has ended)."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > _START_TIME_TOLERANCE:
            return False  # the pid was recycled
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
