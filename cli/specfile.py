"""Reading workload specs from TOML or JSON files.

Rule: a spec that does not decode exactly (unknown field, wrong type, bad value) is refused
with one sentence naming the file, the field and what was expected.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from gavel.shared.messages import Spec

__all__ = ["SpecError", "humanize", "load_spec"]


class SpecError(ValueError):
    pass


def load_spec(path: Path) -> Spec:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec file: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            return msgspec.json.decode(raw, type=Spec)
        data = tomllib.loads(raw.decode())
        return msgspec.convert(data, type=Spec)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib, or msgspec on JSON, nested about a thousand deep
        raise SpecError(f"{path}: not a valid spec: nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise SpecError(f"{path}: invalid spec: {humanize(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from None


def humanize(text: str) -> str:
    """msgspec says ``Expected `float` >= 0.0 - at `$.cpu```; lead with the field."""
    if " - at `$." in text:
        what, where = text.rsplit(" - at `$.", 1)
        return f"field {where.rstrip('`')!r}: {what[0].lower()}{what[1:]}"
    if text.startswith("Object missing required field"):
        return text.replace("Object missing required field", "missing required field")
    if text.startswith("Object contains unknown field"):
        return text.replace("Object contains unknown field", "unknown field")
    return text
