"""`bench.hour.sched_s`: a process's CPU run time and its waits for a CPU, read from
the kernel (`bench.run` rule 8). Two processes spinning on the same one CPU each wait while
the other runs: the waits are real, not a formula."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gavel.bench.hour import sched_s

SPIN = ("import os, time\nos.sched_setaffinity(0, {0})\nend = time.time() + 2.0\n"
        "while time.time() < end:\n    pass\n")


def test_two_processes_spinning_on_one_cpu_each_run_and_wait() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        time.sleep(1.2)
        read = [sched_s(p.pid) for p in procs]
    finally:
        for p in procs:
            p.wait(10)
    for ran, waited, turns in read:
        assert ran > 0.05 and waited > 0.1  # ~1 s on one CPU between them: each waits its turn
        assert turns > 0
    assert sched_s(procs[0].pid) == (0.0, 0.0, 0)  # gone: nothing to read
    assert sched_s(os.getpid())[0] > 0  # this process has run
