"""The kernel's word on a memory kill (`worker.kernellog`), read from records as the kernel
writes them."""

from __future__ import annotations

from gavel.worker.kernellog import killed_for_memory

ID = "7738b9b90b6d900b712d9ea6b9963d94a6643a5cef6cc0d360d1edc42231d21a"
OTHER = "0" * 64


def _kill(memcg: str) -> str:
    return ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,"
            f"oom_memcg={memcg},task_memcg={memcg},task=dd,pid=24531,uid=0")


def test_a_kill_in_the_containers_cgroup_is_found_whatever_the_cgroup_driver() -> None:
    invoked = "busybox invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0"
    assert killed_for_memory(ID, [invoked, _kill(f"/docker/{ID}")])
    assert killed_for_memory(ID, [_kill(f"/system.slice/docker-{ID}.scope")])


def test_another_containers_kill_or_other_records_say_nothing() -> None:
    assert not killed_for_memory(ID, [_kill(f"/docker/{OTHER}")])
    assert not killed_for_memory(ID, [f"Memory cgroup out of memory: Killed process 1 ({ID})"])
    assert not killed_for_memory(ID, [])


def test_only_the_killed_tasks_cgroup_counts_not_the_cgroup_whose_limit_was_hit() -> None:
    record = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,"
              f"oom_memcg=/docker/{ID},task_memcg=/docker/{OTHER},task=dd,pid=1,uid=0")
    assert not killed_for_memory(ID, [record])
    assert killed_for_memory(OTHER, [record])


def test_a_short_id_is_never_matched() -> None:
    assert not killed_for_memory(ID[:12], [_kill(f"/docker/{ID}")])
