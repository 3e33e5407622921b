"""Replay stamps: a replay's outcome kept beside its cache repository, recalled only
while every input it was made from holds.

A stamp is data, not authority (docs/SECURITY.md, "Cache contents"). It is read bounded
through :mod:`pinwheel.untrusted`, every id in it fullmatched, and a stamp that is
missing, unreadable, malformed or of another format is ignored: the replay then runs in
full and writes a new one. What a stamp's key holds, and why that is every input, is
:func:`pinwheel.source.replay.stamp_key`'s to say; this module stores stamps and
answers, with one ``git cat-file --batch-check``, what the repository holds now: the
commit each ref names and the type of each object.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pinwheel import untrusted
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text
from pinwheel.source import gitcli

FORMAT = "pinwheel.replay-stamp/1"
SHA = re.compile(r"[0-9a-f]{40}")
_TYPES = frozenset({"commit", "tree", "blob", "tag"})


def path(repo: Path, name: str) -> Path:
    """Where the stamp of the stack ``name`` lives in the cache repository ``repo``."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return Path(repo) / "pinwheel" / f"replay-{digest}.json"


def load(repo: Path, name: str) -> dict[str, Any] | None:
    """The stamp of ``name``, or None when there is none or it is not one pinwheel wrote."""
    where = path(repo, name)
    try:
        doc = untrusted.read_json(where, untrusted.REPLAY_STAMP)
    except PinwheelError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    if not isinstance(doc.get("key"), dict) or not isinstance(doc.get("result"), dict):
        return None
    return doc


def save(repo: Path, name: str, key: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    """Record ``result`` under ``key`` (atomic: a reader sees the old stamp or the new)."""
    import json

    doc = {"format": FORMAT, "key": key, "result": result}
    target = path(repo, name)
    target.parent.mkdir(exist_ok=True)
    atomic_write_text(target, json.dumps(doc, sort_keys=True, indent=1) + "\n")


def look(repo: Path, names: Sequence[str]) -> dict[str, tuple[str, str] | None]:
    """What ``repo`` holds now, from one ``git cat-file --batch-check``: for each name (a
    full ref name, a full object id, or ``ID^N`` / ``ID^{tree}``) the object id and type it
    resolves to, None when it resolves to nothing.

    Names travel on stdin, one a line (never as options or arguments).
    """
    if any("\n" in n or not n.strip() for n in names):
        raise ValueError("a name with a newline, or an empty name")
    proc = gitcli.git(
        ["cat-file", "--batch-check=%(objectname) %(objecttype)"],
        git_dir=repo,
        input="".join(f"{n}\n" for n in names).encode(),
        what="git cat-file --batch-check",
    )
    answers = proc.stdout.decode(errors="replace").splitlines()
    if len(answers) != len(names):
        raise PinwheelError(
            f"git cat-file answered {len(answers)} lines for {len(names)} names",
            where=str(repo),
            next="`pinwheel cache verify` checks the cache repositories",
        )
    found: dict[str, tuple[str, str] | None] = {}
    for name, answer in zip(names, answers, strict=True):
        sha, _, kind = answer.partition(" ")
        found[name] = (sha, kind) if SHA.fullmatch(sha) and kind in _TYPES else None
    return found
