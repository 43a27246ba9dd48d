"""Every spec the documentation shows is one gavel accepts, so the docs cannot drift from
`shared.spec`: each ```toml block that is a spec (it has a `command`) read as `gavel submit`
reads a file, and each inline `field = value` of a spec field inside a small service."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from gavel.cli.specfile import load_spec
from gavel.shared.messages import Spec

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"```toml\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`\n]+=[^`\n]+)`")


def blocks() -> list[tuple[str, str]]:
    return [(f"{doc.name}:{n}", m.group(1)) for doc in DOCS
            for n, m in enumerate(BLOCK.finditer(doc.read_text()))
            if re.search(r"^command\s*=", m.group(1), re.M)]


def inline() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for m in INLINE.finditer(prose):
            try:
                table = tomllib.loads(m.group(1))
            except tomllib.TOMLDecodeError:
                continue  # a shell line or a sentence, not TOML
            if next(iter(table)) in Spec.__struct_fields__:
                found.append((doc.name, m.group(1)))
    return found


def test_the_docs_show_specs() -> None:
    """The search finds what it is for (a regex gone wrong would pass every case below)."""
    assert len(blocks()) >= 3
    assert ("services.md", 'spread = "zone"') in inline()


@pytest.mark.parametrize(("where", "text"), blocks())
def test_every_documented_spec_file_is_accepted(where: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    load_spec(path)


@pytest.mark.parametrize(("where", "text"), inline())
def test_every_documented_spec_field_is_accepted(where: str, text: str) -> None:
    spec = {"name": "doc", "type": "service", "command": ["true"], "spread": "zone",
            **tomllib.loads(text)}
    if {"schedule", "time_zone", "overlap"} & spec.keys():  # a periodic job's field
        spec = {"schedule": "@daily", **spec, "type": "job"}
    if spec["type"] == "job":
        del spec["spread"]
    msgspec.convert(spec, type=Spec)
