"""`harness.free_range`: a port another test process claimed is not handed out again while
that process lives, whatever binds at the moment (xdist runs other files' tests beside this
one, and they name the same starts)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration.harness import PORT_CLAIMS, free_range, release_ports


def test_a_range_another_live_process_claimed_is_skipped_and_a_dead_ones_taken_over() -> None:
    start = free_range(31000, 4)[0]
    release_ports()
    PORT_CLAIMS.mkdir(exist_ok=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    try:
        (PORT_CLAIMS / str(start + 1)).write_text(str(other.pid))  # a live holder
        first, last = free_range(start, 4)
        assert first >= start + 4 and last == first + 3, (start, first)
        assert (PORT_CLAIMS / str(first)).read_text() == str(os.getpid())
        release_ports()
        assert not (PORT_CLAIMS / str(first)).exists()
        assert (PORT_CLAIMS / str(start + 1)).read_text() == str(other.pid)  # not ours
        (PORT_CLAIMS / str(start + 1)).write_text(dead)  # its process is gone
        assert free_range(start, 4) == (start, start + 3)
        assert (PORT_CLAIMS / str(start + 1)).read_text() == str(os.getpid())
    finally:
        other.kill()
        other.wait()
        release_ports()
