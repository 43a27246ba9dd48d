"""Git objects written by the ledger itself, in git's own format: a commit's new blobs and
trees, kept in a `Batch` and stored at once - as one pack when there are many
(`broker.packs`), as loose files otherwise - and the trees built on the way (`Trees`).

Rule: a commit of a few hundred node files writes two objects per node (its node.json and
the node's directory), and libgit2 spends many system calls on each write: it first asks
every backend whether the object exists, rescanning the pack directory on the miss, tries
to freshen it, then writes a temporary file and links it into place. On a virtualised file
system those calls are dear, and together they are most of a placement's cost
(docs/performance.md). Writing a new loose object needs four calls - open, write, close,
rename - and a pack two files for the whole commit, so blobs and trees are written here, and
libgit2 keeps what it is good at: reading, the commit, and moving the ref under its lock.

The format is git's (``zlib("<kind> <size>\\0" + body)`` under ``objects/xx/yyyy...``, the
id being the SHA-1 of the uncompressed bytes); `git fsck --strict` checks every object the
ledger tests write. Durability is git's and libgit2's default: no fsync.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from gavel.broker.ledger.packs import PACK_MIN, deflate, put_file, write_pack

__all__ = ["BLOB", "TREE", "Batch", "Entries", "ObjectStore", "Trees", "commit_body",
           "git_order", "object_id", "tree_body"]

#: A tree's entries: ``{name: (mode, raw 20-byte id)}``.
Entries = dict[bytes, tuple[bytes, bytes]]
#: Tree entry modes as git writes them (no leading zero for directories).
BLOB = b"100644"
TREE = b"40000"


def object_id(kind: bytes, body: bytes) -> bytes:
    h = hashlib.sha1(b"%s %d\0" % (kind, len(body)))
    h.update(body)
    return h.digest()


def git_order(entries: Mapping[bytes, tuple[bytes, bytes]]) -> Entries:
    """`entries` re-inserted in git's order (a directory sorts as if its name ended in "/")."""
    def key(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == TREE else name

    return {n: entries[n] for n in sorted(entries, key=key)}


def tree_body(entries: Mapping[bytes, tuple[bytes, bytes]], ordered: bool = False) -> bytes:
    """A tree object's body from ``{name: (mode, raw 20-byte id)}``, in git's order;
    `ordered`: the mapping already iterates in that order (no sort)."""
    if not ordered:
        entries = git_order(entries)
    return b"".join([mode + b" " + n + b"\0" + raw for n, (mode, raw) in entries.items()])


def commit_body(tree: bytes, parents: list[bytes], person: bytes, message: str) -> bytes:
    """A commit object's body as libgit2 writes it: `tree` and `parents` raw ids, `person`
    the author and committer (``name <email> seconds +hhmm``), the message as it is."""
    lines = [b"tree " + tree.hex().encode()]
    lines += [b"parent " + p.hex().encode() for p in parents]
    lines += [b"author " + person, b"committer " + person, b""]
    return b"\n".join(lines) + b"\n" + message.encode()


class Batch:
    """The new objects of one commit, held until `ObjectStore.flush` stores them all at once
    (as one pack when there are many: see `broker.packs`)."""

    def __init__(self) -> None:
        self.objects: dict[bytes, tuple[bytes, bytes]] = {}

    def blob(self, body: bytes) -> bytes:
        raw = object_id(b"blob", body)
        self.objects.setdefault(raw, (b"blob", body))
        return raw

    def tree(self, entries: Mapping[bytes, tuple[bytes, bytes]], ordered: bool = False
             ) -> bytes:
        body = tree_body(entries, ordered)
        raw = object_id(b"tree", body)
        self.objects.setdefault(raw, (b"tree", body))
        return raw

    def commit(self, body: bytes) -> bytes:
        raw = object_id(b"commit", body)
        self.objects.setdefault(raw, (b"commit", body))
        return raw

    def __len__(self) -> int:
        return len(self.objects)


class ObjectStore:
    """Stores objects under `objects_dir`: one at a time as a loose file (`write`), or a
    commit's `Batch` at once (`flush`: a pack when big). Not thread-safe: one per writer."""

    def __init__(self, objects_dir: Path) -> None:
        self.dir = str(objects_dir)
        self._fanout: set[str] = set()

    def write(self, kind: bytes, body: bytes) -> bytes:
        """Store one object (idempotent: the same bytes land on the same name); its raw id."""
        data = b"%s %d\0%s" % (kind, len(body), body)
        raw = hashlib.sha1(data).digest()
        hexid = raw.hex()
        fan = f"{self.dir}/{hexid[:2]}"
        if fan not in self._fanout:
            os.makedirs(fan, exist_ok=True)
            self._fanout.add(fan)
        put_file(f"{fan}/{hexid[2:]}", deflate(data))
        return raw

    def flush(self, batch: Batch) -> bool:
        """Store a batch: one pack when it is big, loose objects otherwise; True if a pack
        was written."""
        if len(batch) >= PACK_MIN:
            write_pack(Path(self.dir) / "pack",
                       ((raw, kind, body) for raw, (kind, body) in batch.objects.items()))
            return True
        for kind, body in batch.objects.values():
            self.write(kind, body)
        return False


class Trees:
    """Writes trees with changes applied, remembering the entries of the trees it wrote or
    read (by id, so never stale): the next commit's base is almost always the tree just
    written, and reading the ``nodes/`` listing (an entry per node) and each touched node
    directory back from git would be a large share of the writer's time (docs/performance.md).

    `read` gives a tree's entries from git (None if the id is not a tree)."""

    def __init__(self, read: Callable[[bytes], Entries | None], size: int = 50_000) -> None:
        self._read = read
        self._size = size
        self._known: OrderedDict[bytes, Entries] = OrderedDict()

    def entries(self, tree_id: bytes) -> Entries | None:
        known = self._known.get(tree_id)
        if known is not None:
            self._known.move_to_end(tree_id)
            return known
        read = self._read(tree_id)
        if read is not None:
            self._remember(tree_id, read)
        return read

    def _remember(self, tree_id: bytes, entries: Entries) -> None:
        self._known[tree_id] = entries
        if len(self._known) > self._size:
            self._known.popitem(last=False)

    def write(self, base_id: bytes | None, changes: Mapping[str, object],
              batch: Batch, *, top: bool = True) -> tuple[bytes, int]:
        """The tree `base_id` with `changes` (``{name: bytes | None | nested changes}``)
        applied, its new objects added to `batch`; (its raw id, how many entries). Entries
        it does not change are kept as they are, whatever they are. A directory left empty
        is dropped from its parent and never stored (only an empty root is)."""
        base = self.entries(base_id) if base_id is not None else None
        entries: Entries = dict(base) if base is not None else {}
        # Entries are kept in git's order (as git stores them, and as this writes them): a
        # change to an existing name keeps its place, so only a new name needs a sort - a
        # 10,000-node directory is not re-sorted on every commit.
        moved = False  # a new name, or a name turned from file to directory or back
        for name, sub in changes.items():
            key = name.encode()
            was = entries.get(key)
            if isinstance(sub, dict):
                sub_base = was[1] if was is not None and was[0] == TREE else None
                tid, count = self.write(sub_base, sub, batch, top=False)
                if count == 0:
                    entries.pop(key, None)
                else:
                    entries[key] = (TREE, tid)
                    moved = moved or was is None or was[0] != TREE
            elif sub is None:
                entries.pop(key, None)
            else:
                assert isinstance(sub, bytes)
                entries[key] = (BLOB, batch.blob(sub))
                moved = moved or was is None or was[0] == TREE
        if not entries and not top:
            return b"", 0
        if moved:
            entries = git_order(entries)
        tree_id = batch.tree(entries, ordered=True)
        self._remember(tree_id, entries)
        return tree_id, len(entries)
