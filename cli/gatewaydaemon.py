"""`gavel gateway`: an operator client of the broker that keeps Caddy's routes - NATS
reached (for ever, but for a credential NATS refuses: `cli.daemons` rule 5), its keeper run
until a signal, a refusal or the keeper's crash (`cli.daemons` rule 9) stops it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

import nats

from gavel.cli import logs
from gavel.cli.config import ConfigError, GatewayConfig, effective_timing
from gavel.cli.daemons import Refusals, log, nats_options_of, on_signal, url_secrets
from gavel.cli.metrics_http import MetricsUnavailable, serve
from gavel.gateway.admin import Admin
from gavel.gateway.files import FileServer
from gavel.gateway.keeper import Keeper
from gavel.gateway.metrics import GatewayMetrics
from gavel.gateway.trust import cluster_ports, load_book
from gavel.shared.redact import mask_url
from gavel.transport.tasks import Tasks, opened_until
from gavel.transport.urls import servers

__all__ = ["run_gateway"]


async def run_gateway(args: argparse.Namespace) -> int:
    """The gateway until it is stopped; its exit status."""
    cfg: GatewayConfig = args.settings
    logs.configure(cfg.log_format, cfg.log_level, secrets=url_secrets(cfg.nats, cfg.admin))
    timing = effective_timing(cfg, os.environ)
    stopping = asyncio.Event()
    on_signal(stopping.set)
    refusals = Refusals(cfg, stopping.set)  # rule 5
    options: dict[str, Any] = {"name": "gavel-gateway", "max_reconnect_attempts": -1,
                               "reconnect_time_wait": 0.5, "error_cb": refusals.on_error,
                               **nats_options_of(cfg)}
    nc, said = None, False
    while nc is None:  # a gateway started before NATS waits for it, saying so once
        # nats-py's first connect retries a refused credential for ever: a stop (a signal,
        # `Refusals` giving up) ends it where it stands
        try:
            nc = await opened_until(stopping, nats.connect(servers(cfg.nats), **options))
            if nc is None:
                return 1 if refusals.fatal else 0
        except Exception as exc:
            if not said:
                log.warning("cannot reach NATS at %s (%s); retrying", mask_url(cfg.nats), exc)
                said = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timing.reconnect_s):
                    await stopping.wait()
            if stopping.is_set():
                return 0
    reserved = cluster_ports(nats=servers(cfg.nats), admin=cfg.admin, listen=cfg.listen,
                             metrics_port=cfg.metrics_port, reserved=cfg.reserved_ports)
    book = load_book(cfg.nodes)
    files = FileServer(lambda rid: keeper.root_of(rid))
    keeper = Keeper(nc=nc, admin=Admin(cfg.admin, timing.caddy_s), timing=timing, server=cfg.server,
                    listen=cfg.listen, static_roots=cfg.static_roots, book=book,
                    reserved=reserved, files_dial=files.dial)
    if keeper.book is None:
        log.warning("no node book (--trust-advertised-addresses): routes lead to the "
                    "addresses nodes advertise themselves; `gavel auth init --node "
                    "NAME=ADDRESS:FIRST-LAST` writes one for --nodes")
    server = None
    if cfg.metrics_port is not None:
        try:
            server = serve(GatewayMetrics(keeper).registry, cfg.metrics_port, cfg.metrics_addr)
        except MetricsUnavailable as exc:
            await nc.close()
            files.close()
            raise ConfigError(f"{exc}.") from None
        log.info("metrics at %s", server.url)
    log.info("gateway: routes into Caddy server %r through %s", cfg.server, mask_url(cfg.admin))
    keeping = Tasks("the gateway", log, crashed=lambda crash: stopping.set())  # rule 9
    running = keeping.spawn(keeper.run(), name="keeper")
    try:
        await stopping.wait()
    finally:
        keeper.stop()
        await keeping.wait(None)  # its step in hand finishes: Caddy is left whole
        await nc.close()
        files.close()
        if server is not None:
            server.close()
    crashed = not running.cancelled() and running.exception() is not None
    return 1 if refusals.fatal or crashed else 0
