"""Configuration of the daemons: a TOML file, then ``GAVEL_*`` environment, then flags.

Rules:
1. Precedence is file < environment < flags, field by field: a layer only sets what it names
   (flags default to None, so an absent flag never hides the layers below it).
2. A file is decoded strictly into `BrokerConfig` / `WorkerConfig`, which forbid unknown
   fields; an environment value is parsed by the same function as its flag (the `Option`
   tables of `gavel.cli.options`). Every mistake is one `ConfigError` sentence naming where
   it came from, the field, and what was expected.
3. The effective config renders back to TOML (`render`) with passwords in URLs masked.
4. A field of a table (``ha.lease_ttl_s``) is set by its flag or variable inside that table,
   beside what the file's table holds; a switch (``--ha``) makes the table with its
   defaults, or (``GAVEL_HA=0``) takes it away.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from gavel.cli.options import DEFAULT_ADMIN, DEFAULT_NATS, Option
from gavel.cli.parsers import absolute_paths, address, admin_url, listen_addresses
from gavel.shared.admission import DEFAULT_CAPS
from gavel.shared.errors import BadInput
from gavel.shared.redact import mask_url
from gavel.shared.strategies import names as strategy_names
from gavel.shared.timing import FAST_FACTOR, Timing
from gavel.shared.tuning import AUCTIONS_MOST, BATCH_MOST, GAP_MS_MOST
from gavel.transport import nodebook

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "DaemonConfig",
    "GatewayConfig",
    "WorkerConfig",
    "check_common",
    "default_broker_id",
    "effective_timing",
    "load",
    "render",
]

Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Uid = Annotated[int, msgspec.Meta(ge=1, le=4_294_967_293)]
NodeId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class ConfigError(BadInput):
    """One sentence naming the source, the field and what was expected."""


class DaemonConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every daemon reads: how to reach NATS, where its state lives, how it is watched
    (metrics, logs) and its clocks."""

    nats: str = DEFAULT_NATS
    creds: str = ""
    state: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    metrics_port: Port | None = None
    metrics_addr: str = "127.0.0.1"
    log_format: LogFormat = "text"
    log_level: LogLevel = "INFO"
    timing: Timing | None = None


class HaConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[ha]``: several brokers, one leader (`gavel.broker.ha`); `push` names the remote
    they share. Every broker must hold the same values: they are the lease bucket's."""

    #: How long a leader's lease lasts without a renewal: a dead leader is replaced this
    #: long after its last renewal (plus the takeover).
    lease_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    #: How often the leader renews it: well inside the TTL.
    renew_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    #: Copies of the lease bucket and of the node.json mirror the NATS cluster keeps.
    replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 3


class BrokerConfig(DaemonConfig, kw_only=True, forbid_unknown_fields=True):
    #: This broker's id, as `gavel nodes` names the leader ("": the host's name).
    broker_id: Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z0-9_-]{1,64})?$")] = ""
    #: Several brokers, one leader (None: this broker alone, as ever).
    ha: HaConfig | None = None
    ref: str = "refs/heads/main"
    secrets: str = ""
    push: str = ""
    #: Ask this many sampled nodes per request (Sparrow's batch sampling); 0: every node.
    sample_d: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    #: Requests a round carries, rounds in flight, the least time between one commit and
    #: the next (`broker.committer` rule 7): None, the auctioneer tunes it to the load
    #: (`shared.tuning`); a value pins it.
    batch_max: Annotated[int, msgspec.Meta(ge=1, le=BATCH_MOST)] | None = None
    max_auctions: Annotated[int, msgspec.Meta(ge=1, le=AUCTIONS_MOST)] | None = None
    batch_wait_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] = 0.0
    #: Re-auction of running replicas every this many seconds (`broker.reauction`); 0: off.
    rebalance_every_s: Annotated[float, msgspec.Meta(ge=0, le=86_400)] = 0.0
    commit_gap_ms: Annotated[float, msgspec.Meta(ge=0, le=GAP_MS_MOST)] | None = None
    #: Ended instance records kept in the tree at most (the oldest leave first); 0: no cap.
    ended_max: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    #: Replicas one service may ask for, and live instances in the cluster
    #: (`gavel.shared.admission`); 0: no cap.
    max_service_count: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_CAPS.per_service
    max_instances: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_CAPS.instances


class WorkerConfig(DaemonConfig, kw_only=True, forbid_unknown_fields=True):
    node_id: NodeId = ""
    strategy: str = "least-loaded"
    strategy_params: dict[str, float] = {}
    labels: dict[str, str] = {}
    #: Label keys this node keeps itself for (`shared.strategies.reserve`): a request that
    #: asks for none of them is priced one whole node higher, so it lands here only when no
    #: other node bids.
    reserve_for: list[str] = []
    cpu: Annotated[float, msgspec.Meta(gt=0)] | None = None
    memory_mb: Annotated[int, msgspec.Meta(gt=0)] | None = None
    ports: tuple[Port, Port] = (20000, 20999)
    #: Enforce each instance's cpu and memory with cgroups (`worker.cgroups`): v2, v1, auto
    #: (whichever the host offers, else nothing, said at start) or off.
    cgroups: Literal["auto", "v1", "v2", "off"] = "auto"
    #: Cpu as a weight in proportion to the award (used when others want the cpu), or also a
    #: quota capping the instance at its award.
    cgroup_cpu: Literal["weight", "quota"] = "weight"
    #: Run each instance as a uid of its own from `uids` (`worker.isolation`), or "off": as
    #: the worker's user.
    isolation: Literal["uids", "off"] = "uids"
    uids: tuple[Uid, Uid] = (200_000, 265_535)
    #: Whether a spec asking for root (``root = true``) may run as root here.
    allow_root: bool = False
    #: The address a gateway reaches this node's instances at ("": the host's primary one).
    advertise: str = ""
    #: An instance's stdout.log / stderr.log is rotated past this size (`worker.logfiles`).
    instance_log_mb: Annotated[float, msgspec.Meta(gt=0, le=1_000_000)] = 10.0
    #: Files kept per stream, the live one included.
    instance_log_files: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    #: An ended instance's directory (its logs) is removed this long after it ended ...
    ended_logs_s: Annotated[float, msgspec.Meta(ge=0)] = 86_400.0
    #: ... or once this many newer ended ones are kept.
    ended_logs_max: Annotated[int, msgspec.Meta(ge=0)] = 100
    #: The container engine image specs run on (`worker.engine`): auto, off, or its URL.
    engine: str = "auto"
    #: Host volumes a spec may name: name -> absolute path (`shared.spec.Volume`).
    volumes: dict[Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")],
                  Annotated[str, msgspec.Meta(pattern=r"^/")]] = {}


class GatewayConfig(DaemonConfig, kw_only=True, forbid_unknown_fields=True):
    """`gavel gateway`: where Caddy's admin API is, and the server gavel's routes go in."""

    admin: str = DEFAULT_ADMIN
    #: The Caddy server (``apps.http.servers.<name>``) gavel's routes go in; gavel creates
    #: it, listening on `listen`, when Caddy has none of that name.
    server: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "gavel"
    listen: list[str] = msgspec.field(default_factory=lambda: [":8080"])
    #: Directories a files route with a static root may serve from (none: no static roots).
    static_roots: list[str] = []
    #: The node book (`gavel auth init --node`): upstreams only at the addresses and in the
    #: port ranges it gives ("": none, refused unless `trust_advertised_addresses`).
    nodes: str = ""
    #: Without a node book the gateway refuses to start unless this says to let routes lead
    #: to the addresses nodes advertise themselves (self-reported: a lying node steers them).
    trust_advertised_addresses: bool = False
    #: Ports of the cluster no route may lead to, beyond those the gateway sees itself.
    reserved_ports: list[Annotated[int, msgspec.Meta(ge=1, le=65535)]] = []


C = TypeVar("C", BrokerConfig, WorkerConfig, GatewayConfig)

#: Why a gateway without a node book does not start: what a node advertises is its own word.
NO_NODE_BOOK = ("the gateway has no node book (field `nodes`, --nodes FILE, written by `gavel "
                "auth init --node NAME=ADDRESS:FIRST-LAST`); without one, routes would lead "
                "wherever nodes advertise themselves, so --trust-advertised-addresses must say "
                "that is meant.")


# -- loading ---------------------------------------------------------------------------------
def load(cls: type[C], options: Sequence[Option], *, file: str | None,
         env: Mapping[str, str], flags: Mapping[str, Any] | None = None) -> C:
    """The effective config: `cls` defaults < `file` < `env` < `flags`."""
    layers: dict[str, Any] = {}
    source: dict[str, str] = {}
    tables = _tables(cls)
    if file:
        raw = _read(file)
        _convert(cls, raw, f"config file {file}")
        layers.update(raw)
        source.update(dict.fromkeys(raw, f"config file {file}"))
    for o in options:
        text = env.get(o.env)
        if text is None or text == "":
            continue
        try:
            _set(layers, o.field, (o.env_parse or o.parse)(text), o.field in tables)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"environment variable {o.env}: {exc}.") from None
        source[o.field] = f"environment variable {o.env}"
    for name, value in (flags or {}).items():
        _set(layers, name, value, name in tables)
        source[name] = "flag"
    cfg = _convert(cls, layers, "the merged config")
    return _finish(cfg, source)


def _tables(cls: type[msgspec.Struct]) -> set[str]:
    """The fields of `cls` that are tables (a Struct or None), which a switch makes."""
    return {f.name for f in msgspec.structs.fields(cls)
            if any(isinstance(t, type) and issubclass(t, msgspec.Struct)
                   for t in typing.get_args(f.type))}


def _set(layers: dict[str, Any], field: str, value: Any, switch: bool) -> None:
    """Rule 4: a table's field inside its table; a switch makes or removes the table (a
    plain true/false setting is only its value)."""
    table, dot, name = field.partition(".")
    if dot:
        inner = layers.get(table)
        layers[table] = {**(inner if isinstance(inner, dict) else {}), name: value}
    elif not switch:
        layers[table] = value
    elif value is True:
        inner = layers.get(table)
        layers[table] = inner if isinstance(inner, dict) else {}
    elif value is False:
        layers[table] = None
    else:
        layers[table] = value


def default_broker_id() -> str:
    """This host's name as a broker id (letters, digits, ``-`` and ``_``; at most 64)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name.strip("-") or "broker"


def check_common(data: Mapping[str, Any], file: str) -> None:
    """The keys both daemons read, checked as either daemon would check them: a
    `ConfigError` naming the field, or nothing."""
    where = f"config file {file}"
    try:
        cfg = msgspec.convert(dict(data), DaemonConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(str(exc), where, DaemonConfig)) from None
    problem = cfg.timing.problem() if cfg.timing is not None else None
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _read(file: str) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(file).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}.") from None
    except RecursionError:
        raise ConfigError(f"config file {file} is not valid TOML: nested too deeply.") from None


def _convert(cls: type[C], data: Mapping[str, Any], where: str) -> C:
    try:
        return msgspec.convert(dict(data), cls)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(str(exc), where, cls)) from None


def _explain(text: str, where: str, cls: type[msgspec.Struct]) -> str:
    """msgspec's message as one sentence: where, which field, what was expected."""
    m = re.match(r"^(?P<msg>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", text, re.S)
    msg = m.group("msg") if m else text
    path = (m.group("path") if m else "") or ""
    unknown = re.match(r"Object contains unknown field `(?P<name>[^`]*)`", msg)
    if unknown:
        name = unknown.group("name")
        if path:
            return f"{where}: unknown field `{name}` in table `{path}`."
        known = ", ".join(cls.__struct_fields__)
        return f"{where}: unknown field `{name}`; expected one of: {known}."
    msg = msg.replace(" | null", "")
    msg = msg[:1].lower() + msg[1:]
    return f"{where}: field `{path}` {msg}." if path else f"{where}: {msg}."


def _finish(cfg: C, source: Mapping[str, str]) -> C:
    def src(name: str) -> str:
        return source.get(name) or source.get(name.partition(".")[0], "the defaults")

    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise ConfigError("fields `tls_cert` and `tls_key` go together: set both or neither.")
    problem = cfg.timing.problem() if cfg.timing is not None else None
    if problem:
        raise ConfigError(f"{src('timing')}: {problem}")
    if isinstance(cfg, GatewayConfig):
        for name, parse, value in (("admin", admin_url, cfg.admin),
                                   ("listen", listen_addresses, ",".join(cfg.listen)),
                                   ("static_roots", absolute_paths, ",".join(cfg.static_roots))):
            try:
                parse(value)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"{src(name)}: field `{name}`: {exc}.") from None
        if not cfg.listen:
            raise ConfigError(f"{src('listen')}: field `listen` names at least one address.")
        if cfg.nodes:
            try:
                nodebook.load(Path(cfg.nodes))
            except BadInput as exc:
                raise ConfigError(f"{src('nodes')}: field `nodes`: {exc}.") from None
        elif not cfg.trust_advertised_addresses:
            raise ConfigError(NO_NODE_BOOK)
        return cfg
    if isinstance(cfg, BrokerConfig):
        if not cfg.state:
            raise ConfigError("field `state` is required: set it in the config file, "
                              "GAVEL_STATE or --state.")
        if not cfg.broker_id:
            cfg.broker_id = default_broker_id()
        if cfg.ha is not None:
            if not cfg.push:
                raise ConfigError(f"{src('ha')}: field `ha` needs `push`: the git remote every "
                                  "broker reads and writes (a bare repository on shared "
                                  "storage, git daemon or a git server).")
            if not cfg.ha.renew_s < cfg.ha.lease_ttl_s / 2:
                raise ConfigError(f"{src('ha.renew_s')}: field `ha.renew_s` must be under half "
                                  f"of `ha.lease_ttl_s` (a renewal well inside the lease), got "
                                  f"{cfg.ha.renew_s:g} and {cfg.ha.lease_ttl_s:g}.")
            if not cfg.ref.startswith("refs/heads/") and "/" in cfg.ref:
                raise ConfigError(f"{src('ref')}: field `ref` must be a branch with `ha`: the "
                                  f"leader writes it, got {cfg.ref!r}.")
        return cfg
    if not cfg.node_id:
        raise ConfigError("field `node_id` is required: set it in the config file, "
                          "GAVEL_NODE_ID or --node-id.")
    if cfg.strategy not in strategy_names():
        raise ConfigError(f"{src('strategy')}: field `strategy` expected one of "
                          f"{', '.join(strategy_names())}, got {cfg.strategy!r}.")
    for key in cfg.reserve_for:
        if key not in cfg.labels:
            raise ConfigError(f"{src('reserve_for')}: field `reserve_for` names label key "
                              f"{key!r}, which this node does not carry (its labels: "
                              f"{', '.join(sorted(cfg.labels)) or 'none'}).")
    if cfg.cpu is not None and not math.isfinite(cfg.cpu):
        raise ConfigError(f"{src('cpu')}: field `cpu` expected a finite number, got {cfg.cpu}.")
    if cfg.advertise:
        try:
            cfg.advertise = address(cfg.advertise)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{src('advertise')}: field `advertise`: {exc}.") from None
    lo, hi = cfg.ports
    if lo > hi:
        raise ConfigError(f"{src('ports')}: field `ports` expected FIRST <= LAST, got "
                          f"{lo}-{hi}.")
    lo, hi = cfg.uids
    if lo > hi:
        raise ConfigError(f"{src('uids')}: field `uids` expected FIRST <= LAST, got "
                          f"{lo}-{hi}.")
    if not cfg.state:
        cfg.state = f".gavel-worker-{cfg.node_id}"
    return cfg


def effective_timing(cfg: DaemonConfig, env: Mapping[str, str]) -> Timing:
    """The config's `[timing]` table (or the defaults), tenfold faster under
    GAVEL_FAST_TIMERS=1."""
    base = cfg.timing or Timing()
    fast = env.get("GAVEL_FAST_TIMERS", "").strip().lower() in ("1", "true", "yes", "on")
    return base.scaled(FAST_FACTOR) if fast else base


# -- rendering -------------------------------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot render {type(value).__name__} as TOML")


def render(cfg: DaemonConfig) -> str:
    """The config as TOML that `--config` reads back (URL passwords masked)."""
    lines: list[str] = []
    tables: list[str] = []
    for name in cfg.__struct_fields__:
        value = getattr(cfg, name)
        if value is None:
            continue
        if isinstance(value, msgspec.Struct):
            tables.append(f"\n[{name}]")
            tables.extend(f"{k} = {_toml(getattr(value, k))}" for k in value.__struct_fields__)
            continue
        if name in ("nats", "push"):
            value = mask_url(value)
        lines.append(f"{name} = {_toml(value)}")
    return "\n".join(lines + tables) + "\n"
