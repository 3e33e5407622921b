"""The step model: ``[[step]]`` (the engine's stack) and ``[[kernel.step]]`` (a component's).

One parser for both, so a component's pick / merge / patch steps are validated
and replayed exactly like the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pinwheel import validate
from pinwheel.errors import ManifestError
from pinwheel.manifest.table import FULL_SHA, SHORT_SHA, Table, check_file_sha

ACTIONS = ("pick", "merge", "patch")


@dataclass(frozen=True)
class Resolution:
    """A recorded conflict fix: apply ``patch`` instead of merging ``commit``."""

    commit: str  # the original commit whose replay conflicted ("merge" for a merge step)
    patch: Path
    sha256: str


@dataclass(frozen=True)
class Step:
    number: int  # 1-based position in the stack
    action: str  # pick | merge | patch
    pr: int | None
    head: str | None
    title: str | None
    commits: tuple[str, ...] | None  # expected original commits (audit)
    patch: Path | None
    patch_sha256: str | None
    resolutions: tuple[Resolution, ...] = ()
    # Blame, not identity: the file and line of its table ("manifest.toml:22"), and the
    # stack it belongs to when that is not the engine ("[[kernel]] kern ").
    at: str = field(default="", compare=False)
    owner: str = field(default="", compare=False)

    @property
    def label(self) -> str:
        if self.pr is not None:
            return f"step {self.number} ({self.action} PR #{self.pr})"
        name = self.patch.name if self.patch else "?"
        return f"step {self.number} ({self.action} {name})"

    @property
    def where(self) -> str:
        """What an error about this step names: ``manifest.toml:22: [[kernel]] kern step 1
        (pick PR #5)``; the bare label for a step made in code."""
        text = f"{self.owner}{self.label}"
        return f"{self.at}: {text}" if self.at else text


def parse_step(t: Table, number: int, root: Path, allow_short: bool) -> Step:
    """One ``[[step]]`` (or a component's ``[[kernel.step]]``)."""
    t.only("action", "pr", "head", "title", "commits", "path", "sha256", "resolve")
    action = t.choice("action", ACTIONS)
    pr = t.int("pr", None, minimum=1)
    head = t.sha("head", None, allow_short=allow_short)
    title = t.checked("title", validate.line_problem, "a one-line title", None)
    commits = None
    if t.has("commits"):
        commits = t.str_list("commits")
        for c in commits:
            if not (FULL_SHA.fullmatch(c) or (allow_short and SHORT_SHA.fullmatch(c))):
                raise t.error("commits", "a list of full 40-hex commit SHAs", c)
    patch = patch_sha = None
    if action in ("pick", "merge"):
        if pr is None:
            raise t.error("pr", f"a PR number (action '{action}' replays a pull request)")
        if head is None and not allow_short:
            raise ManifestError(
                f"PR #{pr} has no 'head'",
                where=t.where("head"),
                next="run `pinwheel lock` to pin the PR's current head",
            )
        for k in ("path", "sha256"):
            if t.has(k):
                raise t.error(k, f"no '{k}' on a '{action}' step (only 'patch' steps take one)")
    else:
        patch = t.path_under("path", root, "patches")
        patch_sha = t.sha256("sha256")
        check_file_sha(t, "path", patch, patch_sha, verify=not allow_short)
    resolutions = []
    for r in t.subs("resolve"):
        r.only("commit", "path", "sha256")
        commit = r.str("commit")
        if commit != "merge" and not FULL_SHA.fullmatch(commit):
            raise r.error("commit", 'a full commit SHA, or "merge" for a merge step', commit)
        p = r.path_under("path", root, "patches")
        digest = r.sha256("sha256")
        check_file_sha(r, "path", p, digest, verify=not allow_short)
        resolutions.append(Resolution(commit=commit, patch=p, sha256=digest))
    return Step(
        number=number,
        action=action,
        pr=pr,
        head=head,
        title=title,
        commits=commits,
        patch=patch,
        patch_sha256=patch_sha,
        resolutions=tuple(resolutions),
        at=t.at(),
    )
