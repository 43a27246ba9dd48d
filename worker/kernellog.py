"""What the kernel's own log says about a memory kill: the evidence a container engine may
miss.

An engine learns of a container's OOM kill from an event the runtime's shim registers
after the container starts; a program killed within milliseconds of its start is killed
before that registration, and the engine reports a plain exit 137 with ``OOMKilled``
false (containerd issues 8180 and 8893). The kernel logs every memory-cgroup kill itself,
naming the cgroup of the task it killed::

    oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/docker/ID,task_memcg=/docker/ID,task=dd,pid=N,uid=0

Rules:
1. A kill is this container's when a record's ``task_memcg`` path names the container's
   full id (64 hex digits, so one container cannot be taken for another); the cgroup
   driver (``/docker/ID``, ``/system.slice/docker-ID.scope``) does not matter.
2. The log is read from ``/dev/kmsg`` (Linux 3.5+; the ``oom-kill:`` record, 4.19+),
   without blocking, every record the kernel still holds. A worker that may not read it
   (no CAP_SYSLOG under ``dmesg_restrict``, a container without the device) learns
   nothing from it: the engine's word stands.
3. Read only as a second opinion, for a run that ended by SIGKILL while the engine says
   it was not an OOM kill: reading the whole ring is a few thousand reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

KMSG = Path("/dev/kmsg")
_RECORDS_MAX = 1 << 16  # a ring of at most this many records is read, whatever its size


def killed_for_memory(container_id: str, records: Iterable[str]) -> bool:
    """Whether one of `records` is the kernel's memory kill of a task in `container_id`
    (rule 1)."""
    if len(container_id) != 64:
        return False
    for record in records:
        at = record.find("oom-kill:")
        if at < 0:
            continue
        for field in record[at + len("oom-kill:"):].split(","):
            name, _, value = field.partition("=")
            if name == "task_memcg" and container_id in value:
                return True
    return False


def kernel_records(path: Path = KMSG) -> Iterator[str]:
    """The messages of every record the kernel's log holds now, oldest first; none when it
    cannot be read (rule 2)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        for _ in range(_RECORDS_MAX):
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                return  # read to the end
            except BrokenPipeError:
                continue  # the ring overwrote the record we were at: on to the next
            except OSError:
                return
            if not raw:
                return
            _, _, message = raw.decode("utf-8", "replace").partition(";")
            yield message.split("\n", 1)[0]
    finally:
        os.close(fd)


def readable(path: Path = KMSG) -> bool:
    """Whether this process may read the kernel's log (rule 2)."""
    return next(kernel_records(path), None) is not None


def oom_killed(container_id: str, path: Path = KMSG) -> bool:
    """Whether the kernel says it killed a task of `container_id` for its memory (rules
    1-3)."""
    return killed_for_memory(container_id, kernel_records(path))
