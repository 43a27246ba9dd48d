"""The cgroup layout and limits, against directories laid out like the kernel's hierarchies
(a cgroup2 mount's files, v1 controllers' files): where gavel makes its cgroups, what it
writes in them, how an OOM kill is read, and what a host without a usable hierarchy gets.
The real kernel is exercised in tests/integration/test_cgroups.py."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gavel.worker.cgroups import Cgroup, Enforcement, Unavailable, detect
from gavel.worker.driver import Process

MB = 1024 * 1024


def v2_root(tmp_path: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> Path:
    """A cgroup2 mount's root as the kernel shows it: its controllers, none delegated yet."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("1\n")
    return root


def kernel_files(cgroup: Path, *names: str) -> None:
    """What the kernel puts in a new cgroup directory (the module only ever writes them)."""
    cgroup.mkdir(parents=True, exist_ok=True)
    for name in names:
        (cgroup / name).write_text("")


def v1_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    for controller, files in (("memory", ("memory.limit_in_bytes", "memory.oom_control")),
                              ("cpu", ("cpu.shares", "cpu.cfs_quota_us"))):
        kernel_files(root / controller, "cgroup.procs", *files)
    return root


# -- v2 ------------------------------------------------------------------------------------


def test_v2_delegates_memory_and_cpu_down_to_the_nodes_parent(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    got = detect("v2", "node-1", root=root)
    assert got.version == "v2" and not got.missing
    assert got.summary == (f"resources enforced: cgroup v2 at {root}/gavel/node-1: memory "
                           "limit and cpu weight, pids limit per instance")
    # pids is delegated where the level offers it (the mount's root here)
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    for level in (root / "gavel", root / "gavel" / "node-1"):
        assert (level / "cgroup.subtree_control").read_text() == "+memory +cpu"


def test_v2_writes_the_limits_of_the_award(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    hierarchy = detect("v2", "node-1", root=root).hierarchy
    assert hierarchy is not None
    where = root / "gavel" / "node-1" / "web-1"
    kernel_files(where, "cgroup.procs", "memory.swap.max", "memory.oom.group", "memory.events")
    cg = hierarchy.create("web-1", cpu=1.5, memory_mb=96)
    assert cg.dirs == (where,)
    assert (where / "memory.max").read_text() == str(96 * MB)
    assert (where / "memory.swap.max").read_text() == "0"  # no paging past the limit
    assert (where / "memory.oom.group").read_text() == "1"  # the whole instance goes
    assert (where / "cpu.weight").read_text() == "150"  # 100 a cpu, as the default is
    assert (where / "cpu.max").read_text() == "max 100000"  # a weight only: no cap


def test_v2_swap_and_group_kill_are_left_alone_where_the_kernel_has_none(
        tmp_path: Path) -> None:
    hierarchy = detect("v2", "n", root=v2_root(tmp_path)).hierarchy
    assert hierarchy is not None
    cg = hierarchy.create("i", cpu=0.1, memory_mb=16)
    assert sorted(p.name for p in cg.dirs[0].iterdir()) == ["cpu.max", "cpu.weight",
                                                           "memory.max"]


def test_v2_quota_caps_at_the_awarded_cpu(tmp_path: Path) -> None:
    hierarchy = detect("v2", "n", root=v2_root(tmp_path), cpu_limit="quota").hierarchy
    assert hierarchy is not None
    assert "cpu weight and quota" in hierarchy.describe()
    for cpu, weight, quota in ((0.5, "50", "50000 100000"), (2.0, "200", "200000 100000"),
                               (0.001, "1", "1000 100000"), (500.0, "10000", "50000000 100000")):
        cg = hierarchy.create(f"i-{cpu}", cpu=cpu, memory_mb=16)
        assert (cg.dirs[0] / "cpu.weight").read_text() == weight
        assert (cg.dirs[0] / "cpu.max").read_text() == quota


def test_v2_reads_an_oom_kill_since_the_process_started(tmp_path: Path) -> None:
    hierarchy = detect("v2", "n", root=v2_root(tmp_path)).hierarchy
    assert hierarchy is not None
    events = tmp_path / "cgroup" / "gavel" / "n" / "i" / "memory.events"
    kernel_files(events.parent)
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    cg = hierarchy.create("i", cpu=1.0, memory_mb=16)
    cg.started()  # a restart in place: the kill before it was the last run's
    assert not cg.exceeded(-9)
    events.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert cg.exceeded(-9) and cg.exceeded(1) and cg.exceeded(None)
    assert not cg.exceeded(0)  # it succeeded: a helper of it was killed, not the instance


def test_v2_is_refused_with_a_sentence_where_it_has_no_controllers(tmp_path: Path) -> None:
    # This host's layout: cgroup2 mounted at unified/ with no controllers, v1 beside it.
    root = v1_root(tmp_path)
    unified = root / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("\n")
    with pytest.raises(Unavailable, match=r"^cgroup v2: no unified hierarchy with the memory "
                                          r"and cpu controllers at "):
        detect("v2", "n", root=root)
    assert detect("auto", "n", root=root).version == "v1"


def test_v2_on_a_hybrid_host_is_found_under_unified(tmp_path: Path) -> None:
    (tmp_path / "hybrid").mkdir()
    unified = v2_root(tmp_path / "hybrid")
    root = tmp_path / "cgroup"
    root.mkdir()
    unified.rename(root / "unified")
    got = detect("auto", "n", root=root)
    assert got.version == "v2"
    assert got.hierarchy is not None
    assert got.hierarchy.parents["memory"] == root / "unified" / "gavel" / "n"


def test_a_hierarchy_gavel_cannot_write_is_unavailable(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    (root / "gavel").write_text("not a directory")  # what mkdir cannot get past
    with pytest.raises(Unavailable, match=r"^cgroup v2 at .* is not writable: "):
        detect("v2", "n", root=root)
    off = detect("auto", "n", root=root)
    assert off.hierarchy is None and off.missing and off.version == "none"
    assert off.summary.startswith("resources not enforced (cgroup v2 at ")
    assert off.summary.endswith("cpu and memory reservations are bookkeeping only")


# -- v1 ------------------------------------------------------------------------------------


def test_v1_makes_the_nodes_parent_in_each_controller(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    got = detect("v1", "node-1", root=root)
    assert got.hierarchy is not None
    assert got.hierarchy.parents == {"memory": root / "memory" / "gavel" / "node-1",
                                     "cpu": root / "cpu" / "gavel" / "node-1"}
    assert all(p.is_dir() for p in got.hierarchy.parents.values())


def test_v1_writes_memory_swap_and_cpu_in_proportion(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    hierarchy = detect("v1", "n", root=root, cpu_limit="quota").hierarchy
    assert hierarchy is not None
    mem, cpu = root / "memory" / "gavel" / "n" / "i", root / "cpu" / "gavel" / "n" / "i"
    kernel_files(mem, "memory.memsw.limit_in_bytes")
    cg = hierarchy.create("i", cpu=0.25, memory_mb=48)
    assert cg.dirs == (mem, cpu)
    assert (mem / "memory.limit_in_bytes").read_text() == str(48 * MB)
    assert (mem / "memory.memsw.limit_in_bytes").read_text() == str(48 * MB)
    assert (cpu / "cpu.shares").read_text() == "256"  # 1024 a cpu
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "25000"


def test_v1_reads_the_kill_counter_or_else_a_sigkill_at_the_limit(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    hierarchy = detect("v1", "n", root=root).hierarchy
    assert hierarchy is not None
    mem = root / "memory" / "gavel" / "n" / "i"
    kernel_files(mem)
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    cg = hierarchy.create("i", cpu=1.0, memory_mb=16)
    assert not cg.exceeded(-9)
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cg.exceeded(-9) and cg.exceeded(137)
    # An older kernel without the counter: the limit hit, at the limit, and a SIGKILL.
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    (mem / "memory.failcnt").write_text("0\n")
    (mem / "memory.max_usage_in_bytes").write_text(f"{16 * MB}\n")
    old = Cgroup("v1", cg.dirs, mem, 16)
    (mem / "memory.failcnt").write_text("12\n")
    assert old.exceeded(-9) and not old.exceeded(1)
    (mem / "memory.max_usage_in_bytes").write_text(f"{8 * MB}\n")
    assert not old.exceeded(-9)  # hit often, never at the limit: not its memory


def test_no_hierarchy_at_all(tmp_path: Path) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    for mode in ("v1", "v2"):
        with pytest.raises(Unavailable):
            detect(mode, "n", root=empty)  # type: ignore[arg-type]
    got = detect("auto", "n", root=empty)
    assert got.hierarchy is None and got.missing
    assert got.summary == (f"resources not enforced (cgroup v2: no unified hierarchy with the "
                           f"memory and cpu controllers at {empty}; cgroup v1: no memory "
                           f"hierarchy at {empty}): cpu and memory reservations are "
                           "bookkeeping only")
    off = detect("off", "n", root=empty)
    assert off == Enforcement.off() and not off.missing
    assert not list(empty.iterdir())  # off touches nothing


# -- entering, removing --------------------------------------------------------------------


async def test_the_child_enters_its_cgroup_before_its_command_runs(tmp_path: Path) -> None:
    hierarchy = detect("v2", "n", root=v2_root(tmp_path)).hierarchy
    assert hierarchy is not None
    cg = hierarchy.create("i", cpu=1.0, memory_mb=16)
    procs = cg.dirs[0] / "cgroup.procs"
    # The command reads what its process wrote there before exec (a real cgroup.procs would
    # list its pid; this plain file keeps the "0" the kernel takes as "me").
    proc = Process.spawn([sys.executable, "-c", f"print(open({str(procs)!r}).read())"],
                         env={}, cwd=tmp_path / "run", poll_s=0.05, cgroup=cg)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert (tmp_path / "run" / "stdout.log").read_text().strip() == "0"


async def test_a_child_that_cannot_enter_its_cgroup_never_runs(tmp_path: Path) -> None:
    hierarchy = detect("v2", "n", root=v2_root(tmp_path)).hierarchy
    assert hierarchy is not None
    cg = hierarchy.create("i", cpu=1.0, memory_mb=16)
    procs = cg.dirs[0] / "cgroup.procs"
    marker = tmp_path / "ran"
    # The kernel refuses the move (here: a write that always fails, as /dev/full's does).
    procs.symlink_to("/dev/full")
    with pytest.raises(subprocess.SubprocessError):
        Process.spawn(["touch", str(marker)], env={"PATH": "/usr/bin:/bin"},
                      cwd=tmp_path / "run", poll_s=0.05, cgroup=cg)
    assert not marker.exists()
    # The cgroup went away before the fork: its file cannot even be opened.
    procs.unlink()
    procs.mkdir()
    with pytest.raises(OSError):
        Process.spawn(["touch", str(marker)], env={"PATH": "/usr/bin:/bin"},
                      cwd=tmp_path / "run", poll_s=0.05, cgroup=cg)
    assert not marker.exists()


def test_pids_never_name_the_worker_or_its_process_group(tmp_path: Path) -> None:
    import os

    hierarchy = detect("v2", "n", root=v2_root(tmp_path)).hierarchy
    assert hierarchy is not None
    cg = hierarchy.create("i", cpu=1.0, memory_mb=16)
    (cg.dirs[0] / "cgroup.procs").write_text(f"0\n{os.getpid()}\n-1\n")
    assert cg.pids() == []  # so killing what is left can never hit this process or its group


# -- staying in, and parents of one's own ------------------------------------------------------


def test_membership_is_read_per_controller_v1_and_v2() -> None:
    from gavel.worker.cgroups import _inside

    v1 = (("memory", "/gavel/n/w1/i"), ("cpu", "/gavel/n/w1/i"), ("pids", "/gavel/n/w1/i"))
    text = ("9:name=systemd:/\n8:pids:/gavel/n/w1/i\n4:memory:/gavel/n/w1/i\n"
            "2:cpuacct:/\n1:cpu:/gavel/n/w1/i\n0::/\n")
    assert _inside(text, v1)
    assert not _inside(text.replace("4:memory:/gavel/n/w1/i", "4:memory:/"), v1)
    assert not _inside(text.replace("8:pids:/gavel/n/w1/i", "8:pids:/gavel/n/w1/i2"), v1)
    assert _inside(text.replace("1:cpu:", "1:cpu,cpuacct:"), v1)  # a joint mount
    v2 = (("", "/gavel/n/w1/i"),)
    assert _inside("0::/gavel/n/w1/i\n", v2) and _inside("0::/gavel/n/w1/i/sub\n", v2)
    assert not _inside("0::/\n", v2) and not _inside("0::/gavel/n/w1/i2\n", v2)


def test_each_worker_has_its_own_parent_and_a_removed_one_is_made_again(
        tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    one = detect("v2", "n", root=root, state_dir=tmp_path / "one").hierarchy
    two = detect("v2", "n", root=root, state_dir=tmp_path / "two").hierarchy
    assert one is not None and two is not None
    assert one.parents["memory"].parent == two.parents["memory"].parent == root / "gavel" / "n"
    assert one.parents["memory"] != two.parents["memory"]
    again = detect("v2", "n", root=root, state_dir=tmp_path / "one").hierarchy
    assert again is not None and again.parents == one.parents  # a restarted worker: the same
    shutil.rmtree(root / "gavel")  # removed from outside while the worker runs
    cg = two.create("i", cpu=0.5, memory_mb=32, pids=7)
    assert (two.parents["memory"] / "i" / "memory.max").read_text() == str(32 * MB)
    assert (two.parents["pids"] / "i" / "pids.max").read_text() == "7"
    assert (root / "gavel" / "cgroup.subtree_control").read_text().startswith("+memory +cpu")
    assert cg.where == (("", f"/gavel/n/{two.parents['memory'].name}/i"),)


def test_an_instance_from_before_per_worker_parents_is_tracked_where_it_runs(
        tmp_path: Path) -> None:
    """A worker from before per-worker parents put its instances in the node's parent; the
    upgraded worker re-adopting one finds its cgroup there (memory and OOM kills read, the
    membership check against that path) and writes its pids limit, instead of leaving it
    untracked and unlimited."""
    root = v2_root(tmp_path)
    h = detect("v2", "n", root=root, state_dir=tmp_path / "state").hierarchy
    assert h is not None
    old = root / "gavel" / "n" / "i"
    old.mkdir()
    kernel_files(old, "memory.max", "memory.events", "cgroup.procs", "pids.max")
    cg = h.find("i", memory_mb=64, pids=9)
    assert cg is not None and cg.dirs == (old,) and cg.memory_dir == old
    assert cg.where == (("", "/gavel/n/i"),)
    assert (old / "pids.max").read_text() == "9"
    assert h.find("j", memory_mb=64) is None  # nowhere: nothing to track
    own = h.create("k", cpu=0.5, memory_mb=32, pids=7)  # its own still come first
    assert h.find("k", memory_mb=32) is not None and own.dirs[0].parent == h.parents["memory"]
