"""A nats-server cluster on loopback: several `NatsServer`s routed to each other, each with
JetStream on and a store of its own - what replicated KV buckets (the brokers' lease, the
node.json mirror at R3) need, for `gavel` tests and local runs.

Rules:
1. Every server gets a client port, a cluster port and a `server_name` of its own; each
   lists every cluster port as a route (a server ignores the route to itself), so any one
   of them may be stopped and started again and finds the others.
2. `extra` is config text every server holds too (an `authorization` block from
   `gavel auth init`, say): what clients may do is the same on every server.
3. A server that never listened yet and cannot bind its cluster port (something took it
   between the choice and the start) gets another one, and every server's config is written
   again: the servers already up learn the new route when it connects to them (routes are
   gossiped), and read the new list at their next start.
4. `wait_jetstream` returns once the cluster answers JetStream's account info: its meta
   leader is elected and streams can be made. A cluster that just started, or lost the
   server that held the meta leadership, refuses them until then.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from gavel.shared.timing import Timing
from gavel.transport.inbound import Malformed, js_answer
from gavel.transport.natsserver import NatsServer, NatsServerError
from gavel.transport.ports import free_port

__all__ = ["NatsCluster"]

#: A child's start and JetStream's election are the machine's waits (`shared.timing` rule 3).
_TIMING = Timing()


class NatsCluster:
    def __init__(self, root: Path | None = None, size: int = 3, *, name: str = "gavel",
                 extra: str = "") -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="gavel-cluster-"))
        self.name = name
        self.extra = extra
        self.cluster_ports = [free_port() for _ in range(size)]
        self.servers = [
            NatsServer(store_dir=self.root / f"n{i + 1}" / "jetstream",
                       config=self.root / f"n{i + 1}" / "nats.conf",
                       log=self.root / f"n{i + 1}" / "nats.log")
            for i in range(size)]
        self._listened = [False] * size
        for server in self.servers:
            server.store_dir.mkdir(parents=True, exist_ok=True)
        self._write_configs()

    def _write_configs(self) -> None:
        for i, server in enumerate(self.servers):
            assert server.config is not None
            server.config.write_text(self._config(i))

    def _config(self, i: int) -> str:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.cluster_ports)
        return (f'server_name: "{self.name}-{i + 1}"\n'
                f"cluster {{\n  name: {json.dumps(self.name)}\n"
                f'  listen: "127.0.0.1:{self.cluster_ports[i]}"\n  routes: [{routes}]\n}}\n'
                f"{self.extra}\n")

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated (what `--nats` takes for a cluster)."""
        return ",".join(self.urls)

    def start(self, timeout: float = _TIMING.start_s) -> NatsCluster:
        for i in range(len(self.servers)):
            self.start_one(i, timeout)
        return self

    def start_one(self, i: int, timeout: float = _TIMING.start_s) -> None:
        """Start server `i` (rule 3 when its cluster port was taken meanwhile)."""
        for _ in range(3):
            try:
                self.servers[i].start(timeout)
            except NatsServerError as exc:
                if not (exc.port_taken and not self._listened[i]
                        and f"127.0.0.1:{self.cluster_ports[i]}:" in str(exc)):
                    raise
                self.cluster_ports[i] = free_port()
                self._write_configs()
                continue
            self._listened[i] = True
            return
        self.servers[i].start(timeout)
        self._listened[i] = True

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    async def wait_jetstream(self, timeout: float = _TIMING.jetstream_s,
                             **connect: object) -> None:
        """Rule 4 (`connect`: nats-py options, credentials above all)."""
        import nats

        deadline = time.monotonic() + timeout
        last = "no answer"
        pause = _TIMING.poll_s
        while time.monotonic() < deadline:
            try:
                nc = await nats.connect(self.urls, connect_timeout=_TIMING.ask_s,
                                        allow_reconnect=False, **connect)
            except Exception as exc:
                last = str(exc) or type(exc).__name__
                await asyncio.sleep(pause)
                pause = min(pause * 2, _TIMING.poll_max_s)
                continue
            try:
                msg = await nc.request("$JS.API.INFO", b"", timeout=_TIMING.ask_s)
                answer = js_answer(msg.data)
                if isinstance(answer, Malformed):
                    last = answer.why
                elif "error" not in answer:
                    return
                else:
                    last = str(answer["error"].get("description", answer["error"]))
            except Exception as exc:
                last = str(exc) or type(exc).__name__
            finally:
                await nc.close()
            await asyncio.sleep(pause)
            pause = min(pause * 2, _TIMING.poll_max_s)
        raise TimeoutError(f"the NATS cluster's JetStream was not ready within {timeout}s: "
                           f"{last}")

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
