"""The one error a person causes: a flag, a config or spec file, a credential or key file that
cannot be used.

Rule: its text is one sentence that names what is wrong and, where it helps, what to do; the
`gavel` command prints it and exits 2. Each room raises its own kind (a config field, a spec
file, a credential, a key) and every kind is a `BadInput`, so the command line needs to know
only this one.
"""

from __future__ import annotations

__all__ = ["BadInput"]


class BadInput(Exception):
    """Bad input from a person: one sentence, exit status 2."""
