"""The daemons, `gavel broker`, `gavel worker` and `gavel gateway`: settings in, a running
service out.

Rules:
1. Settings are resolved before anything starts (`settings`): --config FILE < GAVEL_*
   environment < flags. `--check` and `gavel config check` stop there and print them.
2. Logs are configured before the first line is written, with every secret value the daemon
   knows (the secrets file, passwords in URLs, the push token) registered for redaction.
3. The metrics endpoint and the git pusher live exactly as long as the daemon.
4. A broker whose state repository is damaged (an object missing or unreadable) stops with
   `Stopped`: one sentence naming the object and what to do, exit status 1, no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from gavel.cli import logs
from gavel.cli.config import (
    BROKER_OPTIONS,
    GATEWAY_OPTIONS,
    WORKER_OPTIONS,
    BrokerConfig,
    ConfigError,
    DaemonConfig,
    GatewayConfig,
    WorkerConfig,
    effective_timing,
    flags_of,
    load,
    render,
)
from gavel.cli.parsers import unusable_dir
from gavel.shared.redact import mask_url
from gavel.shared.strategies import Strategy
from gavel.transport.creds import connect_options

if TYPE_CHECKING:
    from gavel.broker.service import Broker

__all__ = ["Stopped", "check", "config_check", "run_broker", "run_gateway", "run_worker",
           "settings"]

log = logging.getLogger("gavel.cli")


class Stopped(Exception):
    """The daemon stopped on its own for a reason the operator must act on (rule 4): the
    command prints this one sentence and exits 1."""


def _on_signal(stop: Callable[[], Any]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def _secrets(path: str) -> dict[str, str]:
    if not path:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: TOML or UTF-8
        raise ConfigError(f"cannot read secrets file {path}: {exc}.") from None
    bad = [k for k, v in data.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"secrets file {path}: {bad[0]!r} must be a string.")
    return {k: str(v) for k, v in data.items()}


def settings(args: argparse.Namespace) -> DaemonConfig:
    """The daemon's effective config: --config FILE < GAVEL_* environment < flags."""
    file = args.config or os.environ.get("GAVEL_CONFIG") or None
    if args.command == "broker":
        return load(BrokerConfig, BROKER_OPTIONS, file=file, env=os.environ,
                    flags=flags_of(args, BROKER_OPTIONS))
    if args.command == "gateway":
        return load(GatewayConfig, GATEWAY_OPTIONS, file=file, env=os.environ,
                    flags=flags_of(args, GATEWAY_OPTIONS))
    return load(WorkerConfig, WORKER_OPTIONS, file=file, env=os.environ,
                flags=flags_of(args, WORKER_OPTIONS))


def check(args: argparse.Namespace) -> int:
    """`--check`: validate everything the daemon would read, print the effective config."""
    cfg = args.settings
    if isinstance(cfg, BrokerConfig):
        _secrets(cfg.secrets)
    elif isinstance(cfg, WorkerConfig):
        _strategy(cfg)
    _nats_options(cfg)
    print(render(cfg), end="")
    return 0


def config_check(args: argparse.Namespace) -> int:
    """`gavel config check FILE`: the effective config of FILE under this environment."""
    kind = args.kind
    if kind is None:
        try:
            data = tomllib.loads(Path(args.file).read_text())
        except (OSError, ValueError, RecursionError):  # not UTF-8, not TOML, too deep
            data = {}  # `load` names the problem
        kind = "worker" if "node_id" in data else "gateway" if "admin" in data else "broker"
    cfg: DaemonConfig
    if kind == "broker":
        cfg = load(BrokerConfig, BROKER_OPTIONS, file=args.file, env=os.environ)
        _secrets(cfg.secrets)
    elif kind == "gateway":
        cfg = load(GatewayConfig, GATEWAY_OPTIONS, file=args.file, env=os.environ)
    else:
        cfg = load(WorkerConfig, WORKER_OPTIONS, file=args.file, env=os.environ)
        _strategy(cfg)
    print(f"# effective {kind} config: {args.file}, then GAVEL_* environment")
    print(render(cfg), end="")
    return 0


def _nats_options(cfg: DaemonConfig) -> dict[str, Any]:
    """Credentials (a .creds file or an nkey seed, told apart by content) and TLS for
    nats.connect; a tls:// URL alone uses the system CA store."""
    out: dict[str, Any] = connect_options(cfg.creds) if cfg.creds else {}
    if cfg.tls_ca or cfg.tls_cert:
        try:
            ctx = ssl.create_default_context(cafile=cfg.tls_ca or None)
            if cfg.tls_cert:
                ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS files: {exc}.") from None
        out["tls"] = ctx
    return out


def _url_secrets(*urls: str) -> list[str]:
    out = []
    for url in urls:
        with contextlib.suppress(ValueError):
            if (pw := urlsplit(url).password) is not None:
                out += [pw, quote(pw, safe="")]
    return out


def _nats_errors(cfg: BrokerConfig) -> Callable[[Exception], Awaitable[None]]:
    """The broker's nats-py error callback: each error as one log line, repeats of the same
    one in a row dropped (a refused credential is retried every half second, forever)."""
    last = ""

    async def on_error(exc: Exception) -> None:
        nonlocal last
        text = (str(exc) or type(exc).__name__).removeprefix("nats: ")
        if text == last:
            return
        last = text
        if "authorization violation" in text.lower():
            who = f"the credentials in {cfg.creds}" if cfg.creds else \
                "a broker without credentials (--creds FILE or GAVEL_CREDS)"
            log.error("NATS at %s refused %s; retrying", mask_url(cfg.nats), who)
        else:
            log.warning("nats: %s", text)

    return on_error


def make_broker(cfg: BrokerConfig, secrets: dict[str, str]) -> Broker:
    """The daemon's broker, as its config says (it keeps trying to reach NATS for ever)."""
    from gavel.broker.ledger.repository import LedgerError
    from gavel.broker.service import Broker

    try:
        return Broker(nats_url=cfg.nats, state_dir=Path(cfg.state), ref=cfg.ref,
                      timing=effective_timing(cfg, os.environ), secrets=secrets,
                      sample_d=cfg.sample_d or None, batch_max=cfg.batch_max,
                      max_auctions=cfg.max_auctions, batch_wait_s=cfg.batch_wait_ms / 1000,
                      commit_gap_s=cfg.commit_gap_ms / 1000,
                      ended_max=cfg.ended_max,
                      nats_options={"error_cb": _nats_errors(cfg), **_nats_options(cfg)},
                      connect_wait_s=None)
    except LedgerError as exc:  # a state path that is a file, a ref git cannot hold
        raise ConfigError(f"{exc}.") from None


async def run_broker(args: argparse.Namespace) -> int:
    from gavel.broker.ledger.repository import LedgerError
    from gavel.broker.service import tune_gc
    from gavel.cli.metrics_http import MetricsUnavailable, serve

    tune_gc()
    cfg: BrokerConfig = args.settings
    secrets = _secrets(cfg.secrets)
    logs.configure(cfg.log_format, cfg.log_level,
                   secrets=[*secrets.values(), *_url_secrets(cfg.nats, cfg.push),
                            os.environ.get("GAVEL_PUSH_TOKEN", "")])
    broker = make_broker(cfg, secrets)
    pusher = None
    if cfg.push:
        from gavel.broker.ledger.remote import Pusher

        pusher = Pusher.attach(broker.ledger, broker.committer, cfg.push, wake=broker.wake,
                               registry=broker.metrics.registry)
    server = None
    if cfg.metrics_port is not None:
        try:
            server = serve(broker.metrics.registry, cfg.metrics_port, cfg.metrics_addr)
        except MetricsUnavailable as exc:
            raise ConfigError(f"{exc}.") from None
        log.info("metrics at %s", server.url)
    running = asyncio.ensure_future(broker.run())
    connecting = False

    def stop() -> None:
        nonlocal connecting
        broker.stop()
        if broker.nc is None:  # still connecting: NATS may refuse the credential forever
            connecting = True
            running.cancel()

    _on_signal(stop)
    pushing = asyncio.ensure_future(pusher.run()) if pusher is not None else None
    try:
        await running
    except asyncio.CancelledError:
        if not connecting:
            raise
        await broker.close()
    except LedgerError as exc:  # rule 4: Damaged, at start or later
        raise Stopped(str(exc)) from None
    finally:
        if pusher is not None and pushing is not None:
            await pusher.close(pushing, timeout=5.0)
        if server is not None:
            server.close()
    return 0


def _strategy(cfg: WorkerConfig) -> Strategy:
    from gavel.shared.strategies import make_strategy

    try:
        return make_strategy(cfg.strategy, cfg.strategy_params)
    except ValueError as exc:
        raise ConfigError(f"field `strategy_params`: {exc}.") from None


def _writable_dir(path: Path) -> None:
    """The worker's state directory exists (made if need be) and takes files - or a
    `ConfigError` sentence now, not a traceback at the first write."""
    why = unusable_dir(path, write=True)
    if why:
        raise ConfigError(f"field `state`: cannot keep the worker's state in {path} ({why}).")


async def run_worker(args: argparse.Namespace) -> int:
    from gavel.cli.metrics_http import MetricsUnavailable, serve
    from gavel.worker.metrics import ObservedAgent

    cfg: WorkerConfig = args.settings
    logs.configure(cfg.log_format, cfg.log_level, secrets=_url_secrets(cfg.nats))
    _writable_dir(Path(cfg.state))
    agent = ObservedAgent(nats_url=cfg.nats, node_id=cfg.node_id, strategy=_strategy(cfg),
                          labels=cfg.labels, state_dir=Path(cfg.state),
                          timing=effective_timing(cfg, os.environ), cpu=cfg.cpu,
                          memory_mb=cfg.memory_mb, port_range=cfg.ports,
                          nats_options=_nats_options(cfg), advertise=cfg.advertise)
    loop = asyncio.get_running_loop()
    agent.metrics.attach(agent, loop)
    server = None
    if cfg.metrics_port is not None:
        try:
            server = serve(agent.metrics.registry, cfg.metrics_port, cfg.metrics_addr)
        except MetricsUnavailable as exc:
            raise ConfigError(f"{exc}.") from None
        log.info("metrics at %s", server.url)
    _on_signal(lambda: asyncio.ensure_future(agent.stop()))
    try:
        await agent.run()
    finally:
        if server is not None:
            server.close()
    return 0


async def run_gateway(args: argparse.Namespace) -> int:
    """`gavel gateway`: an operator client of the broker that keeps Caddy's routes."""
    import nats

    from gavel.cli.metrics_http import MetricsUnavailable, serve
    from gavel.gateway.admin import Admin
    from gavel.gateway.keeper import Keeper
    from gavel.gateway.metrics import GatewayMetrics

    cfg: GatewayConfig = args.settings
    logs.configure(cfg.log_format, cfg.log_level, secrets=_url_secrets(cfg.nats, cfg.admin))
    timing = effective_timing(cfg, os.environ)
    stopping = asyncio.Event()
    _on_signal(stopping.set)
    options: dict[str, Any] = {"name": "gavel-gateway", "max_reconnect_attempts": -1,
                               "reconnect_time_wait": 0.5, "error_cb": _gateway_nats_error,
                               **_nats_options(cfg)}
    nc, said = None, False
    while nc is None:  # a gateway started before NATS waits for it, saying so once
        try:
            nc = await nats.connect(cfg.nats, **options)
        except Exception as exc:
            if not said:
                log.warning("cannot reach NATS at %s (%s); retrying", mask_url(cfg.nats), exc)
                said = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await stopping.wait()
            if stopping.is_set():
                return 0
    keeper = Keeper(nc=nc, admin=Admin(cfg.admin), timing=timing, server=cfg.server,
                    listen=cfg.listen, static_roots=cfg.static_roots)
    server = None
    if cfg.metrics_port is not None:
        try:
            server = serve(GatewayMetrics(keeper).registry, cfg.metrics_port, cfg.metrics_addr)
        except MetricsUnavailable as exc:
            await nc.close()
            raise ConfigError(f"{exc}.") from None
        log.info("metrics at %s", server.url)
    log.info("gateway: routes into Caddy server %r through %s", cfg.server, mask_url(cfg.admin))
    running = asyncio.ensure_future(keeper.run())
    try:
        await stopping.wait()
    finally:
        keeper.stop()
        await running
        await nc.close()
        if server is not None:
            server.close()
    return 0


async def _gateway_nats_error(exc: Exception) -> None:
    log.warning("nats: %s", str(exc) or type(exc).__name__)
