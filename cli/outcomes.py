"""A client verb's outcomes and their exit codes: one table (`EXIT_CODES`) for every verb."""

from __future__ import annotations

from gavel.shared.api import ArrayStatus, InstanceStatus
from gavel.shared.errors import BadInput
from gavel.shared.reasons import Reason
from gavel.transport.client import ClientError

#: Every exit status of a client verb and what it means (rule 1; README.md shows this table).
EXIT_CODES = {
    0: "done",
    1: "no answer to be had: no broker answers (none runs, none leads this moment, too "
       "slow), a node does not answer or has no output for it, or NATS refused the credential",
    2: "bad input: a flag, spec, config file, credential or NATS URL, or nothing answers at "
       "the NATS URL",
    3: "refused: the broker answered no (never fits, pinned, ...), or --wait ended without "
       "success (failed, unschedulable, rolled back, not healthy in time)",
    4: "unknown: no such instance, service or node",
    130: "interrupted (Ctrl-C)",
    141: "the reader of its output went away (| head)",
}


#: The sentences that mean "no such thing" (exit 4), as the broker says them.
_UNKNOWN = (Reason.UNKNOWN_INSTANCE, Reason.UNKNOWN_SERVICE, Reason.UNKNOWN_NODE)


class UsageError(BadInput):
    """Bad input from the operator: exit code 2."""


class Unknown(ClientError):
    """No instance, service or node of that name: exit code 4."""


def refusal_code(sentence: str) -> int:
    """The exit status of a broker's no: 4 for "no such ...", else 3 (rule 1)."""
    return 4 if sentence.startswith(_UNKNOWN) else 3


class Refused(Exception):
    """The broker answered, but no: exit code 3. `status`: the instance as last seen, when
    there is one (``--json`` prints it with the error)."""

    def __init__(self, message: str, status: InstanceStatus | ArrayStatus | None = None
                 ) -> None:
        super().__init__(message)
        self.status = status
