"""A plain HTTP/1.1 client on asyncio streams, for the HTTP API's tests: one request per
connection, the status, headers and body as they came; server-sent events frame by frame."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any


async def http(port: int, method: str, path: str, body: bytes | None = None,
               headers: dict[str, str] | None = None, json_body: Any = None,
               tls: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request: status, headers (lower-cased), body."""
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    hdrs = {"Host": f"127.0.0.1:{port}", **(headers or {})}
    if body is not None and "Content-Length" not in hdrs:
        hdrs["Content-Length"] = str(len(body))
    w.write((f"{method} {path} HTTP/1.1\r\n"
             + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode()
            + (body or b""))
    data = await asyncio.wait_for(r.read(), 60)
    w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    out = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        out[k.strip().lower()] = v.strip()
    return int(lines[0].split(" ")[1]), out, rest


async def get_json(port: int, path: str, **kw: Any) -> tuple[int, Any]:
    status, _, body = await http(port, "GET", path, **kw)
    return status, json.loads(body)


class Sse:
    """An open event stream, read frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 status: int, headers: bytes) -> None:
        self.reader, self.writer, self.status, self.head = reader, writer, status, headers
        #: The ``id:`` of the last frame read that had one ("" none yet).
        self.last_id = ""
        #: The ``id:`` of the last frame read ("" it had none).
        self.id = ""

    @classmethod
    async def open(cls, port: int, path: str, last_id: str = "") -> Sse:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        resume = f"Last-Event-ID: {last_id}\r\n" if last_id else ""
        w.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Accept: text/event-stream\r\n{resume}\r\n").encode())
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
        return cls(r, w, int(head.split(b" ")[1]), head)

    async def frame(self, timeout: float = 30.0) -> tuple[str, Any]:
        """The next frame that is an event (comments and retry lines skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            raw = await asyncio.wait_for(self.reader.readuntil(b"\n\n"),
                                         max(0.1, deadline - loop.time()))
            event, data, self.id = "", b"", ""
            for line in raw.split(b"\n"):
                if line.startswith(b"id: "):
                    self.id = self.last_id = line[4:].decode()
                elif line.startswith(b"event: "):
                    event = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
            if event:
                return event, json.loads(data)

    async def until(self, want: str, pred: Any = None, timeout: float = 30.0) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event, data = await self.frame(max(0.1, deadline - loop.time()))
            if event == want and (pred is None or pred(data)):
                return data

    def close(self) -> None:
        self.writer.close()
