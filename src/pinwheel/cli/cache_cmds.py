"""`pinwheel cache du|verify|clean|prune` (the logic: pinwheel.source.cachetool)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.cli import Context, action, command
from pinwheel.errors import EXIT_ERROR, EXIT_OK
from pinwheel.manifest import load
from pinwheel.printable import shown
from pinwheel.progress import human_bytes

if TYPE_CHECKING:  # imported where used: `pinwheel --help` loads no libgit2
    from pinwheel.source.cachetool import DiskUsage, Removal, RepoCheck, Usage


def _removal(ctx: Context, outcome: Removal, verb: str, how: str) -> int:
    listing = [f"  {p.relative_to(outcome.root)}" for p in outcome.paths]
    if outcome.applied:
        head = f"{verb} {len(outcome.paths)} entr(ies), {human_bytes(outcome.bytes)} freed"
    else:
        head = (
            f"would {verb.removesuffix('d')} {len(outcome.paths)} entr(ies), "
            f"{human_bytes(outcome.bytes)} (dry run; {how})"
        )
    ctx.emit(
        {
            "cache": str(outcome.root),
            "applied": outcome.applied,
            "bytes": outcome.bytes,
            "paths": [str(p) for p in outcome.paths],
            "busy": [str(p) for p in outcome.busy],
        },
        "\n".join(
            [head, *listing]
            + [
                f"kept {p.relative_to(outcome.root)}: another run holds its cache lock"
                for p in outcome.busy
            ]
        ),
    )
    return EXIT_OK


def verify_lines(root: Path, checks: tuple[RepoCheck, ...]) -> list[str]:
    """What `cache verify` prints: each repository by its path, a partial mirror's known
    missing objects (with their paths) apart from damage, and a fix only for damage."""
    lines = []
    for c in checks:
        if not c.ok:
            lines.append(f"BAD  {c.path}\n       {c.detail}")
        elif c.partial:
            lines.append(
                f"ok   {c.path}\n       partial mirror: {len(c.known_missing)} object(s) it "
                "never had (a re-fetch gives the same; replay does not need their content):"
            )
            lines += [
                f"         {k.kind} {k.object}  {k.path or '(no cached ref names it)'}"
                for k in c.known_missing
            ]
        else:
            lines.append(f"ok   {c.path}")
    if not checks:
        lines.append(f"no repositories under {root / 'repos'}")
    bad = [c for c in checks if not c.ok]
    if bad:
        lines.append(
            "next: remove each damaged repository and run again; it is re-fetched:\n"
            + "\n".join(f"  rm -rf -- {shlex.quote(str(c.path))}" for c in bad)
        )
    elif any(c.partial for c in checks):
        lines.append(
            "nothing to fix; a checkout of those paths needs a complete mirror (git clone --mirror)"
        )
    return lines


def cmd_cache(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.source import cachetool

    root = ctx.cache
    if args.cache_action == "du":
        usage = cachetool.disk_usage(root)
        ctx.emit(
            {
                "cache": str(root),
                "total": usage.total,
                "largest_first": [e.name for e in usage.entries],  # (JSON objects have no order)
                # name -> bytes and files, and each entry under it, largest first
                "entries": {
                    e.name: e.to_json()
                    | {"children": [{"name": c.name, **c.to_json()} for c in e.children]}
                    for e in usage.entries
                },
            },
            "\n".join(_du_lines(usage, args.top)),
        )
        return EXIT_OK
    if args.cache_action == "verify":
        checks = cachetool.verify(root, full=args.full)
        ctx.emit(
            {
                "cache": str(root),
                "repos": [
                    {
                        "path": str(c.path),
                        "ok": c.ok,
                        "detail": c.detail,
                        "partial": c.partial,
                        "known_missing": [asdict(k) for k in c.known_missing],
                    }
                    for c in checks
                ],
            },
            "\n".join(verify_lines(root, checks)),
        )
        return EXIT_ERROR if any(not c.ok for c in checks) else EXIT_OK
    if args.cache_action == "clean":
        outcome = cachetool.clean(root, apply=args.yes)
        return _removal(ctx, outcome, "removed", "pass --yes to remove")
    manifests = [load(Path(p)) for p in args.manifests]
    outcome = cachetool.prune(root, manifests, older_than_days=args.older_than, apply=args.apply)
    return _removal(ctx, outcome, "pruned", "pass --apply to remove")


def _du_lines(usage: DiskUsage, top: int) -> list[str]:
    """Each top-level entry, largest first, with its ``top`` largest entries below it."""

    def row(u: Usage, indent: str) -> str:
        extra = [f"{n} {what}" for n, what in ((u.links, "link(s), not followed"),
                 (u.special, "FIFO/socket/device(s), not opened"),
                 (u.unreadable, "unreadable folder(s)")) if n]  # fmt: skip
        if u.shared:
            extra.append(f"{human_bytes(u.shared)} more in hard links to files counted above")
        more = "; " + "; ".join(extra) if extra else ""
        name = shown(u.name) + ("/" if u.folder else "")
        return f"{human_bytes(u.bytes):>10}  {indent}{name}  ({u.files} files{more})"

    lines: list[str] = []
    for e in usage.entries:
        lines.append(row(e, ""))
        shown_kids = e.children if top <= 0 else e.children[:top]
        lines += [row(c, "    ") for c in shown_kids]
        rest = e.children[len(shown_kids):]
        if rest:
            lines.append(
                f"{human_bytes(sum(c.bytes for c in rest)):>10}      ... {len(rest)} more "
                f"(--top 0 lists all)"
            )
    lines.append(f"{human_bytes(usage.total):>10}  total in {usage.root}")
    return lines


def register(sub: Any) -> None:
    p = command(
        sub, "cache", "cache sizes, integrity and cleanup (du, verify, clean, prune)", cmd_cache
    )
    actions = p.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    d = action(actions, "du", "size of each entry under the cache (repos/, toolchains/...) "
               "and of each entry under those, largest first")  # fmt: skip
    d.add_argument("--top", type=int, default=10, metavar="N",
                   help="the N largest entries under each folder (0: all)")  # fmt: skip
    v = action(actions, "verify", "git fsck each cache repository; name damaged ones")
    v.add_argument("--full", action="store_true", help="also read every object (slow)")
    c = action(actions, "clean", "remove everything in the cache except locks/")
    c.add_argument("--yes", action="store_true", help="really remove (default: list only)")
    r = action(
        actions, "prune", "remove cache repositories the given manifests do not use (dry run)"
    )
    r.add_argument("manifests", nargs="*", metavar="MANIFEST", help="manifests whose repos stay")
    r.add_argument(
        "--older-than", type=float, metavar="DAYS", help="only repos unused for DAYS days"
    )
    r.add_argument("--apply", action="store_true", help="really remove (default: dry run)")
