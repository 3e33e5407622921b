"""Replay stamps: every input a replay reads (``stamp_key``), the result recorded under
it (``record``), and a warm replay given back from its stamp after the fetch while every
input, ref and recorded object still holds (``recall``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pinwheel import checksums
from pinwheel.errors import PinwheelError
from pinwheel.manifest import Manifest
from pinwheel.source import gitcli, stamp
from pinwheel.source.cache import PULL_PREFIX, UPSTREAM_PREFIX, Fetched, Refs
from pinwheel.source.result import ReplayedCommit, ReplayRequest, ReplayResult, StepResult

# The engine's version: raise it with any change that makes other commits or trees from
# the same inputs (it is part of every stamp's key, so older stamps stop matching).
REPLAY_VERSION = 1


def _libgit2_identity() -> str | None:
    """The installed pygit2, and the libgit2 its wheel carries, without loading it: where
    it is, its dist-info (name and version) and its RECORD's inode, size and mtime, which
    every install rewrites. None: not found (then nothing is stamped or recalled)."""
    import importlib.util

    spec = importlib.util.find_spec("pygit2")
    if spec is None or spec.origin is None:
        return None
    site = Path(spec.origin).parent.parent
    records = sorted(site.glob("pygit2-*.dist-info/RECORD"))
    if len(records) != 1:
        return None
    st = records[0].stat()
    return f"{records[0].parent} {st.st_ino} {st.st_size} {st.st_mtime_ns}"


def _file_digest(path: Path) -> str | None:
    try:
        return checksums.sha256_file(path, chunk=1 << 16)
    except FileNotFoundError:
        return None


def stamp_key(
    request: ReplayRequest, repo_path: Path, refs: Mapping[str, str]
) -> dict[str, Any] | None:
    """Every input a replay reads, as data; None when one cannot be named (no stamp).

    A replay is a function of: the manifest's stack (upstream, base, identity, each
    step's action, PR, pinned head and commits, title, and the bytes of every patch and
    resolution it applies; the whole manifest's sha256 on top), the refs just fetched
    (the branch tip, whose merge-bases with each PR head pick a PR's commits, and each
    PR's head), the objects those ids name (immutable: an id is its content), the
    options, this engine (:data:`REPLAY_VERSION`, pinwheel's version, the installed
    libgit2), the cache repository's own ``config`` and ``info/attributes`` (which libgit2
    reads while merging) and, for patch steps, git (``git apply``).
    """
    from pinwheel import __version__

    m = request.manifest
    libgit2 = _libgit2_identity()
    if libgit2 is None:
        return None
    steps = []
    patched = False
    for step in m.steps:
        fixes = [[r.commit, checksums.sha256_file(r.patch)] for r in step.resolutions]
        patch = checksums.sha256_file(step.patch) if step.patch else None
        patched = patched or bool(fixes) or patch is not None
        steps.append(
            [step.number, step.action, step.pr, step.head, step.title,
             list(step.commits) if step.commits is not None else None, patch, fixes]
        )  # fmt: skip
    ident = m.identity
    return {
        "engine": REPLAY_VERSION,
        "pinwheel": __version__,
        "libgit2": libgit2,
        "git": gitcli.out(["version"]) if patched else None,
        "repo": [_file_digest(repo_path / "config"), _file_digest(repo_path / "info/attributes")],
        "options": {"allow_drift": request.allow_drift},
        "manifest": {
            "name": m.name,
            "sha256": m.sha256,
            "upstream": [m.upstream.url, m.upstream.branch, m.upstream.commit],
            "identity": [ident.name, ident.email, ident.time, ident.offset],
            "result": [m.result.tree, m.result.tag],
            "steps": steps,
        },
        "refs": dict(sorted(refs.items())),
    }


def _ref_names(manifest: Manifest) -> list[str]:
    """The refs a fetch of ``manifest`` writes: the branch, then each PR's head."""
    return [f"{UPSTREAM_PREFIX}{manifest.upstream.branch}"] + [
        f"{PULL_PREFIX}{n}/head" for n in manifest.prs
    ]


def record(request: ReplayRequest, fetched: Fetched, result: ReplayResult) -> None:
    """Stamp ``result`` (its refs written, no head drifted) under the key of its inputs."""
    if any(s.drifted for s in result.steps) or fetched.missing_prs:
        return
    refs = {f"{UPSTREAM_PREFIX}{fetched.branch}": fetched.branch_tip}
    refs.update({f"{PULL_PREFIX}{n}/head": h for n, h in fetched.pr_heads.items()})
    key = stamp_key(request, fetched.repo_path, refs)
    secret = stamp.secret(request.cache)
    if key is None or secret is None:
        return
    doc = {
        "base": result.base,
        "head": result.head,
        "tree": result.tree,
        "tag": result.tag,
        "steps": [
            {
                "pr_head": s.pr_head,
                "head": s.head,
                "tree": s.tree,
                "commits": [[c.original, c.replayed] for c in s.commits],
            }
            for s in result.steps
        ],
    }
    try:
        stamp.save(fetched.repo_path, request.manifest.name, key, doc, secret)
    except (OSError, PinwheelError):  # a stamp only saves time: the next run replays in full
        return


def _sha(value: Any) -> str:
    if isinstance(value, str) and stamp.SHA.fullmatch(value):
        return value
    raise ValueError("not a commit id")


def _decode(manifest: Manifest, repo_path: Path, doc: Any) -> ReplayResult:
    """The result a stamp records, every value typed and every id fullmatched."""
    steps = doc["steps"]
    if not isinstance(steps, list) or len(steps) != len(manifest.steps):
        raise ValueError("not one entry per step")
    decoded = []
    for step, entry in zip(manifest.steps, steps, strict=True):
        commits = []
        for row in entry["commits"]:
            original, replayed = row
            # Subject and author: read from the commit object by recall, never the stamp's.
            commits.append(
                ReplayedCommit(None if original is None else _sha(original), _sha(replayed),
                               "", "", "")  # fmt: skip
            )
        pr_head = None if entry["pr_head"] is None else _sha(entry["pr_head"])
        decoded.append(
            StepResult(step, pr_head, False, tuple(commits), _sha(entry["head"]),
                       _sha(entry["tree"]))  # fmt: skip
        )
    tag = doc["tag"]
    if tag != manifest.result.tag:
        raise ValueError("another tag")
    return ReplayResult(
        manifest, repo_path, _sha(doc["base"]), _sha(doc["head"]), _sha(doc["tree"]),
        tuple(decoded), tag,
    )  # fmt: skip


def recall(request: ReplayRequest, refs: Refs) -> ReplayResult | None:
    """The replay's recorded result when every input and every object still holds; None
    (replay in full) at the first doubt. Only a replay that writes its refs is recalled:
    the tag and the stack ref must already name the recorded head, so writing them again
    would change nothing.

    What the full replay would check, and why each holds here:
      - each PR's ref exists and no pinned head drifted: the refs just fetched are read
        (one ``git cat-file``) and compared; any missing ref or drift replays in full;
      - the base and every pinned commit exist: looked up, with their types;
      - the replay itself (which commits, merged how): the stamp's key is
        :func:`stamp_key` of this run (the manifest's stack, the fetched refs, options,
        engine, libgit2 and the repository's config), equal or nothing is recalled;
      - the recorded commits are in the repository as one chain: every step's commits
        exist, each one's first parent is the one before (the first: the base), a merge
        step's second parent is its PR head, each step's tree is its head's tree;
      - the tag (never moved) and the stack ref point at the recorded head;
      - ``[result].tree``: checked by the caller on the recalled result, as on a replay.
    """
    manifest = request.manifest
    if not request.write_refs or refs.missing_prs:
        return None
    repo = refs.repo_path
    secret = stamp.secret(request.cache)
    doc = stamp.load(repo, manifest.name, secret) if secret is not None else None
    if doc is None:
        return None
    try:
        result = _decode(manifest, repo, doc["result"])
    except (KeyError, TypeError, ValueError):
        return None
    ref_names = _ref_names(manifest)
    stack_ref = f"refs/pinwheel/stack/{manifest.name}"
    names = [*ref_names, stack_ref]
    if result.tag:
        names.append(f"refs/tags/{result.tag}")
    want = {result.base: "commit", result.tree: "tree"}
    for step in manifest.steps:
        want.update({sha: "commit" for sha in (step.head, *(step.commits or ())) if sha})
    links: dict[str, str] = {}  # "X^1" / "X^2" / "X^{tree}" -> the id it must resolve to
    state = result.base
    for s in result.steps:
        for c in s.commits:
            want[c.replayed] = "commit"
            links[f"{c.replayed}^1"] = state
            state = c.replayed
        if s.step.action == "merge" and s.pr_head:
            links[f"{s.head}^2"] = s.pr_head
        links[f"{s.head}^{{tree}}"] = s.tree
        if state != s.head:
            return None
    if state != result.head:
        return None
    links[f"{result.head}^{{tree}}"] = result.tree
    replayed = [c.replayed for s in result.steps for c in s.commits]
    found, people = stamp.look(repo, [*names, *want, *links], replayed)
    if any(sha not in people for sha in replayed):
        return None
    if any((hit := found[sha]) is None or hit != (sha, kind) for sha, kind in want.items()):
        return None
    if any((hit := found[name]) is None or hit[0] != sha for name, sha in links.items()):
        return None
    for name in names[len(ref_names):]:  # the stack ref and the tag: at the recorded head
        if (hit := found[name]) is None or hit != (result.head, "commit"):
            return None
    current: dict[str, str] = {}
    for name in ref_names:
        if (hit := found[name]) is None or hit[1] != "commit":
            return None
        current[name] = hit[0]
    for step, s in zip(manifest.steps, result.steps, strict=True):
        if step.pr is not None:
            head = current[f"{PULL_PREFIX}{step.pr}/head"]
            if (step.head or head) != head or s.pr_head != head:
                return None  # drifted, or recorded from another head: replay decides
    try:
        key = stamp_key(request, repo, current)
    except OSError:  # a patch gone: the replay says so
        return None
    if key is None or key != doc["key"]:
        return None
    return _with_people(result, people)


def _with_people(result: ReplayResult, people: Mapping[str, stamp.People]) -> ReplayResult:
    """``result`` with every commit's subject and author as its object says."""
    steps = tuple(
        replace(s, commits=tuple(
            replace(c, subject=people[c.replayed][0], author=people[c.replayed][1],
                                author_email=people[c.replayed][2])
            for c in s.commits
        ))
        for s in result.steps
    )  # fmt: skip
    return replace(result, steps=steps)
