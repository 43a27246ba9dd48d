"""The Prometheus scrape endpoint, for the broker's and a worker's registry alike.

Rule: it listens on loopback unless told otherwise (``--metrics-addr``), serves one registry
from prometheus_client's own threaded HTTP server, and is closed with the daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

__all__ = ["MetricsServer", "MetricsUnavailable", "serve"]


class MetricsUnavailable(Exception):
    """The address or port cannot be listened on."""


@dataclass
class MetricsServer:
    addr: str
    port: int
    _httpd: Any

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve `registry` at http://addr:port/metrics until `close()`."""
    try:
        httpd, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise MetricsUnavailable(
            f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None
    return MetricsServer(addr=addr, port=int(httpd.server_port), _httpd=httpd)
