"""The kernel's own log on a container's memory kill (`worker.kernellog`), against the real
engine and kernel: the second opinion a worker asks when the engine reports a plain SIGKILL
(an engine misses kills in the first milliseconds of a run)."""

from __future__ import annotations

from typing import Any

import pytest

from gavel.worker.kernellog import oom_killed, readable
from tests.integration.dockerkit import image

pytestmark = pytest.mark.integration


@pytest.fixture
def kmsg() -> None:
    if not readable():
        pytest.skip("the kernel's log cannot be read here (/dev/kmsg needs CAP_SYSLOG)")


def _ended(docker: Any, tag: str, command: list[str], *, kill: bool = False) -> tuple[str, int]:
    made = docker.api.create_container(tag, command, host_config=docker.api.create_host_config(
        mem_limit=16 * 2**20, memswap_limit=16 * 2**20))
    cid = made["Id"]
    try:
        docker.api.start(cid)
        if kill:
            docker.api.kill(cid)  # SIGKILL, by the engine
        return cid, docker.api.wait(cid, timeout=60)["StatusCode"]
    finally:
        docker.api.remove_container(cid, force=True)


def test_the_kernel_names_a_container_killed_for_its_memory(docker: Any, kmsg: None) -> None:
    tag = image(docker, "v1")
    cid, code = _ended(docker, tag, ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"])
    assert code == 137
    assert oom_killed(cid)


def test_a_container_killed_otherwise_is_not_taken_for_a_memory_kill(
        docker: Any, kmsg: None) -> None:
    tag = image(docker, "v1")
    cid, code = _ended(docker, tag, ["sleep", "60"], kill=True)
    assert code == 137
    assert not oom_killed(cid)
