"""A client of Caddy's admin API (JSON over HTTP): read the whole config, send one request.
The API is reached at ``http(s)://HOST:PORT`` or, as `gavel up` runs it, on a unix socket
``unix:///path`` (`gavel.gateway.caddyserver`).

Rules:
1. Every failure - Caddy down, a timeout, a refusal (an HTTP error, with Caddy's own words)
   - is one `AdminError` sentence naming the request; nothing else escapes.
2. Requests run in a thread with a timeout, so a Caddy that hangs never holds the caller's
   event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import urllib.error
import urllib.request
from typing import Any

from gavel.gateway.caddyconfig import Op
from gavel.shared.timing import Timing

__all__ = ["Admin", "AdminError"]


class AdminError(Exception):
    """A request the admin API did not carry out, as one sentence; `status` is the HTTP
    status of a refusal (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Admin:
    def __init__(self, url: str, timeout: float = Timing().caddy_s) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def config(self) -> Any:
        """Everything Caddy runs (``GET /config/``): None for a Caddy with no config."""
        return await self.send(Op("GET", "/config/"))

    async def send(self, op: Op) -> Any:
        return await asyncio.to_thread(self.request, op)

    def request(self, op: Op) -> Any:
        """`send`, in the caller's thread."""
        data = None if op.body is None else json.dumps(op.body).encode()
        try:
            if self.url.startswith("unix://"):
                status, body = self._over_socket(op, data)
            else:
                status, body = self._over_tcp(op, data)
        except (OSError, ValueError, http.client.HTTPException) as exc:  # a timeout, a reset
            reason = getattr(exc, "reason", exc)
            raise AdminError(f"Caddy's admin API at {self.url} did not answer {op}: "
                             f"{reason}") from None
        if status >= 400:
            raise AdminError(f"Caddy at {self.url} refused {op}: {status} {_said(body)}",
                             status)
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise AdminError(f"the answer of {self.url} to {op} is not JSON") from None

    def _over_tcp(self, op: Op, data: bytes | None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"{self.url}{op.path}", data=data, method=op.method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _over_socket(self, op: Op, data: bytes | None) -> tuple[int, bytes]:
        conn = _UnixConnection(self.url.removeprefix("unix://"), self.timeout)
        try:
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(op.method, op.path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket; the Host header says ``localhost``, which Caddy's admin
    endpoint accepts on a socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _said(body: bytes) -> str:
    """Caddy's error text (``{"error": "..."}``), or the body as it came."""
    text = body.decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])[:300]
    return text[:300]
