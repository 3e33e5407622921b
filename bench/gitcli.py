"""The plain git-CLI way to replay a manifest: the baseline pinwheel is measured and checked by.

``git clone --shared``, a checkout of the base, ``git cherry-pick`` per commit
of each ``pick`` step and ``git merge --no-ff`` for each ``merge`` step, under
a sealed environment (no user or system config, fixed committer, UTC) so the
result depends only on the manifest.

Partial mirrors: a promisor pack can lack blobs that the base tree names
(1Cat-vLLM's mirror lacks two under docs/assets). A plain checkout fails on
them, so the checkout is sparse and leaves exactly the absent paths out. The
sparse checkout leaves the index's cache-tree cold, and `git commit` would then
rebuild every tree and refuse the absent blobs ("invalid object"); a
`reset --hard` to the base primes the cache-tree from the base tree, so later
commits reuse the stored subtrees. Steps that touch an absent path cannot be
replayed this way at all; the in-memory engine does not need those blobs.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pinwheel.manifest import Manifest


@dataclass(frozen=True)
class CliStep:
    number: int
    action: str
    pr: int | None
    originals: tuple[str, ...]  # the PR commits replayed (pick) or merged (merge: the head)
    head: str
    tree: str


@dataclass(frozen=True)
class CliReplay:
    base: str
    head: str
    tree: str
    steps: tuple[CliStep, ...]


class CliConflict(RuntimeError):
    """git stopped on a conflict: the step, the commit and git's status lines."""


def sealed_env(home: Path, manifest: Manifest) -> dict[str, str]:
    """Environment under which the git CLI's result depends only on the manifest."""
    ident = manifest.identity
    date = ""
    if ident.time is not None:
        off = ident.offset or 0
        sign = "-" if off < 0 else "+"
        date = f"@{ident.time} {sign}{abs(off) // 60:02d}{abs(off) % 60:02d}"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "TZ": "UTC",
        "LC_ALL": "C",
        "GIT_COMMITTER_NAME": ident.name,
        "GIT_COMMITTER_EMAIL": ident.email,
    }
    if date:
        env["GIT_COMMITTER_DATE"] = date
    return env


def git(args: list[str], cwd: Path | None, env: dict[str, str], check: bool = True) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        err = proc.stderr.strip()
        raise RuntimeError(f"git {' '.join(args)} failed ({proc.returncode}): {err}")
    return proc.stdout


def absent_paths(mirror: Path, commit: str, env: dict[str, str]) -> tuple[str, ...]:
    """Paths in ``commit``'s tree whose blobs the (partial) mirror does not hold."""
    listing = git(["--git-dir", str(mirror), "ls-tree", "-r", "-z", commit], None, env)
    entries = [e for e in listing.split("\0") if e]
    blobs: dict[str, list[str]] = {}
    for entry in entries:
        meta, _, path = entry.partition("\t")
        _mode, kind, sha = meta.split()
        if kind == "blob":
            blobs.setdefault(sha, []).append(path)
    proc = subprocess.run(
        ["git", "--git-dir", str(mirror), "cat-file", "--batch-check=%(objectname)"],
        input="\n".join(blobs) + "\n",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    missing = [line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" missing")]
    return tuple(sorted(p for sha in missing for p in blobs[sha]))


def own_commits(
    repo: Path, base: str, branch_ref: str, head: str, env: dict[str, str]
) -> list[str]:
    """A PR's own non-merge commits: not in the base, not in the branch's merge-bases with head."""
    bases = git(["merge-base", "--all", branch_ref, head], repo, env, check=False).split()
    rev_args = ["rev-list", "--topo-order", "--reverse", "--no-merges", head, f"^{base}"]
    return git(rev_args + [f"^{b}" for b in bases], repo, env).split()


def replay_with_git_cli(
    manifest: Manifest, mirror: Path, workdir: Path, absent: tuple[str, ...]
) -> CliReplay:
    """Replay ``manifest`` with the git CLI in a fresh clone under ``workdir``."""
    env = sealed_env(workdir / "home", manifest)
    repo = workdir / "repo"
    base = manifest.upstream.commit
    branch_ref = f"refs/remotes/origin/{manifest.upstream.branch}"
    git(["clone", "-q", "--shared", "--no-checkout", str(mirror), str(repo)], None, env)
    git(["config", "core.sparseCheckout", "true"], repo, env)
    patterns = ["/*", *(f"!/{p}" for p in absent)]
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "sparse-checkout").write_text("\n".join(patterns) + "\n")
    git(["checkout", "-q", "--detach", base], repo, env)
    git(["reset", "-q", "--hard", base], repo, env)  # primes the cache-tree (module doc)

    steps: list[CliStep] = []
    for step in manifest.steps:
        assert step.head is not None, "the baseline replays pick and merge steps only"
        if step.action == "pick":
            originals = own_commits(repo, base, branch_ref, step.head, env)
            for commit in originals:
                _run_or_conflict(
                    ["cherry-pick", "--allow-empty", "--keep-redundant-commits", commit],
                    repo,
                    env,
                    f"{step.label} commit {commit}",
                )
        elif step.action == "merge":
            originals = [step.head]
            merge_env = dict(env)
            merge_env.update(
                GIT_AUTHOR_NAME=env["GIT_COMMITTER_NAME"],
                GIT_AUTHOR_EMAIL=env["GIT_COMMITTER_EMAIL"],
            )
            if "GIT_COMMITTER_DATE" in env:
                merge_env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"]
            message = f"Merge PR #{step.pr} ({step.head})"
            _run_or_conflict(
                ["merge", "-q", "--no-ff", "--no-edit", "-m", message, step.head],
                repo,
                merge_env,
                step.label,
            )
        else:
            raise ValueError(f"{step.label}: the git-CLI baseline does not replay patch steps")
        head = git(["rev-parse", "HEAD"], repo, env).strip()
        tree = git(["rev-parse", "HEAD^{tree}"], repo, env).strip()
        steps.append(CliStep(step.number, step.action, step.pr, tuple(originals), head, tree))
    head = git(["rev-parse", "HEAD"], repo, env).strip()
    tree = git(["rev-parse", "HEAD^{tree}"], repo, env).strip()
    return CliReplay(base=base, head=head, tree=tree, steps=tuple(steps))


def _run_or_conflict(args: list[str], repo: Path, env: dict[str, str], where: str) -> None:
    proc = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        status = git(["status", "--porcelain"], repo, env, check=False)
        unmerged = [line for line in status.splitlines() if line[:2] in ("UU", "AA", "DU", "UD")]
        raise CliConflict(f"{where}: git {args[0]} stopped: {unmerged or proc.stderr.strip()}")
