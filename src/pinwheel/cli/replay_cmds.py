"""Replay subcommands: plan, run, build, lock, drift, export, resolve."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel import options
from pinwheel.cli import Context, command
from pinwheel.errors import UsageError
from pinwheel.manifest import Manifest
from pinwheel.manifest.component import ENGINE, Stack, stacks
from pinwheel.printable import shown_cmd

if TYPE_CHECKING:  # imported where used: `pinwheel --help` should not load libgit2
    from pinwheel.compile.pipeline import BuildRequest
    from pinwheel.source.cache import Cache
    from pinwheel.source.result import ReplayRequest, ReplayResult


def _cache(ctx: Context) -> Cache:
    from pinwheel.source.cache import Cache

    return Cache(ctx.cache, ctx.mirrors, ctx.offline, reporter=ctx.reporter)


def _stacks(ctx: Context, args: argparse.Namespace) -> tuple[Stack, ...]:
    return stacks(ctx.manifest(), tuple(getattr(args, "component", None) or ()))


def _per_stack(
    ctx: Context,
    args: argparse.Namespace,
    one: Any,
) -> tuple[dict[str, Any], str]:
    """Run ``one(stack) -> (payload, human)`` for each stack; engine payload stays top-level."""
    payload: dict[str, Any] = {}
    components: dict[str, Any] = {}
    human: list[str] = []
    chosen = _stacks(ctx, args)
    for stack in chosen:
        data, text = one(stack)
        if stack.name == ENGINE:
            payload.update(data)
        else:
            components[stack.name] = data
        human.append(text if len(chosen) == 1 else f"== {stack.title}\n{text}")
    if components:
        payload["components"] = components
    return payload, "\n".join(human)


def replay_request(
    ctx: Context, args: argparse.Namespace, manifest: Manifest | None = None, **kw: Any
) -> ReplayRequest:
    """Flags + context (cache, mirrors, offline) + manifest, resolved once into a request."""
    from pinwheel.source.result import ReplayRequest

    return ReplayRequest(
        manifest=manifest or ctx.manifest(),
        cache=ctx.cache,
        mirrors=ctx.mirrors,
        offline=ctx.offline,
        allow_drift=getattr(args, "allow_drift", False),
        **kw,
    )


def _replay(
    ctx: Context, args: argparse.Namespace, manifest: Manifest | None = None
) -> ReplayResult:
    from pinwheel.source.replay import replay, replaying


    request = replay_request(ctx, args, manifest)
    ctx.reporter.info(replaying(request.manifest))
    return replay(request, ctx.reporter)


def _summary(result: ReplayResult) -> str:
    verified = result.manifest.result.tree
    state = "matches [result].tree" if verified else "UNVERIFIED (no [result].tree pinned)"
    lines = [f"head {result.head}", f"tree {result.tree}  {state}"]
    if result.tag:
        lines.append(f"tag  {result.tag} (in the cache)")
    return "\n".join(lines)


def cmd_run(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.replay import lock_payload

    def one(stack: Stack) -> tuple[dict[str, Any], str]:
        result = _replay(ctx, args, stack.manifest)
        return lock_payload(result), _summary(result)

    ctx.emit(*_per_stack(ctx, args, one))
    return 0


def cmd_build(ctx: Context, args: argparse.Namespace) -> int:
    """Replay, then kernel + engine wheels as one set: the build stage does every step."""
    from pinwheel.compile.pipeline import build

    manifest = ctx.manifest()
    request = build_request(
        ctx,
        args,
        Path(args.out),
        reach=True,
        # A manifest of components only (no [upstream]) builds its [[kernel]] wheels.
        replay=replay_request(ctx, args, manifest) if manifest.has_engine else None,
        kernels=() if args.no_kernels else None,
    )
    outcome = build(request, ctx.reporter)
    head = _summary(outcome.replayed) + "\n" if outcome.replayed else ""
    ctx.emit(outcome.to_json(), head + "\n".join(outcome.human_lines()))
    return 0


def build_request(
    ctx: Context, args: argparse.Namespace, out: Path | None = None, **kw: Any
) -> BuildRequest:
    """Flags + context (cache, mirrors, offline, environment) + manifest, resolved once into
    the build stage's request: `build`, `kernels`, `toolchain`, `verify-build` and
    `attribute` make theirs here; ``kw``: what only that command sets."""
    from pinwheel.compile.pipeline import BuildRequest
    from pinwheel.compile.toolchain import parse_flags

    manifest = ctx.manifest()
    fields: dict[str, Any] = {
        "manifest": manifest,
        "cache": ctx.cache,
        "out_dir": (Path(out) if out is not None else manifest.root / "wheels").absolute(),
        "host": ctx.host,
        "mirrors": ctx.mirrors,
        "offline": ctx.offline,
        # `kernels` and `toolchain` say --no-provision; the others provision unless offline
        "provision": not (args.no_provision if hasattr(args, "no_provision") else ctx.offline),
        "compiler_cache": not getattr(args, "no_cache", False),
        "reuse_from": getattr(args, "reuse_from", None),
        "substitute": parse_flags(getattr(args, "substitute", ())),
        "wheelhouse": _wheelhouse(ctx, args),
        "build_python": ctx.host.build_python,
    }
    return BuildRequest(**(fields | kw))


def _wheelhouse(ctx: Context, args: argparse.Namespace) -> Path | None:
    """--wheelhouse (`build`, `attribute`), else $PINWHEEL_WHEELHOUSE (every build command)."""
    chosen = ctx.option(args, "PINWHEEL_WHEELHOUSE")
    if chosen.source == "flag" and chosen.value:
        return Path(chosen.value).absolute()
    return ctx.host.wheelhouse  # the variable, checked (or None: the index)


def cmd_plan(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.buildpins import plan_sources
    from pinwheel.source.plan import make_plan, plan_payload, render_plan

    def one(stack: Stack) -> tuple[dict[str, Any], str]:
        plan = make_plan(stack.manifest, _cache(ctx))
        payload, human = plan_payload(plan), render_plan(plan)
        if stack.name == ENGINE and (sources := plan_sources(stack.manifest, _cache(ctx))):
            payload["build_sources"] = sources.to_json()
            human += "\n" + "\n".join(sources.human_lines())
        return payload, human

    ctx.emit(*_per_stack(ctx, args, one))
    return 0


def cmd_lock(ctx: Context, args: argparse.Namespace) -> int:
    if args.tools:
        return _lock_tools(ctx, args)
    from pinwheel.source.lock import lock_manifest

    outcome = lock_manifest(
        ctx.manifest_path,
        _cache(ctx),
        update_base=args.update_base,
        update_heads=args.update_heads,
        components=tuple(args.component or ()),
    )
    human = [f"  {c.where}: {_lock_value(c.old)} -> {_lock_value(c.new)}" for c in outcome.changes]
    trees = [
        f"locked {outcome.path.name}: tree {s.tree}"
        if s.name == ENGINE
        else f"locked {outcome.path.name} component {s.name}: tree {s.tree}"
        for s in outcome.stacks
    ]
    ctx.emit(
        {
            "changes": [c.__dict__ for c in outcome.changes],
            "head": outcome.head,
            "tree": outcome.tree,
            "stacks": [s.__dict__ for s in outcome.stacks],
        },
        "\n".join([*(human or ["  nothing to change"]), *trees]),
    )
    return 0


def _lock_tools(ctx: Context, args: argparse.Namespace) -> int:
    """``lock --tools``: regenerate the hashed locks in locks/ and the torch locks the
    repository's manifests pin, and show what moved."""
    import shutil
    import sys

    from pinwheel.compile import torchlocks
    from pinwheel.compile.toollocks import LockError, cooldown_cutoff, refresh, repo_root

    root = repo_root()
    if root is None:
        raise LockError(
            "no locks/ beside this pinwheel: `lock --tools` rewrites a checkout's locks",
            where="locks/",
            next="run it from the pinwheel checkout (tools/replay lock --tools, nox -s lock)",
        )
    here = Path(sys.executable).parent / "uv"
    uv = str(here) if here.is_file() else shutil.which("uv", path=ctx.host.path)
    if uv is None:
        raise LockError(
            "uv is needed to regenerate the locks and is not installed here",
            where="lock --tools",
            next="run it through tools/replay (its venv has uv) or `nox -s lock`",
        )
    # The torch locks first: one that no longer fits its manifest stops before anything is
    # written.
    cutoff = cooldown_cutoff(args.cooldown)
    if cutoff is not None:
        ctx.reporter.info(f"cooldown {args.cooldown} days: no file uploaded after {cutoff} "
                          "is taken")  # fmt: skip
    torch = torchlocks.refresh(
        torchlocks.TorchLockRequest(root, uv, ctx.environ, check=args.check,
                                    exclude_newer=cutoff)  # fmt: skip
    )
    done = refresh(root, uv, ctx.environ, check=args.check, exclude_newer=cutoff)
    lines = []
    for r in done:
        state = "unchanged" if not r.changed else ("would change" if args.check else "rewritten")
        lines.append(f"{r.path}: sha256 {r.new_sha256} ({state})")
        if r.changed and not r.diff:
            lines.append("  same versions, new hashes (a file was added or removed upstream)")
        lines += ["  " + d for d in r.diff.splitlines()]
    for t in torch:
        state = "unchanged" if not t.changed else ("would change" if args.check else "rewritten")
        lines.append(f"{t.path}: sha256 {t.new_sha256} ({state}; torch {t.torch} for "
                     f"{t.platform}, [build.torch_lock] of {t.manifest})")  # fmt: skip
        if t.changed:
            if not t.diff:
                lines.append("  same versions: new hashes or a new header")
            lines += ["  " + d for d in t.diff.splitlines()]
            verb = "would be" if args.check else "is"
            lines.append(f"  {t.manifest} [build.torch_lock] sha256 {verb} {t.new_sha256} "
                         f"(was {t.old_sha256})")  # fmt: skip
    ctx.emit(
        {
            "locks": [{**r.__dict__, "changed": r.changed} for r in done],
            "torch_locks": [{**t.__dict__, "changed": t.changed} for t in torch],
            "check": args.check,
        },
        "\n".join(lines),
    )
    changed = any(r.changed for r in done) or any(t.changed for t in torch)
    return 1 if args.check and changed else 0


def _lock_value(value: Any) -> str:
    """A value lock changed, whole (a SHA is never cut mid-way); an absent one says so."""
    if value is None:
        return "(unset)"
    if isinstance(value, list | tuple):
        return (
            f"[{len(value)} item(s)]" if len(value) > 3 else "[" + ", ".join(map(str, value)) + "]"
        )
    return str(value)


def cmd_drift(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.buildpins import drift_lines, plan_sources
    from pinwheel.source.drift import drift_payload, drift_report, render_drift

    def one(stack: Stack) -> tuple[dict[str, Any], str]:
        report = drift_report(stack.manifest, _cache(ctx))
        payload, human = drift_payload(report), render_drift(report)
        build = stack.manifest.build
        if stack.name == ENGINE and build is not None and build.sources:
            sources = plan_sources(stack.manifest, _cache(ctx))
            assert sources is not None
            rows = drift_lines(sources.declared, build.sources, _cache(ctx))
            payload["build_sources"] = rows
            human += "\nbuild sources:\n" + "\n".join(f"  {r['name']}: {r['state']}" for r in rows)
        return payload, human

    ctx.emit(*_per_stack(ctx, args, one))
    return 0


def cmd_export(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source.export import export_tarball, export_tree
    from pinwheel.source.replay import lock_payload

    chosen = _stacks(ctx, args)
    if len(chosen) != 1 and getattr(args, "component", None):
        raise UsageError("export writes one stack", where="--component", next="name one")
    result = _replay(ctx, args, chosen[0].manifest)
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
        s = resolve.start(ctx.manifest(), _cache(ctx), Path(args.dir), _stacks(ctx, args))
        ctx.emit(
            {
                "workdir": str(s.workdir),
                "step": s.step_number,
                "commit": s.commit,
                "files": list(s.files),
            },
            f"{s.where}step {s.step_number} (PR #{s.pr}) commit {s.commit[:12]} "
            f"recreated in {s.workdir}\n"
            + "".join(f"  conflict: {f}\n" for f in s.files)
            + f"fix the files, then: {shown_cmd('pinwheel', 'resolve', 'finish', args.dir)}",
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


def _component_arg(p: Any) -> None:
    p.add_argument(
        "--component",
        action="append",
        metavar="NAME",
        help="only this stack: 'engine' or a [[kernel]] name (repeatable; default: all)",
    )


def add_substitute_flag(p: Any) -> None:
    """--substitute, shared by `build`, `kernels` and `toolchain`."""
    p.add_argument(
        "--substitute", action="append", default=[], metavar="KEY=VERSION",
        help="build with another CUDA or gcc than [build] pins (cuda=12.4, gcc=12; repeatable): "
        "recorded in provenance.json, `check` and the release notes",
    )  # fmt: skip


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
    _component_arg(p)
    p = command(sub, "run", "replay the stack in the cache; print head and tree", cmd_run)
    p.add_argument("--allow-drift", action="store_true", help="replay pinned heads that moved")
    _component_arg(p)
    p = command(sub, "build", "replay, then build the release wheels into wheels/", cmd_build)
    p.add_argument("--allow-drift", action="store_true", help="replay pinned heads that moved")
    p.add_argument("--out", default="wheels", help="output directory (default: wheels/)")
    p.add_argument("--no-kernels", action="store_true", help="skip the [[kernel]] wheels")
    options.add_flag(p, "PINWHEEL_WHEELHOUSE", metavar="DIR")
    add_cache_flags(p)
    add_substitute_flag(p)
    p = command(sub, "lock", "pin short SHAs, PR heads, commits and the tree in place", cmd_lock)
    p.add_argument("--update-base", action="store_true", help="move the base to the branch tip")
    p.add_argument("--update-heads", action="store_true", help="move PR heads to upstream's")
    p.add_argument(
        "--tools", action="store_true",
        help="instead: regenerate the hashed locks in locks/ (pinwheel's own environments, nox, "
        "the build tools) and the torch locks of manifest.toml and recipes/*/manifest.toml "
        "([build.torch_lock], its sha256 with it) with uv and show the diff",
    )  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="with --tools: write nothing; exit 1 when a lock would change")
    p.add_argument("--cooldown", type=int, default=0, metavar="DAYS",
                   help="with --tools: take no file uploaded in the last DAYS days "
                   "(uv's exclude-newer; default 0: none)")  # fmt: skip
    _component_arg(p)
    p = command(sub, "drift", "compare the manifest with upstream now", cmd_drift)
    _component_arg(p)
    p = command(sub, "export", "write the tree as a tarball + lock JSON", cmd_export)
    p.add_argument("--out", default="wheels", help="directory for the tarball and lock")
    p.add_argument("--dir", help="also extract the tree into this directory")
    _component_arg(p)
    p.add_argument("--allow-drift", action="store_true", help=argparse.SUPPRESS)
    p = command(sub, "resolve", "fix a conflict once and record it under patches/", cmd_resolve)
    p.add_argument("action", choices=("start", "finish", "abort"))
    p.add_argument("dir", help="checkout directory for the conflict")
    _component_arg(p)
