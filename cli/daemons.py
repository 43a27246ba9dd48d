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
5. A credential NATS refuses is retried `AUTH_TRIES` times, then the daemon exits 1 with one
   error line; one that is not the daemon's own (NATS refuses a worker its own node's
   subjects, or the broker or the gateway any subject) stops it at once. A worker stopped
   so leaves its instances running. NATS itself not answering is retried for ever (it may
   start later).
6. `gavel config check` tells a file's daemon by the keys only that daemon reads.
7. With ``[ha]`` the broker is one of several (`gavel.broker.ha`): it stands by until it
   holds the lease, and each of its leaderships pushes to `push` itself.
8. Every exit of the broker is one line on stderr saying why: a log line for the signal
   that stopped it or an unexpected exception (with its traceback), the command's own
   sentence for bad input or a stop it could not go on from (only SIGKILL goes unsaid).
   A signal is also said as it arrives, so a stop cut short by SIGKILL (a supervisor's
   grace run out) has said its cause; SIGHUP (its terminal gone) stops it as SIGTERM does,
   and the signals are caught before the broker is built, not left to kill it unsaid.
9. What a daemon runs beside its part has an owner of its own (`transport.tasks`): a crash
   of the broker's pusher or the gateway's keeper is logged as it happens and stops the
   daemon (exit status 1). The pusher's owner closes last: the broker's close ends the
   broker's tasks, the pusher flushes what they committed, then it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import ssl
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from gavel.cli import logs
from gavel.cli.config import (
    BrokerConfig,
    ConfigError,
    DaemonConfig,
    GatewayConfig,
    WorkerConfig,
    check_common,
    effective_timing,
    load,
    render,
)
from gavel.cli.options import BROKER_OPTIONS, GATEWAY_OPTIONS, WORKER_OPTIONS, flags_of
from gavel.shared.admission import Caps
from gavel.shared.reauction import Settings
from gavel.shared.redact import mask_url
from gavel.shared.strategies import Strategy
from gavel.transport.creds import connect_options
from gavel.transport.tasks import Tasks

if TYPE_CHECKING:
    from gavel.broker.ha import HaBroker
    from gavel.broker.ledger.repository import Ledger
    from gavel.broker.metrics import Metrics
    from gavel.broker.service import Broker, MakePusher
    from gavel.shared.timing import Timing

__all__ = ["BROKER_ONLY", "GATEWAY_ONLY", "WORKER_ONLY", "Stopped", "check", "config_check",
           "config_kind", "run_broker", "settings",
           "worker_strategy"]

log = logging.getLogger("gavel.cli")


class Stopped(Exception):
    """The daemon stopped on its own for a reason the operator must act on (rule 4): the
    command prints this one sentence and exits 1."""


def on_signal(stop: Callable[[], Any], got: list[str] | None = None,
              signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Stop on each of `signals`, adding the name of each signal received to `got`."""
    loop = asyncio.get_running_loop()
    got = [] if got is None else got

    def received(sig: signal.Signals) -> None:
        got.append(sig.name)
        stop()

    for sig in signals:
        loop.add_signal_handler(sig, received, sig)


def _exit_cause(exc: BaseException) -> str:
    """Rule 8's sentence for an exit by exception."""
    if isinstance(exc, asyncio.CancelledError):
        return "its main task was cancelled"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"unexpected {type(exc).__name__}: {exc}"


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
        worker_strategy(cfg)
    nats_options_of(cfg)
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
        kind = config_kind(data, args.file)
    cfg: DaemonConfig
    if kind == "broker":
        cfg = load(BrokerConfig, BROKER_OPTIONS, file=args.file, env=os.environ)
        _secrets(cfg.secrets)
    elif kind == "gateway":
        cfg = load(GatewayConfig, GATEWAY_OPTIONS, file=args.file, env=os.environ)
    else:
        cfg = load(WorkerConfig, WORKER_OPTIONS, file=args.file, env=os.environ)
        worker_strategy(cfg)
    print(f"# effective {kind} config: {args.file}, then GAVEL_* environment")
    print(render(cfg), end="")
    return 0


#: The keys only one of the daemons reads (the rest, `DaemonConfig`'s, all of them do).
_COMMON = set(DaemonConfig.__struct_fields__)
WORKER_ONLY = frozenset(WorkerConfig.__struct_fields__) - _COMMON
BROKER_ONLY = frozenset(BrokerConfig.__struct_fields__) - _COMMON
GATEWAY_ONLY = frozenset(GatewayConfig.__struct_fields__) - _COMMON


def config_kind(data: dict[str, Any], file: str) -> str:
    """Rule 6: which daemon reads a config file, from the keys only one of them has; a file
    with keys of two, or only keys all of them read, is a `ConfigError` asking for --kind."""
    found = {kind: sorted(only & data.keys()) for kind, only in (
        ("worker", WORKER_ONLY), ("broker", BROKER_ONLY), ("gateway", GATEWAY_ONLY))}
    kinds = [kind for kind, keys in found.items() if keys]
    if len(kinds) > 1:
        which = " and ".join(f"keys only a {k} reads ({', '.join(found[k])})" for k in kinds)
        raise ConfigError(f"config file {file} sets {which}: give --kind "
                          f"{' or --kind '.join(kinds)}.")
    if kinds:
        return kinds[0]
    if not data:
        return "broker"  # nothing to go by (or unreadable): `load` names any problem
    check_common(data, file)  # a bad field is the same mistake for any daemon
    raise ConfigError(f"config file {file} sets only keys every daemon reads: give --kind "
                      "broker, --kind worker or --kind gateway.")


def nats_options_of(cfg: DaemonConfig) -> dict[str, Any]:
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


def url_secrets(*urls: str) -> list[str]:
    out = []
    for url in urls:
        with contextlib.suppress(ValueError):
            if (pw := urlsplit(url).password) is not None:
                out += [pw, quote(pw, safe="")]
    return out


#: Refusals of the credential in a row after which a daemon gives up (rule 4).
AUTH_TRIES = 5


class Refusals:
    """A daemon's nats-py error callback (rule 4): each error one log line, repeats of the
    same one in a row dropped; a refused credential retried `AUTH_TRIES` times, then the
    daemon is stopped with one error line; a credential that is not this daemon's (NATS
    refuses it the subjects of its own role) stops it at once. `fatal` keeps the sentence."""

    def __init__(self, cfg: BrokerConfig | WorkerConfig | GatewayConfig,
                 stop: Callable[[], object]) -> None:
        self.cfg = cfg
        self._stop = stop
        self._last = ""
        self.refused = 0
        self.fatal = ""

    def _who(self) -> str:
        if self.cfg.creds:
            return f"the credentials in {self.cfg.creds}"
        return f"a {self._daemon} without credentials (--creds FILE or GAVEL_CREDS)"

    @property
    def _daemon(self) -> str:
        return ("worker" if isinstance(self.cfg, WorkerConfig)
                else "gateway" if isinstance(self.cfg, GatewayConfig) else "broker")

    def _mine(self, subject: str) -> bool:
        """A subject of this daemon's own role: every one for the broker and the gateway,
        the node's own (its id is a token) for a worker."""
        if not isinstance(self.cfg, WorkerConfig):
            return True
        node = self.cfg.node_id.lower()
        return any(tok in (node, f"_inbox_{node}") for tok in subject.lower().split("."))

    def _give_up(self, sentence: str) -> None:
        if not self.fatal:
            self.fatal = sentence
            log.error("%s", sentence)
            self._stop()

    async def on_error(self, exc: Exception) -> None:
        """The callback itself (nats-py takes only a coroutine function)."""
        text = (str(exc) or type(exc).__name__).removeprefix("nats: ")
        low = text.lower()
        url = mask_url(self.cfg.nats)
        if "authorization violation" in low:
            self.refused += 1
            if self.refused >= AUTH_TRIES:
                self._give_up(f"NATS at {url} refused {self._who()} {self.refused} times "
                              "in a row; stopping")
            elif self.refused == 1:
                log.error("NATS at %s refused %s; retrying", url, self._who())
            return
        violation = re.search(r'permissions violation for (\w+) to "([^"]*)"', low)
        if violation and violation.group(2).startswith("gavel.logs."):
            # A server config from before logs: the node works on, unreadable by gavel logs.
            log.warning("NATS refused %s the log subject %s: `gavel logs` cannot reach this "
                        "node until `gavel auth init` is run again and nats-server reloaded",
                        self._who(), violation.group(2))
            return
        if violation and self._mine(violation.group(2)):
            role = (f"node {self.cfg.node_id}'s" if isinstance(self.cfg, WorkerConfig)
                    else f"the {self._daemon}'s")
            self._give_up(f"{self._who()} are not {role}: NATS refused "
                          f"{violation.group(1)} to {violation.group(2)}; stopping")
            return
        if text == self._last:
            return
        self._last = text
        log.warning("nats: %s", text)


def make_broker(cfg: BrokerConfig, secrets: dict[str, str],
                 errors: Callable[[Exception], Awaitable[None]] | None = None
                 ) -> Broker | HaBroker:
    """The daemon's broker, as its config says (it keeps trying to reach NATS for ever, but
    for a refused credential: `Refusals`); without HA, with `push` its commits are pushed
    to that remote (the daemon runs its pusher)."""
    from gavel.broker.config import Config
    from gavel.broker.ha import HaBroker, HaSettings
    from gavel.broker.ledger.repository import Ledger, LedgerError
    from gavel.broker.metrics import Metrics
    from gavel.broker.service import Broker

    config = Config(
        nats_url=cfg.nats, state_dir=Path(cfg.state), ref=cfg.ref, broker_id=cfg.broker_id,
        timing=effective_timing(cfg, os.environ), secrets=secrets,
        sample_d=cfg.sample_d or None, batch_max=cfg.batch_max,
        max_auctions=cfg.max_auctions, batch_wait_s=cfg.batch_wait_ms / 1000,
        commit_gap_s=None if cfg.commit_gap_ms is None else cfg.commit_gap_ms / 1000,
        ended_max=cfg.ended_max,
        caps=Caps(per_service=cfg.max_service_count, instances=cfg.max_instances),
        nats_options={"error_cb": errors or Refusals(cfg, lambda: None).on_error,
                      **nats_options_of(cfg)},
        connect_wait_s=None,
        rebalance=Settings(every_s=cfg.rebalance_every_s) if cfg.rebalance_every_s else None)
    try:
        if cfg.ha is not None:  # rule 7
            Ledger(Path(cfg.state) / "state.git", cfg.ref)  # the state path and ref are usable
            return HaBroker(config, settings=HaSettings(
                remote=cfg.push, ttl_s=cfg.ha.lease_ttl_s, renew_s=cfg.ha.renew_s,
                replicas=cfg.ha.replicas))
        metrics = Metrics()
        return Broker(config, metrics=metrics,
                      pusher=_pusher_of(cfg.push, metrics, config.timing) if cfg.push else None)
    except LedgerError as exc:  # a state path that is a file, a ref git cannot hold
        raise ConfigError(f"{exc}.") from None


def _pusher_of(remote: str, metrics: Metrics, timing: Timing) -> MakePusher:
    """A broker's pusher to `remote` without HA: its outcomes in the broker's metrics."""
    from gavel.broker.ledger.remote import Pusher

    def make(ledger: Ledger, wake: Callable[[], None]) -> Pusher:
        return Pusher(ledger.path, ledger.ref, remote, on_merged=lambda change, sha: wake(),
                      registry=metrics.registry, push_s=timing.push_s,
                      backoff_s=timing.retry_s, max_backoff_s=timing.retry_max_s)
    return make


async def run_broker(args: argparse.Namespace) -> int:
    """Rule 8: the broker and the line that says why it exits."""
    signals: list[str] = []
    try:
        code = await _run_broker(args, signals)
    except (ConfigError, Stopped):
        raise  # the command prints its one sentence on stderr, beside the log: the cause
    except BaseException as exc:
        expected = isinstance(exc, KeyboardInterrupt)
        log.error("broker exits: %s", _exit_cause(exc), exc_info=not expected)
        raise
    why = (f"stopped on {signals[0]}" if signals
           else "NATS refused its credentials" if code else "its run ended")
    log.info("broker exits with status %d: %s", code, why)
    return code


async def _run_broker(args: argparse.Namespace, signals: list[str]) -> int:
    from gavel.broker.lease import LeaseError
    from gavel.broker.ledger.repository import LedgerError
    from gavel.broker.service import Broker, tune_gc
    from gavel.cli.metrics_http import MetricsUnavailable, serve

    tune_gc()
    cfg: BrokerConfig = args.settings
    secrets = _secrets(cfg.secrets)
    logs.configure(cfg.log_format, cfg.log_level,
                   secrets=[*secrets.values(), *url_secrets(cfg.nats, cfg.push),
                            os.environ.get("GAVEL_PUSH_TOKEN", "")])
    stopping: list[Callable[[], None]] = []

    def signalled() -> None:  # rule 8: said as it arrives; it runs once the loop is awaited
        log.info("broker stopping on %s", signals[-1])
        for f in stopping:
            f()

    on_signal(signalled, signals, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    refusals = Refusals(cfg, lambda: [f() for f in stopping])
    broker = make_broker(cfg, secrets, refusals.on_error)
    # with HA each leadership pushes (rule 7)
    pusher = broker.pusher if isinstance(broker, Broker) else None
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

    stopping.append(stop)
    pushers = Tasks("the broker's pusher", log, crashed=lambda crash: stop())  # rule 9
    pushing = pushers.spawn(pusher.run(), name="pusher") if pusher is not None else None
    try:
        await running
    except asyncio.CancelledError:
        if not connecting:
            raise
        await broker.close()
    except (LedgerError, LeaseError) as exc:  # rule 4: Damaged, at start or later
        raise Stopped(str(exc)) from None
    finally:
        try:
            if pusher is not None and pushing is not None:  # a crash is raised here
                await pusher.close(pushing, timeout=broker.config.timing.flush_s)
        finally:
            await pushers.aclose(broker.config.timing.close_s)
            if server is not None:
                server.close()
    return 1 if refusals.fatal else 0


def worker_strategy(cfg: WorkerConfig) -> Strategy:
    """The worker's strategy from its settings; unusable parameters are a `ConfigError`."""
    from gavel.shared.strategies import make_strategy
    from gavel.shared.strategies.reserve import reserve

    try:
        return reserve(make_strategy(cfg.strategy, cfg.strategy_params), cfg.reserve_for)
    except ValueError as exc:
        raise ConfigError(f"field `strategy_params`: {exc}.") from None
