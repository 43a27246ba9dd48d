"""The dashboard's feed (`gavel.cli.ui.feed`): a page that cannot keep up is dropped, never
waited for; a broker without the service verbs is told from one that refused them."""

from __future__ import annotations

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
