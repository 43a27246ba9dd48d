"""A change encodes each node.json once: git gets it pretty (formatted by the writer from the
compact JSON, `files_compact`), the KV mirror compact (the same JSON without whitespace), and
a node file replaced in the change (records are never changed in place) is encoded anew."""

from __future__ import annotations

import msgspec

from gavel.broker.ledger.state import Change, encode
from gavel.shared.records import Assignment, NodeFile, node_path


def test_node_bytes_are_encoded_once_per_record_and_anew_for_a_new_one() -> None:
    change = Change()
    first = NodeFile(node_id="a")
    change.nodes["a"] = first
    files = change.files()
    assert files[node_path("a")] == encode(first)
    _, raw = change.files_compact()
    compact = change.node_compact("a", first)
    assert raw[node_path("a")] is compact  # not encoded again
    assert change.node_bytes("a", first) is change.node_bytes("a", first)
    assert b"\n" not in compact and len(compact) < len(encode(first))
    assert msgspec.json.decode(compact) == msgspec.json.decode(encode(first))
    second = NodeFile(node_id="a", instances={"i1": Assignment(instance_id="i1", auction_id="x")})
    change.nodes["a"] = second
    again = change.files()[node_path("a")]
    assert again == encode(second) and again != encode(first)
    change.nodes["b"] = None
    assert change.files()[node_path("b")] is None
