"""The files of an instance's own directory, served to Caddy by the gateway itself, confined:
a files route never leaves the directory it names.

Caddy's file_server follows every symbolic link, so an instance that wrote ``pub/root -> /``
had the gateway serve the whole host. This server opens every name below the instance's
directory - the route's directory itself, each directory of the request's path, the file -
with ``O_NOFOLLOW`` relative to the directory before it (``openat``): a symbolic link
anywhere below the instance's directory is not followed but refused (404), and no race
between a check and an open exists, as nothing is checked apart from the open.

Rules:
1. Caddy asks ``/<route id>/<path>`` on the server's unix socket (`caddyconfig` rewrites a
   files route's requests so); the directory is the current table's for that route id
   (`root_of`), never anything the request names. A route id the table does not hold is 404.
2. GET and HEAD only. A directory is answered with its ``index.html`` (itself opened the same
   way), else 404: no listings. Only a regular file is served.
3. The instance's directory (``<workdir>/<instance id>``) is opened as its path says: it is
   the worker's, not the instance's. Everything under it is the instance's, so is confined.
4. The socket is mode 0666 in a directory of its own: whoever reaches it can ask only for
   what the public listener already serves.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import mimetypes
import os
import shutil
import socketserver
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["FileServer", "open_confined"]

#: ``(instance directory, the route's directory below it)`` for a route id, or None.
RootOf = Callable[[str], tuple[str, str] | None]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _parts(path: str) -> list[str] | None:
    parts = [p for p in path.split("/") if p and p != "."]
    return None if ".." in parts or any("\0" in p for p in parts) else parts


def open_confined(base: str, below: str, path: str) -> int | None:
    """A descriptor of the regular file `path` names under ``base/below`` (a directory's
    ``index.html``), every name below `base` opened without following a link; None when
    there is none (rules 2-3)."""
    names = _parts(below)
    request = _parts(path)
    if names is None or request is None:
        return None
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for name in [*names, *request[:-1]] if request else names:
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        last = request[-1] if request else None
        if last is not None:
            nxt = os.open(last, _FILE, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            nxt = os.open("index.html", _FILE, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES,
                             errno.EISDIR, errno.ENXIO, errno.EPERM):
            raise
        return None


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    root_of: RootOf


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        rid, _, rest = path.lstrip("/").partition("/")
        where = self.server.root_of(rid)
        fd = open_confined(*where, rest) if where is not None else None
        if fd is None:
            self._not_found()
            return
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            kind = mimetypes.guess_type(rest or "index.html")[0] or "application/octet-stream"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if body:
                shutil.copyfileobj(f, self.wfile)

    def _not_found(self) -> None:
        text = b"not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(text)

    def address_string(self) -> str:
        return "caddy"

    def log_message(self, format: str, *args: Any) -> None:
        pass


class FileServer:
    """Rule 1-4's server on a unix socket of its own, in a thread; `close()` ends it."""

    def __init__(self, root_of: RootOf) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gavel-files-"))
        self._dir.chmod(0o755)
        self.socket = self._dir / "files.sock"
        self._server = _Server(str(self.socket), _Handler)
        self._server.root_of = root_of
        self.socket.chmod(0o666)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="gavel-files", daemon=True)
        self._thread.start()

    @property
    def dial(self) -> str:
        """How a Caddy upstream names the socket."""
        return f"unix/{self.socket}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)
