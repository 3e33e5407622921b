"""Conflict resolution that travels: fix once in a checkout, record it as a patch.

``start`` replays up to the first conflict and recreates it in a git worktree
(conflict markers and all). The user edits. ``finish`` stores the fix as
``patches/<pr>-<commit>.patch`` plus a ``[[step.resolve]]`` entry, so every
machine replays the same fix (git rerere would stay on this one).

Every stack is tried in order (the engine, then each component); the first
that conflicts is recreated, and ``finish`` records the fix in that stack's
steps (``[[step.resolve]]`` or ``[[kernel.step.resolve]]``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from pinwheel.errors import PinwheelError, UsageError
from pinwheel.fsutil import atomic_write_bytes, atomic_write_text, remove_tree
from pinwheel.manifest import Manifest
from pinwheel.manifest.component import Stack, stacks
from pinwheel.source import gitcli
from pinwheel.source.cache import Cache
from pinwheel.source.export import missing_paths, partial_mirror_error
from pinwheel.source.replay import Replayer, fetch_for
from pinwheel.source.result import ReplayConflict

STATE_FILE = "pinwheel-resolve.json"
# Fixed identity for the scratch merge in the worktree; never part of a result.
_SCRATCH_ENV = {
    "GIT_AUTHOR_NAME": "pinwheel",
    "GIT_AUTHOR_EMAIL": "pinwheel@replay.invalid",
    "GIT_COMMITTER_NAME": "pinwheel",
    "GIT_COMMITTER_EMAIL": "pinwheel@replay.invalid",
}


@dataclass(frozen=True)
class ResolveSession:
    workdir: Path
    step_number: int
    pr: int | None
    commit: str  # original commit or "merge"
    parent_state: str
    files: tuple[str, ...]
    kernel_index: int | None = None  # the conflicting component's [[kernel]] position
    component: str | None = None

    @property
    def where(self) -> str:
        return f"component {self.component}: " if self.component else ""


def _state_path(workdir: Path) -> Path:
    gitdir = gitcli.out(["rev-parse", "--absolute-git-dir"], cwd=workdir)
    return Path(gitdir) / STATE_FILE


def start(
    manifest: Manifest, cache: Cache, workdir: Path, chosen: tuple[Stack, ...] = ()
) -> ResolveSession:
    workdir = Path(workdir).absolute()
    if workdir.exists() and any(workdir.iterdir()):
        raise UsageError(
            f"{workdir} exists and is not empty",
            where="pinwheel resolve start",
            next="choose a new directory",
        )
    conflict: ReplayConflict | None = None
    for stack in chosen or stacks(manifest):
        with cache.locked(stack.manifest.upstream.url):
            fetched = fetch_for(stack.manifest, cache)
            try:
                Replayer(stack.manifest, fetched).run()
            except ReplayConflict as exc:
                conflict = exc
                ctx = conflict.context
                # A checkout needs every file; a partial mirror may lack some: name them first.
                for commit in (ctx.parent_state, ctx.theirs):
                    if missing_paths(fetched.repo_path, commit):
                        raise partial_mirror_error(
                            fetched.repo_path,
                            commit,
                            "cannot recreate the conflict in a checkout",
                            f"pinwheel resolve start (step {ctx.step_number})",
                        ) from None
                gitcli.git(
                    ["worktree", "add", "-q", "--detach", "--", str(workdir), ctx.parent_state],
                    git_dir=fetched.repo_path,
                    what="git worktree add",
                )
                break
    if conflict is None:
        raise UsageError(
            "every stack replays without conflicts: nothing to resolve", next="pinwheel run"
        )
    kernel = stack.kernel
    if ctx.commit == "merge":
        args = ["merge", "--no-commit", "--no-ff", "--end-of-options", ctx.theirs]
    else:
        args = ["cherry-pick", "--no-commit", "--end-of-options", ctx.theirs]
    gitcli.git(args, cwd=workdir, env=_SCRATCH_ENV, check=False)  # expected to stop on conflicts
    step = stack.manifest.steps[ctx.step_number - 1]
    session = ResolveSession(
        workdir,
        ctx.step_number,
        step.pr,
        ctx.commit,
        ctx.parent_state,
        conflict.files,
        kernel.index if kernel else None,
        kernel.name if kernel else None,
    )
    state = {
        "manifest": str(manifest.path),
        **{k: v for k, v in session.__dict__.items() if k != "workdir"},
    }
    atomic_write_text(_state_path(workdir), json.dumps(state, indent=2, default=list))
    return session


def finish(workdir: Path) -> tuple[Path, Path]:
    """Record the fix; returns (patch path, manifest path)."""
    workdir = Path(workdir).absolute()
    try:
        state_file = _state_path(workdir)
        state = json.loads(state_file.read_text())
    except (PinwheelError, FileNotFoundError):
        raise UsageError(
            f"{workdir} is not a pinwheel resolve checkout", next="pinwheel resolve start DIR"
        ) from None
    gitcli.git(["add", "-A"], cwd=workdir)
    check = gitcli.git(
        ["diff", "--cached", "--check", state["parent_state"], "--"], cwd=workdir, check=False
    )
    leftovers = [
        ln for ln in check.stdout.decode(errors="replace").splitlines() if "conflict marker" in ln
    ]
    if leftovers:
        raise PinwheelError(
            f"conflict markers remain: {leftovers[0].split(':')[0]}"
            + (f" and {len(leftovers) - 1} more" if len(leftovers) > 1 else ""),
            where=str(workdir),
            next="edit the files to remove <<<<<<< ======= >>>>>>> then run finish again",
        )
    diff = gitcli.git(
        ["diff", "--cached", "--binary", "--full-index", state["parent_state"], "--"], cwd=workdir
    ).stdout
    manifest_path = Path(state["manifest"])
    tag = "merge" if state["commit"] == "merge" else state["commit"][:12]
    name = f"{state['pr'] or 'step' + str(state['step_number'])}-{tag}.patch"
    if state.get("component"):
        name = f"{state['component']}-{name}"
    patch = manifest_path.parent / "patches" / name
    atomic_write_bytes(patch, diff)
    doc = tomlkit.parse(manifest_path.read_text())
    owner = doc if state.get("kernel_index") is None else doc["kernel"][state["kernel_index"]]
    step = owner["step"][state["step_number"] - 1]
    if "resolve" not in step:
        step["resolve"] = tomlkit.aot()
    entry = tomlkit.table()
    entry.update(
        {
            "commit": state["commit"],
            "path": f"patches/{name}",
            "sha256": hashlib.sha256(diff).hexdigest(),
        }
    )
    step["resolve"].append(entry)
    atomic_write_text(manifest_path, tomlkit.dumps(doc))
    abort(workdir)
    return patch, manifest_path


def abort(workdir: Path) -> None:
    workdir = Path(workdir).absolute()
    common = gitcli.out(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=workdir)
    gitcli.git(
        ["worktree", "remove", "--force", "--", str(workdir)], git_dir=Path(common), check=False
    )
    remove_tree(workdir, ignore_errors=True)
