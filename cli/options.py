"""The daemons' settings as flags and environment variables: one `Option` per config field.

Rules:
1. Each option names its config field (``ha.lease_ttl_s`` for a table's), its flag, its
   ``GAVEL_*`` variable and the one parser both use; `gavel.cli.config.load` applies them.
2. Every flag defaults to None, so an absent flag never hides the layers below it;
   `flags_of` returns only what the command line set.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gavel.cli.parsers import (
    absolute_paths,
    address,
    admin_url,
    boolean,
    broker_id,
    choice,
    engine,
    label_keys,
    labels,
    listen_addresses,
    node_id,
    non_negative_float,
    port,
    port_list,
    port_range,
    positive_float,
    positive_int,
    strategy_param,
    strategy_params,
    uid_range,
    volumes,
    whole,
)
from gavel.shared.strategies import names as strategy_names

__all__ = [
    "BROKER_OPTIONS",
    "DEFAULT_ADMIN",
    "DEFAULT_NATS",
    "GATEWAY_OPTIONS",
    "WORKER_OPTIONS",
    "Option",
    "add_options",
    "flags_of",
]

DEFAULT_NATS = "nats://127.0.0.1:4222"
#: Caddy's own default admin address.
DEFAULT_ADMIN = "http://127.0.0.1:2019"


@dataclass(frozen=True)
class Option:
    """One setting: its field in the config Struct, its flag, its environment variable."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str
    metavar: str | None = None
    choices: Sequence[str] | None = None
    #: The flag repeats (KEY=VALUE each time); the environment variable holds a comma list.
    repeat: bool = False
    env_parse: Callable[[str], Any] | None = None
    #: A flag without a value (rule 4); its variable takes `boolean`'s words.
    switch: bool = False


def _common(daemon: str) -> list[Option]:
    return [
        Option("nats", "--nats", "GAVEL_NATS_URL", str, "NATS URL; nats://user:password@host:"
               "4222 for password auth, tls:// for TLS (default nats://127.0.0.1:4222)",
               metavar="URL"),
        Option("creds", "--creds", "GAVEL_CREDS", str, "NATS credentials: an nkey seed file "
               "(gavel auth init writes them) or a .creds file (JWT + seed)", "FILE"),
        Option("tls_ca", "--tls-ca", "GAVEL_TLS_CA", str,
               "CA certificate that signed the NATS server's (default: the system store)",
               "FILE"),
        Option("tls_cert", "--tls-cert", "GAVEL_TLS_CERT", str,
               "client certificate, for a NATS server that verifies clients", "FILE"),
        Option("tls_key", "--tls-key", "GAVEL_TLS_KEY", str,
               "the client certificate's private key", "FILE"),
        Option("metrics_port", "--metrics-port", "GAVEL_METRICS_PORT", port,
               f"serve the {daemon}'s Prometheus metrics over HTTP on this port (default: off)",
               "PORT"),
        Option("metrics_addr", "--metrics-addr", "GAVEL_METRICS_ADDR", str,
               "address the metrics endpoint listens on (default 127.0.0.1)", "ADDR"),
        Option("log_format", "--log-format", "GAVEL_LOG_FORMAT", choice(("text", "json")),
               "log lines as text or as one JSON object per line (default text)",
               choices=("text", "json")),
        Option("log_level", "--log-level", "GAVEL_LOG_LEVEL",
               choice(("DEBUG", "INFO", "WARNING", "ERROR")), "log level (default INFO)",
               choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    ]


BROKER_OPTIONS: list[Option] = [
    *_common("broker"),
    Option("broker_id", "--broker-id", "GAVEL_BROKER_ID", broker_id,
           "this broker's id: letters, digits, '-' and '_' (default: the host's name)", "ID"),
    Option("ha", "--ha", "GAVEL_HA", boolean,
           "run as one of several brokers against one NATS cluster and the --push remote; "
           "one leads (config table [ha]; default: off)", switch=True),
    Option("ha.lease_ttl_s", "--lease-ttl-s", "GAVEL_LEASE_TTL_S", positive_float,
           "HA: how long the leader's lease lasts unrenewed (default 10)", "S"),
    Option("ha.renew_s", "--lease-renew-s", "GAVEL_LEASE_RENEW_S", positive_float,
           "HA: how often the leader renews its lease (default 2)", "S"),
    Option("ha.replicas", "--ha-replicas", "GAVEL_HA_REPLICAS", positive_int,
           "HA: copies of the lease and of the KV mirror the NATS cluster keeps (default 3)",
           "N"),
    Option("state", "--state", "GAVEL_STATE", str,
           "state directory; holds the state repository state.git (required)", "DIR"),
    Option("ref", "--ref", "GAVEL_REF", str, "active ref (default refs/heads/main); a tag or "
           "commit id pins the deployment read-only", "REF"),
    Option("secrets", "--secrets", "GAVEL_SECRETS", str,
           "TOML file of name = \"value\" secrets resolved at award time", "FILE"),
    Option("push", "--push", "GAVEL_PUSH", str,
           "push the active branch to this git remote (URL, path or remote name in "
           "state.git) after commits; merges, never forces (default: no push)", "REMOTE"),
    Option("sample_d", "--sample-d", "GAVEL_SAMPLE_D", whole,
           "ask D sampled nodes per request instead of every node (Sparrow's batch "
           "sampling; default 0: broadcast to every node)", "D"),
    Option("batch_max", "--batch-max", "GAVEL_BATCH_MAX", positive_int,
           "requests one auction carries at most (default: tuned to the load, 24 to 256)",
           "N"),
    Option("max_auctions", "--max-auctions", "GAVEL_MAX_AUCTIONS", positive_int,
           "auctions in flight at once (default: tuned to the load, 1 to 16)", "N"),
    Option("batch_wait_ms", "--batch-wait-ms", "GAVEL_BATCH_WAIT_MS", non_negative_float,
           "let waiting requests wait this long for a fuller batch before an auction opens "
           "(default 0: at once; a broadcast round costs a reply from every node)", "MS"),
    Option("rebalance_every_s", "--rebalance-every-s", "GAVEL_REBALANCE_EVERY_S",
           non_negative_float, "re-auction running service replicas every S seconds and "
           "move those another node bids enough better for, health-gated (default 0: off; "
           "a spec's move = false pins its own)", "S"),
    Option("commit_gap_ms", "--commit-gap-ms", "GAVEL_COMMIT_GAP_MS", non_negative_float,
           "start the next commit no sooner than this long after the last was written: "
           "fewer, bigger commits under sustained load, burstier awards at light load "
           "(default: tuned, the last commits' time up to 20 ms)", "MS"),
    Option("ended_max", "--ended-max", "GAVEL_ENDED_MAX", whole,
           "keep at most N ended instance records in the tree, the oldest leave first (git "
           "history keeps them; default 100000, 0: no cap)", "N"),
    Option("max_service_count", "--max-service-count", "GAVEL_MAX_SERVICE_COUNT", whole,
           "refuse a deploy or scale asking more than N replicas of one service (default "
           "10000, 0: no cap)", "N"),
    Option("max_instances", "--max-instances", "GAVEL_MAX_INSTANCES", whole,
           "refuse a submit, deploy or scale that would make more than N live instances in "
           "the cluster (default 50000, 0: no cap)", "N"),
]

WORKER_OPTIONS: list[Option] = [
    *_common("worker"),
    Option("node_id", "--node-id", "GAVEL_NODE_ID", node_id,
           "this node's id: letters, digits, '-' and '_' (required)", "ID"),
    Option("strategy", "--strategy", "GAVEL_STRATEGY", choice(strategy_names()),
           "bidding strategy (default least-loaded)", choices=strategy_names()),
    Option("strategy_params", "--strategy-param", "GAVEL_STRATEGY_PARAMS", strategy_param,
           "strategy parameter, e.g. ceiling=0.7 for headroom (repeatable; env: a comma "
           "list)", "KEY=VALUE", repeat=True, env_parse=strategy_params),
    Option("labels", "--labels", "GAVEL_LABELS", labels, "labels as k=v,k2=v2", "LABELS"),
    Option("reserve_for", "--reserve-for", "GAVEL_RESERVE_FOR", label_keys,
           "keep this node for requests that ask for one of these label keys (comma list, "
           "e.g. gpu): any other request is priced one whole node higher, so it lands here "
           "only when no other node bids", "KEYS"),
    Option("cpu", "--cpu", "GAVEL_CPU", positive_float, "cpu capacity (default: detected)",
           "N"),
    Option("memory_mb", "--memory-mb", "GAVEL_MEMORY_MB", positive_int,
           "memory capacity in MB (default: detected)", "MB"),
    Option("ports", "--ports", "GAVEL_PORTS", port_range,
           "port range to assign from (default 20000-20999)", "FIRST-LAST"),
    Option("state", "--state", "GAVEL_STATE", str,
           "local state directory (default ./.gavel-worker-NODE)", "DIR"),
    Option("cgroups", "--cgroups", "GAVEL_CGROUPS", choice(("auto", "v1", "v2", "off")),
           "enforce each instance's cpu and memory with cgroups: auto (v2, else v1, else "
           "nothing, said at start), v1, v2 (refuse to start without it) or off (default auto)",
           choices=("auto", "v1", "v2", "off")),
    Option("cgroup_cpu", "--cgroup-cpu", "GAVEL_CGROUP_CPU", choice(("weight", "quota")),
           "cpu as a weight in proportion to the award, or also a quota capping the instance "
           "at it (default weight)", choices=("weight", "quota")),
    Option("isolation", "--isolation", "GAVEL_ISOLATION", choice(("uids", "off")),
           "run each instance as a uid of its own from --uids, with a private /tmp and no "
           "new privileges (needs root; without it instances run as the worker's user, said "
           "at start), or off: as the worker's user (default uids)", choices=("uids", "off")),
    Option("uids", "--uids", "GAVEL_UIDS", uid_range,
           "the uids instances run as, one each (default 200000-265535)", "FIRST-LAST"),
    Option("allow_root", "--allow-root", "GAVEL_ALLOW_ROOT", boolean,
           "let a spec that asks (root = true) run as root on this node (default false)",
           "BOOL"),
    Option("advertise", "--advertise", "GAVEL_ADVERTISE", address,
           "the address a gateway reaches this node's instances at: an IP address or DNS "
           "name (default: the host's primary address)", "ADDR"),
    Option("instance_log_mb", "--instance-log-mb", "GAVEL_INSTANCE_LOG_MB", positive_float,
           "rotate an instance's stdout.log and stderr.log past this many MB (default 10)",
           "MB"),
    Option("instance_log_files", "--instance-log-files", "GAVEL_INSTANCE_LOG_FILES",
           positive_int, "files kept per stream of an instance, the live one included "
           "(default 3: at most 30 MB of stdout and 30 MB of stderr)", "N"),
    Option("ended_logs_s", "--ended-logs-s", "GAVEL_ENDED_LOGS_S", non_negative_float,
           "keep an ended instance's directory, and its logs, this many seconds (default "
           "86400: a day)", "SECONDS"),
    Option("ended_logs_max", "--ended-logs-max", "GAVEL_ENDED_LOGS_MAX", whole,
           "keep the directories of at most N ended instances, the newest (default 100)",
           "N"),
    Option("engine", "--engine", "GAVEL_ENGINE", engine,
           "the container engine image specs run on: auto (DOCKER_HOST, else "
           "/var/run/docker.sock when it answers; none: image specs are declined), off, or "
           "a Docker host URL (default auto)", "URL"),
    Option("volumes", "--volumes", "GAVEL_VOLUMES", volumes,
           "host volumes specs may name, as name=/abs/path,name2=/path (a spec's volumes "
           "are bid for only by nodes holding every one)", "VOLUMES"),
]


GATEWAY_OPTIONS: list[Option] = [
    *_common("gateway"),
    Option("admin", "--admin", "GAVEL_CADDY_ADMIN", admin_url,
           "Caddy's admin API, an http:// URL or a unix:///socket (default "
           f"{DEFAULT_ADMIN})", "URL"),
    Option("server", "--server", "GAVEL_GATEWAY_SERVER", str,
           "the Caddy server gavel's routes go in; created when Caddy has none of that name "
           "(default gavel)", "NAME"),
    Option("listen", "--listen", "GAVEL_GATEWAY_LISTEN", listen_addresses,
           "where a server gavel creates listens: a comma list of [HOST]:PORT (default "
           ":8080)", "ADDRS"),
    Option("static_roots", "--static-roots", "GAVEL_STATIC_ROOTS", absolute_paths,
           "directories a files route with a static root may serve from, a comma list of "
           "absolute paths (default: none)", "DIRS"),
    Option("nodes", "--nodes", "GAVEL_GATEWAY_NODES", str,
           "the node book `gavel auth init --node` writes (auth/nodes.json): upstreams only "
           "at the addresses and in the port ranges it gives (required unless "
           "--trust-advertised-addresses)", "FILE"),
    Option("trust_advertised_addresses", "--trust-advertised-addresses",
           "GAVEL_TRUST_ADVERTISED_ADDRESSES", boolean,
           "start without a node book: routes lead to the addresses nodes advertise "
           "themselves, which a lying node can steer (default: refused)", switch=True),
    Option("reserved_ports", "--reserved-ports", "GAVEL_RESERVED_PORTS", port_list,
           "ports of the cluster no route may lead to (the dashboard, the broker's metrics), "
           "a comma list; NATS's, Caddy's and the gateway's own are always reserved", "PORTS"),
]


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Add `--config`, `--check` and one flag per option; every default is None."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML config file (env GAVEL_CONFIG); environment variables "
                        "override it, flags override both")
    parser.add_argument("--check", action="store_true",
                        help="validate the config file, environment and flags, print the "
                        "effective config and exit (2 naming the bad field)")
    for o in options:
        help_ = f"{o.help} (env {o.env}; config key {o.field})"
        if o.switch:
            parser.add_argument(o.flag, dest=o.field, action="store_const", const=True,
                                default=None, help=help_)
        elif o.repeat:
            parser.add_argument(o.flag, dest=o.field, type=o.parse, action="append",
                                default=None, metavar=o.metavar, help=help_)
        else:
            parser.add_argument(o.flag, dest=o.field, type=o.parse, default=None,
                                metavar=o.metavar if o.choices is None else None,
                                choices=o.choices, help=help_)


def flags_of(args: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    """The fields the command line set (repeatable flags folded into a dict)."""
    out: dict[str, Any] = {}
    for o in options:
        value = getattr(args, o.field, None)
        if value is None:
            continue
        out[o.field] = dict(value) if o.repeat else value
    return out
