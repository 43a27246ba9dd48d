"""The CLI's side of the API: one request, one typed reply (or `ApiError`).

Rules:
1. A broker that does not answer is a clear error naming the URL, never a traceback.
   "No responders" (`NoBroker`) means nobody got the request: no broker runs, or, with
   several, none leads at this moment (one is taking over); asking again is always safe.
   `call` asks again itself, backing off, for up to `Timing.interest_s` within the
   request's own timeout: right after a broker subscribes, or after a failover, its
   interest is still travelling the routes to the client's server, which says no responders
   until it arrives. Only after that is it `NoBroker`.
2. A NATS URL that is not one, or one where nothing answers, is the operator's to fix: one
   `BadInput` sentence (exit 2) naming it, before and instead of a retry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import nats
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeout

from gavel.shared import subjects
from gavel.shared.errors import BadInput
from gavel.shared.messages import ApiError, Message
from gavel.shared.redact import mask_url
from gavel.shared.timing import Timing
from gavel.transport.creds import connect_options, operator_name
from gavel.transport.inbound import Decode, Malformed
from gavel.transport.urls import servers

if TYPE_CHECKING:
    from gavel.shared.api import StatusReply

__all__ = ["BadNatsUrl", "BrokerRefused", "ClientError", "NoAnswer", "NoBroker", "NoNats",
           "NotAllowed", "call", "check_url", "connect", "operator_of", "status", "wait_healthy"]

T = TypeVar("T", bound=Message)
_enc = msgspec.msgpack.Encoder()

#: The operator's waits: machine waits of `Timing` (`shared.timing` rule 3), the same under
#: fast timers; a command's own `--timeout` is passed as `timeout`.
_TIMING = Timing()


class ClientError(Exception):
    """A sentence for the operator; the CLI prints it and exits non-zero."""


class BrokerRefused(ClientError):
    """The broker answered with `ApiError`: it was reached, and it said no."""


class BadNatsUrl(BadInput):
    """The NATS URL is not of the form nats://HOST:PORT (exit 2)."""


class NoNats(BadInput):
    """Nothing answers at the NATS URL (exit 2): the URL is wrong, or NATS is not running."""


_SCHEMES = ("nats", "tls", "ws", "wss")


def check_url(url: str) -> None:
    """Rule 2: every server of `url` (a comma list, as nats-py takes it) is a URL with a
    NATS scheme, a host and a port number; else `BadNatsUrl`."""
    for part in url.split(","):
        text = part.strip()
        try:
            u = urlsplit(text if "://" in text else f"nats://{text}")  # as nats-py reads it
            ok = u.scheme in _SCHEMES and bool(u.hostname) and (u.port or 1) > 0
        except ValueError:  # a port that is not a number, or out of range
            ok = False
        if not ok:
            raise BadNatsUrl(f"{mask_url(part.strip())!r} is not a NATS URL: expected "
                             "nats://HOST:PORT (or tls://, ws://, wss://).")


class NotAllowed(ClientError):
    """NATS refused to take the request: the credential's permissions (a named operator's
    role) do not allow the verb. Nothing was delivered, so nothing was done."""


class NoAnswer(ClientError):
    """The broker did not answer in time: what it did with the request is unknown."""


class NoBroker(ClientError):
    """Nobody received the request (rule 1): nothing was done with it."""


async def _quiet(exc: Exception) -> None:
    """nats-py logs connection errors with a traceback; `connect` raises a sentence instead."""


async def connect(url: str, creds: str | None = None, **options: Any) -> Any:
    """A connection for one command; `creds` is a .creds file or an nkey seed file (a
    `CredsError`, exit 2, if it is neither or cannot be read)."""
    check_url(url)
    kwargs: dict[str, Any] = {"connect_timeout": 3, "max_reconnect_attempts": 2,
                              "allow_reconnect": False, "error_cb": _quiet, **options}
    if creds:
        kwargs.update(connect_options(creds))
    name = operator_name(creds)
    if name != subjects.OPERATOR:  # its answers under its own inbox (`shared.subjects` rule 4)
        kwargs.setdefault("inbox_prefix", subjects.operator_inbox(name))
    try:
        return await nats.connect(servers(url), **kwargs)
    except Exception as exc:
        if "authorization violation" in str(exc).lower():
            which = f"the credentials in {creds}" if creds else \
                "a client without credentials (give --creds FILE or GAVEL_CREDS)"
            raise ClientError(f"NATS at {mask_url(url)} refused {which}") from exc
        if isinstance(exc, NoServersError | OSError | TimeoutError):
            raise NoNats(f"nothing answers at {mask_url(url)}: start NATS there (`gavel up` "
                         "runs one) or give its URL with --nats or GAVEL_NATS_URL.") from exc
        raise ClientError(f"cannot connect to NATS at {mask_url(url)}: {exc}") from exc


def operator_of(nc: Any) -> str:
    """Who connection `nc` asks as: the operator whose inbox prefix it has (`connect` gives a
    named operator's, `shared.subjects` rule 4)."""
    return subjects.operator_of_inbox(nc.new_inbox()) or subjects.OPERATOR


async def call(nc: Any, verb: str, request: Message, reply_type: type[T],
               timeout: float = _TIMING.answer_s) -> T:
    """One request, answered within `timeout` (rule 1: no responders is asked again)."""
    msg = await _answer(nc, verb, request, timeout)
    reply = _answer_of(reply_type)(msg.data)
    if isinstance(reply, Malformed):  # not our broker, or not a broker
        raise ClientError(f"the answer to {verb} is not a gavel reply: {reply.why}")
    if isinstance(reply, ApiError):
        raise BrokerRefused(reply.error)
    return reply  # type: ignore[no-any-return]


@functools.cache
def _answer_of(reply_type: Any) -> Decode[Any]:
    """One decoder per kind of answer, built once (`transport.inbound` rule 1)."""
    return Decode(reply_type | ApiError)


async def _unless_refused(nc: Any, subject: str, verb: str, who: str, asking: Any) -> Any:
    """`asking`'s answer, or at once a sentence when the server refuses to take the request
    (its permissions: nothing was delivered, so nothing was done): a named operator's role
    that does not allow the verb."""
    before = getattr(nc, "last_error", None)
    task = asyncio.ensure_future(asking)
    refused = f'permissions violation for publish to "{subject.lower()}"'
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_TIMING.poll_s)
            if done:
                return task.result()
            err = getattr(nc, "last_error", None)
            if err is not before and err is not None and refused in str(err).lower():
                if who == subjects.OPERATOR:  # the shared one's, or no operator's at all
                    raise NotAllowed(f"NATS did not let this credential call {verb} "
                                     f"({err}); the API takes an operator credential")
                raise NotAllowed(f"NATS refused operator {who}'s {verb}: its role does not "
                                 "allow it (`gavel auth operator add` gives a role)")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _answer(nc: Any, verb: str, request: Message, timeout: float) -> Any:
    """The answer to `request`, asked again while no server knows of a broker (rule 1).

    Asking again cannot do a thing twice, for any verb: no responders is the server saying
    it delivered the request to nobody (it forwards a request only along routes that
    reported interest, and answers no responders only when none did). Submit and deploy
    carry an idempotency key besides, for the retries after a timeout, whose fate is unknown.
    """
    start = time.monotonic()
    grace = start + min(timeout, _TIMING.interest_s)
    pause = _TIMING.poll_s
    data = _enc.encode(request)
    who = operator_of(nc)
    subject = subjects.API.format(verb=verb) if who == subjects.OPERATOR else \
        subjects.API_AS.format(verb=verb, operator=who)
    while True:
        left = start + timeout - time.monotonic()
        try:
            return await _unless_refused(nc, subject, verb, who, nc.request(
                subject, data, timeout=max(left, 0.001)))
        except NoRespondersError:
            if time.monotonic() + pause > grace:
                raise NoBroker("no broker is answering: start one with `gavel broker` or "
                               "`gavel up` (with several brokers, none leads at this moment: "
                               "ask again in a few seconds)") from None
        except NatsTimeout:
            err = getattr(nc, "last_error", None)
            if err is not None and "permissions violation" in str(err).lower():
                raise ClientError(f"NATS did not let this credential call {verb} ({err}); "
                                  "the API takes an operator credential") from None
            raise NoAnswer(f"the broker did not answer {verb} within {timeout:g}s") from None
        await asyncio.sleep(pause)
        pause = min(pause * 2, _TIMING.poll_max_s)


async def status(nc: Any, instance_id: str = "",
                 timeout: float = _TIMING.answer_s) -> StatusReply:
    """`status` of one instance, or of every instance page by page (`broker.api` rule 8),
    as one `StatusReply`."""
    from gavel.shared.api import StatusReply, StatusRequest

    reply = await call(nc, "status", StatusRequest(instance_id=instance_id), StatusReply,
                       timeout)
    pages = reply
    while pages.next:
        pages = await call(nc, "status", StatusRequest(after=pages.next), StatusReply, timeout)
        reply.instances += pages.instances
    reply.next = ""
    return reply


async def wait_healthy(nc: Any, n: int, timeout: float) -> None:
    """Until the broker counts at least `n` healthy nodes; ClientError after `timeout`."""
    from gavel.shared.api import NodesReply, NodesRequest

    deadline = time.monotonic() + timeout
    pause = _TIMING.poll_s
    while time.monotonic() < deadline:
        try:
            reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=_TIMING.ask_s)
            if sum(1 for x in reply.nodes if x.health == "healthy") >= n:
                return
        except ClientError:
            pass
        await asyncio.sleep(pause)
        pause = min(pause * 2, _TIMING.poll_max_s)
    raise ClientError(f"only some of the {n} workers came up within {timeout:g}s; "
                      "see the logs under the state directory")
