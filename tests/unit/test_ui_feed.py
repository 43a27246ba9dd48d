"""The dashboard's feed (`gavel.cli.ui.feed`): a page that cannot keep up is dropped, never
waited for; a broker without the service verbs is told from one that refused them; its
tasks have an owner (a crash is logged as it happens, none outlives `close`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.errors import NoRespondersError

from gavel.cli.ui import feed
from gavel.transport.client import BrokerRefused, ClientError


def test_a_page_that_cannot_keep_up_is_dropped_with_one_last_frame() -> None:
    page = feed.Page()
    for k in range(feed.QUEUE_MAX):
        page.put("event", str(k).encode())
    assert not page.dropped
    page.put("event", b"one too many")
    assert page.dropped
    page.put("event", b"after")  # nothing more is queued for it
    frames = [page.queue.get_nowait() for _ in range(page.queue.qsize())]
    assert len(frames) == feed.QUEUE_MAX and frames[-1] == ("dropped", b"{}")


def _no_responders() -> ClientError:
    try:
        try:
            raise NoRespondersError
        except NoRespondersError:
            raise ClientError("no broker is answering") from None
    except ClientError as exc:
        return exc


def test_a_verb_the_broker_does_not_serve_is_told_from_a_refusal() -> None:
    assert feed.unknown_verb(_no_responders())
    assert feed.unknown_verb(BrokerRefused("unknown verb services"))
    assert feed.unknown_verb(BrokerRefused("unknown request kind 'services'"))
    assert not feed.unknown_verb(BrokerRefused("services failed: boom"))
    assert not feed.unknown_verb(ClientError("the broker did not answer services within 5s"))


class Events:
    """A follower of the broker's events whose next step fails."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> Any:
        raise RuntimeError("a bug in the follower")

    async def aclose(self) -> None:
        self.closed = True


class Broker:
    """A client whose broker does not answer."""

    def __init__(self) -> None:
        self.events_followed = Events()

    async def follow_events(self) -> Events:
        return self.events_followed

    def __getattr__(self, verb: str) -> Any:
        async def refused(*_args: Any, **_kw: Any) -> Any:
            raise ClientError(f"the broker did not answer {verb}")
        return refused


async def test_a_crash_of_the_feed_s_follower_is_logged_at_once_and_close_ends_all(
        caplog: pytest.LogCaptureFixture) -> None:
    client = Broker()
    the_feed = feed.Feed(client)  # type: ignore[arg-type]
    await the_feed.start()
    for _ in range(5):  # the follower's step, then its owner hears it ended
        await asyncio.sleep(0)
    assert "the dashboard's feed task follow failed" in caplog.text  # before any close
    assert "a bug in the follower" in caplog.text
    await the_feed.close()
    assert client.events_followed.closed
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()
