"""What an operator may do: each operator identity has one role (`transport.identity`).

Rules:
1. ``read`` calls the verbs that change nothing (`READ_VERBS`; a plan is a dry run), reads
   events and their history and asks nodes for logs; ``write`` calls every verb and may
   `gavel exec`.
2. A verb that is not listed as reading is writing: a new verb is closed to readers until it
   is listed here.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["READ", "READ_VERBS", "ROLES", "WRITE", "Role"]

Role = Literal["read", "write"]
READ: Role = "read"
WRITE: Role = "write"
ROLES: tuple[Role, ...] = (READ, WRITE)
#: The API verbs a reader may call (rule 2).
READ_VERBS = frozenset({"status", "nodes", "why", "events", "stats", "endpoints", "service",
                        "services", "plan", "periodic"})
