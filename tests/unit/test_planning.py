"""`gavel plan`'s pure parts (`shared.planning`): the version index changes with the
operator's intent and not with a rollout's progress; the diff names fields, nested ones by
their dotted name."""

from __future__ import annotations

import msgspec

from gavel.shared.planning import FieldChange, spec_diff, version_index
from gavel.shared.records import Deployment, ServiceRecord, ServiceVersion
from gavel.shared.spec import Spec, Update

V1 = Spec(name="web", type="service", command=["true"], count=2)
V2 = msgspec.structs.replace(V1, cpu=0.2, env={"A": "1"}, update=Update(max_parallel=2))


def record(**kw: object) -> ServiceRecord:
    base = ServiceRecord(name="web", versions=[ServiceVersion(version=1, spec=V1, at="t")],
                         version=1, count=2)
    return msgspec.structs.replace(base, **kw)


def test_the_index_follows_intent_not_progress() -> None:
    assert version_index(None) == 0
    first = version_index(record())
    assert first > 0 and first == version_index(record())  # the same record, the same index
    assert version_index(record(count=3)) != first  # a scale
    assert version_index(record(stopped=True)) != first  # a stop
    two = [ServiceVersion(version=1, spec=V1, at="t"), ServiceVersion(version=2, spec=V2,
                                                                      at="u")]
    assert version_index(record(versions=two, version=2)) != first  # a deploy
    assert version_index(record(versions=two, version=1)) != \
        version_index(record(versions=two, version=2))  # a rollback
    # the keeper's progress and health are not the operator's intent
    assert version_index(record(healthy_version=1, deployment=Deployment(
        to_version=1, started_at="t", state="succeeded"))) == first
    healthy = [ServiceVersion(version=1, spec=V1, at="t", healthy_at="h")]
    assert version_index(record(versions=healthy)) == first
    assert version_index(record()) < 2 ** 53  # exact as a JSON number


def test_the_diff_names_each_field_that_changes_nested_ones_dotted() -> None:
    assert spec_diff(V1, V1) == []
    assert spec_diff(V1, V2) == [
        FieldChange(field="env", old="{}", new='{"A":"1"}'),
        FieldChange(field="cpu", old="0.1", new="0.2"),
        FieldChange(field="update.max_parallel", old="1", new="2"),
    ]
