"""The replay engine: rebuild a manifest's stack in memory with libgit2.

No worktree, no hooks, no config: each step becomes trees merged by libgit2
and commits created with fixed bytes. Authors are the original ones (name,
email, date, timezone); the committer is the manifest's ``[identity]``; messages
are copied byte for byte. So the same manifest gives the same SHAs anywhere.

Plan first (:func:`pinwheel.source.plan.make_plan`), then execute (``replay_manifest``);
refs are written only after every step succeeded, so a failed run leaves the cache
as it found it (unreferenced objects aside, which git gc removes). Beside it:
:mod:`~pinwheel.source.result` (the request and result types),
:mod:`~pinwheel.source.picks` (which commits a step replays),
:mod:`~pinwheel.source.patches` (patch steps, recorded resolutions) and
:mod:`~pinwheel.source.recall` (a warm replay given back from its stamp).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.errors import DriftError, ManifestError, MismatchError, PinwheelError
from pinwheel.manifest import Identity, Manifest, Step
from pinwheel.manifest.component import Stack
from pinwheel.printable import shown_cmd
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import faults, gitcli, stamp
from pinwheel.source.cache import Cache, Fetched, Refs
from pinwheel.source.patches import apply_patch, read_patch_meta
from pinwheel.source.picks import pick_commits, subject_line
from pinwheel.source.recall import recall, record
from pinwheel.source.result import (
    ConflictContext,
    ReplayConflict,
    ReplayedCommit,
    ReplayRequest,
    ReplayResult,
    StepResult,
)
from pinwheel.urls import redact

if TYPE_CHECKING:  # libgit2 is loaded where it is called: a recalled replay never loads it
    from pinwheel.source.libgit2 import pygit2


def committer_for(identity: Identity, base: pygit2.Commit) -> pygit2.Signature:
    from pinwheel.source.libgit2 import pygit2

    if identity.time is None:  # default: the base commit's committer date, fixed by the manifest
        return pygit2.Signature(
            identity.name, identity.email, base.committer.time, base.committer.offset
        )
    return pygit2.Signature(identity.name, identity.email, identity.time, identity.offset or 0)


def _conflict_files(index: pygit2.Index) -> tuple[str, ...]:
    files = set()
    for ancestor, ours, theirs in index.conflicts or ():
        for entry in (ancestor, ours, theirs):
            if entry is not None:
                files.add(entry.path)
    return tuple(sorted(files))


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
                    f"{shown_cmd('git', '--git-dir', result.repo_path, 'tag', '-d', result.tag)}",
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
