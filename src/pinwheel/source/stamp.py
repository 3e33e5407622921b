"""Replay stamps: a replay's outcome kept beside its cache repository, recalled only
while every input it was made from holds.

A stamp is data, not authority (docs/SECURITY.md, "Cache contents"). It is signed
(HMAC-SHA256, :mod:`pinwheel.keyfile`) with a key made once in the cache and readable by
this user alone, over the stack's name, its key (every input) and its result: whoever can
write the cache but not read the key cannot make a stamp that binds another result to
these inputs. It is read bounded and never through a link (:mod:`pinwheel.untrusted`),
written through folders opened ``O_NOFOLLOW`` (:mod:`pinwheel.confine`), every id in it
fullmatched, and a stamp that is missing, unsigned, unreadable, malformed or of another
format is ignored: the replay then runs in full and writes a new one. It records ids
only: the subjects and authors a recalled replay shows are read from the commit objects.
What a stamp's key holds, and why that is every input, is
:func:`pinwheel.source.recall.stamp_key`'s to say; this module stores stamps and
answers, with one ``git cat-file --batch-command``, what the repository holds now: the
commit each ref names, the type of each object, and the replayed commits themselves.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pinwheel import confine, keyfile, untrusted, validate
from pinwheel.errors import PinwheelError
from pinwheel.source import gitcli

FORMAT = "pinwheel.replay-stamp/2"  # 2: signed, ids only (1 carried subjects and authors)
KEY_NAME = "replay-stamp"  # <cache>/keys/replay-stamp.key
_PURPOSE = "pinwheel replay stamp"
FOLDER = "pinwheel"
SHA = validate.GIT_SHA
_TYPES = frozenset({"commit", "tree", "blob", "tag"})


def _rel(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{FOLDER}/replay-{digest}.json"


def path(repo: Path, name: str) -> Path:
    """Where the stamp of the stack ``name`` lives in the cache repository ``repo``."""
    return Path(repo) / _rel(name)


def secret(cache: Path) -> bytes | None:
    """The key stamps are signed with (``<cache>/keys/replay-stamp.key``), None when there
    is no usable one (then nothing is stamped or recalled)."""
    try:
        return keyfile.cache_key(cache, KEY_NAME)
    except keyfile.NoKey:
        return None


def _payload(name: str, key: Any, result: Any) -> bytes:
    doc = {"format": FORMAT, "name": name, "key": key, "result": result}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load(repo: Path, name: str, key: bytes) -> dict[str, Any] | None:
    """The stamp of ``name`` signed with ``key``, or None when there is none or it is not
    one this cache's pinwheel wrote."""
    try:
        raw = untrusted.read_beneath(Path(repo), _rel(name), untrusted.REPLAY_STAMP)
        doc = untrusted.parse_json(raw, untrusted.REPLAY_STAMP, str(path(repo, name)))
    except PinwheelError:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    if not isinstance(doc.get("key"), dict) or not isinstance(doc.get("result"), dict):
        return None
    payload = _payload(name, doc["key"], doc["result"])
    if not keyfile.signed(key, _PURPOSE, payload, doc.get("signature")):
        return None
    return doc


def save(
    repo: Path, name: str, key: Mapping[str, Any], result: Mapping[str, Any], secret: bytes
) -> None:
    """Record ``result`` under ``key``, signed with ``secret`` (atomic: a reader sees the
    old stamp or the new; no link on the way is gone through)."""
    doc = json.loads(json.dumps({"format": FORMAT, "key": key, "result": result}))
    doc["signature"] = keyfile.sign(secret, _PURPOSE, _payload(name, doc["key"], doc["result"]))
    text = json.dumps(doc, sort_keys=True, indent=1) + "\n"
    confine.write_beneath(Path(repo), _rel(name), text.encode())


# git archive applies the archived tree's own .gitattributes: export-ignore drops files,
# export-subst rewrites $Format:...$, ident/text/eol/filter/working-tree-encoding change
# bytes. The receipt names the pinned tree, so the export must be exactly its blobs:
# $GIT_DIR/info/attributes outranks every in-tree .gitattributes and unsets them all.
# The file is also an input of every replay (libgit2 reads it while merging; it is in
# each stamp's key): it is written before the first replay, so the first export never
# changes the key the first replay was stamped under.
NEUTRAL_ATTRIBUTES = (
    "# pinwheel: export exactly the pinned tree (no export-ignore/export-subst, no\n"
    "# content conversion); written by pinwheel.source.export\n"
    "* -export-ignore -export-subst -ident -text -eol -filter -working-tree-encoding\n"
)


def neutral_attributes(repo_path: Path) -> None:
    """Make ``git archive`` in the cache repository emit every blob as stored (read and
    written never through a link: ``info`` or ``attributes`` planted as one is refused)."""
    try:
        if confine.read_beneath(repo_path, "info/attributes") == NEUTRAL_ATTRIBUTES.encode():
            return
    except (OSError, confine.Escape):
        pass
    confine.write_beneath(repo_path, "info/attributes", NEUTRAL_ATTRIBUTES.encode())


People = tuple[str, str, str]  # a commit's subject, author name and author email


def look(
    repo: Path, names: Sequence[str], commits: Sequence[str] = ()
) -> tuple[dict[str, tuple[str, str] | None], dict[str, People]]:
    """What ``repo`` holds now, from one ``git cat-file --batch-command``: for each name (a
    full ref name, a full object id, or ``ID^N`` / ``ID^{tree}``) the object id and type it
    resolves to, None when it resolves to nothing; and for each id of ``commits`` that is a
    commit, its subject and author as its object says (never as a stamp says).

    Names travel on stdin, one a line (never as options or arguments).
    """
    if any("\n" in n or not n.strip() for n in [*names, *commits]):
        raise ValueError("a name with a newline, or an empty name")
    script = "".join(f"info {n}\n" for n in names) + "".join(f"contents {c}\n" for c in commits)
    proc = gitcli.git(
        ["cat-file", "--batch-command=%(objectname) %(objecttype) %(objectsize)"],
        git_dir=repo,
        input=script.encode(),
        what="git cat-file --batch-command",
    )
    out, pos = proc.stdout, 0
    found: dict[str, tuple[str, str] | None] = {}
    people: dict[str, People] = {}
    for i, name in enumerate([*names, *commits]):
        end = out.find(b"\n", pos)
        if end < 0:
            raise _short(repo, len(names) + len(commits))
        sha, kind, size = (out[pos:end].decode(errors="replace").split(" ") + ["", ""])[:3]
        pos = end + 1
        ok = bool(SHA.fullmatch(sha)) and kind in _TYPES and size.isdigit()
        if i < len(names):
            found[name] = (sha, kind) if ok else None
            continue
        if not ok:
            continue  # "<name> missing": nothing follows
        body = out[pos : pos + int(size)]
        pos += int(size) + 1
        if kind == "commit" and sha == name:
            people[name] = _people(body)
    return found, people


def _short(repo: Path, n: int) -> PinwheelError:
    return PinwheelError(
        f"git cat-file answered fewer lines than the {n} names it was given",
        where=str(repo),
        next="`pinwheel cache verify` checks the cache repositories",
    )


_AUTHOR = re.compile(rb"author (.*) <([^<>]*)> -?\d+ [+-]\d{4}")


def _people(body: bytes) -> People:
    """Subject, author name and email of a raw commit object (as libgit2 reads them:
    the message's first non-blank line; names decoded as UTF-8, bad bytes replaced)."""
    head, _, message = body.partition(b"\n\n")
    name = email = ""
    for line in head.split(b"\n"):
        m = _AUTHOR.fullmatch(line)
        if m is not None:
            name, email = m.group(1).decode(errors="replace"), m.group(2).decode(errors="replace")
            break
    text = message.decode(errors="replace").strip()
    return (text.splitlines()[0] if text else ""), name, email
