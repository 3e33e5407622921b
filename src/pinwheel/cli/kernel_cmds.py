"""`pinwheel toolchain` (find or provision CUDA 12.x) and `pinwheel kernels` (kernel wheels)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel.cli import Context, command
from pinwheel.printable import shown_cmd

if TYPE_CHECKING:
    from pinwheel.compile.toolchain import ToolchainError
    from pinwheel.manifest.build import KernelSpec


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


def cmd_toolchain(ctx: Context, args: argparse.Namespace) -> int:
    """One report: the substitutions, Python, gcc, the arch table and every CUDA seen here
    (installed, in the cache, provisionable), then the toolkit the build stage resolves
    (provisioned unless --no-provision); every problem at once, in one error after the
    report."""
    from pinwheel.cli.replay_cmds import build_request
    from pinwheel.compile.pipeline import toolchain
    from pinwheel.compile.toolchain import ToolchainError, parse_flags
    from pinwheel.compile.toolchain.choose import ToolchainChoice, one_report
    from pinwheel.compile.toolchain.survey import report_lines, survey
    from pinwheel.cudaarch import parse_arch
    from pinwheel.wheels.substitute import to_json

    found = survey(
        ctx.manifest().require("build"), ctx.host, ctx.cache, parse_flags(args.substitute)
    )
    config = found.config
    substituted = [w for sub in args.substitute or () for w in ("--substitute", sub)]
    problems = [_python_scope(p, ctx.manifest().kernels, substituted) for p in found.problems]
    toolkit, seconds = None, 0.0
    if found.table_ok:  # else resolving would only repeat the table's problem
        # The stage resolves the toolkit for the survey's choice: a missing gcc or Python
        # is reported beside it, not in its way.
        chosen = ToolchainChoice(config, found.substitutions, None)
        try:
            request = dataclasses.replace(build_request(ctx, args), chosen=chosen)
            outcome = toolchain(request, ctx.reporter)
            toolkit, seconds = outcome.toolkit, outcome.seconds
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


def _python_scope(
    problem: ToolchainError, kernels: Sequence[KernelSpec], substituted: Sequence[str]
) -> ToolchainError:
    """A missing ``[build] python`` says what needs it and what builds without it (issue 53:
    on Debian 12, with no 3.12, the first green build passes while this report fails)."""
    from pinwheel.compile.toolchain import ToolchainError
    from pinwheel.compile.toolchain.choose import python_free

    free = [k.name for k in kernels if python_free(k)]
    if problem.where != "[build] python" or not free:
        return problem
    needs = ["the engine", *(k.name for k in kernels if not python_free(k))]
    names = [w for n in free for w in ("--name", n)]
    build = shown_cmd("tools/replay", "kernels", *names, *substituted)
    return ToolchainError(
        f"{problem.what}; needed by {' and '.join(needs)}, not by {', '.join(free)} "
        f"(py3-none wheels: `{build}` builds them without it)",
        where=problem.where,
        next=problem.next,
    )


def cmd_kernels(ctx: Context, args: argparse.Namespace) -> int:
    """The selected [[kernel]] wheels: the build stage checks the toolchain, reaches every
    selected component's upstream (a missing commit fails before a toolkit is provisioned),
    then builds."""
    from pinwheel.cli.replay_cmds import build_request
    from pinwheel.compile.pipeline import build

    request = build_request(
        ctx,
        args,
        args.out,
        reach=True,
        kernels=tuple(args.name or ()) or None,
        all_kernels=args.all,
        twice=args.twice,
        source_date_epoch=args.source_date_epoch,
    )
    outcome = build(request, ctx.reporter)
    ctx.emit(outcome.to_json(), "\n".join(outcome.human_lines()))
    return 0
