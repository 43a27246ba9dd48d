"""The git ledger: the state repository is the deployment.

`repository` is the handle (the active ref, its head, the State at it, the writes); `reading`
reads a tree, `cascommit` writes one commit and moves the branch by compare-and-swap,
`history` walks the commits and their auction records, `errors` names what goes wrong and
`stalelock` clears a dead writer's lock; `state` is that tree in memory and the `Change` a
commit writes; `plan` holds the pure plans that make changes; `committer` groups them into
commits, written by `gitwriter` in a process of its own with `objects` and `packs` (git's own
formats); `remote` pushes the branch and merges what others pushed.
"""

from gavel.broker.ledger.repository import Conflict, Ledger, LedgerError, Pinned
from gavel.broker.ledger.state import Change, State

__all__ = ["Change", "Conflict", "Ledger", "LedgerError", "Pinned", "State"]
