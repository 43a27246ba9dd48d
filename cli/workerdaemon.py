"""`gavel worker`: a worker's settings made into its parts (strategy, cgroups, isolation,
engine), each unusable one refused as a `ConfigError` sentence before the agent starts.

Its outbound messages are counted (`worker.metrics`) only when ``--metrics-port`` serves the
counts: a worker that serves none neither keeps them nor loads prometheus_client, whose
package brings its HTTP server and exposition with it, into a daemon idle on every node."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gavel.cli import logs
from gavel.cli.config import ConfigError, WorkerConfig, effective_timing
from gavel.cli.daemons import (
    Refusals,
    log,
    nats_options_of,
    on_signal,
    url_secrets,
    worker_strategy,
)
from gavel.cli.parsers import unusable_dir
from gavel.transport.tasks import Tasks

if TYPE_CHECKING:
    from gavel.cli.metrics_http import MetricsServer
    from gavel.worker.agent import Agent
    from gavel.worker.cgroups import Enforcement
    from gavel.worker.engine import Engine
    from gavel.worker.isolation import Isolation
    from gavel.worker.logfiles import LogLimits

__all__ = ["log_limits", "run_worker"]


def _cgroups(cfg: WorkerConfig) -> Enforcement:
    """What the worker enforces (`worker.cgroups`); a hierarchy named but unusable is a
    `ConfigError` sentence saying why."""
    from gavel.worker.cgroups import Unavailable, detect

    try:
        return detect(cfg.cgroups, cfg.node_id, cpu_limit=cfg.cgroup_cpu,
                      state_dir=Path(cfg.state))
    except Unavailable as exc:
        raise ConfigError(f"field `cgroups`: {exc}.") from None


def _isolation(cfg: WorkerConfig) -> Isolation:
    """Who the worker's instances run as (`worker.isolation`)."""
    from gavel.worker.cgroups import worker_key
    from gavel.worker.isolation import configure

    return configure(cfg.isolation, cfg.uids, allow_root=cfg.allow_root,
                     owner=f"{cfg.node_id}.{worker_key(Path(cfg.state))}",
                     timing=effective_timing(cfg, os.environ))


def _writable_dir(path: Path) -> None:
    """The worker's state directory exists (made if need be) and takes files - or a
    `ConfigError` sentence now, not a traceback at the first write."""
    why = unusable_dir(path, write=True)
    if why:
        raise ConfigError(f"field `state`: cannot keep the worker's state in {path} ({why}).")


def log_limits(cfg: WorkerConfig) -> LogLimits:
    """What the worker keeps of its instances' output (`worker.logfiles` rule 4)."""
    from gavel.worker.logfiles import LogLimits

    return LogLimits(max_bytes=max(1, int(cfg.instance_log_mb * 2**20)),
                     files=cfg.instance_log_files, keep_s=cfg.ended_logs_s,
                     keep_max=cfg.ended_logs_max)


def _engine(cfg: WorkerConfig) -> Engine | None:
    """The node's container engine (`worker.engine`), its host volumes' directories made."""
    for name, path in cfg.volumes.items():
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"volume {name!r}: cannot make {path}: "
                              f"{exc.strerror or exc}.") from None
    from gavel.worker.engine import connect

    return connect(cfg.engine, node_id=cfg.node_id, home=str(Path(cfg.state).resolve()),
                   timing=effective_timing(cfg, os.environ))


def _find_engine(cfg: WorkerConfig) -> Callable[[], Engine | None] | None:
    """How the worker asks for its engine again while none answers (`worker.engine` rule 5);
    None when the setting is ``off``."""
    if cfg.engine == "off":
        return None
    from gavel.worker.engine import connect

    return functools.partial(connect, cfg.engine, node_id=cfg.node_id,
                             home=str(Path(cfg.state).resolve()), quiet=True,
                             timing=effective_timing(cfg, os.environ))


def _agent_class(cfg: WorkerConfig) -> type[Agent]:
    """The agent, counting what it sends only when the counts are served (module doc)."""
    if cfg.metrics_port is None:
        from gavel.worker.agent import Agent

        return Agent
    from gavel.worker.metrics import ObservedAgent

    return ObservedAgent


def _serve_metrics(cfg: WorkerConfig, agent: Agent) -> MetricsServer | None:
    """The agent's metrics endpoint at ``--metrics-port``; None when it has none."""
    if cfg.metrics_port is None:
        return None
    from gavel.cli.metrics_http import MetricsUnavailable, serve
    from gavel.worker.metrics import ObservedAgent

    assert isinstance(agent, ObservedAgent)  # `_agent_class` made it, with its port
    agent.metrics.attach(agent, asyncio.get_running_loop())
    try:
        server = serve(agent.metrics.registry, cfg.metrics_port, cfg.metrics_addr)
    except MetricsUnavailable as exc:
        raise ConfigError(f"{exc}.") from None
    log.info("metrics at %s", server.url)
    return server


async def run_worker(args: argparse.Namespace) -> int:
    cfg: WorkerConfig = args.settings
    logs.configure(cfg.log_format, cfg.log_level, secrets=url_secrets(cfg.nats))
    _writable_dir(Path(cfg.state))
    stopping: list[Callable[[], object]] = []
    # A credential that is refused, or is another node's: the worker stops, leaving what runs
    # here running for a worker with the right one to adopt.
    refusals = Refusals(cfg, lambda: [f() for f in stopping])
    agent = _agent_class(cfg)(
        nats_url=cfg.nats, node_id=cfg.node_id, strategy=worker_strategy(cfg),
        labels=cfg.labels, state_dir=Path(cfg.state), timing=effective_timing(cfg, os.environ),
        cpu=cfg.cpu, memory_mb=cfg.memory_mb, port_range=cfg.ports,
        nats_options={"error_cb": refusals.on_error, **nats_options_of(cfg)},
        advertise=cfg.advertise, log_limits=log_limits(cfg), cgroups=_cgroups(cfg),
        isolation=_isolation(cfg), engine=_engine(cfg), volumes=cfg.volumes,
        find_engine=_find_engine(cfg))
    stops = Tasks("the worker's stop", log)  # an owner, as for every task (daemons rule 9)
    stopping.append(lambda: stops.spawn(agent.stop(kill_children=False), name="stop"))
    server = _serve_metrics(cfg, agent)
    on_signal(lambda: stops.spawn(agent.stop(), name="stop"))
    try:
        await agent.run()
    finally:
        await stops.aclose(agent.timing.close_s)  # each ends with the run it stopped
        if server is not None:
            server.close()
    return 1 if refusals.fatal or agent.crashed else 0
