"""Every gavel process runs on uvloop unless GAVEL_EVENT_LOOP says asyncio; another value
is refused with a sentence, by the CLI too."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from gavel.transport import eventloop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_the_default_and_asyncio_can_be_chosen() -> None:
    assert eventloop.run(_loop_module(), env={}).startswith("uvloop")
    assert eventloop.run(_loop_module(), env={"GAVEL_EVENT_LOOP": "asyncio"}
                         ).startswith("asyncio")


def test_another_loop_is_refused_with_a_sentence() -> None:
    with pytest.raises(ValueError, match="GAVEL_EVENT_LOOP must be 'uvloop' or 'asyncio'"):
        eventloop.run(_loop_module(), env={"GAVEL_EVENT_LOOP": "trio"})


def test_the_cli_refuses_an_unknown_loop() -> None:
    env = {**os.environ, "GAVEL_EVENT_LOOP": "tokio"}
    out = subprocess.run([sys.executable, "-m", "gavel", "status", "--nats",
                          "nats://127.0.0.1:1"], capture_output=True, text=True, env=env,
                         timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert "GAVEL_EVENT_LOOP must be 'uvloop' or 'asyncio', not 'tokio'" in out.stderr
