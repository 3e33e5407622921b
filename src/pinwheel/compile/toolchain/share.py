"""Two variants of one CUDA toolkit share their common files by hard links, not copies.

``cuda-12.4.131`` and ``cuda-12.4.131-dev`` are assembled from the same pinned
packages; the dev tree adds headers and link stubs. Once a tree is assembled (and
before it is published), :func:`link_twins` replaces each of its regular files that
has a byte-identical file at the same place in an already provisioned sibling with a
hard link to that file: the second tree costs only what it adds. The sibling is a
cache tree an earlier run left (data, not authority): it is read with no symlink
followed anywhere (:mod:`pinwheel.confine`), only a plain file with the same size, mode
and bytes is linked, and a tree on another filesystem is simply not shared.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pinwheel import confine

_CHUNK = 1 << 20


def _same_bytes(a: int, b: int) -> bool:
    while True:
        x, y = os.read(a, _CHUNK), os.read(b, _CHUNK)
        if x != y:
            return False
        if not x:
            return True


def link_twins(tree: Path, sibling: Path) -> int:
    """Hard-link ``tree``'s files to their identical twins in ``sibling``; the bytes shared.
    ``tree`` is pinwheel's own, not yet published; ``sibling`` is only read and linked to."""
    shared = 0
    for node in confine.walk(tree):
        if node.kind != "file":
            continue
        twin = confine.lstat_beneath(sibling, node.rel)
        if (
            twin is None
            or not stat.S_ISREG(twin.st_mode)
            or twin.st_size != node.size
            or stat.S_IMODE(twin.st_mode) != stat.S_IMODE(node.mode)
        ):
            continue
        folder, _, name = node.rel.rpartition("/")
        try:
            with confine.folder_beneath(sibling, folder) as fd:
                theirs = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    held = os.fstat(theirs)
                    if not stat.S_ISREG(held.st_mode):
                        continue
                    ours = os.open(tree / node.rel, os.O_RDONLY | os.O_NOFOLLOW)
                    try:
                        same = _same_bytes(ours, theirs)
                    finally:
                        os.close(ours)
                    if not same:
                        continue
                    temp = tree / f"{node.rel}.pinwheel-link"
                    os.link(name, temp, src_dir_fd=fd, follow_symlinks=False)
                finally:
                    os.close(theirs)
            made = os.lstat(temp)
            if (made.st_dev, made.st_ino) != (held.st_dev, held.st_ino):
                os.unlink(temp)  # the name was swapped after it was compared: not shared
                continue
        except (confine.Escape, OSError):
            continue  # a link on the way, gone meanwhile, another filesystem: not shared
        os.replace(temp, tree / node.rel)
        shared += node.size
    return shared
