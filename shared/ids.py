"""What an instance may be named, and the names a counted submission makes: the rules every
verb that takes an instance id holds to (`gavel.shared.api` re-exports them); which names a
kind of work takes for itself."""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from gavel.shared.spec import Spec

__all__ = ["INSTANCE_ID", "INSTANCE_ID_MAX", "SUBMIT_KEY", "InstanceId", "SubmitKey",
           "counted_id_problem", "counted_ids", "key_problem", "kind_naming_problem"]

#: What an operator may name an instance (or "": the broker names it): a letter or digit,
#: then letters, digits, ``_ -`` and single dots — usable in a NATS subject, as a file name in
#: git and as the worker's directory name for it.
INSTANCE_ID = r"^([A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*)?$"
#: The longest instance id: every verb that takes one (status, logs, cancel) takes this many.
INSTANCE_ID_MAX = 128
InstanceId = Annotated[str, msgspec.Meta(max_length=INSTANCE_ID_MAX, pattern=INSTANCE_ID)]
#: An idempotency key (or "": none): 8 to 64 letters, digits, ``_ -``; a uuid4 as the CLI
#: makes one fits. It is stored in every record the submission makes (`InstanceRecord.key`).
SUBMIT_KEY = r"^([A-Za-z0-9_-]{8,64})?$"
SubmitKey = Annotated[str, msgspec.Meta(max_length=64, pattern=SUBMIT_KEY)]


def key_problem(key: str) -> str:
    """Why `key` cannot be a submission's idempotency key, in one sentence; "" if it can."""
    if key and not re.match(SUBMIT_KEY, key):
        return (f"key {key[:80]!r} is not usable: expected 8 to 64 letters, digits, '_' or "
                "'-' (a uuid4 fits)")
    return ""


def counted_id_problem(base: str, count: int) -> str:
    """Why the ids a submission of `count` named `base` makes (`counted_ids`) are not
    instance ids every verb takes, in one sentence; "" if they are."""
    if not base or count <= 1:
        return ""  # the id's own type says what one id may be
    last = counted_ids(base, count)[-1]
    if len(last) <= INSTANCE_ID_MAX:
        return ""
    return (f"id {base[:40]!r}...: with the count's suffix -{count} the ids are {len(last)} "
            f"characters, over the {INSTANCE_ID_MAX} an instance id may have; give a shorter "
            "id")


def counted_ids(base: str, count: int) -> list[str]:
    """The ids a submission of `count` instances named `base` gets: `base` alone, or
    `base-1` .. `base-count` (the broker names them so; a client can check its reply)."""
    return [base] if count == 1 else [f"{base}-{k}" for k in range(1, count + 1)]


def kind_naming_problem(spec: Spec, instance_id: str, count: int = 1) -> str:
    """Why a submit of a periodic or a system job may not say `instance_id` (``--id``) or a
    `count`, in one sentence naming the field; "" when it says neither (or names the job
    by its own name). Such a job is named by its spec's name - `gavel status NAME`, `gavel
    cancel NAME` - and names its own instances (a run by its fire time, a system job's
    instance by its node), so an id it would not use is refused, never dropped."""
    if spec.system:
        kind, own = "a system job", "its instances by their nodes"
    elif spec.schedule is not None:
        kind, own = "a periodic job", "each run by its fire time"
    else:
        return ""
    if instance_id and instance_id != spec.name:
        return (f"--id {instance_id!r} does not apply to {kind}: it is named by its spec's name "
                f"({spec.name!r}) and names {own}; leave --id out or change the name")
    if count != 1:
        return (f"count {count} does not apply to {kind}: submit it once (it is named by its "
                f"spec's name, {spec.name!r})")
    return ""
