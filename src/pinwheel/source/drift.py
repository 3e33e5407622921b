"""How far the manifest has drifted from upstream, per PR, and whether it still replays."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from pinwheel.errors import PinwheelError
from pinwheel.manifest import Manifest, Upstream
from pinwheel.source.cache import Cache, Fetched
from pinwheel.source.libgit2 import pygit2
from pinwheel.source.replay import Replayer


@dataclass(frozen=True)
class PrDrift:
    pr: int
    pinned: str | None
    current: str | None
    moved: bool
    merged_upstream: str | None  # how: "ancestor of <branch>" or "squash <sha>"
    status: str = "ok"  # "ok", "missing ref" (no refs/pull/N/head), "missing head"


@dataclass(frozen=True)
class DriftReport:
    base: str
    branch_tip: str
    new_upstream_commits: int
    prs: tuple[PrDrift, ...]
    replays_on_tip: bool
    replay_problem: str | None


def _merged_upstream(
    repo: pygit2.Repository, fetched: Fetched, base: str, pr: int, head: str | None
) -> str | None:
    tip = fetched.branch_tip
    if head and head in repo and (head == tip or repo.descendant_of(tip, head)):
        return f"head is in {fetched.branch}"
    # Squash and rebase merges on GitHub end the subject with "(#N)".
    marker = re.compile(rf"\(#{pr}\)\s*$")
    walker = repo.walk(tip, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(base)
    for c in walker:
        first = c.message.strip().splitlines()[0] if c.message.strip() else ""
        if marker.search(first):
            return f"squashed as {str(c.id)[:12]}"
    return None


def drift_report(manifest: Manifest, cache: Cache) -> DriftReport:
    with cache.locked(manifest.upstream.url):
        # Every PR is reported, even when some refs or pinned heads are gone upstream.
        base = manifest.upstream.commit
        heads = [s.head for s in manifest.steps if s.head]
        fetched = cache.fetch(
            manifest.upstream.url,
            manifest.upstream.branch,
            manifest.prs,
            [base, *heads],
            missing_ok=True,
            where=manifest.stack_where,
        )
        repo = fetched.open()
        if base not in repo:
            raise PinwheelError(
                f"base commit {base[:12]} is not in {manifest.upstream.branch}'s history here",
                where=manifest.base_where,
                next="check that commit against the upstream branch, or point "
                "--mirror URL=PATH at a complete mirror",
            )
        walker = repo.walk(fetched.branch_tip, pygit2.enums.SortMode.NONE)
        walker.hide(base)
        new_commits = sum(1 for _ in walker)
        prs = []
        for s in manifest.steps:
            if s.pr is None:
                continue
            current = fetched.pr_heads.get(s.pr)
            status = "ok"
            if s.pr in fetched.missing_prs:
                status = "missing ref"
            if s.head and s.head not in repo:
                status = "missing head" if status == "ok" else "missing ref and head"
            others = sorted(
                n for n, h in fetched.pr_heads.items() if s.head and h == s.head and n != s.pr
            )
            if others and current != s.head:  # a slip, not a force-push
                status = f"pinned head is PR #{others[0]}'s head"
            known = s.head if s.head and s.head in repo else None
            prs.append(
                PrDrift(
                    pr=s.pr,
                    pinned=s.head,
                    current=current,
                    moved=bool(s.head and current not in (None, s.head)) and not others,
                    merged_upstream=_merged_upstream(repo, fetched, base, s.pr, known),
                    status=status,
                )
            )
        # Does the pinned stack still replay on the branch tip? (No refs written.)
        gone = [p for p in prs if p.status != "ok" and not (p.pinned and p.pinned in repo)]
        problem = None
        if gone:
            problem = "cannot replay: " + ", ".join(f"PR #{p.pr} ({p.status})" for p in gone)
        else:
            moved = replace(
                manifest,
                upstream=Upstream(
                    manifest.upstream.url, fetched.branch_tip, manifest.upstream.branch
                ),
            )
            try:
                Replayer(moved, fetched, allow_drift=True).run()
            except PinwheelError as exc:
                problem = f"{exc.where}: {exc.what}" if exc.where else exc.what
    return DriftReport(base, fetched.branch_tip, new_commits, tuple(prs), problem is None, problem)


def drift_payload(report: DriftReport) -> dict[str, Any]:
    return {
        "schema": "pinwheel.drift/1",
        "base": report.base,
        "branch_tip": report.branch_tip,
        "new_upstream_commits": report.new_upstream_commits,
        "replays_on_tip": report.replays_on_tip,
        "replay_problem": report.replay_problem,
        "prs": [p.__dict__ for p in report.prs],
    }


def render_drift(report: DriftReport) -> str:
    lines = [
        f"upstream: {report.new_upstream_commits} new commit(s) since base "
        f"{report.base[:12]} (tip {report.branch_tip[:12]})"
    ]
    for p in report.prs:
        state = []
        if p.status.startswith("pinned head is PR"):
            state.append(f"{p.status} (a typo?); PR #{p.pr}'s own head is {p.current}")
        elif p.status != "ok":
            state.append(
                f"{p.status}: upstream has no refs/pull/{p.pr}/head"
                if p.status == "missing ref"
                else f"{p.status} (pinned {p.pinned} not found)"
            )
        if p.moved:
            state.append(f"head moved {str(p.pinned)[:12]} -> {str(p.current)[:12]}")
        if p.merged_upstream:
            state.append(f"already upstream ({p.merged_upstream})")
        lines.append(f"  PR #{p.pr}: " + ("; ".join(state) if state else "unchanged"))
    if report.replays_on_tip and report.branch_tip == report.base:
        lines.append(f"the base is the branch tip {report.branch_tip[:12]}: nothing to update")
    elif report.replays_on_tip:
        lines.append(
            f"stack replays cleanly on {report.branch_tip[:12]}: "
            "`pinwheel lock --update-base` moves the base there"
        )
    else:
        lines.append(f"stack does NOT replay on the tip: {report.replay_problem}")
    slips = [p for p in report.prs if p.status.startswith("pinned head is PR")]
    if slips:
        lines.append(
            "next: fix the head of "
            + ", ".join(f'PR #{p.pr} (head = "{p.current}")' for p in slips)
            + " in the manifest after reviewing it"
        )
    if any(p.status.startswith("missing") for p in report.prs):
        lines.append(
            "next: check those PR numbers upstream; a deleted PR can be kept by keeping its "
            "pinned head in a --mirror, or remove its step"
        )
    return "\n".join(lines)
