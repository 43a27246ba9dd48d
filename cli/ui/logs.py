"""The instance page's logs panel: an instance's recent lines, from the node that holds it.

Rules:
1. The lines come from the `gavel logs` API (`transport.logclient.read`: a request on
   ``gavel.logs.<node>``, chunks on the asker's inbox), never through the broker or git.
   Where to ask is the instance's node in the status API.
2. The panel asks for the last `TAIL` lines of stdout and stderr and, while the instance
   runs, follows what it writes next. Lines are sent whole (a chunk's unfinished last line
   waits for the rest), as frames of ``{"stream", "lines"}``.
3. When no lines can be had - this gavel has no logs API, the instance has not run on a
   node yet, the node does not answer - the panel is sent one ``unavailable`` frame with the
   sentence why; when the output ends, an ``end`` frame. The page stops listening at either.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from gavel.cli.ui.feed import encode
from gavel.shared.api import StatusReply, StatusRequest
from gavel.transport.client import ClientError, call

__all__ = ["TAIL", "follow", "logs_api"]

#: Lines of each stream the panel opens with (rule 2).
TAIL = 200
STREAMS = ["stdout", "stderr"]
NO_API = ("this gavel has no logs API yet (`gavel logs`, gavel.transport.logclient): the "
          "panel fills in once it has")

Send = Callable[[str, bytes], Awaitable[None]]


def logs_api() -> tuple[ModuleType, ModuleType] | None:
    """Rule 1: (`transport.logclient`, `shared.logstream`), or None when this gavel has no
    logs API yet."""
    try:
        return (importlib.import_module("gavel.transport.logclient"),
                importlib.import_module("gavel.shared.logstream"))
    except ImportError:
        return None


async def follow(nc: Any, instance_id: str, send: Send) -> None:
    """Rules 1-3: the panel's frames for `instance_id`, sent through `send`."""
    async def unavailable(why: str) -> None:
        await send("unavailable", encode({"text": why}))

    api = logs_api()
    if api is None:
        await unavailable(NO_API)
        return
    logclient, logstream = api
    try:
        reply = await call(nc, "status", StatusRequest(instance_id=instance_id), StatusReply)
    except ClientError as exc:
        await unavailable(str(exc))
        return
    inst = reply.instances[0]
    if not inst.node_id:
        await unavailable(f"{instance_id} has not run on a node yet ({inst.state}): it has no "
                          "output")
        return
    rest: dict[str, bytes] = {}

    async def chunk(c: Any) -> None:
        *lines, tail = (rest.pop(c.stream, b"") + bytes(c.data)).split(b"\n")
        if tail:
            rest[c.stream] = tail
        if lines:
            await send("lines", encode({"stream": c.stream, "lines": [
                ln.decode(errors="replace") for ln in lines]}))

    running = inst.state in ("placed", "provisioning", "running")
    request = logstream.LogsRequest(node_id=inst.node_id, instance_id=instance_id,
                                    streams=STREAMS, tail=TAIL, follow=running)
    try:
        done = await logclient.read(nc, request, chunk)
    except ClientError as exc:  # the node does not answer, or refused
        await unavailable(str(exc))
        return
    for stream, tail in rest.items():
        await send("lines", encode({"stream": stream, "lines": [
            tail.decode(errors="replace")]}))
    ended = getattr(done, "ended", "")
    await send("end", encode({"text": f"the output ended ({ended})" if ended
                              else "no more output for now"}))
