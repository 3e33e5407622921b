"""Ownership, as git's ``safe.directory`` does it (CVE-2022-24765).

A manifest pinwheel found by itself (the upward search from the current directory),
the default cache and the mirrors the environment names are used only when the
current user owns them and no other user can write them: owned by another user, or a
world-writable directory without the sticky bit (``/tmp``-style sharing done wrong),
is refused. Another user's ``manifest.toml`` in a shared parent directory would
otherwise decide what ``pinwheel serve`` runs (``[serve.profile.*] env``), and another
user's cache or mirror what it builds.

What the user names on the command line (``--manifest``, ``--cache``, ``--mirror``) is
used as named. Any other directory is trusted when listed in
``PINWHEEL_SAFE_DIRECTORIES`` (:data:`SAFE_ENV`; entries separated by ``:``, an entry
ending in ``/*`` covers everything under it, ``*`` alone every directory), as git's
``safe.directory`` does. The CLI reads that variable and hands the list in; nothing here
reads the environment.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from pinwheel import options
from pinwheel.errors import UsageError

SAFE_ENV = options.SAFE_DIRECTORIES


def parse_safe(value: str | None) -> tuple[str, ...]:
    """The entries of :data:`SAFE_ENV` (empty ones dropped)."""
    return tuple(p for p in (value or "").split(":") if p)


def listed(path: Path | str, safe: Sequence[str]) -> bool:
    """Whether ``path`` is covered by an entry of the safe list (a file: also when its
    folder is, as ``safe.directory`` names the folder, never the file)."""
    real = os.path.realpath(path)
    for entry in safe:
        if entry == "*":
            return True
        if entry.endswith("/*"):
            base = os.path.realpath(entry[:-2])
            if real == base or real.startswith(base.rstrip("/") + "/"):
                return True
        elif os.path.realpath(entry) == real:
            return True
    return False


def problem(path: Path | str, uid: int | None = None) -> str | None:
    """Why ``path`` (a file or a directory, and what a symlink there leads to) is not
    safe to use unnamed, else None."""
    me = os.geteuid() if uid is None else uid
    for follow in (False, True):
        try:
            st = os.stat(path, follow_symlinks=follow)
        except FileNotFoundError:
            return None
        if st.st_uid != me:
            return f"it is owned by uid {st.st_uid}, not by you (uid {me})"
        if st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode):
            if not stat.S_ISDIR(st.st_mode):
                return "it is world-writable"
            if not st.st_mode & stat.S_ISVTX:
                return "it is a world-writable directory without the sticky bit"
    return None


def check(
    paths: Sequence[Path | str], *, what: str, flag: str, safe: Sequence[str]
) -> None:
    """Refuse ``what`` when any of ``paths`` has an ownership :func:`problem` and is not
    :func:`listed` as safe. ``flag``: the option that names it explicitly."""
    for path in paths:
        why = problem(path)
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        if why and not (listed(path, safe) or listed(folder, safe)):
            raise UsageError(
                f"refusing {what} {path}: {why} (as git refuses a repository another user "
                "owns: CVE-2022-24765)",
                where=str(path),
                next=f"name it explicitly with {flag} if you trust it, or add it to "
                f"{SAFE_ENV} (':'-separated; DIR/* covers everything under DIR)",
            )
