"""Patch steps and recorded resolutions: a diff or mbox applied to a tree in a throwaway
index (``git apply``), and the author and message an mbox carries."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pinwheel.errors import ConflictError
from pinwheel.source import gitcli

if TYPE_CHECKING:  # libgit2 is loaded where it is called: a recalled replay never loads it
    from pinwheel.source.libgit2 import pygit2


def apply_patch(repo_path: Path, tree: str, patch: Path, *, where: str) -> str:
    """Apply a diff or mbox to ``tree`` in a throwaway index; return the new tree id."""
    with tempfile.TemporaryDirectory(prefix="pinwheel-apply-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitcli.git(
            ["read-tree", "--end-of-options", tree],
            git_dir=repo_path,
            env=env,
            what="git read-tree",
        )
        proc = gitcli.git(
            ["apply", "--cached", "--whitespace=nowarn", "--binary", "--", str(patch.absolute())],
            git_dir=repo_path,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            lines = gitcli.stderr_lines(proc)
            files = tuple(
                sorted(
                    {m.group(1) for ln in lines if (m := re.search(r"patch failed: ([^:]+):", ln))}
                )
            )
            raise ConflictError(
                f"patch {patch.name} does not apply: {lines[-1] if lines else '?'}",
                files=files,
                where=where,
                next=f"refresh {patch.name} against the stack (`pinwheel resolve start`), "
                "then `pinwheel lock`",
            )
        return gitcli.out(["write-tree"], git_dir=repo_path, env=env)


@dataclass(frozen=True)
class PatchMeta:
    author: pygit2.Signature | None
    message: str


def read_patch_meta(patch: Path) -> PatchMeta:
    """Author and message from a ``git format-patch`` mbox; none for a plain diff."""
    import email.utils
    from email.header import decode_header, make_header

    from pinwheel.source.libgit2 import pygit2

    head = patch.read_bytes().split(b"\ndiff --git ", 1)[0].decode("utf-8", "replace")
    if not head.startswith("From "):
        return PatchMeta(author=None, message=f"Apply {patch.name}\n")
    headers, _, body = head.partition("\n\n")
    fields: dict[str, str] = {}
    last = None
    for line in headers.splitlines()[1:]:
        if line[:1] in (" ", "\t") and last:
            fields[last] += " " + line.strip()
        elif ":" in line:
            last, _, value = line.partition(":")
            last = last.lower()
            fields[last] = value.strip()
    name, addr = email.utils.parseaddr(str(make_header(decode_header(fields.get("from", "")))))
    subject = str(make_header(decode_header(fields.get("subject", patch.name))))
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body = body.split("\n---\n", 1)[0].strip()
    message = subject + ("\n\n" + body if body else "") + "\n"
    author = None
    if name and addr and "date" in fields:
        stamp = email.utils.parsedate_to_datetime(fields["date"])
        delta = stamp.utcoffset()
        offset = int(delta.total_seconds() // 60) if delta else 0
        author = pygit2.Signature(name, addr, int(stamp.timestamp()), offset)
    return PatchMeta(author=author, message=message)
