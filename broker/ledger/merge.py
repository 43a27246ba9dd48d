"""Merging what others pushed into our branch (`broker.ledger.remote` rules 2 and 3).

Rules:
1. A file only they changed is taken from them; a file both sides changed keeps our version,
   because the broker is the single writer of placements.
2. A taken ``instances/`` or ``nodes/`` file that does not decode, or names another id than
   its path, is left out; the merge commit's message names it, as it names every file
   taken and every file where ours was kept (``Gavel-Merge-*`` trailers).
3. The merge is a commit with two parents, ours first, and our branch moves to it by
   compare-and-swap (`Moved`: it moved meanwhile; merge again on the new head).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pygit2

from gavel.broker.ledger.state import Change
from gavel.shared.records import InstanceRecord, NodeFile

__all__ = ["Merged", "Moved", "merge"]

_SIGNATURE = ("gavel-broker", "broker@gavel.local")
#: A record in its shard, or put flat by hand (`shared.records.instance_path`).
_INSTANCE = re.compile(r"^instances/(?:[0-9a-f]{2}/)?(?P<id>[^/]+)\.json$")
_NODE = re.compile(r"^nodes/(?P<id>[^/]+)/node\.json$")
_instance_dec = msgspec.json.Decoder(InstanceRecord)
_node_dec = msgspec.json.Decoder(NodeFile)
Files = dict[str, tuple[str, int]]  # path -> (blob id, file mode)


class Moved(Exception):
    """Our branch moved while we merged: merge again on the new head."""


@dataclass
class Merged:
    sha: str
    summary: str
    change: Change
    took: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def merge(repo: pygit2.Repository, ref: str, ours: str, theirs: str, url: str) -> Merged:
    """Rules 1-3: their commits merged into our `ref` (at `ours`)."""
    base_id = repo.merge_base(ours, theirs)
    base = _files(repo, repo[base_id].peel(pygit2.Tree)) if base_id else {}
    mine = _files(repo, repo[ours].peel(pygit2.Tree))
    their = _files(repo, repo[theirs].peel(pygit2.Tree))
    result = dict(mine)
    took: list[str] = []
    kept: list[str] = []
    ignored: list[str] = []
    change = Change()
    for path in sorted(set(base) | set(their)):
        b, t, o = base.get(path), their.get(path), mine.get(path)
        if t == b or o == t:
            continue  # they did not change it, or made the same change as we did
        if o != b:
            kept.append(path)  # both changed it: ours wins
            continue
        problem = _take(repo, path, t, change)
        if problem:
            ignored.append(f"{path} ({problem})")
            continue
        if t is None:
            result.pop(path, None)
        else:
            result[path] = t
        took.append(path)
    branch = ref.removeprefix("refs/heads/")
    lines = [f"merge {branch} from {url}: took {len(took)} of their changes, "
             f"kept ours on {len(kept)}", ""]
    lines += [f"Gavel-Merge-Took: {p}" for p in took]
    lines += [f"Gavel-Merge-Kept-Ours: {p}" for p in kept]
    lines += [f"Gavel-Merge-Ignored: {p}" for p in ignored]
    message = "\n".join(lines) + "\n"
    sig = pygit2.Signature(*_SIGNATURE)
    commit = repo.create_commit(None, sig, sig, message, _build(repo, result),
                                [pygit2.Oid(hex=ours), pygit2.Oid(hex=theirs)])
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        current = repo.references.get(ref)
        if current is None or str(current.target) != ours:
            raise Moved()
        txn.set_target(ref, commit, message=lines[0][:200])
    return Merged(sha=str(commit), summary=lines[0], change=change, took=took, kept=kept,
                  ignored=ignored)


def _files(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> Files:
    out: Files = {}
    for entry in tree:
        path = prefix + str(entry.name)
        obj = repo[entry.id]
        if isinstance(obj, pygit2.Tree):
            out.update(_files(repo, obj, path + "/"))
        else:
            out[path] = (str(entry.id), int(entry.filemode))
    return out


def _build(repo: pygit2.Repository, files: Files) -> pygit2.Oid:
    nested: dict[str, Any] = {}
    for path, blob in files.items():
        *dirs, name = path.split("/")
        cur = nested
        for d in dirs:
            cur = cur.setdefault(d, {})
        cur[name] = blob

    def write(level: dict[str, Any]) -> pygit2.Oid:
        tb = repo.TreeBuilder()
        for name, value in sorted(level.items()):
            if isinstance(value, dict):
                tb.insert(name, write(value), pygit2.enums.FileMode.TREE)
            else:
                tb.insert(name, pygit2.Oid(hex=value[0]), value[1])
        return tb.write()

    return write(nested)


def _take(repo: pygit2.Repository, path: str, blob: tuple[str, int] | None,
          change: Change) -> str:
    """Check a file of theirs and note it in `change`; a non-empty answer says why not."""
    inst, node = _INSTANCE.match(path), _NODE.match(path)
    if inst is None and node is None:
        return ""
    data = b"" if blob is None else repo[pygit2.Oid(hex=blob[0])].read_raw()
    try:
        if inst is not None:
            key = inst.group("id")
            rec = None if blob is None else _instance_dec.decode(data)
            if rec is not None and rec.instance_id != key:
                return f"instance_id {rec.instance_id!r} does not match the file name"
            change.instances[key] = rec
        elif node is not None:
            key = node.group("id")
            nf = None if blob is None else _node_dec.decode(data)
            if nf is not None and nf.node_id != key:
                return f"node_id {nf.node_id!r} does not match the directory"
            change.nodes[key] = nf
    except (msgspec.DecodeError, RecursionError) as exc:
        return str(exc)
    return ""
