"""What the fuzz suites share: a stand-in NATS message and connection, byte mutations, and
a deterministic hypothesis profile.

Rule: the stand-ins replace NATS only (a message is subject, data, reply, headers; a
connection records what it would publish) — every piece of gavel's own logic under test is
the real one.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "FUZZ",
    "REFUSED",
    "Msg",
    "Wire",
    "bombs",
    "floats_hostile",
    "garbage_for",
    "mutated",
    "wire_values",
    "wrong_typed",
]

#: Deterministic (same examples on every run, so CI is stable), no example database, no
#: per-example deadline (git commits vary); examples share one broker or agent per test.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


#: What a msgspec decoder may raise on hostile input. Nesting about a thousand deep (a few
#: KB, and a wire struct accepts it inside any unknown field) raises `RecursionError`, which
#: is not a `DecodeError` — so every handler must catch both.
REFUSED = (msgspec.DecodeError, RecursionError)

#: Deeply nested msgpack: maps or arrays a few hundred to many thousand levels deep.
bombs = st.builds(lambda depth, unit: unit * depth + b"\xc0",
                  st.sampled_from([300, 999, 1000, 3000, 100_000]),
                  st.sampled_from([b"\x81\xa1k", b"\x91", b"\x82\xa4kind\xa1x\xa1k"]))


class Msg:
    """The four things a handler reads from a `nats.aio.msg.Msg`, and `respond`."""

    def __init__(self, subject: str, data: bytes, reply: str = "",
                 headers: dict[str, str] | None = None) -> None:
        self.subject = subject
        self.data = data
        self.reply = reply
        self.headers = headers
        self.responses: list[bytes] = []

    async def respond(self, data: bytes) -> None:
        self.responses.append(data)


class Wire:
    """Stands in for the broker's NATS connection: records what would be published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.is_closed = False

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:
        self.sent.append((subject, payload))

    async def drain(self) -> None:
        self.is_closed = True


#: Floats a hostile sender would pick: NaN, both infinities, negatives, zero, huge, tiny.
floats_hostile = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, -1.0, 1e308, -1e308,
                     5e-324, 1.0]),
    st.floats(allow_nan=True, allow_infinity=True),
)

#: Any value msgpack can carry, for putting a wrong type into a field.
wire_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | floats_hostile
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn, template: bytes) -> bytes:
    """`template` after a few random edits: flips, deletions, insertions, a truncation."""
    data = bytearray(template)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "truncate", "repeat"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "truncate":
            del data[i:]
        else:
            data[i:i] = data[i:i + draw(st.integers(1, 16))]
    return bytes(data)


@st.composite
def wrong_typed(draw: st.DrawFn, template: msgspec.Struct) -> bytes:
    """`template` as msgpack with one field (top level or one level down) set to a value
    of any type, or deleted, or an unknown field added."""
    obj = msgspec.to_builtins(template)
    target = obj
    nested = [k for k, v in obj.items() if isinstance(v, dict) and v]
    if nested and draw(st.booleans()):
        target = obj[draw(st.sampled_from(sorted(nested)))]
    keys = sorted(target)
    how = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if how == "add":
        target[draw(st.text(min_size=1, max_size=8))] = draw(wire_values)
    elif how == "delete" and keys:
        del target[draw(st.sampled_from(keys))]
    elif keys:
        target[draw(st.sampled_from(keys))] = draw(wire_values)
    return msgspec.msgpack.encode(obj)


def garbage_for(*templates: msgspec.Struct) -> st.SearchStrategy[bytes]:
    """Random bytes, msgpack of random values, and mutations or wrong-typed versions of
    the valid `templates` — the whole menu of hostile payloads for one endpoint."""
    encoded = [msgspec.msgpack.encode(t) for t in templates]
    return st.one_of(
        st.binary(max_size=64),
        wire_values.map(msgspec.msgpack.encode),
        st.sampled_from(encoded).flatmap(lambda b: st.integers(0, len(b) - 1).map(
            lambda n, b=b: b[:n])),  # truncated msgpack
        st.sampled_from(encoded).flatmap(mutated),
        st.sampled_from(list(templates)).flatmap(wrong_typed),
        bombs,
    )
