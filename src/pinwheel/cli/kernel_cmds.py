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
    from pinwheel.cudaarch import parse_arch

    config = _config(ctx, args)
    toolkit, seconds = _toolkit(ctx, config, not args.no_provision)
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
    from pinwheel.cli.replay_cmds import _cache
    from pinwheel.compile.kernels import select
    from pinwheel.compile.pipeline import BuildRequest, build
    from pinwheel.compile.toolchain import parse_flags
    from pinwheel.manifest.component import stacks
    from pinwheel.source.replay import reach_all

    _config(ctx, args)  # a missing gcc or a bad --substitute fails before anything runs
    out = (args.out or ctx.manifest().root / "wheels").absolute()
    # Reach every selected component's upstream first: a missing commit fails before
    # a toolkit is provisioned.
    chosen = {k.name for k in select(ctx.manifest().kernels, args.name, all_=args.all)}
    reach_all(tuple(s for s in stacks(ctx.manifest()) if s.kernel and s.name in chosen),
              _cache(ctx))  # fmt: skip
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
