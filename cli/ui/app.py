"""`gavel ui` (and `gavel up`'s dashboard): the routes, the static page, the command.

Rules:
1. The page is files in the package (``static/``: HTML, CSS, JavaScript, an icon): no CDN,
   no build step, nothing fetched from the internet. Everything else is JSON the page asks
   for, or an event stream.
2. Routes: ``/`` the page; ``/static/NAME`` its files; ``/api/overview`` nodes, instances
   and services; ``/api/events`` the event stream (the overview, the recent events, then
   every event and every new overview as they come); ``/api/instances/ID`` one instance's
   status, auctions and usage over the last minutes (`ui.usage`); ``/api/logs/ID`` its log
   lines as an event stream (`ui.logs`).
3. It listens on ``--addr`` (loopback by default) and ``--port`` (`DEFAULT_PORT`, or a free
   port when that one is taken and none was asked for; 0 asks for a free one). The URL is
   printed once; a token the dashboard made is printed once, in that URL (`access`).
4. ``/?token=...`` with the right token answers with the cookie and a redirect to ``/``: the
   token leaves the address bar and the page's own requests carry the cookie.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import socket
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gavel.cli.ui import access, feed, logs, views
from gavel.cli.ui.http import Request, Response, Server, Sse, Stream
from gavel.cli.ui.options import DEFAULT_PORT
from gavel.client import BrokerRefused, Client, ClientError
from gavel.shared.api import INSTANCE_ID
from gavel.shared.errors import BadInput
from gavel.shared.timing import Timing

__all__ = ["Dashboard", "UiUnavailable", "run", "start"]

#: A comment on an idle event stream this often (the browser notices a dead connection).
KEEPALIVE_S = Timing().keepalive_s
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_JSON = "application/json"
_INSTANCE = re.compile(INSTANCE_ID)


class UiUnavailable(BadInput):
    """The dashboard cannot listen where it was asked to (exit 2)."""


def _static() -> dict[str, tuple[bytes, str]]:
    """Rule 1: every file of the page, by name."""
    out = {}
    for entry in resources.files("gavel.cli.ui").joinpath("static").iterdir():
        suffix = os.path.splitext(entry.name)[1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def _json(status: int, obj: Any) -> Response:
    return Response(status, feed.encode(obj), _JSON)


@dataclass
class Dashboard:
    """A running dashboard: where it listens and what it needs."""

    addr: str
    port: int
    token: str
    #: The token was made here (and is printed, once, in `open_url`).
    token_made: bool
    server: Server
    feed: feed.Feed
    client: Client

    @property
    def url(self) -> str:
        host = self.addr
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    @property
    def open_url(self) -> str:
        """The URL to open: with the token when the dashboard made it (rule 3)."""
        return f"{self.url}?token={self.token}" if self.token_made else self.url

    def announce(self) -> str:
        if self.token and not self.token_made:
            return f"{self.open_url} (it asks for the token given with --token)"
        return self.open_url

    async def close(self) -> None:
        await self.server.close()
        await self.feed.close()
        with contextlib.suppress(Exception):
            await self.client.close()


class Routes:
    """Rule 2."""

    def __init__(self, client: Client, the_feed: feed.Feed, token: str) -> None:
        self.client = client
        self.feed = the_feed
        self.token = token
        self.files = _static()
        self.port = 0

    async def __call__(self, req: Request) -> Response | Stream:
        path = req.path
        if path in ("/", "/index.html"):
            if self.token and "token" in req.query:  # rule 4 (access checked it already)
                return Response(303, b"", headers={
                    "Location": "/", "Set-Cookie": f"{access.cookie_name(self.port)}="
                    f"{self.token}; HttpOnly; SameSite=Strict; Path=/"})
            body, kind = self.files["index.html"]
            return Response(200, body, kind)
        if path.startswith("/static/"):
            found = self.files.get(path.removeprefix("/static/"))
            if found is None:
                return Response(404, b"no such file\n")
            return Response(200, found[0], found[1])
        if path == "/favicon.ico":
            body, kind = self.files["favicon.svg"]
            return Response(200, body, kind)
        if path == "/api/overview":
            return Response(200, self.feed.overview, _JSON)
        if path == "/api/events":
            return Stream(self._events)
        if path.startswith("/api/instances/"):
            return await self._instance(path.removeprefix("/api/instances/"))
        if path.startswith("/api/logs/"):
            iid = path.removeprefix("/api/logs/")
            if not _usable(iid):
                return _json(404, {"error": f"{iid[:80]!r} is not an instance id"})
            return Stream(lambda sse: logs.follow(self.client, iid, sse.send))
        return Response(404, b"no such page\n")

    async def _instance(self, iid: str) -> Response:
        if not _usable(iid):
            return _json(404, {"error": f"{iid[:80]!r} is not an instance id"})
        try:
            why = await self.client.why(iid)
            told = await self.client.events(iid, limit=feed.EVENTS_KEPT)
        except BrokerRefused as exc:
            return _json(404, {"error": str(exc)})
        except ClientError as exc:
            return _json(502, {"error": str(exc)})
        return _json(200, {**views.instance_page(why, told.events),
                           "usage": self.feed.usage.of(iid)})

    async def _events(self, sse: Sse) -> None:
        history = b"[" + b",".join(self.feed.events) + b"]"
        page = self.feed.open_page()  # with no wait since `history`: no event in between
        try:
            await sse.send("overview", self.feed.overview)
            await sse.send("history", history)
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        event, data = await page.queue.get()
                except TimeoutError:
                    await sse.comment()
                    continue
                if event == "dropped":  # feed rule 3: the browser starts again
                    return
                await sse.send(event, data)
        finally:
            self.feed.close_page(page)


def _usable(iid: str) -> bool:
    return 0 < len(iid) <= 128 and _INSTANCE.match(iid) is not None


async def _listen(server: Server, addr: str, port: int | None) -> int:
    """Rule 3."""
    try:
        return await server.start_at(addr, port, DEFAULT_PORT)
    except OSError as exc:
        what = f"port {port}" if port else "a port"
        raise UiUnavailable(f"the dashboard cannot listen on {addr}, {what}: "
                            f"{exc.strerror or exc}") from None


async def start(nats_url: str, creds: str | None, *, addr: str = "127.0.0.1",
                port: int | None = None, token: str = "") -> Dashboard:
    """A dashboard for the cluster at `nats_url`, listening until `Dashboard.close`."""
    required = access.token_for(addr, token)
    client = await Client.connect(nats_url, creds, timeout=feed.CALL_S, allow_reconnect=True,
                                  max_reconnect_attempts=-1, reconnect_time_wait=1)
    the_feed = feed.Feed(client)
    routes = Routes(client, the_feed, required)
    server = Server(routes, required)
    try:
        routes.port = await _listen(server, addr, port)
        await the_feed.start()
    except BaseException:
        await server.close()
        await the_feed.close()
        await client.close()
        raise
    return Dashboard(addr=addr, port=routes.port, token=required,
                     token_made=bool(required) and not token, server=server, feed=the_feed,
                     client=client)


async def run(args: argparse.Namespace) -> int:
    """`gavel ui`: serve the dashboard until SIGTERM or Ctrl-C."""
    dash = await start(args.nats, args.creds, addr=args.ui_addr, port=args.ui_port,
                       token=args.ui_token)
    try:
        print(f"gavel ui: dashboard at {dash.announce()}   (Ctrl-C stops it)", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        return 0
    finally:
        await dash.close()
