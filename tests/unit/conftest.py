"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_fuzz_broker import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """One broker on a fake wire, its own event loop and a fixed clock (`Rig`)."""
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()
