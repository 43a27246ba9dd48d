"""A commit's new objects as one git pack, and the merging that keeps packs few.

Rule: the cost of a placement commit on a real disk is file-system metadata, not bytes: a
loose object is a file created and renamed (dearer on a disk than on tmpfs, and by a margin
that varies from moment to moment: docs/performance.md), and a commit writes two of them
for every node file it touches, hundreds of node files in a big one. A pack holds them all
in two files, so a big commit writes `.pack` then `.idx` (readers find a pack by its index,
so they never see half of one); a small one stays loose.

One pack per big commit would leave thousands of packs, and every lookup that misses walks
their indexes; merging all of them whenever there are a few more would copy every object
again and again (quadratic: under a steady stream of placements, merging would come to take
a large share of the writer's time). So packs of fewer than `BIG_PACK` objects are merged
by size tier, as log-structured stores compact: a pack of n objects is in tier
floor(log8 n), and once a tier holds `TIER_WIDTH` packs they are merged - with every
smaller pack - into one of the next tier. An object is copied about once per tier it
climbs - fewer times than under a geometric progression as `git repack --geometric=2`
keeps (docs/performance.md) - and there are at most seven packs a tier.
Packs someone else made with companions we do not write (`.keep`, `.bitmap`, `.rev`,
`.promisor`, `.mtimes`) are never touched. A reader
holding the old pack list may then miss an object it expected: `Ledger` re-opens the
repository and reads again (git's own readers do the same on a vanished pack).

Format: pack v2 (full objects, no deltas) and index v2, as in git's
Documentation/gitformat-pack.txt.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from isal import isal_zlib

__all__ = [
    "BIG_PACK",
    "LEVEL",
    "PACK_MIN",
    "TIER_WIDTH",
    "deflate",
    "merge_small_packs",
    "merge_split",
    "object_ids",
    "put_file",
    "write_pack",
]

#: Fewer new objects than this stay loose (a quiet cluster's one-placement commits).
PACK_MIN = 32
#: Packs with at least this many objects are never merged again (one merge's cost is bounded).
BIG_PACK = 50_000
#: Packs a size tier holds before they are merged into one of the next tier (and a tier
#: spans a factor of this many objects).
TIER_WIDTH = 8
_TYPES = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
_FOREIGN = (".keep", ".bitmap", ".rev", ".promisor", ".mtimes")
#: Speed over size: ISA-L's level 0 deflates a node.json or a tree of ids several times
#: faster than zlib's fastest level (trees are mostly SHA-1s, the slowest input for zlib),
#: and its objects come out only somewhat larger than zlib's (docs/performance.md). The
#: stream is plain zlib, as git reads it; `git gc` recompresses whatever it packs.
LEVEL = 0
_tmp = itertools.count()
#: Objects in each pack index seen (packs are immutable; forgotten when merged away).
_counts: dict[Path, int] = {}


def _header(kind: int, size: int) -> bytes:
    out = bytearray()
    c = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    return bytes(out)


def deflate(data: bytes) -> bytes:
    """`data` as a zlib stream, the fast way (`LEVEL`)."""
    return isal_zlib.compress(data, LEVEL)


def _record(kind: bytes, body: bytes) -> tuple[bytes, int]:
    """One whole object as a pack stores it (header + deflated body), and its crc32."""
    rec = _header(_TYPES[kind], len(body)) + deflate(body)
    return rec, zlib.crc32(rec)


def put_file(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` by a temporary name beside it and a rename (a reader sees all
    or none), read-only like every file git writes under objects/."""
    tmp = os.path.join(os.path.dirname(path), f"tmp_gavel_{os.getpid()}_{next(_tmp)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o444)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_pack(pack_dir: Path, objects: Iterable[tuple[bytes, bytes, bytes]]) -> Path:
    """Store ``(raw id, kind, body)`` objects as ``pack-<checksum>.pack`` and ``.idx`` under
    `pack_dir`; the path of the index. Duplicate ids are stored once."""
    def records() -> Iterator[tuple[bytes, bytes, int]]:
        for raw, kind, body in objects:
            yield raw, *_record(kind, body)

    return _write_records(pack_dir, records())


def _write_records(pack_dir: Path, records: Iterable[tuple[bytes, bytes, int]]) -> Path:
    """A pack of already-encoded ``(raw id, header + deflated body, crc32)`` records."""
    seen: set[bytes] = set()
    chunks: list[bytes] = []
    rows: list[tuple[bytes, int, int]] = []  # (id, crc32, offset)
    offset = 12
    for raw, rec, crc in records:
        if raw in seen:
            continue
        seen.add(raw)
        rows.append((raw, crc, offset))
        chunks.append(rec)
        offset += len(rec)
    if offset >= 2**31:
        raise ValueError("a pack over 2 GiB needs 64-bit offsets; write fewer objects")
    pack = b"".join([b"PACK", struct.pack(">II", 2, len(rows)), *chunks])
    checksum = hashlib.sha1(pack).digest()
    pack += checksum
    rows.sort()
    fanout = [0] * 256
    for raw, _, _ in rows:
        fanout[raw[0]] += 1
    idx = bytearray(b"\xfftOc" + struct.pack(">I", 2))
    idx += struct.pack(">256I", *itertools.accumulate(fanout))
    idx += b"".join(raw for raw, _, _ in rows)
    idx += struct.pack(f">{len(rows)}I", *(crc for _, crc, _ in rows))
    idx += struct.pack(f">{len(rows)}I", *(off for _, _, off in rows))
    idx += checksum
    idx += hashlib.sha1(idx).digest()
    pack_dir.mkdir(parents=True, exist_ok=True)
    name = pack_dir / f"pack-{checksum.hex()}"
    put_file(name.with_suffix(".pack"), pack)
    put_file(name.with_suffix(".idx"), bytes(idx))
    return name.with_suffix(".idx")


def _index(idx: Path) -> tuple[list[bytes], tuple[int, ...], tuple[int, ...]]:
    """(ids, crc32s, offsets) from a version-2 pack index, in its (sorted) order."""
    data = idx.read_bytes()
    if data[:8] != b"\xfftOc" + struct.pack(">I", 2):
        raise ValueError(f"{idx.name} is not a version 2 pack index")
    (count,) = struct.unpack_from(">I", data, 8 + 255 * 4)
    start = 8 + 256 * 4
    ids = [data[start + 20 * i:start + 20 * (i + 1)] for i in range(count)]
    crcs = struct.unpack_from(f">{count}I", data, start + 20 * count)
    offsets = struct.unpack_from(f">{count}I", data, start + 24 * count)
    return ids, crcs, offsets


def _count(idx: Path) -> int:
    """How many objects a version-2 pack index lists (its header only)."""
    with idx.open("rb") as f:
        head = f.read(8 + 256 * 4)
    if head[:8] != b"\xfftOc" + struct.pack(">I", 2):
        raise ValueError(f"{idx.name} is not a version 2 pack index")
    return int(struct.unpack_from(">I", head, 8 + 255 * 4)[0])


def object_ids(idx: Path) -> list[bytes]:
    """The object ids a version-2 pack index lists."""
    return _index(idx)[0]


def _records(idx: Path, read: Callable[[bytes], tuple[bytes, bytes]]
             ) -> Iterator[tuple[bytes, bytes, int]]:
    """A pack's objects as records to copy: whole objects byte for byte (no inflating and
    deflating again), deltas - which only someone else's packs hold - re-read in full."""
    ids, crcs, offsets = _index(idx)
    pack = idx.with_suffix(".pack").read_bytes()
    large = any(off & 0x80000000 for off in offsets)
    ends = [*sorted(offsets), len(pack) - 20]
    end_of = {start: ends[i + 1] for i, start in enumerate(ends[:-1])}
    for raw, crc, off in zip(ids, crcs, offsets, strict=True):
        if not large and (pack[off] >> 4) & 7 in (1, 2, 3, 4):
            yield raw, pack[off:end_of[off]], crc
        else:
            yield raw, *_record(*read(raw))


def _ours_to_merge(pack_dir: Path) -> list[tuple[int, Path]]:
    """Our packs of fewer than BIG_PACK objects, as (objects, index), smallest first. One
    listing of the directory (a pack is named by its checksum and never changes, so the
    counts read from the indexes are remembered)."""
    try:
        names = set(os.listdir(pack_dir))
    except FileNotFoundError:
        return []
    if len(_counts) > 2 * len(names) + 64:  # packs someone else removed (git gc)
        for gone in [p for p in _counts if p.parent == pack_dir and p.name not in names]:
            del _counts[gone]
    out = []
    for name in sorted(names):
        if not (name.startswith("pack-") and name.endswith(".idx")):
            continue
        stem = name[:-4]
        if stem + ".pack" not in names or any(stem + s in names for s in _FOREIGN):
            continue
        idx = pack_dir / name
        count = _counts.get(idx)
        if count is None:
            try:
                count = _counts[idx] = _count(idx)
            except (OSError, ValueError, struct.error):
                continue
        if count < BIG_PACK:
            out.append((count, idx))
    out.sort()
    return out


def _tier(count: int) -> int:
    tier = 0
    while count >= TIER_WIDTH:
        count //= TIER_WIDTH
        tier += 1
    return tier


def merge_split(counts: list[int]) -> int:
    """How many of the smallest packs (`counts` ascending) to merge: all of the smallest
    tier holding TIER_WIDTH packs, and every smaller pack; 0 when no tier is full."""
    full: dict[int, int] = {}
    for j, count in enumerate(counts):
        tier = _tier(count)
        full[tier] = full.get(tier, 0) + 1
        if full[tier] >= TIER_WIDTH:
            last = j
            while last + 1 < len(counts) and _tier(counts[last + 1]) == tier:
                last += 1
            return last + 1
    return 0


def merge_small_packs(pack_dir: Path,
                      read: Callable[[bytes], tuple[bytes, bytes]]) -> int:
    """Merge a full tier: write the objects of its packs and all smaller ones (fetched with
    `read(raw id) -> (kind, body)` where a pack holds a delta) into one new pack and remove
    them, again while a merge fills the next tier; how many were removed (0: none full)."""
    removed = 0
    while True:  # a merged pack may fill the next tier in turn
        ours = _ours_to_merge(pack_dir)
        k = merge_split([count for count, _ in ours])
        if k < 2:
            return removed
        small = [idx for _, idx in ours[:k]]
        merged = _write_records(pack_dir,
                                (rec for idx in small for rec in _records(idx, read)))
        for idx in small:
            if idx == merged:
                continue
            _counts.pop(idx, None)
            idx.unlink(missing_ok=True)  # the index first: no reader finds a pack without it
            idx.with_suffix(".pack").unlink(missing_ok=True)
            removed += 1
