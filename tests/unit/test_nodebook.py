"""The node book (`gavel.shared.nodebook`, `gavel.transport.nodebook`): entries an operator
writes, refused with one sentence when they are not entries, merged on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.shared.errors import BadInput
from gavel.shared.nodebook import KnownNode, entry
from gavel.transport import nodebook


def test_an_entry_names_a_node_an_address_and_a_port_range() -> None:
    assert entry("node-1=10.0.0.5:21000-21099") == (
        "node-1", KnownNode(address="10.0.0.5", ports=(21000, 21099)))
    assert entry("v6=[fd00::0:1]:8000-8000")[1].address == "fd00::1"
    assert entry("n=host.example:1-2")[1].holds(2)
    assert entry("n=10.0.0.5:1-2:/var/lib/gavel/instances/")[1] == KnownNode(
        address="10.0.0.5", ports=(1, 2), workdir="/var/lib/gavel/instances")
    assert entry("v6=[fd00::1]:1-2:/w")[1].workdir == "/w"


@pytest.mark.parametrize(("text", "words"), [
    ("node-1", "is not of the form NAME=ADDRESS:FIRST-LAST"),
    ("node-1=10.0.0.5", "is not of the form"),
    ("node-1=10.0.0.5:9-1", "port range 9-1 is not"),
    ("node-1=10.0.0.5:0-10", "port range 0-10 is not"),
    ("bad id=10.0.0.5:1-2", "node id 'bad id' must be"),
    ("n=not_an address:1-2", "is neither an IP address nor a DNS name"),
    ("n=10.0.0.5:1-2:/a/../b", "is not an absolute path without '..'"),
])
def test_a_bad_entry_is_one_sentence(text: str, words: str) -> None:
    with pytest.raises(BadInput, match=words):
        entry(text)


def test_recording_merges_and_a_broken_book_is_refused_whole(tmp_path: Path) -> None:
    nodebook.record(tmp_path, dict([entry("a=10.0.0.1:1-10"), entry("b=10.0.0.2:1-10")]))
    path = nodebook.record(tmp_path, dict([entry("a=10.0.0.9:20-30")]))
    assert nodebook.load(path) == {"a": KnownNode(address="10.0.0.9", ports=(20, 30)),
                                   "b": KnownNode(address="10.0.0.2", ports=(1, 10))}
    assert path.stat().st_mode & 0o777 == 0o600
    afresh = nodebook.record(tmp_path, dict([entry("c=10.0.0.3:1-10")]), merge=False)
    assert list(nodebook.load(afresh)) == ["c"]  # `gavel up`: exactly its workers
    path.write_text('{"a": {"address": "10.0.0.1", "ports": [1, 2], "extra": 1}}')
    with pytest.raises(BadInput, match="is not a node book"):
        nodebook.load(path)
    path.write_text('{"a": {"address": "10.0.0.1", "ports": [5, 2]}}')
    with pytest.raises(BadInput, match="port range 5-2"):
        nodebook.load(path)
