"""Identity on the wire: `gavel auth init` writes one nkey per node, one for the broker and one
for operators, and the nats-server config that gives each of them exactly its own subjects.

Rules:
1. A node publishes only on subjects that end in its own id (bids, heartbeats, reports,
   assignment requests), subscribes only to what is addressed to it and to its own inbox
   (``_INBOX_<node>.>``: the broker's answers to other nodes' assignment requests carry their
   secrets), and never writes the KV bucket where the broker mirrors node.json.
2. The broker holds the least it needs: it publishes RFBs, awards, cancels, events and the
   KV mirror's puts, creates the mirror's bucket and the leadership lease's, writes the
   lease's one key and watches it (`broker.lease`), makes the JetStream calls of its
   heartbeat stream (`heartbeat_stream_permissions`: nodes need nothing for it, the server
   stores their heartbeats as they publish them), and answers only under the
   operators' inbox and each node's own (listed per node: a NATS wildcard is a whole
   token, so ``_INBOX_*`` is no pattern); it subscribes to what it serves and its own inbox
   (``_INBOX_broker``). No ``allow_responses``: it would let the broker publish to any reply
   subject a request names, the very thing `transport.inbound` rule 5 refuses, and an
   explicit list is checked by the server whatever the broker's code does.
3. Operators call the API, read events and their history and ask nodes for logs (rule 6);
   they cannot bid, award, speak as a node, or write, purge or delete the history. Nodes
   cannot touch the history: only the broker publishes events.
4. A node may call no JetStream subject at all: a consumer's deliver subject is in the
   create request's payload, which permissions cannot see, and every JetStream answer goes
   to the reply subject its request names, so any JetStream call would let a node make the
   server publish wherever it chose. Its watch of its own key is a consumer the broker
   makes on its request (``gavel.watch.<node>``, `broker.watches`), delivering into that
   node's own inbox, one at a time per node; the broker may create consumers of node keys
   and delete them, nothing else of the bucket.
5. `init` is idempotent: a seed that exists is reused, never rewritten. The config authorizes
   the nodes named to this run and to earlier ones (recorded in ``auth/node-ids``, which
   only `init` writes), never a seed file merely found in the directory: a stray ``x.nk`` put
   there by anyone who can write the directory is no node. Revoking a node is deleting its
   seed and running `init` again (then reloading nats-server): a recorded node whose seed is
   gone is dropped from the record.
6. Operators may ask any node for an instance's output (``gavel.logs.<node>``), and run a
   command in an instance (``gavel.exec.<node>.<operator>``, `shared.execstream`); only that
   node hears it, and it answers on the operator's inbox through the server's response
   permission (``allow_responses``: at most `shared.logstream.REPLIES_MAX` replies within
   `shared.logstream.WINDOW_S` of each request it received) - the one grant of a reply
   subject named by the request, because a node may answer any operator's inbox this way
   and no other: listing the operators' inbox for nodes would let every node publish into
   it, answering for another node's logs. A node may publish into no inbox otherwise.
7. Operators are not all one: besides the shared ``operator.nk``, `add_operator` makes one
   identity per person or pipeline, ``operators/<name>.nk``, with a role (`shared.roles`),
   recorded in ``operators.json`` (only `add_operator` writes it) and given to the server by
   `init`. A named operator publishes only on subjects ending in its own name, so whoever
   hears its request knows who asked; a reader may call only the reading verbs and cannot
   exec; its answers come under ``_GAVEL_OP.<name>``, which only it may subscribe to.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gavel.shared import logstream, subjects
from gavel.shared.errors import BadInput
from gavel.shared.roles import READ_VERBS, ROLES, WRITE, Role
from gavel.transport.creds import OPERATORS_DIR

__all__ = [
    "BROKER",
    "OPERATOR",
    "Identities",
    "IdentityError",
    "add_operator",
    "broker_permissions",
    "heartbeat_stream_permissions",
    "init",
    "operator_permissions",
    "operator_roles",
    "public_key",
    "render_config",
    "worker_permissions",
]

#: The seed files of the two roles that are not nodes; no node may take these names.
BROKER = "broker"
OPERATOR = "operator"


class IdentityError(BadInput):
    """A seed that cannot be read or is not one, a reserved node id, a key directory that
    cannot be written: one sentence naming the file and what to do."""


_SEED = re.compile(r"SU[A-Z2-7]{56}")


def worker_permissions(node: str) -> dict[str, Any]:
    """Node `node`: its own subjects out, what is addressed to it in, and nothing of
    JetStream (rule 4)."""
    inbox = f"{subjects.NODE_INBOX.format(node=node)}.>"
    return {
        "publish": {"allow": [
            subjects.BIDS.format(node=node),
            subjects.HEARTBEAT.format(node=node),
            subjects.REPORT.format(node=node),
            subjects.ASSIGN.format(node=node),
            inbox,  # the worker's subscription barrier: a message to itself
            subjects.WATCH.format(node=node),  # its KV watch, made by the broker (rule 4)
        ]},
        "subscribe": {"allow": [
            subjects.RFB,
            subjects.RFB_NODE.format(node=node),
            subjects.AWARD.format(node=node),
            subjects.CANCEL.format(node=node),
            subjects.LOGS.format(node=node),
            subjects.LOGS_AS.format(node=node, operator="*"),
            subjects.EXEC_NODE.format(node=node),  # `gavel exec` in its instances (rule 6)
            inbox,
        ]},
        # Rule 6: answers to the log requests it received, and only those.
        "allow_responses": {"max": logstream.REPLIES_MAX,
                            "expires": f"{logstream.WINDOW_S:g}s"},
    }


def operator_permissions(name: str = subjects.OPERATOR, role: Role = WRITE) -> dict[str, Any]:
    """Operators and CI: the request/reply API, the event stream and its history (read by
    sequence, `transport.eventstream`: no write, purge or delete), and nodes' logs. The
    shared operator calls the API on ``gavel.api.<verb>`` and answers come to ``_INBOX``; a
    named one (rule 7) only on subjects that end in its name, for the verbs its role allows
    (`shared.roles`), its answers under its own inbox, which no one else may read."""
    history = [subjects.EVENTS_GET, subjects.EVENTS_INFO]
    if name == subjects.OPERATOR:
        return {"publish": {"allow": [subjects.API_ALL, subjects.LOGS_ALL, *history,
                                      subjects.EXEC.format(node="*", operator=name)]},
                "subscribe": {"allow": [f"{subjects.OPERATOR_INBOX}.>", subjects.EVENTS_ALL]}}
    verbs = [subjects.API_AS.format(verb="*", operator=name),
             subjects.EXEC.format(node="*", operator=name)] if role == WRITE else \
        [subjects.API_AS.format(verb=v, operator=name) for v in sorted(READ_VERBS)]
    return {"publish": {"allow": [*verbs, subjects.LOGS_AS.format(node="*", operator=name),
                                  *history]},
            "subscribe": {"allow": [f"{subjects.operator_inbox(name)}.>",
                                    subjects.EVENTS_ALL]}}


def heartbeat_stream_permissions() -> dict[str, Any]:
    """What the broker's heartbeat stream (`gavel.broker.heartbeat_stream`) calls: make or
    update the stream, make, pull from and delete its own consumers, publish its probe and
    purge probes of brokers long gone; the API's answers and the pulled messages come to
    its own inbox. Without JetStream it subscribes to the heartbeat subjects and its probe
    themselves."""
    stream = subjects.HEARTBEAT_STREAM
    return {
        "publish": {"allow": [
            f"$JS.API.STREAM.CREATE.{stream}",
            f"$JS.API.STREAM.UPDATE.{stream}",
            f"$JS.API.STREAM.PURGE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.API.CONSUMER.DELETE.{stream}.*",
            subjects.HEARTBEAT_PROBE_ALL,
        ]},
        "subscribe": {"allow": [f"{subjects.BROKER_INBOX}.>", subjects.HEARTBEAT_ALL,
                                subjects.HEARTBEAT_PROBE_ALL]},
    }


def broker_permissions(nodes: Iterable[str] = ()) -> dict[str, Any]:
    """The broker (rule 2): what it publishes, the answers it gives (to operators' inbox and
    to each of `nodes`' own), the subjects it serves, and its heartbeat stream's calls."""
    own = f"{subjects.BROKER_INBOX}.>"
    stream = heartbeat_stream_permissions()
    return {
        "publish": {"allow": [
            subjects.RFB,
            subjects.RFB_NODE.format(node="*"),
            subjects.AWARD.format(node="*"),
            subjects.CANCEL.format(node="*"),
            subjects.EVENTS_ALL,
            # The event history (`transport.eventstream`): made, kept in line, read at start.
            f"$JS.API.STREAM.CREATE.{subjects.EVENTS_STREAM}",
            f"$JS.API.STREAM.UPDATE.{subjects.EVENTS_STREAM}",
            subjects.EVENTS_INFO,
            subjects.EVENTS_GET,
            subjects.NODE_KEY.format(node="*"),  # the KV mirror's puts
            # Nodes' watches (rule 4): a consumer of one node's key, and deleting one.
            subjects.NODE_WATCH.format(name="*", node="*"),
            subjects.NODE_WATCH_DELETE.format(name="*"),
            f"$JS.API.STREAM.CREATE.{subjects.NODES_STREAM}",  # making sure the bucket exists
            # The leadership lease (`broker.lease`): its bucket, its one key (create, renew,
            # release), and a consumer of that key alone, for the standbys' watch.
            f"$JS.API.STREAM.CREATE.{subjects.LEADER_STREAM}",
            subjects.LEADER_KEY,
            subjects.LEADER_GET,  # whether a put refused on its retry had landed
            subjects.LEADER_WATCH.format(name="*"),
            f"{subjects.OPERATOR_INBOX}.>",  # answers to the API
            f"{subjects.operator_inbox('*')}.>",  # to named operators' (rule 7)
            *(f"{subjects.NODE_INBOX.format(node=n)}.>" for n in nodes),  # to assign requests
            own,  # its subscription barrier
            *stream["publish"]["allow"],
        ]},
        "subscribe": {"allow": [
            subjects.HEARTBEAT_ALL,
            subjects.BIDS_ALL,
            subjects.REPORT_ALL,
            subjects.ASSIGN_ALL,
            subjects.WATCH_ALL,
            subjects.API_ALL,
            subjects.API_AS_ALL,
            own,  # JetStream's answers, its subscription barrier
            *(s for s in stream["subscribe"]["allow"] if s not in (own, subjects.HEARTBEAT_ALL)),
        ]},
    }


# -- keys --------------------------------------------------------------------------------------
def public_key(seed: str) -> str:
    """The user public key (``U...``) of an nkey seed (``SU...``)."""
    import nkeys  # PyNaCl: loaded by the verbs that make or check keys, not by every daemon

    kp = nkeys.from_seed(bytearray(seed.encode()))
    try:
        return str(kp.public_key.decode())
    finally:
        kp.wipe()


def _read_seed(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"cannot read the nkey seed {path}: "
                          f"{getattr(exc, 'strerror', None) or exc}.") from None
    if not _valid_seed(text):
        raise IdentityError(f"{path} is not an nkey user seed; delete it and run "
                          "`gavel auth init` again to make a new one.")
    return text


def _valid_seed(text: str) -> bool:
    """A user seed: ``SU``, 56 more base32 characters, and a CRC-16 that matches."""
    import nkeys

    if not _SEED.fullmatch(text):
        return False
    raw = base64.b32decode(text + "=" * (-len(text) % 8))
    return bytes(nkeys.crc16_checksum(raw[:-2])) == raw[-2:]


def _new_seed(path: Path) -> str:
    """A fresh user seed in `path`, created 0600 (never readable by anyone else, not even
    for a moment) and never over an existing file."""
    import nkeys

    seed = str(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(seed + "\n")
    return seed


def _seed(path: Path) -> str:
    """The seed in `path`, made if it does not exist yet (idempotent)."""
    if path.exists():
        return _read_seed(path)
    return _new_seed(path)


# -- the nats-server config ------------------------------------------------------------------
def _conf(value: Any, indent: str = "") -> str:
    """A value in NATS config syntax (JSON-like: every string quoted, so ``$JS`` is literal,
    never a variable)."""
    if isinstance(value, dict):
        inner = indent + "  "
        body = "\n".join(f"{inner}{k}: {_conf(v, inner)}" for k, v in value.items())
        return "{\n" + body + "\n" + indent + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(value)


def render_config(users: Sequence[tuple[str, str, dict[str, Any]]]) -> str:
    """nats-server config text: one nkey user per (comment, public key, permissions). It
    holds only `authorization`; JetStream comes from the command line (``-js -sd DIR``) or
    from a config that ``include``-s this one."""
    lines = [
        "# gavel: NATS identities and permissions, written by `gavel auth init`.",
        "# Run `gavel auth init` again rather than editing this file: it keeps every key and",
        "# rewrites the list. Revoke a node: delete its .nk seed, run init, reload nats-server.",
        "#",
        "# On more than one host, add TLS and give every client a tls:// URL:",
        '#   tls { cert_file: "server.pem", key_file: "server-key.pem", ca_file: "ca.pem" }',
        "",
    ]
    lines += ["authorization {", "  users: ["]
    for comment, key, perms in users:
        lines.append(f"    # {comment}")
        lines.append(f"    {{ nkey: {json.dumps(key)}, permissions: {_conf(perms, '    ')} }}")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


#: The nodes `init` was given, one id a line, in the key directory (rule 5).
NODES_RECORD = "node-ids"


def _recorded(directory: Path) -> list[str]:
    """The node ids earlier runs of `init` were given; a line that is no node id (a hand
    edit) is no node."""
    path = directory / NODES_RECORD
    if not path.exists():
        return []
    names = [line.strip() for line in path.read_text().splitlines()]
    return [n for n in names if subjects.is_node_id(n) and n not in (BROKER, OPERATOR)]


@dataclass(frozen=True)
class Identities:
    """What `init` wrote: the server config and each identity's seed file."""

    directory: Path
    config: Path
    broker: Path
    operator: Path
    nodes: dict[str, Path]
    #: Each named operator's seed (rule 7).
    operators: dict[str, Path] = field(default_factory=dict)


def _write(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def init(state: Path, nodes: Iterable[str] = ()) -> Identities:
    """Seeds for the broker, operators and `nodes` under ``state/auth`` (existing ones kept),
    and ``state/auth/nats.conf`` authorizing `nodes` and the nodes earlier runs were given
    whose seeds remain (rule 5), never a seed file it was not given."""
    directory = state / "auth"
    for name in nodes:
        if name in (BROKER, OPERATOR):
            raise IdentityError(f"node id {name!r} is reserved for the {name}'s own key; "
                              "choose another.")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        broker = directory / f"{BROKER}.nk"
        operator = directory / f"{OPERATOR}.nk"
        broker_key, operator_key = public_key(_seed(broker)), public_key(_seed(operator))
        named = set(nodes)
        for name in named:
            _seed(directory / f"{name}.nk")
        known = sorted(named | {n for n in _recorded(directory)
                                if (directory / f"{n}.nk").exists()})
        _write(directory / NODES_RECORD, "".join(f"{n}\n" for n in known))
        paths = {name: directory / f"{name}.nk" for name in known}
        users = [("broker: what it publishes, serves and answers", broker_key,
                  broker_permissions(known)),
                 ("operators: the API and events", operator_key, operator_permissions())]
        for name in known:
            users.append((f"node {name}", public_key(_read_seed(paths[name])),
                          worker_permissions(name)))
        roles = _operators(directory)
        operators = {n: directory / OPERATORS_DIR / f"{n}.nk" for n in roles
                     if (directory / OPERATORS_DIR / f"{n}.nk").exists()}
        for name, seed in operators.items():
            users.append((f"operator {name} ({roles[name]})", public_key(_read_seed(seed)),
                          operator_permissions(name, roles[name])))
        config = directory / "nats.conf"
        _write(config, render_config(users))
    except OSError as exc:
        raise IdentityError(f"cannot write the keys under {directory}: "
                          f"{exc.strerror or exc}.") from None
    return Identities(directory=directory, config=config, broker=broker, operator=operator,
                      nodes=paths, operators=operators)


#: Each named operator's role, in the key directory (rule 7).
OPERATORS_RECORD = "operators.json"


def _operators(directory: Path) -> dict[str, Role]:
    path = directory / OPERATORS_RECORD
    try:
        got = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as exc:
        raise IdentityError(f"cannot read {path}: {exc}; run `gavel auth operator add` "
                            "again for each operator.") from None
    return {str(n): r for n, r in got.items()
            if subjects.is_node_id(str(n)) and n != subjects.OPERATOR and r in ROLES}


def operator_roles(directory: Path) -> dict[str, Role]:
    """Each named operator recorded in the key directory `directory`, and its role."""
    return _operators(directory)


def add_operator(state: Path, name: str, role: Role) -> Identities:
    """Operator `name` with `role` (rule 7): its seed made if it has none (kept if it has),
    its role recorded, the server config written again."""
    if not subjects.is_node_id(name) or name in (BROKER, OPERATOR):
        raise IdentityError(f"operator name {name!r} must be 1-64 letters, digits, '-' or "
                            f"'_', and not {BROKER!r} or {OPERATOR!r}.")
    directory = state / "auth"
    try:
        (directory / OPERATORS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
        _seed(directory / OPERATORS_DIR / f"{name}.nk")
        roles = {**_operators(directory), name: role}
        _write(directory / OPERATORS_RECORD, json.dumps(roles, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise IdentityError(f"cannot write the keys under {directory}: "
                            f"{exc.strerror or exc}.") from None
    return init(state)
