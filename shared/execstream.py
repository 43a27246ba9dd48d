"""`gavel exec`: a command run inside a running instance, its input and output streamed between
an operator and the one node that holds the instance.

Rules:
1. An operator opens a session with `ExecStart` on ``gavel.exec.<node>.<operator>``; its
   input, acknowledgements and keepalives are `ExecInput` on the same subject, each naming the
   session. The subject's last token is who asks (`transport.identity` lets each operator
   publish there under its own name only), so the node knows who ran what without trusting
   the message, and a session answers only the operator that opened it.
2. The node answers on the reply subject of the operator's newest message, under that
   operator's own inbox, through the server's response permission (`transport.identity`
   rule 6). The server counts a grant's replies from the message that made it and never
   starts again for the same reply subject, so each operator message carries a reply subject
   of its own (a fresh grant); the operator sends one at least every `KEEPALIVE_S` (its
   acknowledgements usually are) and the node never sends more than `WINDOW` chunks past the
   last acknowledged one (`ExecInput.acked`): far below a grant's
   `shared.logstream.REPLIES_MAX`, and the command's output waits rather than piling up.
3. Bounded: a session ends at its time limit (`ExecStart.timeout_s`, at most `TIMEOUT_MAX_S`,
   `TIMEOUT_S` when unsaid) or once it has streamed `OUTPUT_MAX` bytes, and when its operator
   has not been heard for `IDLE_S`; its command is then killed and `ExecExit.reason` says why.
4. `ExecExit` is the last reply: the command's exit status (None when it was killed or
   never started) and why it ended early, a fixed sentence ("" when it ended by itself).
5. Nothing of a session lands in git. The node logs it and reports it as an ``exec`` event of
   the instance (who, what command, its exit status), which the broker publishes and keeps
   in the event history like any other.
"""

from __future__ import annotations

import re
import shlex
from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from gavel.shared.messages import Message

__all__ = ["ARGS_MAX", "ARGV_BYTES_MAX", "CHUNK_MAX", "IDLE_S", "KEEPALIVE_S", "OUTPUT_MAX",
           "TIMEOUT_MAX_S", "TIMEOUT_S", "WINDOW", "Ended", "ExecExit", "ExecInput", "ExecOutput",
           "ExecRequest", "ExecStart", "Stream", "check", "describe", "is_session", "limit"]

#: Output chunks in flight past the last acknowledged one (rule 2).
WINDOW = 32
#: The most the operator stays silent: well inside the response grant's window (60 s).
KEEPALIVE_S = 10.0
#: An operator silent this long has gone: its session ends (rule 3).
IDLE_S = 3 * KEEPALIVE_S
#: The session's time limit when the operator names none, and the most it may name.
TIMEOUT_S = 3600.0
TIMEOUT_MAX_S = 24 * 3600.0
#: Bytes of output one session may stream (stdout and stderr together).
OUTPUT_MAX = 256 * 1024 * 1024
#: Bytes one `ExecOutput` or `ExecInput` carries at most.
CHUNK_MAX = 64 * 1024
#: The most words and bytes a command line may have.
ARGS_MAX = 256
ARGV_BYTES_MAX = 64 * 1024

Stream = Literal["stdout", "stderr"]
_SESSION = re.compile(r"[0-9a-f]{16,64}")


class Ended(StrEnum):
    """Why a session ended before its command did (rule 4): the sentence the operator reads."""

    TIMEOUT = "the session reached its time limit; the command was killed"
    OUTPUT = "the session streamed its output limit; the command was killed"
    IDLE = "the operator was not heard from; the command was killed"
    HUNG_UP = "the operator ended the session; the command was killed"
    NOT_HELD = "this node does not run that instance"
    NOT_RUNNING = "the instance is not running; nothing to exec into"
    INSTANCE_ENDED = "the instance ended; the command was killed"
    WORKER_STOPPED = "the worker is stopping; the command was killed"
    BUSY = "this node runs as many exec sessions as it allows; try again shortly"
    START_FAILED = "the command could not be started"
    FAILED = "the node failed serving the session; the command was killed"


class ExecStart(Message, tag="exec-start"):
    """Operator -> the node `node_id` (the subject's node: checked): run `command` inside
    instance `instance_id`."""

    node_id: str
    instance_id: Annotated[str, msgspec.Meta(max_length=128)]
    #: The operator's name for the session: 16-64 lowercase hex digits.
    session: str
    command: Annotated[list[str], msgspec.Meta(min_length=1, max_length=ARGS_MAX)]
    #: A terminal: stdout and stderr are one stream, and the command sees a tty.
    tty: bool = False
    #: Seconds the session may last (0: `TIMEOUT_S`); more than `TIMEOUT_MAX_S` is refused.
    timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    #: The terminal's size, with `tty`.
    rows: Annotated[int, msgspec.Meta(ge=0, le=10000)] = 0
    cols: Annotated[int, msgspec.Meta(ge=0, le=10000)] = 0


class ExecRequest(Message, tag="exec"):
    """The HTTP API's exec (``POST /v1/instances/ID/exec``): `command` inside the running
    instance without a terminal, its whole input given at once (`stdin`, closed after it),
    run as `ExecStart` is: the same limits, the same event. `node_id`: ask that node, without
    the status API."""

    instance_id: Annotated[str, msgspec.Meta(max_length=128)]
    command: Annotated[list[str], msgspec.Meta(min_length=1, max_length=ARGS_MAX)]
    stdin: bytes = b""
    timeout_s: Annotated[float, msgspec.Meta(ge=0, le=TIMEOUT_MAX_S)] = 0.0
    node_id: str = ""


class ExecInput(Message, tag="exec-input"):
    """Operator -> node: input for the command, an acknowledgement, a keepalive (rule 2)."""

    node_id: str
    session: str
    data: bytes = b""
    #: No more input: the command's stdin is closed.
    eof: bool = False
    #: The output chunks received so far (`ExecOutput.seq` of the last).
    acked: Annotated[int, msgspec.Meta(ge=0)] = 0
    #: The operator ends the session: the command is killed.
    hangup: bool = False


class ExecOutput(Message, tag="exec-output"):
    session: str
    stream: Stream
    data: bytes
    #: 1 for the session's first chunk, then one more each.
    seq: int


class ExecExit(Message, tag="exec-exit"):
    """The last reply (rule 4)."""

    session: str
    exit_code: int | None = None
    #: Why it ended early (an `Ended` sentence; "" when the command ended by itself).
    reason: str = ""
    #: What the reason adds (why a start failed).
    detail: str = ""


def is_session(token: str) -> bool:
    return _SESSION.fullmatch(token) is not None


def limit(start: ExecStart) -> float:
    """The session's time limit in seconds (rule 3)."""
    return start.timeout_s or TIMEOUT_S


def check(start: ExecStart) -> str:
    """What is wrong with a start ("" nothing): a malformed session, a limit past the most, a
    command line too long."""
    if not is_session(start.session):
        return "an exec session is 16-64 lowercase hex digits"
    if start.timeout_s > TIMEOUT_MAX_S:
        return f"an exec session lasts at most {TIMEOUT_MAX_S:g} seconds"
    if sum(len(a.encode()) for a in start.command) > ARGV_BYTES_MAX or \
            any("\0" in a for a in start.command):
        return "the command line is too long, or holds a NUL byte"
    return ""


def describe(command: list[str], width: int = 200) -> str:
    """A command line as the event and the node's log show it: shell-quoted, cut short."""
    text = shlex.join(command)
    return text if len(text) <= width else text[:width - 3] + "..."
