"""The dashboard's and the API's HTTP server listens on a socket it bound and listened on
itself: a port another process holds is an OSError at `start` on either event loop, and the
API and dashboard fall back to a free port only when they were given none."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from gavel.cli.ui import http
from gavel.cli.ui.http import Server


@pytest.fixture
def held() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield int(sock.getsockname()[1])
    sock.close()


async def _handler(*_: Any) -> None:
    return None


async def _start_on(port: int) -> tuple[int, int | None]:
    """Start on `port`: (the errno it was refused with or 0, the port listened on)."""
    server = Server(_handler, "")  # type: ignore[arg-type]
    try:
        got = await server.start("127.0.0.1", port)
    except OSError as exc:
        return exc.errno or -1, None
    await server.close()
    return 0, got


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_port_held_elsewhere_is_refused_at_start(held: int, run: Any) -> None:
    assert run(_start_on(held)) == (errno.EADDRINUSE, None)
    code, port = run(_start_on(0))
    assert code == 0 and port and port != held


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_listen_refused_after_the_bind_is_an_oserror_not_a_closed_server(
        monkeypatch: pytest.MonkeyPatch, run: Any) -> None:
    # Another process listening on the port between this one's bind and its listen (two
    # `gavel up`s side by side): uvloop closed its server without a word, and the API
    # started with no socket at all.
    def taken(_sock: socket.socket, _backlog: int) -> None:
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(http.socket.socket, "listen", taken)
    assert run(_start_on(0)) == (errno.EADDRINUSE, None)
