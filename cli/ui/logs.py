"""The instance page's logs panel: an instance's recent lines, from the node that holds it.

Rules:
1. The lines come from the `gavel logs` API (`Client.logs`: a request on
   ``gavel.logs.<node>``, chunks on the asker's inbox), never through the broker or git.
   Where to ask is the instance's node in the status API.
2. The panel asks for the last `TAIL` lines of stdout and stderr and, while the instance
   may still write, follows what it writes next. Lines are sent whole (a chunk's unfinished
   last line waits for the rest, or for the end), as frames of ``{"stream", "lines"}``.
3. When no lines can be had - the instance has not run on a node yet, the node does not
   answer - the panel is sent one ``unavailable`` frame with the sentence why; when the
   output ends, an ``end`` frame. The page stops listening at either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gavel.cli.ui.feed import encode
from gavel.client import Client, ClientError
from gavel.shared.logstream import LogChunk, LogsDone
from gavel.shared.messages import InstanceState

__all__ = ["TAIL", "follow"]

#: Lines of each stream the panel opens with (rule 2).
TAIL = 200
#: States in which an instance may still write (rule 2).
_WRITING = frozenset({InstanceState.PLACED, InstanceState.PROVISIONING, InstanceState.RUNNING})

Send = Callable[[str, bytes], Awaitable[None]]


async def follow(client: Client, instance_id: str, send: Send) -> None:
    """Rules 1-3: the panel's frames for `instance_id`, sent through `send`."""
    async def unavailable(why: str) -> None:
        await send("unavailable", encode({"text": why}))

    try:
        inst = await client.instance(instance_id)
    except ClientError as exc:
        await unavailable(str(exc))
        return
    if not inst.node_id:
        await unavailable(f"{instance_id} has not run on a node yet ({inst.state}): it has no "
                          "output")
        return
    rest: dict[str, bytes] = {}

    async def lines(stream: str, found: list[bytes]) -> None:
        if found:
            await send("lines", encode({"stream": stream, "lines": [
                ln.decode(errors="replace") for ln in found]}))

    async def chunk(c: LogChunk) -> None:
        *whole, tail = (rest.pop(c.stream, b"") + c.data).split(b"\n")
        if tail:
            rest[c.stream] = tail
        await lines(c.stream, whole)

    done = LogsDone(instance_id=instance_id)
    try:
        async for got in client.logs(instance_id, node_id=inst.node_id,
                                     streams=["stdout", "stderr"], tail=TAIL,
                                     follow=inst.state in _WRITING):
            if isinstance(got, LogsDone):
                done = got
            else:
                await chunk(got)
    except ClientError as exc:  # the node does not answer, or refused
        await unavailable(str(exc))
        return
    for stream, tail in rest.items():
        await lines(stream, [tail])
    await send("end", encode({"text": f"the output ended ({done.ended})" if done.ended
                              else "no more output for now"}))
