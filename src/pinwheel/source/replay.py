"""The replay engine: rebuild a manifest's stack in memory with libgit2.

No worktree, no hooks, no config: each step becomes trees merged by libgit2
and commits created with fixed bytes. Authors are the original ones (name,
email, date, timezone); the committer is the manifest's ``[identity]``; messages
are copied byte for byte. So the same manifest gives the same SHAs anywhere.

Plan first (``plan_step_commits``), then execute (``replay_manifest``); refs
are written only after every step succeeded, so a failed run leaves the cache
as it found it (unreferenced objects aside, which git gc removes).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel import checksums
from pinwheel.errors import ConflictError, DriftError, ManifestError, MismatchError, PinwheelError
from pinwheel.manifest import Identity, Manifest, Step
from pinwheel.manifest.component import Stack
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import faults, gitcli, stamp
from pinwheel.source.cache import PULL_PREFIX, UPSTREAM_PREFIX, Cache, Fetched, Refs
from pinwheel.urls import redact

if TYPE_CHECKING:  # libgit2 is loaded where it is called: a recalled replay never loads it
    from pinwheel.source.libgit2 import pygit2


@dataclass(frozen=True)
class ReplayedCommit:
    original: str | None  # None for merge commits and plain-diff patches
    replayed: str
    subject: str
    author: str
    author_email: str


@dataclass(frozen=True)
class StepResult:
    step: Step
    pr_head: str | None  # the PR head actually used
    drifted: bool  # the PR ref no longer points at the pinned head
    commits: tuple[ReplayedCommit, ...]
    head: str
    tree: str


@dataclass(frozen=True)
class ReplayResult:
    manifest: Manifest = field(repr=False)
    repo_path: Path
    base: str
    head: str
    tree: str
    steps: tuple[StepResult, ...]
    tag: str | None


@dataclass(frozen=True)
class ConflictContext:
    """Where a replay stopped, so ``pinwheel resolve`` can recreate the conflict."""

    step_number: int
    commit: str  # original commit, or "merge"
    parent_state: str  # stack head before the conflicting commit
    theirs: str  # the original commit (pick) or PR head (merge)


class ReplayConflict(ConflictError):
    def __init__(self, what: str, *, context: ConflictContext, **kw: Any):
        super().__init__(what, **kw)
        self.context = context


# --------------------------------------------------------------------------- helpers


def merge_bases(repo_path: Path, a: str, b: str) -> list[str]:
    """``git merge-base --all a b`` (pygit2 exposes only a single base)."""
    proc = gitcli.git(
        ["merge-base", "--all", "--end-of-options", a, b], git_dir=repo_path, check=False
    )
    return proc.stdout.decode().split()


def committer_for(identity: Identity, base: pygit2.Commit) -> pygit2.Signature:
    from pinwheel.source.libgit2 import pygit2

    if identity.time is None:  # default: the base commit's committer date, fixed by the manifest
        return pygit2.Signature(
            identity.name, identity.email, base.committer.time, base.committer.offset
        )
    return pygit2.Signature(identity.name, identity.email, identity.time, identity.offset or 0)


def pr_bases(repo_path: Path, branch_tip: str, head: str) -> list[str]:
    """The branch's merge-bases with a PR head, less the head itself.

    A PR merged upstream with its own SHAs (fast-forward or rebase-free merge)
    has its head on the branch: then the merge-base is the head, and hiding it
    would drop every commit of the PR. Its own commits are base..head then.
    """
    return [b for b in merge_bases(repo_path, branch_tip, head) if b != head]


def subject_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""


def commits_between(repo: pygit2.Repository, head: str, hide: Sequence[str]) -> list[pygit2.Commit]:
    """Commits reachable from ``head`` and from none of ``hide``, oldest first."""
    from pinwheel.source.libgit2 import pygit2

    walker = repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    for sha in hide:
        walker.hide(sha)
    return list(walker)


def pick_commits(
    repo: pygit2.Repository,
    step: Step,
    base: str,
    branch_tip: str,
    bases: Sequence[str] | None = None,
) -> list[pygit2.Commit]:
    """The PR's own commits, oldest first.

    Pinned ``commits`` win (the branch tip moves; a pinned list does not).
    Otherwise: reachable from the head, not from the base, and not from the
    upstream branch's merge-bases with the head (main merged into the PR);
    pass ``bases`` when the caller has computed those already.
    """
    from pinwheel.source.libgit2 import pygit2

    assert step.head is not None
    if step.commits:
        picked = []
        for sha in step.commits:
            if sha not in repo or not (sha == step.head or repo.descendant_of(step.head, sha)):
                raise PinwheelError(
                    f"pinned commit {sha[:12]} is not part of PR #{step.pr}'s head "
                    f"{step.head[:12]}",
                    where=f"{step.where} commits",
                    next="run `pinwheel lock` to re-pin the PR's commits",
                )
            picked.append(repo[sha].peel(pygit2.Commit))
    else:
        if bases is None:
            bases = pr_bases(Path(repo.path), branch_tip, step.head)
        picked = commits_between(repo, step.head, [base, *bases])
        if not picked:
            # The head is an ancestor of the base (or of main): nothing to replay.
            # Exit 2: replaying "nothing" silently would hide a stale step.
            raise ManifestError(
                f"PR #{step.pr} selects 0 commits: its head {step.head[:12]} is already "
                f"contained in the base {base[:12]}",
                where=step.where,
                next=f"remove step {step.number} from the manifest (the PR is already in the "
                "base), or run `pinwheel drift` to see which PRs are upstream",
            )
    merges = [c for c in picked if len(c.parents) > 1]
    if merges:
        first = merges[0]
        # Exit 2: the manifest asks for something impossible; the fix is an edit.
        raise ManifestError(
            f"PR #{step.pr} contains merge commit {str(first.id)[:12]} "
            f"'{subject_line(first.message)}' ({len(merges)} merge(s) in its range): "
            "its own commits cannot be cherry-picked in order",
            where=step.where,
            next=f'change step {step.number} to action = "merge" (and check `pinwheel plan` '
            "for the mainline commits a merge would import)",
        )
    return picked


def _conflict_files(index: pygit2.Index) -> tuple[str, ...]:
    files = set()
    for ancestor, ours, theirs in index.conflicts or ():
        for entry in (ancestor, ours, theirs):
            if entry is not None:
                files.add(entry.path)
    return tuple(sorted(files))


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


def merge_message(step: Step, branch: str) -> str:
    """Fixed merge message: a function of the manifest only (not of ref spelling)."""
    title = f"\n\n{step.title}" if step.title else ""
    return f"Merge PR #{step.pr} into {branch}{title}\n\nhead {step.head}\n"


# --------------------------------------------------------------------------- engine


class Replayer:
    """Executes a manifest's steps against a fetched cache repo."""

    def __init__(
        self,
        manifest: Manifest,
        fetched: Fetched,
        *,
        base: str | None = None,
        allow_drift: bool = False,
        reporter: Reporter = SILENT,
    ):
        from pinwheel.source.libgit2 import pygit2

        self.manifest = manifest
        self.fetched = fetched
        self.repo = fetched.open()
        self.base = base or manifest.upstream.commit
        self.allow_drift = allow_drift
        self.reporter = reporter
        base_commit = self.repo[self.base].peel(pygit2.Commit)
        self.committer = committer_for(manifest.identity, base_commit)

    def pr_head(self, step: Step) -> tuple[str, bool]:
        """The head to replay and whether the PR ref has moved away from it."""
        assert step.pr is not None
        current = self.fetched.pr_heads.get(step.pr)
        pinned = step.head
        if pinned is None:
            if current is None:
                raise PinwheelError(
                    f"PR #{step.pr} has no head", where=step.where, next="run `pinwheel lock`"
                )
            return current, False
        if current is None or current == pinned:
            return pinned, False
        others = sorted(n for n, h in self.fetched.pr_heads.items() if h == pinned and n != step.pr)
        if others:
            # A copy-paste slip, not a force-push: --allow-drift must not replay it either.
            raise ManifestError(
                f"PR #{step.pr}'s pinned head {pinned} is the head of PR #{others[0]}, "
                f"not of PR #{step.pr} (whose head upstream is {current})",
                where=f"{step.where} head",
                next=f'set head = "{current}" in step {step.number} after reviewing it, '
                "or run `pinwheel lock --update-heads`",
            )
        if not self.allow_drift:
            raise DriftError(
                f"PR #{step.pr} head moved: manifest pins {pinned[:12]}, "
                f"upstream now has {current[:12]} (force-push or new commits)",
                where=step.where,
                next="review the change, then `pinwheel lock --update-heads` to move the pin, "
                "or rerun with --allow-drift to replay the pinned head",
            )
        if pinned in self.repo:
            return pinned, True
        return current, True

    def run(self) -> ReplayResult:
        from pinwheel.source.libgit2 import pygit2

        try:
            return self._run()
        except (pygit2.GitError, OSError, KeyError) as exc:
            # libgit2 writing objects into the cache: a full disk or a damaged object.
            fault = faults.classify_exception(exc, self.fetched.repo_path)
            if fault is None and faults.low_space(self.fetched.repo_path):
                fault = faults.disk_full(self.fetched.repo_path, f"object {exc} not stored")
            if fault is not None:
                raise fault from None
            if isinstance(exc, KeyError):
                raise
            raise PinwheelError(
                f"libgit2 failed in the cache: {exc}",
                where=str(self.fetched.repo_path),
                next="`pinwheel cache verify` checks the cache repositories",
            ) from None

    def _run(self) -> ReplayResult:
        from pinwheel.source.libgit2 import pygit2

        current = self.repo[self.base].peel(pygit2.Commit)
        results = []
        for step in self.manifest.steps:
            results.append(self._step(step, current))
            current = self.repo[results[-1].head].peel(pygit2.Commit)
            done = results[-1]
            note = ""
            if done.drifted:
                used = "pinned" if done.pr_head == step.head else "NEW (pinned one is gone)"
                note = f"  [PR head moved upstream; replayed the {used} head {done.pr_head}]"
            self.reporter.info(
                f"  {step.label}: {len(done.commits)} commit(s) -> {done.head[:12]}{note}"
            )
        return ReplayResult(
            manifest=self.manifest,
            repo_path=self.fetched.repo_path,
            base=self.base,
            head=str(current.id),
            tree=str(current.tree_id),
            steps=tuple(results),
            tag=self.manifest.result.tag,
        )

    def _step(self, step: Step, current: pygit2.Commit) -> StepResult:
        if step.action == "patch":
            return self._patch(step, current)
        head, drifted = self.pr_head(step)
        step_at = step if head == step.head else _with_head(step, head)
        if step.action == "pick":
            return self._pick(step_at, current, head, drifted)
        return self._merge(step_at, current, head, drifted)

    def _commit(
        self,
        author: pygit2.Signature,
        message: str | bytes,
        tree: str,
        parents: list[str],
        encoding: str | None = None,
    ) -> str:
        from pinwheel.source.libgit2 import pygit2

        args: list[Any] = [
            None,
            author,
            self.committer,
            message,
            pygit2.Oid(hex=tree),
            [pygit2.Oid(hex=p) for p in parents],
        ]
        if encoding:
            args.append(encoding)
        new = self.repo.create_commit(*args)
        if new not in self.repo:  # libgit2 can drop a loose object on ENOSPC and say nothing
            raise faults.write_failed(self.fetched.repo_path, f"commit {str(new)[:12]}")
        return str(new)

    def _resolution(self, step: Step, commit: str) -> Path | None:
        for r in step.resolutions:
            if r.commit == commit:
                return r.patch
        return None

    def _pick(self, step: Step, current: pygit2.Commit, head: str, drifted: bool) -> StepResult:
        from pinwheel.source.libgit2 import pygit2

        replayed = []
        state = current
        for c in pick_commits(self.repo, step, self.base, self.fetched.branch_tip):
            sha = str(c.id)
            where = f"{step.where} commit {sha[:12]} '{subject_line(c.message)}'"
            fix = self._resolution(step, sha)
            if fix is not None:
                tree = apply_patch(self.fetched.repo_path, str(state.tree_id), fix, where=where)
            else:
                parent_tree = c.parents[0].tree if c.parents else self.repo[_empty_tree(self.repo)]
                index = self._merge_trees(parent_tree, state.tree, c.tree, where)
                if index.conflicts:
                    raise self._conflict(step, where, index, sha, str(state.id), sha)
                tree = str(index.write_tree(self.repo))
            new = self._commit(c.author, c.raw_message, tree, [str(state.id)], c.message_encoding)
            replayed.append(
                ReplayedCommit(sha, new, subject_line(c.message), c.author.name, c.author.email)
            )
            state = self.repo[new].peel(pygit2.Commit)
        return StepResult(step, head, drifted, tuple(replayed), str(state.id), str(state.tree_id))

    def _merge(self, step: Step, current: pygit2.Commit, head: str, drifted: bool) -> StepResult:
        from pinwheel.source.libgit2 import pygit2

        where = f"{step.where} head {head[:12]}"
        fix = self._resolution(step, "merge")
        if fix is not None:
            tree = apply_patch(self.fetched.repo_path, str(current.tree_id), fix, where=where)
        else:
            try:
                renames = pygit2.enums.MergeFlag.FIND_RENAMES
                index = self.repo.merge_commits(current, head, flags=renames)
            except (KeyError, pygit2.GitError) as exc:
                ours, theirs = current.tree, self.repo[head].peel(pygit2.Commit).tree
                base_id = self.repo.merge_base(current.id, head)
                ancestor = self.repo[base_id].peel(pygit2.Commit).tree if base_id else ours
                paths = _paths_without_content(self.repo, ancestor, ours, theirs)
                raise _missing_object(exc, where, self.fetched.repo_path, paths) from None
            if index.conflicts:
                raise self._conflict(step, where, index, "merge", str(current.id), head)
            tree = str(index.write_tree(self.repo))
        message = merge_message(step, self.manifest.upstream.branch)
        ident = self.committer
        new = self._commit(ident, message, tree, [str(current.id), head])
        commit = ReplayedCommit(None, new, subject_line(message), ident.name, ident.email)
        merged = self.repo[new].peel(pygit2.Commit)
        return StepResult(step, head, drifted, (commit,), new, str(merged.tree_id))

    def _patch(self, step: Step, current: pygit2.Commit) -> StepResult:
        assert step.patch is not None
        where = f"{step.where} file patches/{step.patch.name}"
        tree = apply_patch(self.fetched.repo_path, str(current.tree_id), step.patch, where=where)
        meta = read_patch_meta(step.patch)
        author = meta.author or self.committer
        new = self._commit(author, meta.message, tree, [str(current.id)])
        commit = ReplayedCommit(None, new, subject_line(meta.message), author.name, author.email)
        return StepResult(step, None, False, (commit,), new, tree)

    def _merge_trees(self, ancestor: Any, ours: Any, theirs: Any, where: str) -> pygit2.Index:
        from pinwheel.source.libgit2 import pygit2

        try:
            renames = pygit2.enums.MergeFlag.FIND_RENAMES
            return self.repo.merge_trees(ancestor, ours, theirs, flags=renames)
        except (KeyError, pygit2.GitError) as exc:
            paths = _paths_without_content(self.repo, ancestor, ours, theirs)
            raise _missing_object(exc, where, self.fetched.repo_path, paths) from None

    def _conflict(
        self,
        step: Step,
        where: str,
        index: pygit2.Index,
        commit: str,
        parent_state: str,
        theirs: str,
    ) -> ReplayConflict:
        files = _conflict_files(index)
        return ReplayConflict(
            f"conflict in {len(files)} file(s)",
            files=files,
            where=where,
            next=f"pinwheel resolve start DIR  (recreates step {step.number}'s conflict in DIR; "
            "fix it, then `pinwheel resolve finish DIR` records the fix under patches/)",
            context=ConflictContext(step.number, commit, parent_state, theirs),
        )


def _with_head(step: Step, head: str) -> Step:
    # A moved head invalidates the pinned commit list: recompute it from the new head.
    return replace(step, head=head, commits=None)


def _empty_tree(repo: pygit2.Repository) -> pygit2.Oid:
    return repo.TreeBuilder().write()


def _paths_without_content(
    repo: pygit2.Repository, ancestor: Any, ours: Any, theirs: Any
) -> list[str]:
    """Files changed on both sides of a merge whose blobs the cache and mirrors lack."""
    from pinwheel.source.libgit2 import pygit2

    try:
        ours_changed = {d.new_file.path for d in repo.diff(ancestor, ours).deltas}
        theirs_changed = {d.new_file.path for d in repo.diff(ancestor, theirs).deltas}
        missing = []
        for path in sorted(ours_changed & theirs_changed):
            for tree in (ancestor, ours, theirs):
                try:
                    entry = tree[path]
                except KeyError:
                    continue
                if entry.id not in repo:
                    missing.append(path)
                    break
        return missing
    except (KeyError, pygit2.GitError):
        return []


def _missing_object(
    exc: Exception, where: str, repo_path: Path, paths: Sequence[str] = ()
) -> PinwheelError:
    fault = faults.classify_exception(exc, repo_path)
    if fault is not None:
        return fault
    named = f": {', '.join(paths[:20])}" + (" ..." if len(paths) > 20 else "") if paths else ""
    return PinwheelError(
        f"an object this step needs is missing from the mirror ({exc}); "
        f"{len(paths)} file(s) to merge have no content here{named}"
        if paths
        else f"an object this step needs is missing from the mirror ({exc})",
        where=where,
        next="use a complete mirror for this step (git clone --mirror), or `git fetch "
        "--refetch` in the partial one",
    )


# --------------------------------------------------------------------------- entry points


def fetch_for(
    manifest: Manifest, cache: Cache, *, extra_want: Sequence[str] = (), refs: Refs | None = None
) -> Fetched:
    """Fetch what the manifest names (call inside ``cache.locked``).

    Every commit the manifest pins (the base, each PR head, each pinned pick) is
    resolved here, before anything is built: whatever is missing is reported at
    once, each SHA with the step that names it. ``refs``: the refs already fetched.
    """
    return cache.fetch(
        manifest.upstream.url,
        manifest.upstream.branch,
        manifest.prs,
        wanted_commits(manifest, extra_want),
        where=manifest.stack_where,
        refs=refs,
    )


def wanted_commits(manifest: Manifest, extra: Sequence[str] = ()) -> dict[str, str]:
    """Every commit the manifest pins -> what names it, in manifest order."""
    want = {manifest.upstream.commit: manifest.base_where}
    for step in manifest.steps:
        if step.head:
            want.setdefault(step.head, f"{step.where} head")
        for sha in step.commits or ():
            want.setdefault(sha, f"{step.where} commits")
    for sha in extra:
        want.setdefault(sha, "")
    return want


def reach_all(chosen: Sequence[Stack], cache: Cache) -> None:
    """Fetch every stack's upstream and resolve its pinned commits; one error for all."""
    failed: list[tuple[Stack, PinwheelError]] = []
    for stack in chosen:
        try:
            with cache.locked(stack.manifest.upstream.url):
                fetch_for(stack.manifest, cache)
        except PinwheelError as exc:
            failed.append((stack, exc))
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        raise PinwheelError(
            f"{len(failed)} stacks cannot be fetched:\n"
            + "\n".join(
                f"  {s.title}: {e.where + ': ' if e.where else ''}{e.what}" for s, e in failed
            ),
            where="pinwheel build",
            next=failed[0][1].next,
        )


def replaying(manifest: Manifest) -> str:
    """The line said before a replay: what is replayed onto which base."""
    return (
        f"replaying {manifest.name}: {len(manifest.steps)} step(s) on "
        f"{manifest.upstream.commit[:12]} ({redact(manifest.upstream.url)})"
    )


@dataclass(frozen=True)
class ReplayRequest:
    """Everything one replay needs, resolved once by the caller (the CLI: flags, environment)."""

    manifest: Manifest
    cache: Path
    mirrors: Mapping[str, str] = field(default_factory=dict)
    offline: bool = False
    allow_drift: bool = False
    check_tree: bool = True  # raise MismatchError when [result].tree differs
    write_refs: bool = True  # refs/pinwheel/stack/NAME and the [result] tag in the cache


def replay(request: ReplayRequest, reporter: Reporter = SILENT) -> ReplayResult:
    """Fetch, replay, check the tree, and tag: the whole of ``pinwheel run``.

    After the fetch, a replay whose stamp (:func:`recall`) holds is given back from it
    without loading libgit2; otherwise the stack is replayed and, when its refs were
    written and no head drifted, stamped (:func:`record`).
    """
    manifest = request.manifest
    store = Cache(request.cache, request.mirrors, request.offline, reporter=reporter)
    with store.locked(manifest.upstream.url):
        with store.fetching(manifest.upstream.url, manifest.prs):
            refs = store.fetch_refs(manifest.upstream.url, manifest.upstream.branch, manifest.prs)
            # An input of every replay, written by the first export: written first instead,
            # so the stamp of the first replay is recalled by the second.
            stamp.neutral_attributes(refs.repo_path)
            recalled = recall(request, refs)
            fetched = None if recalled else fetch_for(manifest, store, refs=refs)
        if recalled is not None:
            if request.check_tree:
                check_result_tree(recalled)
            return recalled
        assert fetched is not None
        result = Replayer(
            manifest, fetched, allow_drift=request.allow_drift, reporter=reporter
        ).run()
        if request.check_tree:
            check_result_tree(result)
        if request.write_refs:
            write_result_refs(result)
            record(request, fetched, result)
    return result


# --------------------------------------------------------------------------- stamps

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


def replay_manifest(
    manifest: Manifest,
    *,
    cache: Path,
    mirrors: Mapping[str, str] | None = None,
    offline: bool = False,
    allow_drift: bool = False,
    check_tree: bool = True,
    write_refs: bool = True,
    reporter: Reporter = SILENT,
) -> ReplayResult:
    """:func:`replay` with the request's fields as keywords (library callers, tests, benches)."""
    request = ReplayRequest(
        manifest, Path(cache), dict(mirrors or {}), offline, allow_drift, check_tree, write_refs
    )
    return replay(request, reporter)


def check_result_tree(result: ReplayResult) -> None:
    expected = result.manifest.result.tree
    if expected and expected != result.tree:
        raise MismatchError(
            f"replayed tree {result.tree} differs from the pinned {expected}",
            where=f"{result.manifest.path.name} [result].tree (head {result.head[:12]})",
            next="run `pinwheel plan` to see what changed; if intended, `pinwheel lock` re-pins",
        )


def write_result_refs(result: ReplayResult, *, tag: bool = True) -> None:
    """Point the stack ref (and create the tag) in one transaction, after everything succeeded.

    The stack ref follows the latest replay of this manifest name; a tag never
    moves: one that already names another commit is an error, not an overwrite.
    """
    from pinwheel.source.libgit2 import pygit2

    repo = pygit2.Repository(str(result.repo_path))
    lines = ["start", f"update refs/pinwheel/stack/{result.manifest.name} {result.head}"]
    if tag and result.tag:
        ref = f"refs/tags/{result.tag}"
        if ref in repo.references:
            current = str(repo.references[ref].peel(pygit2.Commit).id)
            if current != result.head:
                raise ManifestError(
                    f"tag {result.tag} already exists in the cache at {current[:12]}; this "
                    f"replay made {result.head[:12]} and a tag is never moved",
                    where=f"{result.manifest.path.name} [result] tag",
                    next=f"give this stack its own [result].tag, or delete the old tag: "
                    f"git --git-dir {result.repo_path} tag -d {result.tag}",
                )
        else:
            lines.append(f"create {ref} {result.head}")
    lines += ["prepare", "commit"]
    gitcli.git(
        ["update-ref", "--stdin"],
        git_dir=result.repo_path,
        input=("\n".join(lines) + "\n").encode(),
        what="writing the stack ref and tag",
    )


def lock_payload(result: ReplayResult) -> dict[str, Any]:
    """The JSON record of a replay (``--json`` output and the exported lock file)."""
    m = result.manifest
    return {
        "schema": "pinwheel.lock/1",
        "manifest": {"name": m.name, "path": m.path.name, "sha256": m.sha256},
        "upstream": {
            "url": redact(m.upstream.url),
            "branch": m.upstream.branch,
            "base": result.base,
        },
        "head": result.head,
        "tree": result.tree,
        "tag": result.tag,
        "tree_verified": bool(m.result.tree) and m.result.tree == result.tree,
        "steps": [
            {
                "number": s.step.number,
                "action": s.step.action,
                "pr": s.step.pr,
                "title": s.step.title,
                "head": s.pr_head,
                "drifted": s.drifted,
                "patch": s.step.patch.name if s.step.patch else None,
                "result": s.head,
                "tree": s.tree,
                "commits": [
                    {
                        "original": c.original,
                        "replayed": c.replayed,
                        "subject": c.subject,
                        "author": f"{c.author} <{c.author_email}>",
                    }
                    for c in s.commits
                ],
            }
            for s in result.steps
        ],
    }
