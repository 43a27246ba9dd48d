"""Workloads are not the node: who an instance's process runs as, and what it can reach.

Rules:
1. Identity. With isolation on (the worker's ``isolation = "uids"``, the default) and the
   worker running as root, each instance runs as a uid of its own, and a gid of the same
   number, taken from the node's range (``uids``): never root, never the worker's, never
   another instance's. A uid per instance rather than one shared user, because processes of
   one uid may signal, ptrace and read each other's ``/proc/PID/environ``: only distinct uids
   keep one instance's secrets from another. A spec that asks for root (``root = true``)
   gets it only where the node's config allows it (``allow_root``); elsewhere it fails to
   start with `Reason.ROOT_REFUSED`. A worker that is not root cannot switch uids: its
   instances run as its own user, and it says so once at start. Root without the
   capabilities (a container's root: no CAP_SYS_ADMIN, or no CAP_SETUID) is found by one
   confined child at start, and does what it can (uids without a private /tmp, or neither),
   said at start: never a start that fails for it.
2. Leases. A uid is held by a file named after it in a host-wide directory (`LEASES`), made
   with O_EXCL and naming the worker and instance, so two workers on one host never hand out
   the same uid. The search starts at a hash of the worker and instance (a free uid is
   usually the first tried). The owner of the instance's directory records its uid: a
   restart in place, or a restarted worker re-adopting it, keeps the same one. The lease
   goes when the instance ends; a worker that starts takes back its own leases of
   instances it did not re-adopt (`reclaim`: it crashed, or was killed, before it could
   give them back), and leaves every other worker's alone.
3. Files. The instance's directory is owned by its uid, mode 0700; the worker's state
   directory and its ``instances/`` are 0711 (passable, not listable) and its own files 0600,
   so an instance reads nothing of the worker's (``agent.json``, credentials, logs) and
   nothing of another instance's.
4. The child, between fork and exec: it enters its cgroup (`worker.cgroups`), then, as root,
   a mount namespace of its own whose mounts are slaves of the host's (nothing it mounts
   leaks out) with a fresh tmpfs on ``/tmp`` (private, its pages charged to its own memory
   cgroup), RLIMIT_NPROC at its pids (its uid is its own, so the count is its own: a pids
   limit even where no pids controller exists), no supplementary groups, its gid and uid;
   last no_new_privs, so no setuid binary gives any of it back. A step that fails leaves the
   command unrun. An instance directory under ``/tmp`` (a worker whose state is there) is
   bound back at its own path inside the private ``/tmp``: its HOME, and the directory its
   checks and exec sessions start in, are where they were.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import logging
import os
import resource
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gavel.shared.timing import Timing

__all__ = ["LEASES", "MODES", "Identity", "Isolation", "RootRefused", "configure", "off",
           "processes", "zombie"]

log = logging.getLogger("gavel.worker.isolation")
#: The one try at start, unless the worker hands its own: a machine wait of `Timing`.
_TIMING = Timing()

Mode = Literal["uids", "off"]
MODES: tuple[Mode, ...] = ("uids", "off")
#: Where uid leases live, shared by every worker on the host (rule 2).
LEASES = Path("/run/gavel/uids")

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_SLAVE = 0x2, 0x4, 0x1000, 0x4000, 0x80000
_PR_SET_NO_NEW_PRIVS = 38


class RootRefused(Exception):
    """The spec asks for root and this node's config does not allow it."""


@dataclass(frozen=True)
class Identity:
    """Who an instance's processes run as (rule 1)."""

    uid: int
    gid: int


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def confine(identity: Identity | None, *, pids: int, tmp_mb: int, private_tmp: bool,
            join: int | None = None, enter: Sequence[Path] = ()) -> Callable[[], None]:
    """What the child runs between fork and exec, after entering its cgroup (rule 4); with
    `join`, it enters that process's mount namespace instead of making one (an exec check
    sees the instance's own /tmp, in the directory it was started in), and first the cgroup
    whose ``cgroup.procs`` files `enter` names."""
    libc = _libc()  # loaded before the fork: nothing to look up in the child

    def child() -> None:
        for procs in enter:
            fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if private_tmp and join is not None:
            here = os.getcwd()  # the child's cwd is set before this runs; setns moves it to /
            fd = os.open(f"/proc/{join}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            _call(libc.setns(fd, _CLONE_NEWNS), "join the instance's mount namespace")
            os.close(fd)
            os.chdir(here)
        elif private_tmp:
            here = os.getcwd()  # the child's cwd (its directory) is set before this runs
            _call(libc.unshare(_CLONE_NEWNS), "unshare a mount namespace")
            _call(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None),
                  "make / a slave mount")
            # opened in the new namespace (a bind's source must be one of its mounts)
            keep = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) \
                if here.startswith("/tmp/") else -1
            _call(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                             f"mode=1777,size={tmp_mb}m".encode()), "mount /tmp")
            if keep >= 0:  # rule 4: its directory, hidden by the new /tmp, bound back
                os.makedirs(here, mode=0o755, exist_ok=True)
                _call(libc.mount(f"/proc/self/fd/{keep}".encode(), here.encode(), None,
                                 _MS_BIND, None), "bind its directory into its /tmp")
                os.close(keep)
                os.chdir(here)
        if identity is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
            os.setgroups([])
            os.setresgid(identity.gid, identity.gid, identity.gid)
            os.setresuid(identity.uid, identity.uid, identity.uid)
        _call(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")

    return child


@dataclass
class Isolation:
    """What a worker does to keep its instances from the node and from each other."""

    #: The uids instances run as (None: none are switched to, rule 1).
    uids: tuple[int, int] | None
    allow_root: bool
    #: Who this worker is in a lease (its node id and state directory's key).
    owner: str
    #: Said once at start.
    summary: str
    leases: Path = LEASES
    #: Whether children get a mount namespace and a private /tmp (needs root).
    private_tmp: bool = False
    #: False: ``isolation = "off"``, children are started as they always were.
    enabled: bool = True

    @property
    def on(self) -> bool:
        return self.uids is not None

    def child(self, identity: Identity | None, *, pids: int, tmp_mb: int,
              join: int | None = None, enter: Sequence[Path] = ()
              ) -> Callable[[], None] | None:
        """What a child of an instance runs before its command (rule 4); None: nothing."""
        if not self.enabled:
            return None
        return confine(identity, pids=pids, tmp_mb=tmp_mb, private_tmp=self.private_tmp,
                       join=join, enter=enter)

    def protect(self, state_dir: Path) -> None:
        """Rule 3: the state directory and ``instances/`` passable, not listable."""
        if not self.on:
            return
        for d in (state_dir, state_dir / "instances"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o711)

    def identity(self, instance_id: str, directory: Path, *, root: bool) -> Identity | None:
        """The identity `instance_id` runs as, its lease taken and its `directory` made its
        own (rules 1-3); None: the worker's own (isolation off, or root allowed). Raises
        `RootRefused`, or OSError when no uid is free or the directory cannot be made."""
        if root:
            if not self.allow_root:
                raise RootRefused
            return None
        if self.uids is None:
            directory.mkdir(parents=True, exist_ok=True)
            return None
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        uid = self._lease(instance_id, directory.stat().st_uid)
        os.chown(directory, uid, uid)
        os.chmod(directory, 0o700)
        return Identity(uid, uid)

    def release(self, instance_id: str, identity: Identity | None) -> None:
        """Give the instance's uid back (rule 2); a lease another holds is left alone."""
        if identity is None:
            return
        lease = self.leases / str(identity.uid)
        with contextlib.suppress(OSError):
            if lease.read_text() == self._holder(instance_id):
                lease.unlink()

    def reclaim(self, keep: Collection[str]) -> list[int]:
        """Rule 2 at start: remove this worker's leases of instances not in `keep` (the
        ones it re-adopted); the uids given back, in order."""
        if not self.on or not self.leases.is_dir():
            return []
        mine, freed = f"{self.owner}/", []
        for lease in sorted(self.leases.iterdir(), key=lambda p: p.name):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                holder = lease.read_text()
                if holder.startswith(mine) and holder[len(mine):] not in keep \
                        and lease.name.isdigit():
                    lease.unlink()
                    freed.append(int(lease.name))
        return freed

    def _holder(self, instance_id: str) -> str:
        return f"{self.owner}/{instance_id}"

    def _lease(self, instance_id: str, owner_uid: int) -> int:
        assert self.uids is not None
        first, last = self.uids
        size = last - first + 1
        holder = self._holder(instance_id)
        start = int.from_bytes(hashlib.sha256(holder.encode()).digest()[:8], "big") % size
        tries = itertools.chain([owner_uid] if first <= owner_uid <= last else [],
                                (first + (start + k) % size for k in range(size)))
        self.leases.mkdir(parents=True, exist_ok=True, mode=0o700)
        for uid in tries:
            lease = self.leases / str(uid)
            try:
                fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600)
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if lease.read_text() == holder:
                        return uid
                continue
            try:
                os.write(fd, holder.encode())
            finally:
                os.close(fd)
            return uid
        raise OSError(errno.EAGAIN, f"no free uid in {first}-{last}")


def configure(mode: Mode, uids: tuple[int, int], *, allow_root: bool, owner: str,
              leases: Path = LEASES, timing: Timing = _TIMING) -> Isolation:
    """The worker's isolation as its config says, and as the host allows (rule 1)."""
    if mode == "off":
        return Isolation(None, True, owner, "isolation off: instances run as the worker's "
                                            "user, in the node's namespaces", leases,
                         enabled=False)
    if os.geteuid() != 0:
        return Isolation(None, allow_root, owner,
                         "isolation: the worker is not root and cannot switch uids: "
                         "instances run as the worker's own user", leases)
    probe = Identity(uids[0], uids[0])
    within = timing.confine_s
    if not _works(probe, within, private_tmp=True):  # root without CAP_SYS_ADMIN (a container)
        if not _works(probe, within, private_tmp=False):
            return Isolation(None, allow_root, owner,
                             "isolation: this root cannot switch uids here (no CAP_SETUID?): "
                             "instances run as the worker's own user", leases)
        return Isolation(uids, allow_root, owner,
                         f"isolation: each instance runs as its own uid in {uids[0]}-{uids[1]}"
                         " with no new privileges; no private /tmp (this root may not make "
                         "a mount namespace)" + _root_note(allow_root), leases)
    return Isolation(uids, allow_root, owner,
                     f"isolation: each instance runs as its own uid in {uids[0]}-{uids[1]}, "
                     "with a private /tmp and no new privileges" + _root_note(allow_root),
                     leases, private_tmp=True)


def _root_note(allow_root: bool) -> str:
    return "; root allowed for specs that ask" if allow_root else ""


def _works(identity: Identity, within: float, *, private_tmp: bool) -> bool:
    """Whether a child can be confined so here (rule 4): one try at start, as root."""
    try:
        return subprocess.run(["/bin/true"], preexec_fn=confine(
            identity, pids=64, tmp_mb=1, private_tmp=private_tmp), cwd="/",
            stdin=subprocess.DEVNULL, timeout=within, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def off() -> Isolation:
    """No isolation: children start as they always did (``isolation = "off"``)."""
    return configure("off", (0, 0), allow_root=True, owner="")


def processes(uids: Collection[int]) -> dict[int, list[int]]:
    """The processes on the host running as each of `uids` (the owner of ``/proc/PID`` is
    the process's effective uid)."""
    out: dict[int, list[int]] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                uid = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if uid in uids:
                out.setdefault(uid, []).append(int(entry.name))
    return out


#: The kernel's flag of a task on its way out (PF_EXITING): it has left its cgroup already
#: (a cgroup v1 exit moves it to the root) before it shows as a zombie.
_PF_EXITING = 0x4


def zombie(pid: int) -> bool:
    """Whether `pid` has ended or is ending (a zombie, a task past its exit's cgroup step, or
    gone): nothing of it runs, and where its cgroup file says it is means nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()  # state, ppid, pgrp, session, tty, tpgid, flags
    if fields[:1] in (["Z"], ["X"]):
        return True
    try:
        return bool(int(fields[6]) & _PF_EXITING)
    except (IndexError, ValueError):
        return False
