"""Decode, count, drop is the inbound guard's job (`transport.inbound` rule 1): no module but
`transport/inbound.py` decodes what came off the wire or catches a decoder's error for it.
Every message heard, KV entry, stored stream message and answer (a JetStream API answer
too: `js_answer`) is decoded by its `Guard` or `Decode`, which hand back a refusal instead
of raising.

Two scans: a handler (or `suppress`) of `DecodeError`, and a decode by hand - `json.loads`,
`msgspec.json.decode`/`msgspec.msgpack.decode`, or a `msgspec.json.Decoder`/
`msgspec.msgpack.Decoder` of its own. The files listed in `NOT_THE_WIRE` do one or both for
what a file, the state repository or another program's HTTP answer holds - bad input an
operator wrote, or a repository's damage - whose refusal is a sentence of its own
(`shared.errors.BadInput`, `Damaged`, a disputed file), not the wire's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec

from gavel.shared.messages import Event
from gavel.transport.inbound import Decode, Malformed, js_answer

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ["shared", "transport", "broker", "worker", "gateway", "client", "cli", "sim", "bench"]
THE_GUARD = "transport/inbound.py"

NOT_THE_WIRE = {
    "broker/ledger/reading.py": "records in the state repository (a dispute, or Damaged)",
    "broker/ledger/merge.py": "records of a commit merged from the remote",
    "broker/ledger/takeover.py": "the leader file in the state repository",
    "worker/localstate.py": "the worker's own state file on disk",
    "worker/logfiles.py": "an instance's log index on disk",
    "shared/nodebook.py": "the node book file",
    "cli/specfile.py": "a spec file an operator wrote (BadInput)",
    "cli/api/routes.py": "an HTTP request's body, refused as a 400 with its sentence",
    "sim/replay.py": "records of a state repository replayed",
    "sim/scenario.py": "a scenario file (BadInput)",
    "sim/preemption.py": "its scenario file, refused with a sentence",
    "bench/chaoscheck.py": "the chaos run's files on disk",
    "shared/records.py": "the auction records a commit's message carries in git",
    "transport/identity.py": "the operators' record on disk",
    "worker/engine.py": "the Docker Engine API's HTTP answer",
    "gateway/admin.py": "Caddy's admin API's HTTP answer",
    "bench/agents.py": "the bench's stand-in workers: the harness's own wire, a fault ends the run",
    "bench/natslite.py": "the bench's own NATS client: the server's INFO line",
    "bench/statushop.py": "the HTTP API's answer the measurement reads",
}


def catches_decode_errors(source: str) -> list[int]:
    """The lines of `source` that catch (or suppress) a `DecodeError`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        caught: ast.AST | None = None
        if isinstance(node, ast.ExceptHandler):
            caught = node.type
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "suppress":
            caught = ast.Tuple(elts=list(node.args))
        if caught is None:
            continue
        names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
                 for n in ast.walk(caught)}
        if "DecodeError" in names:
            lines.append(node.lineno)
    return lines


_BY_HAND = {("json", "loads"), ("json", "decode"), ("msgpack", "decode"), ("json", "Decoder"),
            ("msgpack", "Decoder")}


def decodes_by_hand(source: str) -> list[int]:
    """The lines of `source` that decode bytes themselves (`json.loads`, msgspec's decode or a
    decoder of their own)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if (name, node.func.attr) in _BY_HAND:
                lines.append(node.lineno)
    return sorted(lines)


def _decoding() -> dict[str, list[int]]:
    found = {}
    for room in ROOMS:
        for p in sorted((ROOT / room).rglob("*.py")):
            lines = decodes_by_hand(p.read_text())
            if lines:
                found[str(p.relative_to(ROOT))] = lines
    return found


def _catching() -> dict[str, list[int]]:
    found = {}
    for room in ROOMS:
        for p in sorted((ROOT / room).rglob("*.py")):
            lines = catches_decode_errors(p.read_text())
            if lines:
                found[str(p.relative_to(ROOT))] = lines
    return found


def test_only_the_guard_catches_what_a_decoder_raises() -> None:
    own = {f: lines for f, lines in _catching().items()
           if f != THE_GUARD and f not in NOT_THE_WIRE}
    assert own == {}, ("decode wire data with transport.inbound's Guard or Decode, not by "
                       f"hand: {own}")


def test_only_the_guard_decodes_by_hand() -> None:
    own = {f: lines for f, lines in _decoding().items()
           if f != THE_GUARD and f not in NOT_THE_WIRE}
    assert own == {}, ("decode wire data with transport.inbound's Guard, Decode or js_answer, "
                       f"not by hand: {own}")


def test_every_file_said_not_to_be_the_wire_still_decodes_by_hand() -> None:
    assert sorted(set(NOT_THE_WIRE) - set(_catching()) - set(_decoding())) == []


def test_the_scan_sees_a_handler_and_a_suppress() -> None:
    code = '''
try:
    x()
except (msgspec.DecodeError, RecursionError):
    pass
with contextlib.suppress(DecodeError):
    y()
try:
    z()
except ValueError:
    pass
'''
    assert catches_decode_errors(code) == [4, 6]


def test_the_scan_sees_each_decode_by_hand() -> None:
    code = '''
a = json.loads(b)
c = msgspec.json.decode(b, type=X)
d = msgspec.msgpack.Decoder(X)
e = msgspec.json.Decoder(X).decode(b)
f = msgspec.msgpack.decode(b)
g = msgspec.json.encode(x)
h = b"x".decode()
'''
    assert decodes_by_hand(code) == [2, 3, 4, 5, 6]


def test_decode_hands_back_a_refusal_instead_of_raising() -> None:
    event = Event(instance_id="a", type="placed")
    decode: Decode[Event] = Decode(Event)
    assert decode(msgspec.msgpack.encode(event)) == event
    assert isinstance(decode(b"\xc1"), Malformed)
    deep = b"\x91" * 100_000 + b"\xc0"  # nests past the decoder's depth guard
    refused = decode(deep)
    assert isinstance(refused, Malformed) and refused.why
    as_json: Decode[Event] = Decode(Event, json=True)
    assert as_json(msgspec.json.encode(event)) == event
    assert isinstance(as_json(b"{"), Malformed)


def test_a_jetstream_answer_is_an_object_or_a_refusal() -> None:
    assert js_answer(b'{"seq": 3, "duplicate": true}') == {"seq": 3, "duplicate": True}
    assert isinstance(js_answer(b"<html>"), Malformed)
    assert isinstance(js_answer(b"[1, 2]"), Malformed)  # JSON, but no answer of JetStream's
