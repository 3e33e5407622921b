"""`pinwheel toolchain` (find or provision CUDA 12.x) and `pinwheel kernels` (kernel wheels)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.cli import Context, command

if TYPE_CHECKING:
    from pinwheel.compile.toolchain import Toolkit
    from pinwheel.manifest.build import BuildConfig


def add_kernel_commands(sub: Any) -> None:
    t = command(sub, "toolchain", "show the CUDA toolkit [build] needs; provision it if absent",
                cmd_toolchain)  # fmt: skip
    t.add_argument("--no-provision", action="store_true",
                   help="only look for an installed toolkit; fail if none fits")  # fmt: skip
    from pinwheel.cli.replay_cmds import add_substitute_flag

    add_substitute_flag(t)

    k = command(sub, "kernels", "build the [[kernel]] packages into wheels", cmd_kernels)
    k.add_argument("--name", action="append", metavar="NAME", help="build only NAME (repeatable)")
    k.add_argument("--all", action="store_true", help="also the kernels marked default = false")
    k.add_argument("--out", type=Path, default=None, help="wheel directory (default: wheels/)")
    k.add_argument(
        "--twice", action="store_true", help="build twice; fail unless the wheels are identical"
    )
    k.add_argument(
        "--source-date-epoch", type=int, default=None,
        help="timestamp for the wheels (default: date of each kernel's source)",
    )  # fmt: skip
    k.add_argument("--no-provision", action="store_true", help="do not provision a toolkit")
    from pinwheel.cli.replay_cmds import add_cache_flags

    add_cache_flags(k)
    add_substitute_flag(k)


def _config(ctx: Context, args: argparse.Namespace) -> BuildConfig:
    """[build] after --substitute, its gcc found (before any toolkit is provisioned)."""
    from pinwheel.cli.replay_cmds import chosen_toolchain

    config: BuildConfig = chosen_toolchain(ctx, args).config
    return config


def _toolkit(ctx: Context, config: BuildConfig, provision: bool) -> tuple[Toolkit, float]:
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit

    started = time.monotonic()
    with ctx.reporter.status(f"resolving CUDA {config.cuda} for {', '.join(config.arches)}"):
        toolkit = resolve_toolkit(
            ToolkitRequest(
                config, ctx.cache, ctx.environ, provision=provision, reporter=ctx.reporter
            )
        )
    return toolkit, time.monotonic() - started


def cmd_toolchain(ctx: Context, args: argparse.Namespace) -> int:
    """One report: the substitutions, Python, gcc, the arch table and every CUDA seen here
    (installed, in the cache, provisionable), then the toolkit resolved (provisioned
    unless --no-provision); every problem at once, in one error after the report."""
    from pinwheel.compile.toolchain import ToolchainError, parse_flags
    from pinwheel.compile.toolchain.choose import one_report
    from pinwheel.compile.toolchain.survey import report_lines, survey
    from pinwheel.cudaarch import parse_arch
    from pinwheel.wheels.substitute import to_json

    found = survey(
        ctx.manifest().require("build"), ctx.environ, ctx.cache, parse_flags(args.substitute)
    )
    config = found.config
    problems = list(found.problems)
    toolkit, seconds = None, 0.0
    if found.table_ok:  # else resolving would only repeat the table's problem
        try:
            toolkit, seconds = _toolkit(ctx, config, not args.no_provision)
        except ToolchainError as exc:
            problems.append(exc)
    lines = report_lines(found)
    if toolkit is not None:
        lines += [
            f"using CUDA {toolkit.version} ({toolkit.source}) at {toolkit.root}",
            f"compiles {', '.join(parse_arch(a).name for a in toolkit.arches)} "
            f"(probed in {seconds:.1f} s)",
            f"use it: export CUDA_HOME={toolkit.root} PATH={toolkit.root / 'bin'}:$PATH",
        ]
    elif not problems:  # pragma: no cover - resolve either returns a toolkit or raises
        lines.append("no CUDA toolkit resolved")
    else:
        lines.append(f"using: no CUDA toolkit ({len(problems)} problem(s); see the error below)")
    payload = {
        "ok": not problems,
        "root": str(toolkit.root) if toolkit else None,
        "nvcc": str(toolkit.nvcc) if toolkit else None,
        "version": toolkit.version if toolkit else None,
        "arches": list(config.arches),
        "source": toolkit.source if toolkit else None,
        "seconds": round(seconds, 2),
        "cmake_architectures": config.cmake_architectures,
        "torch_arch_list": config.torch_arch_list,
        "python": {"pinned": config.python, "path": found.python.path if found.python else None,
                   "source": found.python.source if found.python else None},
        "gcc": {"pinned": config.gcc, "cxx": found.gcc.cxx if found.gcc else None,
                "version": found.gcc.version if found.gcc else None},
        "cuda": {"pinned": config.cuda, "seen": [t.to_json() for t in found.cudas]},
        "substitutions": to_json(found.substitutions),
        "problems": [{"where": p.where, "what": p.what, "next": p.next} for p in problems],
    }  # fmt: skip
    ctx.emit(payload, "\n".join(lines))
    if problems:
        raise one_report(problems)
    return 0


def cmd_kernels(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.cli.replay_cmds import reach_all
    from pinwheel.compile.kernels import select
    from pinwheel.compile.pipeline import BuildRequest, build
    from pinwheel.compile.toolchain import parse_flags
    from pinwheel.manifest.component import stacks

    _config(ctx, args)  # a missing gcc or a bad --substitute fails before anything runs
    out = (args.out or ctx.manifest().root / "wheels").absolute()
    # Reach every selected component's upstream first: a missing commit fails before
    # a toolkit is provisioned.
    chosen = {k.name for k in select(ctx.manifest().kernels, args.name, all_=args.all)}
    reach_all(ctx, tuple(s for s in stacks(ctx.manifest()) if s.kernel and s.name in chosen))
    request = BuildRequest(
        manifest=ctx.manifest(),
        cache=ctx.cache,
        out_dir=out,
        environ=ctx.environ,
        mirrors=ctx.mirrors,
        offline=ctx.offline,
        provision=not args.no_provision,
        kernels=tuple(args.name or ()) or None,
        all_kernels=args.all,
        twice=args.twice,
        source_date_epoch=args.source_date_epoch,
        compiler_cache=not args.no_cache,
        reuse_from=args.reuse_from,
        substitute=parse_flags(args.substitute),
    )
    outcome = build(request, ctx.reporter)
    ctx.emit(outcome.to_json(), "\n".join(outcome.human_lines()))
    return 0
