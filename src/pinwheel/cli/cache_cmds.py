"""`pinwheel cache du|verify|clean|prune` (the logic: pinwheel.source.cachetool)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.cli import Context, command
from pinwheel.errors import EXIT_ERROR, EXIT_OK
from pinwheel.manifest import load

if TYPE_CHECKING:  # imported where used: `pinwheel --help` loads no libgit2 or filelock
    from pinwheel.source.cachetool import Removal


def _removal(ctx: Context, outcome: Removal, verb: str, how: str) -> int:
    from pinwheel.source.cachetool import human

    listing = [f"  {p.relative_to(outcome.root)}" for p in outcome.paths]
    if outcome.applied:
        head = f"{verb} {len(outcome.paths)} entr(ies), {human(outcome.bytes)} freed"
    else:
        head = (
            f"would {verb.removesuffix('d')} {len(outcome.paths)} entr(ies), "
            f"{human(outcome.bytes)} (dry run; {how})"
        )
    ctx.emit(
        {
            "cache": str(outcome.root),
            "applied": outcome.applied,
            "bytes": outcome.bytes,
            "paths": [str(p) for p in outcome.paths],
        },
        "\n".join([head, *listing]),
    )
    return EXIT_OK


def cmd_cache(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source import cachetool

    human = cachetool.human

    root = ctx.cache
    if args.cache_action == "du":
        usage = cachetool.disk_usage(root)
        lines = [f"{human(e.bytes):>10}  {e.name}/  ({e.files} files)" for e in usage.entries]
        lines.append(f"{human(usage.total):>10}  total in {root}")
        ctx.emit(
            {
                "cache": str(root),
                "total": usage.total,
                "entries": {e.name: {"bytes": e.bytes, "files": e.files} for e in usage.entries},
            },
            "\n".join(lines),
        )
        return EXIT_OK
    if args.cache_action == "verify":
        checks = cachetool.verify(root, full=args.full)
        bad = [c for c in checks if not c.ok]
        lines = [f"{'ok ' if c.ok else 'BAD'}  {c.path.name}  {c.detail}" for c in checks]
        if not checks:
            lines.append(f"no repositories under {root / 'repos'}")
        if bad:
            lines.append(
                "next: remove each BAD repository (rm -rf PATH) and run again; it is re-fetched"
            )
        ctx.emit(
            {
                "cache": str(root),
                "repos": [{"path": str(c.path), "ok": c.ok, "detail": c.detail} for c in checks],
            },
            "\n".join(lines),
        )
        return EXIT_ERROR if bad else EXIT_OK
    if args.cache_action == "clean":
        outcome = cachetool.clean(root, apply=args.yes)
        return _removal(ctx, outcome, "removed", "pass --yes to remove")
    manifests = [load(Path(p)) for p in args.manifests]
    outcome = cachetool.prune(root, manifests, older_than_days=args.older_than, apply=args.apply)
    return _removal(ctx, outcome, "pruned", "pass --apply to remove")


def register(sub: Any) -> None:
    p = command(
        sub, "cache", "cache sizes, integrity and cleanup (du, verify, clean, prune)", cmd_cache
    )
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    actions.add_parser("du", help="size of each entry under the cache (repos/, toolchains/...)")
    v = actions.add_parser("verify", help="git fsck each cache repository; name damaged ones")
    v.add_argument("--full", action="store_true", help="also read every object (slow)")
    c = actions.add_parser("clean", help="remove everything in the cache except locks/")
    c.add_argument("--yes", action="store_true", help="really remove (default: list only)")
    r = actions.add_parser(
        "prune", help="remove cache repositories the given manifests do not use (dry run)"
    )
    r.add_argument("manifests", nargs="*", metavar="MANIFEST", help="manifests whose repos stay")
    r.add_argument(
        "--older-than", type=float, metavar="DAYS", help="only repos unused for DAYS days"
    )
    r.add_argument("--apply", action="store_true", help="really remove (default: dry run)")
