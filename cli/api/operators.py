"""The HTTP API's named operators: a bearer token each, mapped to the operator's own identity.

Rules:
1. `gavel auth operator add NAME --http-token` writes ``auth/operators/NAME.token`` beside
   the operator's nkey (``NAME.nk``, `transport.identity` rule 7): a fresh token, readable by
   its owner alone, kept when it exists (a re-role keeps it). Deleting the file revokes it.
2. ``gavel api --api-operators DIR`` (``gavel up`` gives its own ``auth/``) reads each
   operator recorded in ``DIR/operators.json`` that has both a token and a seed; a request
   bearing that token is served on a connection of that operator's identity, so the broker
   logs it and its ``requested`` events name that operator, and NATS holds it to its role
   as it holds the operator's CLI. A reader's token is refused a writing route by the API
   first, with the same sentence as the API's read token.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gavel.shared.roles import READ, Role
from gavel.transport.creds import OPERATORS_DIR
from gavel.transport.identity import operator_roles

__all__ = ["TOKEN_SUFFIX", "Operator", "load", "token_of"]

#: Rule 1: the token file's name beside the operator's seed.
TOKEN_SUFFIX = ".token"


@dataclass(frozen=True)
class Operator:
    """A named operator the API serves (rule 2)."""

    name: str
    role: Role
    #: Its nkey seed: the identity its requests are made as.
    creds: Path
    token: str

    @property
    def reader(self) -> bool:
        return self.role == READ


def token_of(auth: Path, name: str) -> str:
    """Rule 1: operator `name`'s HTTP token under the key directory `auth`, made if it has
    none."""
    path = auth / OPERATORS_DIR / f"{name}{TOKEN_SUFFIX}"
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def load(auth: Path) -> list[Operator]:
    """Rule 2: every recorded operator under `auth` with a token and a seed, by name."""
    found = []
    for name, role in sorted(operator_roles(auth).items()):
        seed = auth / OPERATORS_DIR / f"{name}.nk"
        path = seed.with_name(f"{name}{TOKEN_SUFFIX}")
        if seed.exists() and path.exists():
            token = path.read_text().strip()
            if token:
                found.append(Operator(name=name, role=role, creds=seed, token=token))
    return found
