"""What a replay is asked and what it gives back: the request, the result of the whole
stack, of each step and of each commit, and where a conflict stopped it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.errors import ConflictError
from pinwheel.manifest import Manifest, Step


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
