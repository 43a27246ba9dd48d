"""A real nats-server run with the config `gavel auth init` writes, for the tests of identity
(test_auth.py, test_replies.py, test_strays.py): connections with the seeds it writes,
their refusals collected, and one witness no deployment has.

The witness is an extra nkey user with no permissions list (so every subject), added to the
very config `init` wrote: a subscriber that may watch ``>``, which no gavel credential may
any more (the broker's own subscribes only to what it serves), to prove a message was never
published anywhere, and a publisher that can put on the wire what no gavel credential may
(a hand-made status message, say).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nkeys
import pytest

from gavel.shared import subjects
from gavel.transport import identity as auth
from gavel.transport import wire
from gavel.transport.natsserver import NatsServer

__all__ = ["WITNESS", "Authed", "Witness", "authed"]

#: The witness's name in `Authed.connect`.
WITNESS = "witness"


@dataclass
class Authed:
    server: NatsServer
    ids: auth.Identities
    root: Path
    witness_seed: Path
    errors: dict[str, list[str]] = field(default_factory=dict)
    conns: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def seed(self, who: str) -> str:
        if who == auth.BROKER:
            return str(self.ids.broker)
        if who == auth.OPERATOR:
            return str(self.ids.operator)
        if who == WITNESS:
            return str(self.witness_seed)
        return str(self.ids.nodes[who])

    async def connect(self, who: str, **kw: Any) -> Any:
        """A connection as `who` whose refusals are collected in `errors[who]`."""
        errors = self.errors.setdefault(who, [])

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        if who not in (auth.BROKER, auth.OPERATOR, WITNESS):
            kw.setdefault("inbox_prefix", subjects.NODE_INBOX.format(node=who))
        if who == auth.BROKER:
            kw.setdefault("inbox_prefix", subjects.BROKER_INBOX)
        nc = await nats.connect(self.url, nkeys_seed=self.seed(who), error_cb=on_error,
                                allow_reconnect=False, **kw)
        self.conns.append(nc)
        return nc

    def refused(self, who: str, action: str, subject: str) -> bool:
        return any(f"permissions violation for {action} to \"{subject.lower()}\"" in e
                   for e in self.errors.get(who, []))

    def violations(self) -> list[str]:
        log = self.root / "nats.log"
        return [line for line in log.read_text().splitlines() if "Violation" in line]


def _with_witness(config: Path, seed: Path) -> Path:
    """`init`'s config with one more user, the witness, and nothing else changed."""
    key = auth.public_key(seed.read_text().strip())
    text = config.read_text()
    tail = "  ]\n}\n"
    assert text.endswith(tail), "the config `init` writes ends its user list so"
    served = config.with_name("nats-with-witness.conf")
    served.write_text(text[:-len(tail)] + "    # the tests' witness: every subject\n"
                      f'    {{ nkey: "{key}" }}\n' + tail)
    return served


@pytest.fixture
async def authed(tmp_path: Path) -> AsyncIterator[Authed]:
    ids = auth.init(tmp_path, ["a", "b"])
    witness = tmp_path / "witness.nk"  # outside auth/: init must not take it for a node
    witness.write_text(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())
    server = NatsServer(store_dir=tmp_path / "js", config=_with_witness(ids.config, witness),
                        log=tmp_path / "nats.log")
    server.start()
    a = Authed(server, ids, tmp_path, witness)
    try:
        yield a
    finally:
        try:
            for nc in a.conns:
                if not nc.is_closed:
                    with contextlib.suppress(Exception):
                        await nc.close()
        finally:
            server.stop()


class Witness:
    """Everything published on `patterns` (``>`` by default), in the order heard."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.nc: Any = None

    async def start(self, authed: Authed, patterns: tuple[str, ...] = (">",)) -> Witness:
        self.nc = nc = await authed.connect(WITNESS)

        async def cb(msg: Any) -> None:
            self.seen.append((msg.subject, msg.data))

        for p in patterns:
            await nc.subscribe(p, cb=cb)
        await wire.subscribed(nc)
        return self

    def subjects(self) -> set[str]:
        return {s for s, _ in self.seen}
