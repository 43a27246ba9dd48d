"""`gavel up --demo` without a container engine: no container workload, one line saying how
to get one, and nothing else touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.cli.demoimage import container_spec


def test_without_an_engine_the_demo_says_in_one_line_how_to_get_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such.sock'}")
    spec, why = container_spec()
    assert spec is None
    assert why.startswith("no container engine here: start a Docker Engine")
    assert "\n" not in why and "docs/containers.md" in why
