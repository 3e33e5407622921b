"""The stacks an attribution compares: the full stack, and the stack without step k
(leave-one-out) or the first k steps (prefixes), each replayed in memory like ``pinwheel run``.

One fetch, one cache lock, then one :class:`~pinwheel.source.replay.Replayer` run per
variant on a copy of the manifest whose ``steps`` leave some out (step numbers stay the
manifest's, so every message names the step as the manifest does). Nothing is written to
refs. A variant that cannot be replayed is kept, with why: the later step that conflicts
once step k is gone and the files it conflicts in (``Blocked``); the full stack itself
must replay (its error is raised as ``pinwheel run`` would raise it).

The comparisons follow: leave-one-out pairs the full stack (with step k) with the stack
without k; prefixes pair the first k steps with the first k-1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel.errors import PinwheelError, UsageError
from pinwheel.manifest import Manifest, Step
from pinwheel.progress import SILENT, Reporter
from pinwheel.source.cache import Cache
from pinwheel.source.libgit2 import pygit2
from pinwheel.source.replay import Replayer, check_result_tree, fetch_for
from pinwheel.source.result import ReplayConflict, ReplayRequest, ReplayResult

LEAVE_ONE_OUT = "leave-one-out"
PREFIXES = "prefixes"
MODES = (LEAVE_ONE_OUT, PREFIXES)
FULL = "full"


@dataclass(frozen=True)
class Blocked:
    """Why a variant cannot be replayed: the step that failed once others were left out."""

    step: int | None  # the manifest's number of the step that conflicts (None: not a conflict)
    label: str  # "step 4 (pick PR #15)"
    files: tuple[str, ...]  # conflicting files
    what: str  # the replay's own message

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "label": self.label,
            "files": list(self.files),
            "what": self.what,
        }


@dataclass(frozen=True)
class Variant:
    name: str  # "full", "without-3", "prefix-2"
    steps: tuple[int, ...]  # the manifest's step numbers replayed, in order
    result: ReplayResult | None  # None when blocked
    blocked: Blocked | None = None

    @property
    def tree(self) -> str | None:
        return self.result.tree if self.result is not None else None


@dataclass(frozen=True)
class Comparison:
    """One step's effect: ``with_`` holds the step, ``without`` is the same stack without it."""

    step: Step
    with_: str  # variant names
    without: str


@dataclass(frozen=True)
class VariantRequest:
    replay: ReplayRequest  # the full stack's replay (cache, mirrors, offline, drift, tree check)
    steps: tuple[int, ...] | None = None  # step numbers to attribute; None = every step
    mode: str = LEAVE_ONE_OUT


@dataclass(frozen=True)
class VariantPlan:
    mode: str
    variants: tuple[Variant, ...]  # the full stack first
    comparisons: tuple[Comparison, ...]  # one per attributed step whose variants replayed
    blocked: tuple[tuple[Step, Blocked], ...]  # attributed steps that cannot be left out

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def chosen_steps(manifest: Manifest, wanted: Sequence[int] | None) -> tuple[Step, ...]:
    """The steps to attribute, in stack order; an unknown number is a usage error."""
    if not manifest.steps:
        raise UsageError(
            f"{manifest.path.name} has no [[step]]: nothing to attribute",
            where=f"{manifest.path.name} [[step]]",
            next="add the PR steps to the manifest, then run `pinwheel attribute`",
        )
    if wanted is None:
        return manifest.steps
    known = {s.number: s for s in manifest.steps}
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise UsageError(
            f"no step {', '.join(map(str, unknown))} in {manifest.path.name} "
            f"(it has steps 1-{len(manifest.steps)})",
            where="--step",
            next="pass step numbers as `pinwheel plan` lists them",
        )
    return tuple(s for s in manifest.steps if s.number in set(wanted))


def replay_variants(request: VariantRequest, reporter: Reporter = SILENT) -> VariantPlan:
    """Replay the full stack and every variant the mode asks for; conflicts become
    :class:`Blocked` variants (the full stack's own failure raises)."""
    if request.mode not in MODES:
        raise UsageError(f"unknown mode {request.mode!r}", next=f"use one of {', '.join(MODES)}")
    manifest = request.replay.manifest
    chosen = chosen_steps(manifest, request.steps)
    every = tuple(s.number for s in manifest.steps)
    wanted: list[tuple[str, tuple[int, ...]]] = [(FULL, every)]
    pairs: list[tuple[Step, str, str]] = []
    if request.mode == LEAVE_ONE_OUT:
        for step in chosen:
            name = f"without-{step.number}"
            wanted.append((name, tuple(n for n in every if n != step.number)))
            pairs.append((step, FULL, name))
    else:
        for i, step in enumerate(manifest.steps):
            if step not in chosen:
                continue
            before = FULL if i == len(every) - 1 else f"prefix-{i + 1}"
            if i + 1 < len(every):
                wanted.append((before, every[: i + 1]))
            name = f"prefix-{i}"
            wanted.append((name, every[:i]))
            pairs.append((step, before, name))
    seen: dict[str, tuple[int, ...]] = {}
    for name, steps in wanted:
        seen.setdefault(name, steps)
    store = Cache(
        request.replay.cache, request.replay.mirrors, request.replay.offline, reporter=reporter
    )
    variants: list[Variant] = []
    with store.locked(manifest.upstream.url):
        fetched = fetch_for(manifest, store)
        for name, steps in seen.items():
            sub = dataclasses.replace(
                manifest, steps=tuple(s for s in manifest.steps if s.number in steps)
            )
            reporter.info(f"replaying {name}: steps {_numbers(steps)}")
            try:
                result = Replayer(
                    sub, fetched, allow_drift=request.replay.allow_drift, reporter=reporter
                ).run()
            except PinwheelError as exc:  # a conflict, or a recorded fix that no longer applies
                if name == FULL:
                    raise
                variants.append(Variant(name, steps, None, _blocked(sub, exc)))
                continue
            if name == FULL and request.replay.check_tree:
                check_result_tree(result)
            variants.append(Variant(name, steps, result))
    by_name = {v.name: v for v in variants}
    comparisons, blocked = [], []
    for step, with_, without in pairs:
        stuck = by_name[without].blocked or by_name[with_].blocked
        if stuck is not None:
            blocked.append((step, stuck))
        else:
            comparisons.append(Comparison(step, with_, without))
    return VariantPlan(request.mode, tuple(variants), tuple(comparisons), tuple(blocked))


def _blocked(manifest: Manifest, exc: PinwheelError) -> Blocked:
    number = exc.context.step_number if isinstance(exc, ReplayConflict) else None
    step = next((s for s in manifest.steps if s.number == number), None)
    files = tuple(getattr(exc, "files", ()) or ())
    label = step.label if step is not None else (exc.where or "the replay")
    return Blocked(number, label, files, exc.what)


def changed_files(repo_path: Path, old_tree: str, new_tree: str) -> tuple[str, ...]:
    """Paths whose content differs between two trees of the cache repository (what a
    build in place of ``old_tree`` has to redo for ``new_tree``)."""
    repo = pygit2.Repository(str(repo_path))
    diff = repo[old_tree].peel(pygit2.Tree).diff_to_tree(repo[new_tree].peel(pygit2.Tree))
    paths = {d.new_file.path for d in diff.deltas} | {d.old_file.path for d in diff.deltas}
    return tuple(sorted(paths))


def _numbers(steps: Sequence[int]) -> str:
    return ", ".join(map(str, steps)) if steps else "none (the base)"


__all__ = [
    "FULL",
    "LEAVE_ONE_OUT",
    "MODES",
    "PREFIXES",
    "Blocked",
    "Comparison",
    "Variant",
    "VariantPlan",
    "VariantRequest",
    "changed_files",
    "chosen_steps",
    "replay_variants",
]
