"""A NATS credential file, of either kind, as `nats.connect` options.

Rule: the kind is read from the content, never from the name — a ``.creds`` file (a user
JWT and its seed, for servers in operator/JWT mode) becomes ``user_credentials=``, a bare
nkey seed (what `gavel auth init` writes) becomes ``nkeys_seed=``. A file that cannot be
read, or is neither, is one sentence naming the file (never its content): exit 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gavel.shared import subjects
from gavel.shared.errors import BadInput

__all__ = ["OPERATORS_DIR", "CredsError", "connect_options", "operator_name"]

#: Where `gavel auth operator add` writes each named operator's seed: ``operators/<name>.nk``.
OPERATORS_DIR = "operators"

_JWT = "-----BEGIN NATS USER JWT-----"
_CREDS_SEED = "BEGIN USER NKEY SEED"
_SEED = re.compile(r"SU[A-Z2-7]{56}")


class CredsError(BadInput):
    """The credential file is missing, unreadable or not a credential."""


def operator_name(path: str | None, env: Mapping[str, str] | None = None) -> str:
    """Who an operator's client asks as (`shared.subjects` rule 4): ``GAVEL_OPERATOR`` when
    set, else the name of a seed file in an ``operators`` directory (``operators/alice.nk``:
    alice), else the shared operator. A name that is not one is bad input."""
    environ = os.environ if env is None else env
    name = environ.get("GAVEL_OPERATOR", "")
    if not name and path and Path(path).parent.name == OPERATORS_DIR:
        name = Path(path).stem
    if not name:
        return subjects.OPERATOR
    if not subjects.is_node_id(name):
        raise CredsError(f"operator name {name!r} must be 1-64 letters, digits, '-' or '_'.")
    return name


def connect_options(path: str) -> dict[str, Any]:
    """``{"user_credentials": path}`` for a .creds file, ``{"nkeys_seed": path}`` for a seed."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CredsError(f"cannot read the credentials file {path}: "
                         f"{(exc.strerror or str(exc)).lower()}.") from None
    except UnicodeDecodeError:
        text = ""
    if _JWT in text and _CREDS_SEED in text:
        return {"user_credentials": path}
    if _SEED.fullmatch(text.strip()):
        return {"nkeys_seed": path}
    raise CredsError(f"the credentials file {path} is neither a NATS .creds file nor an nkey "
                     "user seed (SU...).")
