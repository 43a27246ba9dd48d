"""A spec accepted is a spec some node can run: what exec or a node would refuse on every node
(an argument over the kernel's limit, a label no node can hold, a cpu finer than any node
divides, ids too long once a count's suffix is added) is refused where it is submitted, with
a sentence naming it."""

from __future__ import annotations

import re

import msgspec
import pytest

from gavel.shared.api import SubmitRequest, counted_id_problem
from gavel.shared.spec import MAX_ARG_BYTES, MIN_CPU, Spec


def spec(**kw: object) -> Spec:
    return msgspec.convert({"name": "web", "command": ["true"], **kw}, Spec)


@pytest.mark.parametrize(("fields", "words"), [
    ({"command": ["echo", "x" * 900_000]}, "over the kernel's limit for one argument"),
    ({"env": {"BIG": "x" * MAX_ARG_BYTES}}, "env 'BIG' is over the kernel's limit"),
    ({"command": ["echo", *["x" * 100_000] * 11]}, "over the 1048576 a spec may give exec"),
    ({"labels": {"zone\n": "a"}}, "holds a control character"),
    ({"labels": {"zone": "a\tb"}}, "holds a control character"),
    ({"cpu": 5e-324}, "cpu 4.94066e-324 is below the finest a node divides: at least 0.001"),
    ({"type": "service", "spread": "zone\n"}, "spread 'zone\\n' holds a control character"),
])
def test_what_no_node_could_run_is_refused_with_a_sentence(fields: dict[str, object],
                                                            words: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(words)):
        spec(**fields)


def test_what_a_node_can_run_is_still_accepted() -> None:
    spec(command=["echo", "x" * (MAX_ARG_BYTES - 1)], cpu=MIN_CPU, labels={"zone": "a b"})


def test_ids_a_count_makes_are_ids_every_verb_takes() -> None:
    base = "a" * 126
    assert counted_id_problem(base, 9) == ""  # a-1 .. a-9: 128 characters
    assert "the ids are 129 characters, over the 128" in counted_id_problem(base, 10)
    assert counted_id_problem("", 100_000) == "" and counted_id_problem("a" * 128, 1) == ""
    # The broker decodes a client's request the same way: refused with the sentence.
    request = {"kind": "submit", "spec": {"name": "web", "command": ["true"]},
               "instance_id": base, "count": 10}
    with pytest.raises(msgspec.ValidationError, match="with the count's suffix -10"):
        msgspec.convert(request, SubmitRequest)
    msgspec.convert({**request, "count": 9}, SubmitRequest)
