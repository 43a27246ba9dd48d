"""The node book on disk (`gavel.shared.nodebook`): ``auth/nodes.json`` beside the nodes'
seeds, written by `gavel auth init --node` and read by `gavel gateway --nodes`.

Rule: recording merges - an entry given again replaces that node's, the others stay - unless
told to write the book afresh (`gavel up`, whose workers are exactly the ones it names); the
file is written whole, mode 0600, by rename, so a reader never sees half of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from gavel.shared.errors import BadInput
from gavel.shared.nodebook import KnownNode, decode, encode

__all__ = ["FILE", "load", "record"]

FILE = "nodes.json"


def load(path: Path) -> dict[str, KnownNode]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read the node book {path}: {exc.strerror or exc}") from None
    return decode(data, str(path))


def record(directory: Path, entries: dict[str, KnownNode], *, merge: bool = True) -> Path:
    """Merge `entries` into ``directory/nodes.json`` (or make it of them alone); its path."""
    path = directory / FILE
    book = load(path) if merge and path.exists() else {}
    book.update(entries)
    tmp = path.with_name(f".{FILE}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(encode(book))
        os.replace(tmp, path)
    except OSError as exc:
        raise BadInput(f"cannot write the node book {path}: {exc.strerror or exc}") from None
    return path
