"""Uid leases (`worker.isolation` rule 2) on real files: two workers never hand out one uid,
an instance keeps its uid through its directory's owner, a lease goes when its instance
ends, a full range is a sentence, and root is given only where the node allows it. The
leases are made as root only (a uid is chown-ed to the instance's directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gavel.worker.isolation import Isolation, RootRefused, configure

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="leasing a uid chowns a directory "
                                "to it: only root may")


def iso(tmp_path: Path, owner: str, uids: tuple[int, int] = (500_000, 500_001),
        allow_root: bool = False) -> Isolation:
    return configure("uids", uids, allow_root=allow_root, owner=owner,
                     leases=tmp_path / "leases")


def test_two_workers_never_hand_out_one_uid(tmp_path: Path) -> None:
    one, two = iso(tmp_path, "node.a"), iso(tmp_path, "node.b")
    a = one.identity("i", tmp_path / "a" / "i", root=False)
    b = two.identity("i", tmp_path / "b" / "i", root=False)
    assert a is not None and b is not None and a.uid != b.uid
    with pytest.raises(OSError, match="no free uid in 500000-500001"):
        two.identity("j", tmp_path / "b" / "j", root=False)
    one.release("i", a)
    c = two.identity("j", tmp_path / "b" / "j", root=False)
    assert c is not None and c.uid == a.uid  # freed when its instance ended


def test_an_instance_keeps_its_uid_and_its_directory_is_its_own(tmp_path: Path) -> None:
    first = iso(tmp_path, "node.a", uids=(500_000, 500_099))
    got = first.identity("i", tmp_path / "i", root=False)
    assert got is not None and got.uid == got.gid
    st = (tmp_path / "i").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (got.uid, 0o700)
    again = iso(tmp_path, "node.a", uids=(500_000, 500_099))  # a restarted worker
    assert again.identity("i", tmp_path / "i", root=False) == got


def test_a_worker_takes_back_only_its_own_stale_leases(tmp_path: Path) -> None:
    a, b = iso(tmp_path, "node.a", (500_000, 500_009)), iso(tmp_path, "node.b", (500_000, 500_009))
    kept = a.identity("kept", tmp_path / "a" / "kept", root=False)
    gone = a.identity("gone", tmp_path / "a" / "gone", root=False)
    other = b.identity("gone", tmp_path / "b" / "gone", root=False)
    assert kept is not None and gone is not None and other is not None
    restarted = iso(tmp_path, "node.a", (500_000, 500_009))  # after a crash: "kept" re-adopted
    assert restarted.reclaim(keep={"kept"}) == [gone.uid]
    held = sorted(p.name for p in (tmp_path / "leases").iterdir())
    assert held == sorted(str(i.uid) for i in (kept, other))
    assert restarted.reclaim(keep={"kept"}) == []  # nothing more to take back


def test_root_only_where_the_node_allows_it(tmp_path: Path) -> None:
    with pytest.raises(RootRefused):
        iso(tmp_path, "n").identity("i", tmp_path / "i", root=True)
    assert iso(tmp_path, "n", allow_root=True).identity("i", tmp_path / "i", root=True) is None


def test_off_confines_nothing(tmp_path: Path) -> None:
    off = configure("off", (1, 2), allow_root=False, owner="n")
    assert not off.enabled and off.child(None, pids=1, tmp_mb=1) is None
    assert off.identity("i", tmp_path / "i", root=True) is None  # as it always ran


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) drops a "
                    "capability from a root process; it is not installed here")
def test_a_root_without_the_capabilities_says_what_it_can_do() -> None:
    """Root in a container without CAP_SYS_ADMIN keeps the uids, not the private /tmp;
    without CAP_SETUID it runs instances as itself: each said at start, never a start that
    fails."""
    code = ("from gavel.worker.isolation import configure; i = configure('uids', (200000, "
            "265535), allow_root=False, owner='x'); print(i.on, i.private_tmp, i.summary)")
    for drop, on, tmp, said in (("-sys_admin", "True", "False", "no private /tmp"),
                                ("-sys_admin,-setuid", "False", "False", "cannot switch uids")):
        out = subprocess.run(["setpriv", "--bounding-set", drop, sys.executable, "-c", code],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert out.split()[:2] == [on, tmp] and said in out, out
