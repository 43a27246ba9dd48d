"""The HTTP status of each answer that is not a success, and its JSON body.

Rules:
1. The body is the NATS API's own `ApiError` (``{"kind": "error", "error": SENTENCE}``): the
   sentence is the one the broker, or the CLI for bad input, says.
2. The status follows the sentence's reason: 404 for what does not exist (an instance, a node,
   a service), 409 for what conflicts with the cluster's state or an earlier request (a taken
   id, a reused idempotency key, a pinned deployment), 422 for a request that is well formed
   but can never be carried out (a job deployed as a service, a spec no node could hold, a
   secret the broker lacks); 503 when no broker answers, 504 when it did not answer in time,
   502 when the cluster cannot be reached at all. Any other refusal is 409.
"""

from __future__ import annotations

import msgspec

from gavel.shared.messages import ApiError
from gavel.shared.reasons import Reason

__all__ = ["body", "status_for"]

#: Rule 2, the reasons a sentence may start with, first match wins.
_BY_REASON: tuple[tuple[str, int], ...] = (
    (Reason.UNKNOWN_INSTANCE, 404),
    (Reason.UNKNOWN_NODE, 404),
    (Reason.UNKNOWN_SERVICE, 404),
    (Reason.NOT_A_SERVICE, 422),
    (Reason.NEVER_FITS, 422),
    (Reason.BAD_SPEC, 422),
    ("unknown secret", 422),
    (Reason.LEDGER_UNWRITABLE, 503),
)


def status_for(sentence: str) -> int:
    """Rule 2: the status of a broker's refusal."""
    for start, status in _BY_REASON:
        if sentence.startswith(start):
            return status
    return 409


def body(sentence: str) -> bytes:
    """Rule 1."""
    return msgspec.json.encode(ApiError(error=sentence))
