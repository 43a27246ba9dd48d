"""Who an operator is, in memory: its name from its seed file or GAVEL_OPERATOR, its inbox,
its subjects, its role's permissions, and `gavel exec`'s start checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.shared import execstream, subjects
from gavel.shared.errors import BadInput
from gavel.shared.execstream import ExecStart
from gavel.shared.roles import READ_VERBS
from gavel.transport import identity
from gavel.transport.creds import operator_name


def test_an_operator_s_name_comes_from_the_environment_or_its_seed_file() -> None:
    assert operator_name(None, {}) == "operator"
    assert operator_name("/x/auth/operator.nk", {}) == "operator"
    assert operator_name("/x/auth/operators/alice.nk", {}) == "alice"
    assert operator_name("/x/auth/operators/alice.nk", {"GAVEL_OPERATOR": "bob"}) == "bob"
    with pytest.raises(BadInput):
        operator_name(None, {"GAVEL_OPERATOR": "a.b"})


def test_inboxes_and_subjects_name_the_operator() -> None:
    assert subjects.operator_inbox("operator") == "_INBOX"
    assert subjects.operator_inbox("alice") == "_GAVEL_OP.alice"
    assert subjects.operator_of_inbox("_GAVEL_OP.alice.abc") == "alice"
    assert subjects.operator_of_inbox("_INBOX.abc") == "operator"
    assert subjects.operator_of_inbox("_INBOX_node-1.abc") == ""  # a node's: no operator's
    assert subjects.asker("gavel.api.submit", 3) == "operator"
    assert subjects.asker("gavel.api.submit.alice", 3) == "alice"
    assert subjects.asker("gavel.api.submit.a.b", 3) == ""
    # No node's inbox prefix can be a named operator's, whatever the node is called.
    assert not subjects.operator_inbox("x").startswith("_INBOX")


def test_a_reader_may_call_only_the_reading_verbs_and_never_exec() -> None:
    read = identity.operator_permissions("alice", "read")
    allowed = read["publish"]["allow"]
    assert {f"gavel.api.{v}.alice" for v in READ_VERBS} <= set(allowed)
    assert not any(s.startswith(("gavel.api.submit", "gavel.exec", "gavel.api.*"))
                   for s in allowed)
    assert read["subscribe"]["allow"] == ["_GAVEL_OP.alice.>", "gavel.events.>"]
    write = identity.operator_permissions("bob", "write")
    assert "gavel.api.*.bob" in write["publish"]["allow"]
    assert "gavel.exec.*.bob" in write["publish"]["allow"]


def test_operator_names_that_are_reserved_or_malformed_are_refused(tmp_path: Path) -> None:
    for bad in ("operator", "broker", "a.b", ""):
        with pytest.raises(BadInput):
            identity.add_operator(tmp_path, bad, "read")
    ids = identity.add_operator(tmp_path, "alice", "read")
    seed = ids.operators["alice"].read_text()
    again = identity.add_operator(tmp_path, "alice", "write")  # re-role: the key is kept
    assert again.operators["alice"].read_text() == seed
    assert '"alice": "write"' in (tmp_path / "auth" / "operators.json").read_text()


def test_an_exec_start_is_checked() -> None:
    def start(**kw: object) -> ExecStart:
        base: dict[str, object] = {"node_id": "n", "instance_id": "i", "session": "ab" * 8,
                                   "command": ["true"]}
        return ExecStart(**{**base, **kw})  # type: ignore[arg-type]
    assert execstream.check(start()) == ""
    assert execstream.check(start(session="XYZ")) != ""
    assert execstream.check(start(timeout_s=execstream.TIMEOUT_MAX_S + 1)) != ""
    assert execstream.check(start(command=["a\0b"])) != ""
    assert execstream.describe(["sh", "-c", "echo hi"]) == "sh -c 'echo hi'"
