"""Reading an instance's output from the node that holds it: the request an operator sends on
``gavel.logs.<node>`` and the replies the node streams to the asker's inbox.

Rules:
1. A node answers only on the reply subject of a request it received, and the server holds
   it to that: its response permission (``allow_responses``, `transport.identity`) allows
   `REPLIES_MAX` replies to a request within `WINDOW_S`. A node's answer to one request is
   at most that many replies, the last a `LogsDone`, sent before the window closes; one cut
   short says ``more`` and carries a cursor, and the asker asks again from there. A follow
   is a chain of such requests, each answered until its budget or its window runs out.
2. A position is a byte count since the instance's output began, per stream, across
   rotations: a cursor survives a rotation; bytes rotated away before they were read are
   skipped and counted (`LogsDone.skipped`), never silently mistaken for others.
3. Data travels as raw bytes, at most `CHUNK_MAX` per reply; a chunk that stops short of the
   stream's end stops at a line end when it holds one.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gavel.shared.messages import Message

__all__ = ["CHUNK_MAX", "REPLIES_MAX", "STREAMS", "WINDOW_S", "LogChunk", "LogsDone",
           "LogsRequest", "Stream"]

STREAMS = ("stdout", "stderr")
Stream = Literal["stdout", "stderr"]
#: Replies one request may have (the server's ``allow_responses.max`` for a node).
REPLIES_MAX = 1000
#: How long a node may answer one request (the server's ``allow_responses.expires``).
WINDOW_S = 60.0
#: Bytes of output one reply carries at most (well under NATS's default 1 MB payload).
CHUNK_MAX = 64 * 1024


class LogsRequest(Message, tag="logs"):
    """An instance's output, from the node `node_id` (the subject's node: checked)."""

    node_id: str
    instance_id: Annotated[str, msgspec.Meta(max_length=128)]
    streams: list[Stream] = msgspec.field(default_factory=lambda: ["stdout"])
    #: The last this many lines of each stream (-1: all that is kept).
    tail: Annotated[int, msgspec.Meta(ge=-1)] = -1
    #: Only output written at or after this time (Unix seconds; 0: all that is kept).
    since: float = 0.0
    #: Keep sending new output until the instance ends (or the window closes: rule 1).
    follow: bool = False
    #: Go on from these positions (rule 2) - an answer that said ``more``; tail and since
    #: then do not apply.
    cursor: dict[str, int] = msgspec.field(default_factory=dict)


class LogChunk(Message, tag="log-chunk"):
    instance_id: str
    stream: Stream
    data: bytes
    #: The position right after `data` (rule 2).
    end: int
    #: By when its bytes were written (Unix seconds, to the node's tick: its time marks);
    #: 0 for bytes after the node's last mark (written just now). What an asker merging
    #: several instances' output in time order sorts on.
    at: float = 0.0


class LogsDone(Message, tag="logs-done"):
    """The last reply to a request."""

    instance_id: str
    #: Where each stream's answer stopped: the next request's cursor.
    cursor: dict[str, int] = msgspec.field(default_factory=dict)
    #: The window or the reply budget ran out first: ask again from `cursor`.
    more: bool = False
    #: The node still runs the instance.
    running: bool = False
    #: How it ended, when the node saw it end ("" while it runs, or if unknown).
    ended: str = ""
    #: Bytes that were rotated away before they could be read.
    skipped: int = 0
