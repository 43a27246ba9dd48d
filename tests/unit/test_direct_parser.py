"""`transport.wire` rule 4, the parser: complete MSG frames for direct subscriptions are
handed over as they are cut off, everything else is nats-py's parser's; however what the
server sent is split into reads, each handler and each ordinary subscription sees what
nats-py's own parser would have handed over, in the same order."""

from __future__ import annotations

import asyncio

from nats.protocol.parser import Parser

from gavel.transport import wire

DIRECT_SID, PLAIN_SID = 7, 9


class _Recording(wire.Client):
    """A client whose ordinary subscriptions' messages are written down, in the order they
    come beside the direct ones."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[object, ...]] = []
        self._direct[DIRECT_SID] = lambda m: self.seen.append(
            ("direct", m.subject, m.reply, m.data, m.headers))

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        if sid == PLAIN_SID:
            self.seen.append(("plain", bytes(subject), bytes(reply), data, headers))
            return
        await super()._process_msg(sid, subject, reply, data, headers)


def _stream() -> bytes:
    head = b"NATS/1.0\r\nK: v\r\n\r\n"
    return b"".join([
        b"MSG gavel.bids.n-1 7 5\r\nhello\r\n",
        b"MSG _INBOX.x.1 7 _INBOX.r.1 0\r\n\r\n",  # a reply subject, an empty payload
        b"+OK\r\n",
        b"MSG o.x 9 3\r\nabc\r\n",  # an ordinary subscription's, between direct ones
        b"MSG gavel.bids.n-2 7 13\r\nMSG x 7 1\r\n\r\n\r\n",  # a payload that looks like a frame
        b"HMSG _INBOX.x.2 7 %d %d\r\n%sdata\r\n" % (len(head), len(head) + 4, head),
        b"MSG  d.spaced\t7   4\r\nabcd\r\n",  # any whitespace between the fields
        b"MSG d.after 7 2\r\nok\r\n",
    ])


async def _seen(parser_of: type[Parser] | None, chunks: list[bytes]) -> list[tuple[object, ...]]:
    nc = _Recording()
    parser = nc._ps if parser_of is None else parser_of(nc)
    for chunk in chunks:
        await parser.parse(chunk)
    return nc.seen


def test_every_split_of_the_stream_is_handed_over_as_nats_pys_parser_hands_it() -> None:
    async def run() -> None:
        data = _stream()
        want = await _seen(Parser, [data])
        assert len(want) == 7 and want[2][0] == "plain"
        assert want[0] == ("direct", "gavel.bids.n-1", "", b"hello", None)
        assert want[3][3] == b"MSG x 7 1\r\n\r\n"
        assert want[4] == ("direct", "_INBOX.x.2", "", b"data", b"NATS/1.0\r\nK: v\r\n\r\n")
        assert await _seen(None, [data]) == want
        for size in (1, 2, 3, 5, 7, 11, 16, 40):
            chunks = [data[i:i + size] for i in range(0, len(data), size)]
            assert await _seen(None, chunks) == want, size
        for cut in range(1, len(data)):
            assert await _seen(None, [data[:cut], data[cut:]]) == want, cut

    asyncio.run(run())


def test_the_broker_client_parses_with_the_direct_parser() -> None:
    assert wire.DIRECT
    assert isinstance(wire.Client()._ps, wire._DirectParser)
