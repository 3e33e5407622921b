"""Which commits a pick step replays: a PR's own commits, oldest first, and the
merge-bases that separate them from the upstream branch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.manifest import Step
from pinwheel.source import gitcli

if TYPE_CHECKING:  # libgit2 is loaded where it is called: a recalled replay never loads it
    from pinwheel.source.libgit2 import pygit2


def merge_bases(repo_path: Path, a: str, b: str) -> list[str]:
    """``git merge-base --all a b`` (pygit2 exposes only a single base)."""
    proc = gitcli.git(
        ["merge-base", "--all", "--end-of-options", a, b], git_dir=repo_path, check=False
    )
    return proc.stdout.decode().split()



def pr_bases(repo_path: Path, branch_tip: str, head: str) -> list[str]:
    """The branch's merge-bases with a PR head, less the head itself.

    A PR merged upstream with its own SHAs (fast-forward or rebase-free merge)
    has its head on the branch: then the merge-base is the head, and hiding it
    would drop every commit of the PR. Its own commits are base..head then.
    """
    return [b for b in merge_bases(repo_path, branch_tip, head) if b != head]


def branch_history(repo: pygit2.Repository, branch_tip: str, head: str) -> list[str]:
    """What hides the upstream branch from a walk of ``head``, in process: the branch tip
    itself (every common ancestor lies below one of the merge-bases, so hiding the tip
    hides exactly what hiding :func:`pr_bases` would), or nothing when the head is on the
    branch (:func:`pr_bases` is empty then too). The replay's path: a ``git merge-base``
    per step costs a process (~10 ms) where this costs a walk (~0.2 ms); ``plan`` still
    asks git for the bases themselves (hazards are walked from them)."""
    if head == branch_tip or repo.descendant_of(branch_tip, head):
        return []
    return [branch_tip]


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
        hide = bases if bases is not None else branch_history(repo, branch_tip, step.head)
        picked = commits_between(repo, step.head, [base, *hide])
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

