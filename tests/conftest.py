"""Shared fixtures: a real nats-server on a free loopback port, fast timers everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("GAVEL_FAST_TIMERS", "1")
# Workers the tests start as child processes run their instances as the worker's user: the
# tests' workloads run this interpreter (here under a directory only root may enter) and
# write into pytest's directories under /tmp, which an isolated instance (a uid of its own,
# a /tmp of its own) cannot reach. tests/integration/test_isolation.py and test_up's demo
# run isolated.
os.environ.setdefault("GAVEL_ISOLATION", "off")

from gavel.transport.natsserver import NatsServer

# Property tests are deterministic by default - the same examples on every run, no example
# database, no per-example deadline (a slow CI machine must not turn a slow example into a
# failure) - so CI is red only for a change, never for a lucky draw.
# `GAVEL_HYPOTHESIS=explore` draws new examples each run, for hunting.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("explore" if os.environ.get("GAVEL_HYPOTHESIS") == "explore" else "ci")

_watchdog_stderr: list[TextIO] = []
_current = {"test": "(between tests)"}


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _current["test"] = nodeid


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _current["test"] = f"(after {nodeid})"


def _bark(err: TextIO, after: float) -> None:
    """Every thread's stack, innermost frame last (a CI log shows its tail), then exit 1."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in frames.items():
        err.write(f"\n--- thread {names.get(ident, ident)}:\n")
        err.write("".join(traceback.format_stack(frame)))
    for task in list(asyncio.tasks._all_tasks):  # diagnostics only: a private WeakSet
        if not task.done():
            err.write(f"\n--- asyncio task {task.get_name()}:\n")
            task.print_stack(file=err)
    err.write(f"\ngavel test watchdog: in {_current['test']} the run outlived {after:g}s "
              "(GAVEL_TEST_WATCHDOG_S); stacks above, innermost frame last\n")
    err.flush()
    os._exit(1)


def pytest_configure(config: pytest.Config) -> None:
    """A test run ends with a diagnosis, never at somebody's wall-clock kill: pytest-timeout
    (pyproject) fails a test that hangs; this catches a hang outside any test (a teardown,
    interpreter exit): every thread's stack goes to the real stderr and the run exits 1.
    faulthandler backs it up a minute later for a hang that holds the GIL."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        err = os.fdopen(os.dup(2), "w")  # the terminal's stderr, not pytest's capture
    _watchdog_stderr.append(err)
    after = float(os.environ.get("GAVEL_TEST_WATCHDOG_S", "2700"))
    timer = threading.Timer(after, _bark, (err, after))
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(after + 60, exit=True, file=err)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "jetstream", log=tmp_path / "nats.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url
