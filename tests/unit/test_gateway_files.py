"""The confined open of `gavel.gateway.files` on a real directory tree: no link below the
instance's directory is followed, wherever it points."""

from __future__ import annotations

import os
from pathlib import Path

from gavel.gateway.files import open_confined


def read(base: Path, below: str, path: str) -> str | None:
    fd = open_confined(str(base), below, path)
    if fd is None:
        return None
    with os.fdopen(fd) as f:
        return f.read()


def test_files_below_are_served_and_no_link_is_followed(tmp_path: Path) -> None:
    inst = tmp_path / "inst"
    (inst / "www" / "sub").mkdir(parents=True)
    (inst / "www" / "a.txt").write_text("a")
    (inst / "www" / "sub" / "index.html").write_text("index")
    (inst / "www" / "empty").mkdir()
    (tmp_path / "secret").write_text("seed")
    (inst / "www" / "root").symlink_to("/")
    (inst / "www" / "seed").symlink_to(tmp_path / "secret")
    (inst / "www" / "inner").symlink_to("sub")  # inside, still a link: refused too
    (inst / "pub").symlink_to("/")
    assert read(inst, "www", "a.txt") == "a"
    assert read(inst, "www", "sub") == "index"
    assert read(inst, "www", "sub/") == "index"
    for below, path in (("www", "empty"), ("www", "root/etc/hostname"), ("www", "seed"),
                        ("www", "inner/index.html"), ("pub", "etc/hostname"),
                        ("www", "../../secret"), ("www", "nothing"), ("../", "secret")):
        assert read(inst, below, path) is None, (below, path)
