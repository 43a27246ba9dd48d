"""What goes wrong with the state repository, as the exceptions the ledger raises.

Rules:
1. Every failure to read or write the state repository is a `LedgerError`; `Conflict` (the
   branch moved since the change was planned) and `Pinned` (the active ref is a tag or a
   commit) are the two a caller handles by re-planning or by refusing the write.
2. An object the tree or the history needs that is missing or does not read is `Damaged`:
   one sentence naming the object and what to do (`damaged`). Nothing is guessed around it.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["Conflict", "Damaged", "LedgerError", "Pinned", "damaged"]

_OID = re.compile(r"[0-9a-f]{40}")


class LedgerError(Exception):
    """The state repository could not be read or written."""


class Conflict(LedgerError):
    """The branch moved since the change was planned."""


class Pinned(LedgerError):
    """The active ref is a tag or a commit: nothing may be written."""


class Damaged(LedgerError):
    """An object the state repository needs is missing or corrupt: the broker cannot know
    what its branch says, and stops (the sentence names the object and what to do)."""


def damaged(path: Path, exc: BaseException) -> Damaged:
    """`exc` (libgit2's KeyError for a missing object, GitError for one that does not read)
    as one sentence for the operator."""
    if isinstance(exc, KeyError) and exc.args:
        # the id alone, or a sentence around it ("... of id '<oid>' can not be peeled ...")
        found = _OID.search(str(exc.args[0]))
        oid, why = (found.group(0) if found else str(exc.args[0])), "is missing"
    else:
        text = str(exc)
        found = _OID.search(text)
        oid = found.group(0) if found else "an object"
        why = f"does not read ({text.replace(oid, '').strip(' :') or type(exc).__name__})"
    return Damaged(f"object {oid} in the state repository {path} {why}: restore state.git "
                   f"from the push remote, or run `git fsck --full` in {path} to see what is "
                   "damaged")
