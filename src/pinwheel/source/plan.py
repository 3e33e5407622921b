"""Dry run: what each step would replay, and the merge hazard it carries.

Merge hazard: the upstream-branch commits that merging the PR (or a naive
``base..head`` pick) would import although they are not in the base —
``git rev-list ^BASE $(git merge-base --all UPSTREAM HEAD)``. This is how the
GLM-5.3 V100 card recipe broke: merging PR branches pulled a newer main.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pinwheel.manifest import Manifest, Step
from pinwheel.source.cache import Cache, Fetched
from pinwheel.source.libgit2 import pygit2
from pinwheel.source.picks import commits_between, pick_commits, pr_bases, subject_line
from pinwheel.source.replay import fetch_for


@dataclass(frozen=True)
class PlannedCommit:
    sha: str
    subject: str
    author: str
    is_merge: bool


@dataclass(frozen=True)
class StepPlan:
    step: Step
    head: str | None
    current_head: str | None  # what refs/pull/N/head says now
    commits: tuple[PlannedCommit, ...]  # what the step replays (pick) or brings in (merge)
    hazard: tuple[PlannedCommit, ...]  # mainline commits a merge would import
    problem: str | None  # a reason this step cannot replay as written

    @property
    def drifted(self) -> bool:
        return bool(self.head and self.current_head and self.head != self.current_head)


@dataclass(frozen=True)
class Plan:
    manifest: Manifest
    base: str
    branch_tip: str
    steps: tuple[StepPlan, ...]


def _planned(c: pygit2.Commit) -> PlannedCommit:
    return PlannedCommit(str(c.id), subject_line(c.message), c.author.name, len(c.parents) > 1)


def hazard_commits(repo: pygit2.Repository, base: str, bases: list[str]) -> list[PlannedCommit]:
    """Mainline commits reachable from the merge-bases ``bases`` but not from ``base``."""
    if not bases:
        return []
    walker = repo.walk(bases[0], pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.REVERSE)
    for extra in bases[1:]:
        walker.push(extra)
    walker.hide(base)
    return [_planned(c) for c in walker]


def plan_fetched(manifest: Manifest, fetched: Fetched) -> Plan:
    repo = fetched.open()
    base = manifest.upstream.commit
    plans = []
    for step in manifest.steps:
        current = fetched.pr_heads.get(step.pr) if step.pr else None
        head = step.head or current
        if step.action == "patch" or head is None:
            plans.append(StepPlan(step, None, None, (), (), None))
            continue
        problem = None
        bases = pr_bases(fetched.repo_path, fetched.branch_tip, head)
        hazard = tuple(hazard_commits(repo, base, bases))
        if step.action == "pick":
            commits = tuple(_planned(c) for c in commits_between(repo, head, [base, *bases]))
            try:
                pick_commits(repo, step, base, fetched.branch_tip, bases)
            except Exception as exc:  # noqa: BLE001 - reported, not raised, in a plan
                problem = getattr(exc, "what", str(exc))
            if step.commits and tuple(c.sha for c in commits) != step.commits:
                problem = problem or (
                    "the PR's commits differ from the pinned 'commits' list "
                    "(replay uses the pinned list)"
                )
        else:
            commits = tuple(_planned(c) for c in commits_between(repo, head, [base]))
        plans.append(StepPlan(step, head, current, commits, hazard, problem))
    return Plan(manifest, base, fetched.branch_tip, tuple(plans))


def make_plan(manifest: Manifest, cache: Cache) -> Plan:
    with cache.locked(manifest.upstream.url):
        return plan_fetched(manifest, fetch_for(manifest, cache))


def plan_payload(plan: Plan) -> dict[str, Any]:
    def commits(items: tuple[PlannedCommit, ...]) -> list[dict[str, Any]]:
        return [
            {"sha": c.sha, "subject": c.subject, "author": c.author, "merge": c.is_merge}
            for c in items
        ]

    return {
        "schema": "pinwheel.plan/1",
        "base": plan.base,
        "branch_tip": plan.branch_tip,
        "steps": [
            {
                "number": p.step.number,
                "action": p.step.action,
                "pr": p.step.pr,
                "head": p.head,
                "current_head": p.current_head,
                "drifted": p.drifted,
                "commits": commits(p.commits),
                "hazard_count": len(p.hazard),
                "hazard": commits(p.hazard),
                "problem": p.problem,
            }
            for p in plan.steps
        ],
    }


def render_plan(plan: Plan) -> str:
    lines = [
        f"base {plan.base[:12]}  ({plan.manifest.upstream.branch} is at {plan.branch_tip[:12]})"
    ]
    for p in plan.steps:
        s = p.step
        lines.append(f"{s.label}" + (f"  head {p.head[:12]}" if p.head else ""))
        if p.drifted:
            lines.append(f"    ! PR head moved upstream: now {p.current_head[:12]}")  # type: ignore[index]
        if s.action == "pick":
            for c in p.commits:
                lines.append(f"    pick {c.sha[:12]} {c.subject}  ({c.author})")
        elif s.action == "merge":
            lines.append(f"    merge brings {len(p.commits)} commit(s)")
        if p.hazard:
            verb = "merging" if s.action == "merge" else "a naive base..head pick"
            lines.append(
                f"    ! merge hazard: {verb} would import {len(p.hazard)} mainline commit(s) "
                f"not in the base, e.g. {p.hazard[-1].sha[:12]} {p.hazard[-1].subject}"
            )
        if p.problem:
            lines.append(f"    x {p.problem}")
    return "\n".join(lines)
