"""A client of Caddy's admin API (JSON over HTTP): read the whole config, send one request.

Rules:
1. Every failure - Caddy down, a timeout, a refusal (an HTTP error, with Caddy's own words)
   - is one `AdminError` sentence naming the request; nothing else escapes.
2. Requests run in a thread with a timeout, so a Caddy that hangs never holds the caller's
   event loop.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from gavel.gateway.caddyconfig import Op

__all__ = ["Admin", "AdminError"]


class AdminError(Exception):
    """A request the admin API did not carry out, as one sentence."""


class Admin:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def config(self) -> Any:
        """Everything Caddy runs (``GET /config/``): None for a Caddy with no config."""
        return await self.send(Op("GET", "/config/"))

    async def send(self, op: Op) -> Any:
        return await asyncio.to_thread(self._send, op)

    def _send(self, op: Op) -> Any:
        data = None if op.body is None else json.dumps(op.body).encode()
        req = urllib.request.Request(f"{self.url}{op.path}", data=data, method=op.method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(f"Caddy at {self.url} refused {op}: {exc.code} "
                             f"{_said(exc.read())}") from None
        except (OSError, ValueError) as exc:  # URLError, a timeout, a reset
            reason = getattr(exc, "reason", exc)
            raise AdminError(f"Caddy's admin API at {self.url} did not answer {op}: "
                             f"{reason}") from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise AdminError(f"the answer of {self.url} to {op} is not JSON") from None


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
