"""Replay subcommands: plan, run, build, lock, drift, export, resolve."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.cli import Context, command

if TYPE_CHECKING:  # imported where used: `pinwheel --help` should not load libgit2
    from pinwheel.source.cache import Cache
    from pinwheel.source.replay import ReplayResult


def _cache(ctx: Context) -> Cache:
    from pinwheel.source.cache import Cache

    return Cache(ctx.cache, ctx.mirrors, ctx.offline, show_progress=not ctx.json)


def _replay(ctx: Context, args: argparse.Namespace) -> ReplayResult:
    from pinwheel.source.replay import replay_manifest

    manifest = ctx.manifest()
    report = ctx.reporter
    report.info(
        f"replaying {manifest.name}: {len(manifest.steps)} step(s) on "
        f"{manifest.upstream.commit[:12]} ({manifest.upstream.url})"
    )
    kwargs = dict(
        cache=ctx.cache,
        mirrors=ctx.mirrors,
        offline=ctx.offline,
        allow_drift=getattr(args, "allow_drift", False),
        show_fetch_progress=not ctx.json,
    )
    if ctx.json or not ctx.is_terminal:  # plain lines (or nothing): no live display to load
        return replay_manifest(manifest, progress=report.info, **kwargs)  # type: ignore[arg-type]

    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=ctx.console, transient=True) as bar:
        task = bar.add_task("fetch + replay", total=len(manifest.steps))

        def progress(msg: str) -> None:
            ctx.console.print(escape(msg), highlight=False)
            bar.advance(task)

        return replay_manifest(manifest, progress=progress, **kwargs)  # type: ignore[arg-type]


def _summary(result: ReplayResult) -> str:
    verified = result.manifest.result.tree
    state = "matches [result].tree" if verified else "UNVERIFIED (no [result].tree pinned)"
    lines = [f"head {result.head}", f"tree {result.tree}  {state}"]
    if result.tag:
        lines.append(f"tag  {result.tag} (in the cache)")
    return "\n".join(lines)


def cmd_run(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.replay import lock_payload

    result = _replay(ctx, args)
    ctx.emit(lock_payload(result), _summary(result))
    return 0


def cmd_build(ctx: Context, args: argparse.Namespace) -> int:
    """Check [build] and the toolkit first, replay, then kernel + engine wheels as one set."""
    from pinwheel.build.pipeline import BuildRequest, build, build_config
    from pinwheel.build.toolchain import resolve_toolkit

    manifest = ctx.manifest()
    config = build_config(manifest)  # before the replay: a bad [build] fails in a second
    with ctx.reporter.status(f"resolving CUDA {config.cuda} for {', '.join(config.arches)}"):
        toolkit = resolve_toolkit(config, ctx.cache, provision=not ctx.offline, environ=ctx.environ)
    result = _replay(ctx, args)
    request = BuildRequest(
        manifest=manifest,
        cache=ctx.cache,
        out_dir=Path(args.out).absolute(),
        environ=ctx.environ,
        mirrors=ctx.mirrors,
        offline=ctx.offline,
        provision=not ctx.offline,
        replayed=result,
        kernels=() if args.no_kernels else None,
        toolkit=toolkit,
        compiler_cache=not args.no_cache,
        reuse_from=args.reuse_from,
    )
    outcome = build(request, ctx.reporter)
    ctx.emit(outcome.to_json(), _summary(result) + "\n" + "\n".join(outcome.human_lines()))
    return 0


def cmd_plan(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.plan import make_plan, plan_payload, render_plan

    plan = make_plan(ctx.manifest(), _cache(ctx))
    ctx.emit(plan_payload(plan), render_plan(plan))
    return 0


def cmd_lock(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.lock import lock_manifest

    outcome = lock_manifest(
        ctx.manifest_path, _cache(ctx), update_base=args.update_base, update_heads=args.update_heads
    )
    human = [f"  {c.where}: {c.old!s:.14} -> {c.new!s:.60}" for c in outcome.changes]
    ctx.emit(
        {
            "changes": [c.__dict__ for c in outcome.changes],
            "head": outcome.head,
            "tree": outcome.tree,
        },
        "\n".join(human or ["  nothing to change"]) + f"\nlocked {outcome.path.name}: "
        f"tree {outcome.tree}",
    )
    return 0


def cmd_drift(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.drift import drift_payload, drift_report, render_drift

    report = drift_report(ctx.manifest(), _cache(ctx))
    ctx.emit(drift_payload(report), render_drift(report))
    return 0


def cmd_export(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.export import export_tarball, export_tree
    from pinwheel.source.replay import lock_payload

    result = _replay(ctx, args)
    payload = lock_payload(result)
    if args.dir:
        payload["dir"] = str(export_tree(result, Path(args.dir)))
    tarball, lock = export_tarball(result, Path(args.out))
    payload.update(tarball=str(tarball), lock=str(lock))
    ctx.emit(payload, f"{_summary(result)}\nwrote {tarball}\nwrote {lock}")
    return 0


def cmd_resolve(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source import resolve

    if args.action == "start":
        s = resolve.start(ctx.manifest(), _cache(ctx), Path(args.dir))
        ctx.emit(
            {
                "workdir": str(s.workdir),
                "step": s.step_number,
                "commit": s.commit,
                "files": list(s.files),
            },
            f"step {s.step_number} (PR #{s.pr}) commit {s.commit[:12]} recreated in {s.workdir}\n"
            + "".join(f"  conflict: {f}\n" for f in s.files)
            + f"fix the files, then: pinwheel resolve finish {args.dir}",
        )
    elif args.action == "finish":
        patch, manifest = resolve.finish(Path(args.dir))
        ctx.emit(
            {"patch": str(patch), "manifest": str(manifest)},
            f"recorded {patch.name} in {manifest.name}\nnext: pinwheel run  "
            "(then `pinwheel lock` to re-pin [result].tree)",
        )
    else:
        resolve.abort(Path(args.dir))
    return 0


def add_cache_flags(p: Any) -> None:
    """--no-cache and --reuse-from, shared by `build` and `kernels`."""
    p.add_argument("--no-cache", action="store_true",
                   help="build without the compiler cache ([build.cache])")  # fmt: skip
    p.add_argument(
        "--reuse-from", metavar="RELEASE|URL|WHEEL", default=None,
        help="take compiled members from this earlier verified build when none of their "
        "inputs changed",
    )  # fmt: skip


def register(sub: Any) -> None:
    p = command(sub, "plan", "dry run: commits per step, merge hazard, drifted heads", cmd_plan)
    p = command(sub, "run", "replay the stack in the cache; print head and tree", cmd_run)
    p.add_argument("--allow-drift", action="store_true", help="replay pinned heads that moved")
    p = command(sub, "build", "replay, then build the release wheels into wheels/", cmd_build)
    p.add_argument("--allow-drift", action="store_true", help="replay pinned heads that moved")
    p.add_argument("--out", default="wheels", help="output directory (default: wheels/)")
    p.add_argument("--no-kernels", action="store_true", help="skip the [[kernel]] wheels")
    add_cache_flags(p)
    p = command(sub, "lock", "pin short SHAs, PR heads, commits and the tree in place", cmd_lock)
    p.add_argument("--update-base", action="store_true", help="move the base to the branch tip")
    p.add_argument("--update-heads", action="store_true", help="move PR heads to upstream's")
    command(sub, "drift", "compare the manifest with upstream now", cmd_drift)
    p = command(sub, "export", "write the tree as a tarball + lock JSON", cmd_export)
    p.add_argument("--out", default="wheels", help="directory for the tarball and lock")
    p.add_argument("--dir", help="also extract the tree into this directory")
    p.add_argument("--allow-drift", action="store_true", help=argparse.SUPPRESS)
    p = command(sub, "resolve", "fix a conflict once and record it under patches/", cmd_resolve)
    p.add_argument("action", choices=("start", "finish", "abort"))
    p.add_argument("dir", help="checkout directory for the conflict")
