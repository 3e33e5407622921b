"""`pinwheel toolchain` (find or provision CUDA 12.x) and `pinwheel kernels` (kernel wheels)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pinwheel.cli import Context, command


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
    from pinwheel.cli.replay_cmds import build_request
    from pinwheel.compile.pipeline import toolchain
    from pinwheel.cudaarch import parse_arch

    outcome = toolchain(build_request(ctx, args), ctx.reporter)
    config, toolkit, seconds = outcome.config, outcome.toolkit, outcome.seconds
    payload = {
        "root": str(toolkit.root),
        "nvcc": str(toolkit.nvcc),
        "version": toolkit.version,
        "arches": list(toolkit.arches),
        "source": toolkit.source,
        "seconds": round(seconds, 2),
        "cmake_architectures": config.cmake_architectures,
        "torch_arch_list": config.torch_arch_list,
    }
    human = (
        f"CUDA {toolkit.version} ({toolkit.source}) at {toolkit.root}\n"
        f"compiles {', '.join(parse_arch(a).name for a in toolkit.arches)} "
        f"(probed in {seconds:.1f} s)\n"
        f"use it: export CUDA_HOME={toolkit.root} PATH={toolkit.root / 'bin'}:$PATH"
    )
    ctx.emit(payload, human)
    return 0


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
